#!/usr/bin/env bash
# The small-scale experiment (see README.md): tokenize the machine's Python site-packages, train
# seven ~49M-parameter models on the same tokens, evaluate each with foxlm's own commands, and
# compare them.
#
#   FOXLM=target/release/foxlm experiments/small-scale/run.sh STEP [ARGS] [STEP [ARGS]] ...
#
# Steps (run in the order given; each skips what is already done, so a cut run can be repeated):
#   data                 tokenize $SOURCES (default: site-packages) into $WORK/data
#   train MODEL...       train the named models (preset names; NAME@SEED for another seed)
#   eval MODEL...        per-token loss, needle test and (FoX) gate maps of the named models
#   model MODEL...       train, then evaluate, each named model in turn
#   compare              tables and overlays of every model evaluated so far
#   all                  data, model (all seven), compare
# MODEL may be "all" for the seven presets.
#
# Settings (environment):
#   FOXLM            the foxlm binary (required)
#   DEVICE           cuda (default) or cpu
#   WORK             data, checkpoints and full outputs (default experiments/small-scale/work)
#   RESULTS          the small files worth keeping: metrics, evaluations, plots, tables
#                    (default experiments/small-scale/results)
#   SOURCES          folders to tokenize, space-separated (default: python3's site-packages)
#   GLOB             file pattern (default '**/*.py')
#   VAL_BY           top (whole packages, default), dir (whole folders) or document
#   VAL_FRACTION     held-out share of the bytes (default 0.05)
#   MAX_FILE_BYTES   skip larger files, mostly generated tables (default 1M)
#   TRAIN_ARGS       extra `foxlm train` options, e.g. "--tokens 150000000" or "--lr 1e-3"
#   EVAL_CONTEXT     positions scored by `eval loss` (default 4096, twice the training context)
#   EVAL_SEQUENCES   held-out files averaged (default 256)
#   EVAL_BATCH       sequences per eval batch (default 8)
#   NIAH_LENGTHS     needle-test prompt lengths (default 1024,2048,3072,4096)
#   NIAH_DEPTHS      needle depths in percent (default 0,10,...,100)
#   HAYSTACK         needle-test filler (default the repository's Moby-Dick sample)
#   GATE_TOKENS      tokens of the gate maps (default 512)
#   FORCE            1: evaluate again what has been evaluated (default: skip it)
#   GATE_LAYERS      layers drawn, comma-separated (default 0,5: the first and the last; the
#                    memory-length heatmap always covers every head)
set -euo pipefail

die() { echo "run.sh: $*" >&2; exit 1; }

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
[ -n "${FOXLM:-}" ] || die "set FOXLM to the foxlm binary (e.g. FOXLM=target/release/foxlm)"
[ -x "$FOXLM" ] || die "FOXLM=$FOXLM is not an executable"
FOXLM="$(cd "$(dirname "$FOXLM")" && pwd)/$(basename "$FOXLM")"
DEVICE="${DEVICE:-cuda}"
WORK="${WORK:-$HERE/work}"
RESULTS="${RESULTS:-$HERE/results}"
GLOB="${GLOB:-**/*.py}"
VAL_BY="${VAL_BY:-top}"
VAL_FRACTION="${VAL_FRACTION:-0.05}"
MAX_FILE_BYTES="${MAX_FILE_BYTES:-1M}"
TRAIN_ARGS="${TRAIN_ARGS:-}"
EVAL_CONTEXT="${EVAL_CONTEXT:-4096}"
EVAL_SEQUENCES="${EVAL_SEQUENCES:-256}"
EVAL_BATCH="${EVAL_BATCH:-8}"
NIAH_LENGTHS="${NIAH_LENGTHS:-1024,2048,3072,4096}"
NIAH_DEPTHS="${NIAH_DEPTHS:-0,10,20,30,40,50,60,70,80,90,100}"
HAYSTACK="${HAYSTACK:-$REPO/data/sample/moby-dick}"
GATE_TOKENS="${GATE_TOKENS:-512}"
GATE_LAYERS="${GATE_LAYERS:-0,5}"
ALL_MODELS=(fox-pro-small transformer-pro-small fox-llama-small transformer-llama-small
    transformer-llama-norope-small fox-llama-biasonly-small fox-llama-fixed-small)
DATA="$WORK/data"
mkdir -p "$WORK" "$RESULTS"

# The eval and viz commands take --device once the GPU inference is in; before that they run on
# the CPU without the option.
device_opt() { # subcommand words...
    if "$FOXLM" "$@" --help 2>/dev/null | grep -q -- '--device'; then echo "--device $DEVICE"; fi
}

