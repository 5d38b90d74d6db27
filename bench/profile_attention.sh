#!/usr/bin/env bash
# Nsight Compute profile of the attention kernels at one shape (evidence for BENCHMARKS.md):
# speed of light, warp stall reasons, pipe utilisation. Needs ncu (Firecracker GPU machines).
#
#   bench/profile_attention.sh D T      (defaults 128 4096)
#   KERNELS=fox_bwdws_d COUNT=1 bench/profile_attention.sh 128 16384   (one kernel family)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${FOX_ATTN:-target/release/fox-attn}
D=${1:-128}
T=${2:-4096}
NCU=${NCU:-ncu}
"$NCU" --clock-control none -k "regex:${KERNELS:-fox_(fwd|bwd)}" -c "${COUNT:-5}" \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
    --section Occupancy --section LaunchStats \
    "$BIN" bench --no-sdpa --no-fox-refs --d "$D" --t "$T" --iters 1 --warmup 0
