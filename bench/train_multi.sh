#!/usr/bin/env bash
# Training on several GPUs of one machine (issues 17 and 29), in one call: `foxlm bench train
# --gpus 2,4` (tokens/s on 1 GPU, then 2 ranks, then 4, through NCCL with ZeRO-1; scaling
# efficiency, memory and optimizer state per GPU) for fox-pro-125m (B=2 per GPU) and fox-pro-760m
# (B=1 per GPU) at T=16384, with the PyTorch DDP reference (bench/ddp_reference.py: LLaMA-style
# 125M, torch.compile, B=2 per GPU) under torchrun on 1, 2 and 4 GPUs, each N >= 2 with its 650 MB
# NCCL all-reduce probe. The GPU counts are 1 and the powers of two up to the GPUs visible, at most
# 4 (GPUS="1 2" or similar chooses them). Order: fox-pro-125m, the DDP reference, fox-pro-760m, so
# that a call cut short still has the 125M comparison. JSON rows go to $OUT (default
# runs/bench-train-multi).
#
# With one GPU visible it runs the 1-GPU parts (`--gpus 1`: a world of one rank through NCCL, and
# torchrun --nproc_per_node 1) and says what it skipped. NVLink multicast stays off (exported here
# when unset; every rank inherits the environment).
#
#   bench/train_multi.sh            # FOXLM=path/to/foxlm to use a built binary; ACP=on to time ACP;
#                                   # MODELS="fox-pro-125m" to leave out the 760M
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/foxlm_bench.sh runs/bench-train-multi
ACP=${ACP:-off}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
export TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
export NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS:-1}
if [ "$NCCL_NVLS_ENABLE" != 0 ]; then
    echo "NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE: NVLink multicast must stay off here; unset it or set 0" >&2
    exit 2
fi
# GPUs this process may use (CUDA_VISIBLE_DEVICES counts; nvidia-smi does not see it)
visible=$(python3 -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null \
    || nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ -n "${GPUS:-}" ]; then
    counts=$GPUS
else
    counts=1
    for p in 2 4; do [ "${visible:-0}" -ge "$p" ] && counts="$counts $p"; done
fi
many=$(echo "$counts" | tr ' ' '\n' | awk '$1 > 1' | paste -sd, -)
echo "GPUs visible: ${visible:-0}; measuring ${counts// /, }"
if [ -z "$many" ]; then
    many=1
    echo "skipped (one GPU): foxlm bench train --gpus 2 for fox-pro-125m and fox-pro-760m (run with --gpus 1" \
        "instead), torchrun --nproc_per_node 2 of bench/ddp_reference.py and its NCCL all-reduce probe"
fi
tag=${many//,/-}
rc=0
for m in ${MODELS:-fox-pro-125m ddp fox-pro-760m}; do
    case $m in
    fox-pro-125m)
        "$FL" bench train --gpus "$many" --preset fox-pro-125m --batch 2 --acp "$ACP" \
            --json "$OUT/foxlm-fox-pro-125m-gpus$tag.json" || rc=1 ;;
    fox-pro-760m)
        "$FL" bench train --gpus "$many" --preset fox-pro-760m --batch 1 --acp "$ACP" --steps 5 \
            --json "$OUT/foxlm-fox-pro-760m-gpus$tag.json" || rc=1 ;;
    ddp)
        for p in $counts; do
            torchrun --standalone --nproc_per_node "$p" bench/ddp_reference.py --size 125m --batch 2 \
                --json "$OUT/ref-ddp-125m-gpus$p.json" || rc=1
        done ;;
    *) echo "MODELS: $m is none of fox-pro-125m, ddp, fox-pro-760m" >&2; rc=2 ;;
    esac
done
exit $rc
