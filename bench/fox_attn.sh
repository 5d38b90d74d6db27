# Sourced by the benchmark scripts that run fox-attn: sets FOX_ATTN to the binary to run, the one
# given in $FOX_ATTN if set, else target/release/fox-attn built with cargo (from the repository root).
if [ -z "${FOX_ATTN:-}" ]; then
    cargo build --release -p fox-checks --bin fox-attn >&2
    FOX_ATTN=target/release/fox-attn
fi
