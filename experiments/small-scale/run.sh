#!/usr/bin/env bash
# The small-scale experiments (see README.md): seven ~49M-parameter models trained on the same
# tokens, each evaluated with foxlm's own commands, then compared.
#   EXPERIMENT=ablations (default)  FoX, the Transformer and the gate ablations, on the machine's
#                                   Python site-packages;
#   EXPERIMENT=recurrent            FoX and the Transformer (Pro) against Mamba-2, DeltaNet, Gated
#                                   DeltaNet, HGRN2 and Samba, on prose and code mixed (the prose of
#                                   get-corpora.sh in $CORPORA and a share of site-packages), so that
#                                   the needle test has models that read prose.
#
#   FOXLM=target/release/foxlm experiments/small-scale/run.sh STEP [ARGS] [STEP [ARGS]] ...
#
# Steps (run in the order given; each skips what is already done, so a cut run can be repeated):
#   data                 tokenize $SOURCES (default: site-packages) into $WORK/data; recurrent: the
#                        prose of $CORPORA, one folder per work, and $CODE_BYTES of whole packages
#   train MODEL...       train the named models (preset names; NAME@SEED for another seed)
#   eval MODEL...        per-token loss, needle test and (FoX) gate maps of the named models
#   model MODEL...       train, then evaluate, each named model in turn
#   compare              tables and overlays of every model evaluated so far
#   all                  data, model (all seven), compare
# MODEL may be "all" for the experiment's seven presets.
#
# Settings (environment):
#   FOXLM            the foxlm binary (required)
#   DEVICE           cuda (default) or cpu
#   EXPERIMENT       ablations (default) or recurrent
#   WORK             data, checkpoints and full outputs (default experiments/small-scale/work, or
#                    work-recurrent)
#   RESULTS          the small files worth keeping: metrics, evaluations, plots, tables
#                    (default experiments/small-scale/results, or results-recurrent)
#   SOURCES          folders to tokenize, space-separated (default: python3's site-packages)
#   GLOB             file patterns, space-separated (default '**/*.py'; recurrent sets its own)
#   CORPORA          recurrent: get-corpora.sh's output folder (its prose: sotu, shakespeare, python-docs)
#   CODE_BYTES       recurrent: bytes of .py taken from SOURCES, whole packages in the order of a
#                    SHA-256 of their names, none over half of it (default 60000000)
#   VAL_BY           top (whole packages or works, default), dir (whole folders) or document
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
EXPERIMENT="${EXPERIMENT:-ablations}"
case "$EXPERIMENT" in
    ablations) suffix="" ;;
    recurrent) suffix="-recurrent" ;;
    *) die "EXPERIMENT=$EXPERIMENT: ablations or recurrent" ;;
esac
WORK="${WORK:-$HERE/work$suffix}"
RESULTS="${RESULTS:-$HERE/results$suffix}"
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
CODE_BYTES="${CODE_BYTES:-60000000}"
case "$EXPERIMENT" in
    ablations)
        ALL_MODELS=(fox-pro-small transformer-pro-small fox-llama-small transformer-llama-small
            transformer-llama-norope-small fox-llama-biasonly-small fox-llama-fixed-small) ;;
    recurrent)
        ALL_MODELS=(fox-pro-small transformer-pro-small mamba2-small deltanet-small gated-deltanet-small
            hgrn2-small samba-small) ;;
esac
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

# The prose of get-corpora.sh, one top-level folder per work so that --val-by top holds out whole
# works: both editions of a Shakespeare play (the Gutenberg text and the First Folio's, "_gut_f")
# go together, as do Milton's shorter poems, which come in several collections.
prose_layout() { # out
    local out="$1"
    [ -d "$out" ] && return
    [ -n "${CORPORA:-}" ] || die "EXPERIMENT=recurrent: set CORPORA to get-corpora.sh's output (prose)"
    for c in sotu shakespeare python-docs; do
        [ -d "$CORPORA/$c" ] || die "CORPORA=$CORPORA has no $c/ (run: get-corpora.sh \$CORPORA prose)"
    done
    rm -rf "$out.tmp"
    python3 - "$CORPORA" "$out.tmp" <<'EOF'
import os, re, shutil, sys
src, out = sys.argv[1], sys.argv[2]
same = {"alls_well_that_ends_well": "all_is_well_that_ends_well", "anthonie_and_cleopatra": "antony_and_cleopatra",
        "comedy_of_errours": "comedy_of_errors", "loves_labours_lost": "loves_labour_lost",
        "midsummer_nights_dreame": "midsummer_nights_dream", "paradiselost": "paradise_lost_(no_introduction)",
        "paradiseregained": "paradise_regained", "tragedy_of_titus_andronicus": "titus_andronicus",
        "twelfe-night": "twelfth_night", "allegro": "comus", "lallegro_il_penseroso_comus_and_lycidas": "comus"}
for corpus in ("sotu", "shakespeare", "python-docs"):
    for name in sorted(os.listdir(os.path.join(src, corpus))):
        if not name.endswith(".txt"):
            continue
        work = name[:-4]
        if corpus == "shakespeare":
            work = re.sub(r"_gut(_f)?$", "", work)
            work = same.get(work, work)
        d = os.path.join(out, f"prose-{corpus}-{work}")
        os.makedirs(d, exist_ok=True)
        shutil.copy(os.path.join(src, corpus, name), d)
EOF
    mv "$out.tmp" "$out"
}

