#!/usr/bin/env bash
# GPU check: every mode of the CUDA Forgetting Attention, then every small training op (f32 and
# bf16), against the CPU reference on fresh random inputs; prints the pass/fail tables and exits
# non-zero on any failure. See docs/gpu.md.
#
#   bench/gpu_check.sh [--filter TEXT] [--seed N]
#
# Uses $FOX_ATTN (a built fox-attn binary) if set, else builds it with cargo.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${FOX_ATTN:-}
if [ -z "$BIN" ]; then
    cargo build --release -p fox-kernels --bin fox-attn >&2
    BIN=target/release/fox-attn
fi
rc=0
"$BIN" check "$@" || rc=1
"$BIN" check-ops "$@" || rc=1
exit $rc
