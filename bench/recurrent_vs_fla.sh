#!/usr/bin/env bash
# The recurrent families' kernels against fla 0.6.0's in one call, each forward timed in a process
# of its own and twice: fla's Triton autotuning picks other configurations from process to process
# (its forwards have moved by up to 32% within one call), so one fla process is not a reference.
# Order: fla chunk_delta_rule + chunk_gated_delta_rule, `fox-attn bench-delta`, fla chunk_gla,
# `fox-attn bench-gla` (every version's row), then all four again. Shapes: the 125M models' widths
# (B=2, T=16384, H=6, K=V=128, bf16). Prints every row; keep them all for BENCHMARKS.md.
#
#   bench/recurrent_vs_fla.sh
#
# Needs fla importable (flash-linear-attention 0.6.0 and einops on PYTHONPATH: see docs/gpu.md)
# and uses $FOX_ATTN (a built fox-attn binary) if set, else builds it with cargo.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/fox_attn.sh
python3 -c "import fla" 2>/dev/null || { echo "fla is not importable (PYTHONPATH)" >&2; exit 1; }
for round in 1 2; do
    echo "## round $round ($(date -u +%H:%M:%S) UTC)"
    python3 bench/fla_delta_rule.py
    "$FOX_ATTN" bench-delta
    python3 bench/fla_gla.py --fwd-only
    "$FOX_ATTN" bench-gla
done
