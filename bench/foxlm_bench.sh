# Sourced, from the repository root, by the scripts that time `foxlm bench` next to PyTorch
# references (`. bench/foxlm_bench.sh DEFAULT_OUT`): FL, the foxlm binary ($FOXLM if set, else
# target/release/foxlm); OUT, the folder the JSON rows go to ($OUT if set, else DEFAULT_OUT),
# created; and Python's output unbuffered, so that its lines interleave with foxlm's as they come.
FL=${FOXLM:-target/release/foxlm}
OUT=${OUT:-$1}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
