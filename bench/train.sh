#!/usr/bin/env bash
# Training-step benchmark on the GPU machine: `foxlm bench train` next to what a PyTorch user would
# run, in the same call on the same GPU: a LLaMA-style Transformer with SDPA (eager and
# torch.compile) and the authors' own FoX (Pro) code (a copy of their repository's model files in
# $AUTHORS, never part of this repository). JSON rows go to $OUT (default runs/bench-train).
#
#   bench/train.sh 125m     # fox-pro-125m and transformer-pro-125m, B=2, T=16384
#   bench/train.sh 760m     # fox-pro-760m, B=1, T=16384 (the references with checkpointing)
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/foxlm_bench.sh runs/bench-train
size=${1:-125m}
case $size in
    125m)
        "$FL" bench train --preset fox-pro-125m --batch 2 --json "$OUT/foxlm-fox-pro-125m.json"
        "$FL" bench train --preset transformer-pro-125m --batch 2 --acp off --json "$OUT/foxlm-transformer-pro-125m.json"
        python3 bench/train_reference.py --size 125m --json "$OUT/ref-125m.json"
        python3 bench/train_reference.py --size 125m --compile --json "$OUT/ref-125m-compile.json"
        python3 bench/authors_fox.py --size 125m --json "$OUT/authors-125m.json"
        python3 bench/authors_fox.py --size 125m --acp --json "$OUT/authors-125m-acp.json"
        ;;
    760m)
        "$FL" bench train --preset fox-pro-760m --batch 1 --steps 5 --json "$OUT/foxlm-fox-pro-760m.json"
        python3 bench/train_reference.py --size 760m --batch 1 --checkpoint --compile --json "$OUT/ref-760m-compile.json"
        python3 bench/authors_fox.py --size 760m --batch 1 --checkpoint --json "$OUT/authors-760m.json"
        python3 bench/authors_fox.py --size 760m --batch 1 --checkpoint --acp --json "$OUT/authors-760m-acp.json"
        ;;
    *) echo "usage: bench/train.sh 125m|760m"; exit 2 ;;
esac
