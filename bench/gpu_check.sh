#!/usr/bin/env bash
# The whole GPU check: every CUDA kernel against its CPU reference on fresh random inputs, then the
# whole model on the GPU against the CPU (fixtures in f32 and bf16, training, resume). Each part
# prints a pass/fail table; the script exits non-zero if any row failed. See docs/gpu.md.
#
#   bench/gpu_check.sh                      # everything
#   bench/gpu_check.sh ops gemm model       # some parts: attention, ops, gemm, model
#
# Uses $FOX_ATTN and $FOXLM (built binaries) if set, else builds them with cargo.
set -uo pipefail
cd "$(dirname "$0")/.."
FA=${FOX_ATTN:-}
FL=${FOXLM:-}
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(attention ops gemm model)
# build only the binaries that are not given and that the parts use (foxlm: the model part)
build=()
[ -z "$FA" ] && build+=(-p fox-kernels --bin fox-attn)
[ -z "$FL" ] && [[ " ${parts[*]} " == *" model "* ]] && build+=(-p foxlm --bin foxlm)
if [ ${#build[@]} -gt 0 ]; then
    cargo build --release "${build[@]}" >&2 || exit 1
fi
FA=${FA:-target/release/fox-attn}
FL=${FL:-target/release/foxlm}
rc=0
for p in "${parts[@]}"; do
    echo "=== $p"
    case $p in
        attention) "$FA" check || rc=1 ;;
        ops) "$FA" check-ops || rc=1 ;;
        gemm) "$FA" check-gemm || rc=1 ;;
        model) "$FL" gpu-check || rc=1 ;;
        *) echo "unknown part $p (attention, ops, gemm, model)"; rc=2 ;;
    esac
done
exit $rc
