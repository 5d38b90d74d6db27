#!/usr/bin/env bash
# Training on several GPUs of one machine (issue 17), in one call: `foxlm bench train --gpus 2`
# (tokens/s on 1 GPU, then 2 ranks through NCCL with ZeRO-1; scaling efficiency, memory and
# optimizer state per GPU) for fox-pro-125m (B=2 per GPU) and fox-pro-760m (B=1 per GPU) at T=16384,
# then the PyTorch DDP reference (bench/ddp_reference.py: LLaMA-style 125M, torch.compile, B=2 per
# GPU) under torchrun on 1 and 2 GPUs, with its 650 MB NCCL all-reduce probe. JSON rows go to $OUT
# (default runs/bench-train-multi).
#
# With one GPU visible it runs the 1-GPU parts (`--gpus 1`: a world of one rank through NCCL, and
# torchrun --nproc_per_node 1) and says what it skipped. NVLink multicast stays off (exported here
# when unset; every rank inherits the environment).
#
#   bench/train_multi.sh            # FOXLM=path/to/foxlm to use a built binary; ACP=on to time ACP
set -uo pipefail
cd "$(dirname "$0")/.."
FL=${FOXLM:-target/release/foxlm}
OUT=${OUT:-runs/bench-train-multi}
ACP=${ACP:-off}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
export TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
export NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS:-1}
export PYTHONUNBUFFERED=1
if [ "$NCCL_NVLS_ENABLE" != 0 ]; then
    echo "NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE: NVLink multicast must stay off here; unset it or set 0" >&2
    exit 2
fi
# GPUs this process may use (CUDA_VISIBLE_DEVICES counts; nvidia-smi does not see it)
visible=$(python3 -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null \
    || nvidia-smi -L 2>/dev/null | grep -c '^GPU')
n=$(( visible >= 2 ? 2 : 1 ))
echo "GPUs visible: ${visible:-0}; measuring 1 and $n"
if [ "$n" -lt 2 ]; then
    echo "skipped (one GPU): foxlm bench train --gpus 2 for fox-pro-125m and fox-pro-760m (run with --gpus 1" \
        "instead), torchrun --nproc_per_node 2 of bench/ddp_reference.py and its NCCL all-reduce probe"
fi
rc=0
"$FL" bench train --gpus "$n" --preset fox-pro-125m --batch 2 --acp "$ACP" \
    --json "$OUT/foxlm-fox-pro-125m-gpus$n.json" || rc=1
"$FL" bench train --gpus "$n" --preset fox-pro-760m --batch 1 --acp "$ACP" --steps 5 \
    --json "$OUT/foxlm-fox-pro-760m-gpus$n.json" || rc=1
for p in $(seq 1 "$n"); do
    torchrun --standalone --nproc_per_node "$p" bench/ddp_reference.py --size 125m --batch 2 \
        --json "$OUT/ref-ddp-125m-gpus$p.json" || rc=1
done
exit $rc