# Seconds spent per step, appended to $RESULTS/timings.tsv with the device's name.
gpu_name() {
    if [ "$DEVICE" != cpu ] && command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=name --format=csv,noheader | head -1
    else
        echo "cpu ($(nproc) cores)"
    fi
}
timed() { # label command...
    local label="$1"; shift
    local t0; t0=$(date +%s.%N)
    "$@"
    local t1; t1=$(date +%s.%N)
    local s; s=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
    [ -f "$RESULTS/timings.tsv" ] || printf 'date\tstep\tseconds\tdevice\n' > "$RESULTS/timings.tsv"
    printf '%s\t%s\t%s\t%s\n' "$(date -u +%FT%TZ)" "$label" "$s" "$(gpu_name)" >> "$RESULTS/timings.tsv"
    echo "== $label: $s s"
}

site_packages() {
    python3 -c 'import site, os; print("\n".join(p for p in site.getsitepackages() if os.path.isdir(p)))'
}

step_data() {
    if [ -f "$DATA/manifest.json" ]; then
        echo "== data: $DATA exists"
        return
    fi
    local sources=()
    if [ -n "${SOURCES:-}" ]; then
        read -r -a sources <<< "$SOURCES"
    else
        mapfile -t sources < <(site_packages)
    fi
    [ "${#sources[@]}" -gt 0 ] || die "no site-packages found; set SOURCES"
    local inputs=()
    for s in "${sources[@]}"; do inputs+=(--input "$s"); done
    timed data "$FOXLM" data prepare "${inputs[@]}" --glob "$GLOB" --val-by "$VAL_BY" \
        --val-fraction "$VAL_FRACTION" --max-file-bytes "$MAX_FILE_BYTES" --text-format plain --output "$DATA"
    mkdir -p "$RESULTS/data"
    cp "$DATA/manifest.json" "$RESULTS/data/"
    "$FOXLM" data inspect "$DATA" > "$RESULTS/data/summary.txt"
    # Which packages (or folders) were held out, for the README; the full list stays in $DATA.
    python3 - "$DATA/files.jsonl" "$VAL_BY" > "$RESULTS/data/held-out.txt" <<'EOF'
import json, sys
groups = {}
for line in open(sys.argv[1]):
    f = json.loads(line)
    if f["status"] != "val":
        continue
    p = f["path"]
    g = p.split("/")[0] if sys.argv[2] == "top" else (p.rsplit("/", 1)[0] if "/" in p else ".")
    n, b = groups.get(g, (0, 0))
    groups[g] = (n + 1, b + f["bytes"])
for g, (n, b) in sorted(groups.items()):
    print(f"{g}\t{n} files\t{b} bytes")
EOF
}

# NAME or NAME@SEED -> preset, run folder name, extra train options.
parse_model() {
    local m="$1"
    PRESET="${m%@*}"
    if [ "$PRESET" != "$m" ]; then
        SEED="${m#*@}"
        RUN="$PRESET-seed$SEED"
        SEED_OPT="--seed $SEED"
    else
        RUN="$PRESET"
        SEED_OPT=""
    fi
}

expand_models() {
    for m in "$@"; do
        if [ "$m" = all ]; then printf '%s\n' "${ALL_MODELS[@]}"; else echo "$m"; fi
    done
}

step_train() {
    local m="$1"
    parse_model "$m"
    local out="$WORK/runs/$RUN"
    if [ -d "$out/final" ]; then
        echo "== train $RUN: done before ($out/final)"
    else
        step_data
        local resume=()
        [ -f "$out/latest" ] && resume=(--resume)
        # shellcheck disable=SC2086 # TRAIN_ARGS and SEED_OPT are option lists
        timed "train $RUN" "$FOXLM" train --preset "$PRESET" --data "$DATA" --out "$out" --device "$DEVICE" \
            "${resume[@]}" $SEED_OPT $TRAIN_ARGS
    fi
    mkdir -p "$RESULTS/$RUN/train"
    cp "$out/metrics.jsonl" "$out/run.json" "$RESULTS/$RUN/train/"
    [ -f "$out/loss.png" ] && cp "$out/loss.png" "$RESULTS/$RUN/train/"
    gpu_name > "$RESULTS/$RUN/train/device.txt"
}

# A held-out file for the gate maps: the first validation file of at least 8 KB.
gate_text() {
    python3 - "$DATA" <<'EOF'
import json, os, sys
data = sys.argv[1]
roots = json.load(open(os.path.join(data, "manifest.json")))["sources"]
for line in open(os.path.join(data, "files.jsonl")):
    f = json.loads(line)
    if f["status"] == "val" and f["bytes"] >= 8192:
        print(os.path.join(roots[f["input"]], f["path"]))
        break
EOF
}

