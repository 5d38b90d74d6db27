#!/usr/bin/env bash
# Real clients against `foxlm serve` (not in CI): the official openai package and
# lm-evaluation-harness (local-completions) on three tasks defined from local files (multiple
# choice, perplexity, generation).
#
#   bench/serve_clients.sh [MODEL_DIR] [PORT]
#
# MODEL_DIR defaults to the model `foxlm demo` trains (runs/demo/run/final). Needs a Python with
# `pip install openai "lm-eval[api]" transformers` (set PYTHON, default python3); no network.
# SERVE_ARGS adds options to `foxlm serve` (e.g. SERVE_ARGS="--device cuda"); FOXLM names the
# binary (default target/release/foxlm, built if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-runs/demo/run/final}
PORT=${2:-8012}
PYTHON=${PYTHON:-python3}
LM_EVAL=${LM_EVAL:-$(dirname "$(command -v "$PYTHON")")/lm_eval}
BIN=${FOXLM:-target/release/foxlm}
[ -x "$BIN" ] || cargo build --release -p foxlm
[ -f "$MODEL/config.json" ] || { echo "no model in $MODEL: run 'cargo run --release -- demo' first" >&2; exit 1; }
[ -f "$MODEL/tokenizer.json" ] || "$BIN" tokenizer export "$MODEL"

# shellcheck disable=SC2086 # SERVE_ARGS is a list of options
"$BIN" serve --model "$MODEL" --port "$PORT" ${SERVE_ARGS:-} &
SERVER=$!
trap 'kill "$SERVER" 2>/dev/null || true' EXIT
for _ in $(seq 600); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
  sleep 0.1
done
NAME=$(curl -sf "http://127.0.0.1:$PORT/v1/models" | "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')
CTX=$(curl -sf "http://127.0.0.1:$PORT/v1/models" | "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["max_model_len"])')

echo "== openai client"
"$PYTHON" bench/serve_clients.py "http://127.0.0.1:$PORT" "$MODEL"

echo "== lm-evaluation-harness (local-completions; tokenizer: the server's, auto-detected)"
# max_length leaves one place for the token lm-eval asks to generate with each scoring request.
"$LM_EVAL" --model local-completions \
  --model_args "model=$NAME,base_url=http://127.0.0.1:$PORT/v1/completions,num_concurrent=8,max_retries=1,max_length=$((CTX - 1))" \
  --tasks foxlm_cloze,foxlm_ppl,foxlm_next_word --include_path bench/lm_eval_tasks 2>&1 | grep -v "Requesting API\|it/s\]" 

echo "== stopping the server (SIGTERM: requests in flight are finished first)"
kill -TERM "$SERVER"
wait "$SERVER"
trap - EXIT
