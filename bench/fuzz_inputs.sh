#!/usr/bin/env bash
# The long run of the input mutation fuzzer (issue 13; crates/foxlm/tests/fuzz_inputs.rs):
# FOXLM_FUZZ_CASES damaged inputs (default 1,000,000) through every loader, in-process, from
# seed FOXLM_FUZZ_SEED (default 1e9, so it does not repeat the CI run's cases). Prints progress
# every 100,000 cases and a summary with cases per second; fails on any panic, hang or
# allocation above the bound, naming the seed and the mutation. Results go in
# docs/input-checking.md.
set -euo pipefail
cd "$(dirname "$0")/.."
export FOXLM_FUZZ_CASES="${FOXLM_FUZZ_CASES:-1000000}"
echo "fuzz_inputs: $FOXLM_FUZZ_CASES cases, $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) CPUs, $(git rev-parse --short HEAD)"
cargo test --release -p foxlm --test fuzz_inputs -- --ignored --nocapture --exact fuzz_inputs_long