step_eval() {
    local m="$1"
    parse_model "$m"
    local model="$WORK/runs/$RUN/final"
    [ -d "$model" ] || die "eval $RUN: no trained model at $model (run: train $m)"
    local res="$RESULTS/$RUN"
    mkdir -p "$res"
    if [ "${FORCE:-0}" != 1 ] && [ -f "$res/eval-loss/loss.json" ]; then
        echo "== eval loss $RUN: done before ($res/eval-loss)"
    else
        # shellcheck disable=SC2046 # device_opt is an option list
        timed "eval loss $RUN" "$FOXLM" eval loss --model "$model" --name "$RUN" --data "$DATA" \
            --context "$EVAL_CONTEXT" --sequences "$EVAL_SEQUENCES" --batch-size "$EVAL_BATCH" \
            --out "$res/eval-loss" $(device_opt eval loss)
    fi
    if [ "${FORCE:-0}" != 1 ] && [ -f "$res/niah/niah.json" ]; then
        echo "== eval niah $RUN: done before ($res/niah)"
    else
        # shellcheck disable=SC2046
        timed "eval niah $RUN" "$FOXLM" eval niah --model "$model" --haystack "$HAYSTACK" --mode easy \
            --lengths "$NIAH_LENGTHS" --depths "$NIAH_DEPTHS" --out "$res/niah" $(device_opt eval niah)
    fi
    case "$PRESET" in
        fox-*)
            if [ "${FORCE:-0}" != 1 ] && [ -f "$res/gates/gates.json" ]; then
                echo "== viz gates $RUN: done before ($res/gates)"
                return
            fi
            local text; text="$(gate_text)"
            [ -n "$text" ] || die "no held-out file of 8 KB for the gate maps"
            echo "$text" > "$res/gates-text.txt"
            # shellcheck disable=SC2046
            timed "viz gates $RUN" "$FOXLM" viz gates --model "$model" --text "$text" \
                --max-tokens "$GATE_TOKENS" --layers "$GATE_LAYERS" --out "$res/gates" $(device_opt viz gates)
            ;;
    esac
}

# Overlays and tables of what has been evaluated: all models against the Transformer (Pro), and
# the LLaMA family (gate ablations) against FoX (LLaMA).
compare_set() { # out baseline models...
    local out="$1" base="$2"; shift 2
    local args=() have_base=0
    for m in "$@"; do
        if [ -f "$RESULTS/$m/eval-loss/loss.json" ] && [ -f "$RESULTS/$m/train/metrics.jsonl" ]; then
            args+=(--input "$RESULTS/$m/eval-loss" --run "$RESULTS/$m/train")
            [ "$m" = "$base" ] && have_base=1
        fi
    done
    if [ "${#args[@]}" -eq 0 ]; then
        echo "== compare $out: nothing evaluated yet"
        return
    fi
    local b=()
    [ "$have_base" = 1 ] && b=(--baseline "$base")
    "$FOXLM" eval compare "${args[@]}" "${b[@]}" --diff-clip 1 --out "$RESULTS/$out"
}

step_compare() {
    local all=("${ALL_MODELS[@]}")
    # Second seeds, when trained, join the comparison.
    for d in "$RESULTS"/*-seed*; do [ -d "$d" ] && all+=("$(basename "$d")"); done
    compare_set compare-all transformer-pro-small "${all[@]}"
    compare_set compare-llama fox-llama-small fox-llama-small transformer-llama-small \
        transformer-llama-norope-small fox-llama-biasonly-small fox-llama-fixed-small
}

[ $# -gt 0 ] || die "name a step: data, train MODEL..., eval MODEL..., model MODEL..., compare or all"
while [ $# -gt 0 ]; do
    step="$1"; shift
    models=()
    # "all" after train/eval/model names the seven models; as a step of its own it runs everything.
    while [ $# -gt 0 ] && ! [[ "$1" =~ ^(data|train|eval|model|compare)$ ]]; do
        models+=("$1"); shift
    done
    case "$step" in
        data|compare)
            [ "${#models[@]}" -eq 0 ] || die "$step takes no models (got ${models[*]})"
            "step_$step"
            ;;
        train|eval|model)
            [ "${#models[@]}" -gt 0 ] || die "$step: name the models (or all)"
            for m in $(expand_models "${models[@]}"); do
                case "$step" in
                    train) step_train "$m" ;;
                    eval) step_eval "$m" ;;
                    model) step_train "$m"; step_eval "$m" ;;
                esac
            done
            ;;
        all)
            [ "${#models[@]}" -eq 0 ] || die "all takes no models (got ${models[*]}); use: model MODEL..."
            step_data
            for m in "${ALL_MODELS[@]}"; do step_train "$m"; step_eval "$m"; done
            step_compare
            ;;
        *) die "unknown step $step" ;;
    esac
done
