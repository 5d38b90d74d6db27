#!/usr/bin/env bash
# Forgetting Attention benchmark on the GPU, with PyTorch SDPA (causal, no gate) as the reference
# in the same run: B*T = 32768, H*D = 2048, D in {64, 128}, T in {1024, 4096, 16384}, bf16,
# forward and forward+backward, mixed gates, ACP off and on. Prints a markdown table (for
# BENCHMARKS.md) and writes JSON to ${OUT:-.}/attention-bench.json.
#
#   bench/attention.sh [--d 64,128] [--t 1024,4096,16384] [--iters 10] [--no-sdpa]
#
# Uses $FOX_ATTN (a built fox-attn binary) if set, else builds it with cargo. The same benchmark is
# `foxlm bench attention`.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/fox_attn.sh
exec "$FOX_ATTN" bench --json "${OUT:-.}/attention-bench.json" "$@"
