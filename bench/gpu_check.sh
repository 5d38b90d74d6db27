#!/usr/bin/env bash
# The whole GPU check: every CUDA kernel against its CPU reference on fresh random inputs, then the
# whole model on the GPU against the CPU (fixtures in f32 and bf16, training, resume), then
# data-parallel training through NCCL (dist: on one GPU a world of one rank against the plain
# trainer; with two GPUs also 2 ranks against 1, resume 2 -> 1 and a killed rank; for each
# family, or those of $DIST_MODELS). Each part
# prints a pass/fail table; the script exits non-zero if any row failed. See docs/gpu.md and
# docs/distributed.md.
#
#   bench/gpu_check.sh                      # everything
#   (ops: the small ops and Mamba's selective scan, fox-attn check-ops)
#   bench/gpu_check.sh ops gemm model dist  # some parts: attention, ops, gemm, model, dist
#   bench/gpu_check.sh python               # the Python package's CUDA path (not in the default
#                                           # list: needs python3 with torch and the authors' code)
#
# python: foxlm.ops.forgetting_attention against PyTorch and the authors' kernel, their model with
# it swapped in, and their 125M step with either kernel (crates/foxlm-py/python/tests/gpu_check.py;
# $AUTHORS_SRC: the folder holding their forgetting_transformer/, default .device-bundle/authors/src;
# $FOXLM_PY_EXT: a built extension, else cargo builds it; $GPU_CHECK_PY_ARGS: more options).
#
# Uses $FOX_ATTN and $FOXLM (built binaries) if set, else builds them with cargo.
set -uo pipefail
cd "$(dirname "$0")/.."
FA=${FOX_ATTN:-}
FL=${FOXLM:-}
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(attention ops gemm model dist)
# build only the binaries that are not given and that the parts use (foxlm: the model and dist parts)
build=()
[ -z "$FA" ] && [[ " ${parts[*]} " == *" attention "* || " ${parts[*]} " == *" ops "* || " ${parts[*]} " == *" gemm "* ]] \
    && build+=(-p fox-checks --bin fox-attn)
[ -z "$FL" ] && [[ " ${parts[*]} " == *" model "* || " ${parts[*]} " == *" dist "* ]] && build+=(-p foxlm --bin foxlm)
[ -z "${FOXLM_PY_EXT:-}" ] && [[ " ${parts[*]} " == *" python "* ]] && build+=(-p foxlm-py)
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
        dist)
            # every family's parameters through NCCL ($DIST_MODELS: a subset)
            for m in ${DIST_MODELS:-fox mamba2 samba deltanet gated-deltanet hgrn2}; do
                echo "--- dist: $m"
                "$FL" gpu-check --only dist --dist-model "$m" || rc=1
            done ;;
        python)
            pydir=$(mktemp -d)
            cp -r crates/foxlm-py/python/foxlm "$pydir/"
            cp "${FOXLM_PY_EXT:-target/release/libfoxlm_py.so}" "$pydir/foxlm/_foxlm.abi3.so"
            # shellcheck disable=SC2086
            PYTHONPATH="$pydir:${PYTHONPATH:-}" python3 crates/foxlm-py/python/tests/gpu_check.py \
                --authors-src "${AUTHORS_SRC:-.device-bundle/authors/src}" ${GPU_CHECK_PY_ARGS:-} || rc=1
            rm -rf "$pydir" ;;
        *) echo "unknown part $p (attention, ops, gemm, model, dist, python)"; rc=2 ;;
    esac
done
exit $rc
