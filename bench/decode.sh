#!/usr/bin/env bash
# Generation benchmark on the GPU machine: `foxlm bench decode` (batch 1 and 32 after a 2048-token
# prompt, 128 new tokens, random weights, with and without CUDA graphs) next to what a PyTorch user
# would run in the same call: the same-sized Transformer and FoX (Pro) decoding from a static KV
# cache under torch.compile(mode="reduce-overhead"), as gpt-fast does (bench/decode_reference.py).
# JSON rows go to $OUT (default runs/bench-decode).
#
#   bench/decode.sh 125m
#   bench/decode.sh 760m
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/foxlm_bench.sh runs/bench-decode
size=${1:-125m}
case $size in
    125m|760m) ;;
    *) echo "usage: bench/decode.sh 125m|760m"; exit 2 ;;
esac
"$FL" bench decode --preset "fox-pro-$size,transformer-llama-$size" --batch 1,32 --json "$OUT/foxlm-$size.json"
"$FL" bench decode --preset "fox-pro-$size" --batch 1 --no-graphs --repeats 1 --json "$OUT/foxlm-$size-nographs.json"
"$FL" bench decode --preset "fox-pro-$size" --batch 1 --unfused --repeats 1 --json "$OUT/foxlm-$size-unfused.json"
for m in transformer fox; do
    python3 bench/decode_reference.py --model $m --size "$size" --batch 1 --json "$OUT/ref-$m-$size.json"
    python3 bench/decode_reference.py --model $m --size "$size" --batch 32 --json "$OUT/ref-$m-$size-b32.json"
done