# Packages of site-packages worth about CODE_BYTES of .py, comma-separated: in the order of a
# SHA-256 of their names (an arbitrary but fixed choice), skipping any over half the budget so that
# no single package (torch) makes up the code.
code_packages() { # site-packages folders...
    python3 - "$CODE_BYTES" "$@" <<'EOF'
import hashlib, os, sys
budget = int(sys.argv[1])
sizes = {}
for root in sys.argv[2:]:
    for top in os.listdir(root):
        p = os.path.join(root, top)
        if not os.path.isdir(p) or os.path.islink(p) or top.startswith(".") or any(c in top for c in ",{}*?["):
            continue
        n = 0
        for d, dirs, files in os.walk(p):
            dirs[:] = [x for x in dirs if not x.startswith(".")]
            n += sum(os.path.getsize(os.path.join(d, f)) for f in files if f.endswith(".py"))
        if n:
            sizes[top] = sizes.get(top, 0) + n
taken, total = [], 0
for top in sorted(sizes, key=lambda t: hashlib.sha256(t.encode()).hexdigest()):
    if sizes[top] > budget // 2 or total + sizes[top] > budget:
        continue
    taken.append(top)
    total += sizes[top]
print(",".join(sorted(taken)))
print(f"code: {len(taken)} packages, {total} bytes of .py", file=sys.stderr)
EOF
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
    local globs=()
    read -r -a globs <<< "$GLOB"
    if [ "$EXPERIMENT" = recurrent ]; then
        prose_layout "$WORK/prose"
        local pkgs
        pkgs="$(code_packages "${sources[@]}")"
        [ -n "$pkgs" ] || die "no package of at most CODE_BYTES/2 of .py under ${sources[*]}"
        sources=("$WORK/prose" "${sources[@]}")
        globs=('prose-*/*.txt' "{$pkgs}/**/*.py")
    fi
    local inputs=() g=()
    for s in "${sources[@]}"; do inputs+=(--input "$s"); done
    for p in "${globs[@]}"; do g+=(--glob "$p"); done
    timed data "$FOXLM" data prepare "${inputs[@]}" "${g[@]}" --val-by "$VAL_BY" \
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

# Recurrent: the held-out prose alone as a dataset of its own (every document in its validation
# split), so that L(i) is also measured on prose, the needle test's domain.
prose_val_data() {
    local out="$WORK/prose-val"
    [ -f "$out/data/manifest.json" ] && return
    rm -rf "$out"
    python3 - "$DATA" "$out/src" <<'EOF'
import json, os, shutil, sys
data, out = sys.argv[1], sys.argv[2]
roots = json.load(open(os.path.join(data, "manifest.json")))["sources"]
for line in open(os.path.join(data, "files.jsonl")):
    f = json.loads(line)
    if f["status"] == "val" and os.path.basename(roots[f["input"]]) == "prose":
        dst = os.path.join(out, f["path"])
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy(os.path.join(roots[f["input"]], f["path"]), dst)
EOF
    "$FOXLM" data prepare --input "$out/src" --glob '**/*.txt' --val-by document --val-fraction 0.999 \
        --text-format plain --quiet --output "$out/data"
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
    if [ "$EXPERIMENT" = recurrent ]; then
        if [ "${FORCE:-0}" != 1 ] && [ -f "$res/eval-loss-prose/loss.json" ]; then
            echo "== eval loss (prose) $RUN: done before ($res/eval-loss-prose)"
        else
            prose_val_data
            # shellcheck disable=SC2046
            timed "eval loss (prose) $RUN" "$FOXLM" eval loss --model "$model" --name "$RUN" \
                --data "$WORK/prose-val/data" --context "$EVAL_CONTEXT" --sequences "$EVAL_SEQUENCES" \
                --batch-size "$EVAL_BATCH" --out "$res/eval-loss-prose" $(device_opt eval loss)
        fi
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
compare_set() { # out baseline models... (EVAL_DIR: which evaluation, default eval-loss)
    local out="$1" base="$2"; shift 2
    local args=() have_base=0 ev="${EVAL_DIR:-eval-loss}"
    for m in "$@"; do
        if [ -f "$RESULTS/$m/$ev/loss.json" ] && [ -f "$RESULTS/$m/train/metrics.jsonl" ]; then
            args+=(--input "$RESULTS/$m/$ev" --run "$RESULTS/$m/train")
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
    if [ "$EXPERIMENT" = recurrent ]; then
        # FoX is the reference the recurrent models are read against, as in the paper's figures.
        compare_set compare-all fox-pro-small "${all[@]}"
        EVAL_DIR=eval-loss-prose compare_set compare-prose fox-pro-small "${all[@]}"
        return
    fi
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
