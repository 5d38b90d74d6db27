#!/usr/bin/env bash
# Wheels for running bench/serve_clients.sh (openai + lm-evaluation-harness) on a machine without
# network whose Python (3.12) has PyTorch, transformers, pandas, pyarrow, requests, aiohttp,
# tiktoken, scikit-learn, sacrebleu, xxhash and fsspec but not the rest (the GPU machines).
#
#   bench/lm_eval_gpu_wheels.sh [DIR]     # default .device-bundle/lmeval/whl (git-ignored)
#
# There: python3 -m pip install --no-index --no-deps --target /tmp/site DIR/*.whl, then
# PYTHONPATH=/tmp/site LM_EVAL=/tmp/site/bin/lm_eval bench/serve_clients.sh ...
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.device-bundle/lmeval/whl}
mkdir -p "$DIR"
PLAT=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
# Versions that work with that machine's packages (openai 1.x on its httpx; pydantic 2.11 on its
# typing-extensions; datasets 3.6 with dill 0.3.8 and multiprocess 0.70.16).
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLAT[@]}" \
  -d "$DIR" lm_eval==0.4.13 datasets==3.6.0 evaluate==0.4.6 dill==0.3.8 multiprocess==0.70.16 \
  pytablewriter DataProperty mbstrdecoder pathvalidate tabledata tcolorpy typepy chardet \
  rouge_score nltk more_itertools tenacity openai==1.109.1 distro jiter pydantic==2.11.9 \
  pydantic_core==2.33.2 annotated_types typing_inspection sniffio
# Only source distributions on PyPI: built here (pure Python).
python3 -m pip wheel -q --no-deps -w "$DIR" sqlitedict word2number
ls "$DIR"
