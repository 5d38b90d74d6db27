#!/usr/bin/env bash
# Assemble what the GPU machine needs to run the Python package's GPU check
# (crates/foxlm-py/python/tests/gpu_check.py) into one folder small enough to carry:
#   foxlm/                 the package, with the extension as _foxlm.abi3.so.xz (stripped)
#   gpu_check.py           the check and benchmark
#   authors_common.py      what it shares with bench/'s scripts that run the authors' code
#   authors.tar.xz         the FoX authors' source (from .device-bundle/authors/src)
#   einops-*.whl           their model's one dependency missing there
#   run.sh                 unpacks and runs it: bash run.sh [gpu_check.py options]
#
#   bench/python_bundle.sh OUT_DIR [AUTHORS_DIR] [EINOPS_WHEEL]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bench/python_bundle.sh OUT_DIR [AUTHORS_DIR] [EINOPS_WHEEL]}
authors=${2:-.device-bundle/authors}
einops=${3:-$(ls .device-bundle/deltanet/einops-*.whl 2>/dev/null | head -1)}
cargo build --release -p foxlm-py >&2
rm -rf "$out" && mkdir -p "$out/foxlm"
cp crates/foxlm-py/python/foxlm/*.py "$out/foxlm/"
cp crates/foxlm-py/python/tests/gpu_check.py bench/authors_common.py "$out/"
strip -o "$out/foxlm/_foxlm.abi3.so" target/release/libfoxlm_py.so
xz -9 -T2 "$out/foxlm/_foxlm.abi3.so"
tar -C "$authors" -cJf "$out/authors.tar.xz" src
[ -n "$einops" ] && cp "$einops" "$out/"
cat > "$out/run.sh" <<'RUN'
#!/usr/bin/env bash
# bash run.sh [gpu_check.py options]: unpack into /tmp and run the check (on the GPU machine)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
w=/tmp/foxlm-py && rm -rf $w && mkdir -p $w/site $w/authors
cp -r "$here/foxlm" "$here/gpu_check.py" "$here/authors_common.py" $w/ && xz -d $w/foxlm/_foxlm.abi3.so.xz
tar -C $w/authors -xJf "$here/authors.tar.xz"
if ls "$here"/einops-*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target $w/site "$here"/einops-*.whl
fi
export PYTHONPATH=$w:$w/site:${PYTHONPATH:-} FOXLM_KERNEL_CACHE=${FOXLM_KERNEL_CACHE:-/tmp/kc} PYTHONUNBUFFERED=1
python3 $w/gpu_check.py --authors-src $w/authors/src "$@"
RUN
du -sh "$out"/* >&2
