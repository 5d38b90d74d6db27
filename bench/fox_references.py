#!/usr/bin/env python3
"""Third-party Forgetting Attention kernels on the attention bench's shapes.

Driven like bench/sdpa_reference.py (same flags, same shapes, same timing), so that `fox-attn bench`
can put these rows beside PyTorch SDPA and our own kernels. Two kernels:

  authors  the FoX authors' Triton kernel, `forgetting_attention` from an unmodified copy of their
           package in .device-bundle/authors/src (git-ignored; carried to the GPU machine). Called in
           the layout their model uses: head_first=True, q/k/v bf16 [B, H, T, D], log_fgate fp32
           [B, H, T], sm_scale = D^-0.5. Their kernel takes head dims 16, 32, 64, 128 only.
  fla      flash-linear-attention's `parallel_forgetting_attn` (package `fla`, wheel fla-core), in its
           only layout: q/k/v bf16 [B, T, H, D], g = log forget gate fp32 [B, T, H], scale = D^-0.5.
           If `fla` (or `einops`) is not importable, the wheels in --wheels are installed into a
           temporary folder that is put first on sys.path (the GPU machine has no network).

Shapes: for each D in --d and T in --t, B = tokens / T, H = hidden / D; q, k, v ~ N(0, 1) in bf16;
causal. Gates "mixed" as in our bench: per head a logit bias spread linearly over [-1, 9] (4 when
H = 1) plus N(0, 1) noise per token, log f = logsigmoid(logit) in fp32. Forward is timed under
no_grad; forward+backward takes a random dO and asks for the gradients of q, k, v and the log gate
(torch.autograd.grad, so nothing accumulates into .grad), so the gate's gradient path runs too.
Times: CUDA events after warm-up, median of --iters.

Output: one JSON object per line on stdout. First a header; then per kernel and shape
{"kernel", "d", "t", "b", "h", "fwd_ms", "fwdbwd_ms"}, or {"kernel", "d", "t", "error"} when that
kernel fails there (and the run goes on). With --check, first rows {"check": kernel, ...}: on
B=1, H=2, T=256, D=64 each kernel's output and gradients against a plain PyTorch fp32 reference
(softmax(Q K^T * scale + c_i - c_j, causal) V with c = cumsum(log f)), as max abs errors.
Any failure outside one kernel and shape prints {"error": ...} and exits 0: the bench never crashes.
"""
import argparse
import atexit
import glob
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_AUTHORS_SRC = os.path.join(ROOT, ".device-bundle", "authors", "src")
DEFAULT_WHEELS = os.path.join(ROOT, ".device-bundle", "wheels")
KERNELS = ("authors", "fla")
# module name -> wheel file pattern in --wheels
WHEEL_FOR = {"einops": "einops-*.whl", "fla": "fla_core-*.whl"}


def emit(obj):
    print(json.dumps(obj), flush=True)


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def importable(name):
    try:
        importlib.import_module(name)
        return True
    except ImportError:
        return False


_site = None


def ensure_modules(names, wheels_dir):
    """Install the wheels of those of `names` that don't import into one temporary folder on sys.path."""
    global _site
    missing = [n for n in names if not importable(n)]
    if not missing:
        return
    files = []
    for n in missing:
        found = sorted(glob.glob(os.path.join(wheels_dir, WHEEL_FOR[n])))
        if not found:
            raise RuntimeError(f"{n} is not importable and no {WHEEL_FOR[n]} is in {wheels_dir}")
        files.append(found[-1])
    if _site is None:
        _site = tempfile.mkdtemp(prefix="fox_references_site_")
        atexit.register(shutil.rmtree, _site, ignore_errors=True)
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
           "--disable-pip-version-check", "--upgrade", "--target", _site, *files]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        # pip missing or failing: these wheels are pure Python, so unpacking them is an install too
        log(f"pip install of {files} failed ({r.returncode}): {r.stdout.strip()[-2000:]}; unpacking instead")
        for f in files:
            with zipfile.ZipFile(f) as z:
                z.extractall(_site)
    if _site not in sys.path:
        sys.path.insert(0, _site)
    importlib.invalidate_caches()
    for n in missing:  # drop any half-imported package so the fresh copy is found
        for m in [m for m in sys.modules if m == n or m.startswith(n + ".")]:
            del sys.modules[m]
    log(f"installed {[os.path.basename(f) for f in files]} into {_site}")


def load_authors(src):
    if not os.path.isfile(os.path.join(src, "forgetting_transformer", "ops", "forgetting_attention.py")):
        raise RuntimeError(f"{src}/forgetting_transformer not found (carry .device-bundle/authors)")
    if src not in sys.path:
        sys.path.insert(0, src)
    from forgetting_transformer.ops.forgetting_attention import forgetting_attention

    def call(q, k, v, log_f, scale):
        # q, k, v: [B, H, T, D] bf16; log_f: [B, H, T] fp32
        return forgetting_attention(q, k, v, log_f, head_first=True, sm_scale=scale)

    return call


def load_fla():
    from fla.ops.forgetting_attn import parallel_forgetting_attn

    def call(q, k, v, log_f, scale):
        # q, k, v: [B, T, H, D] bf16; g = log_f: [B, T, H] fp32
        return parallel_forgetting_attn(q, k, v, g=log_f, scale=scale)

    return call


# Per kernel: True when it takes [B, H, T, D] (and a [B, H, T] gate), False for [B, T, H, D] / [B, T, H].
HEAD_FIRST = {"authors": True, "fla": False}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d", default="64,128")
    ap.add_argument("--t", default="1024,4096,16384")
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--kernels", default="authors,fla", help="comma list of: " + ",".join(KERNELS))
    ap.add_argument("--check", action="store_true", help="first compare each kernel with a PyTorch reference")
    ap.add_argument("--no-bench", action="store_true", help="with --check: check only, time nothing")
    ap.add_argument("--no-backward", action="store_true", help="time the forward only")
    ap.add_argument("--wheels", default=DEFAULT_WHEELS, help="folder with fla_core-*.whl and einops-*.whl")
    ap.add_argument("--authors-src", default=DEFAULT_AUTHORS_SRC, help="folder holding forgetting_transformer/")
    a = ap.parse_args()
    kernels = [k.strip() for k in a.kernels.split(",") if k.strip()]
    bad = [k for k in kernels if k not in KERNELS]
    if bad:
        emit({"error": f"unknown kernel(s) {bad}; choose from {list(KERNELS)}"})
        return
    ds = [int(x) for x in a.d.split(",") if x.strip()]
    ts = [int(x) for x in a.t.split(",") if x.strip()]

    import torch
    import torch.nn.functional as F

    if not torch.cuda.is_available():
        emit({"error": "torch sees no GPU"})
        return
    dev = torch.device("cuda")

    calls, load_errors = {}, {}
    for name in kernels:
        try:
            if name == "authors":
                ensure_modules(["einops"], a.wheels)
                calls[name] = load_authors(a.authors_src)
            else:
                ensure_modules(["einops", "fla"], a.wheels)
                calls[name] = load_fla()
        except Exception as e:  # one kernel missing must not stop the other
            load_errors[name] = f"import: {e!r}"

    header = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0), "kernels": kernels}
    try:
        import triton

        header["triton"] = triton.__version__
    except ImportError:
        pass
    if "fla" in calls:
        import fla

        header["fla"] = getattr(fla, "__version__", "?")
    commit_file = os.path.join(os.path.dirname(a.authors_src), "COMMIT")
    if "authors" in calls and os.path.isfile(commit_file):
        with open(commit_file) as f:
            header["authors_commit"] = f.read().strip()
    emit(header)
    for name, err in load_errors.items():
        emit({"kernel": name, "error": err})

    def timeit(fn):
        for _ in range(a.warmup):
            fn()
        ts_ = []
        for _ in range(a.iters):
            s = torch.cuda.Event(enable_timing=True)
            e = torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            ts_.append(s.elapsed_time(e))
        ts_.sort()
        return ts_[len(ts_) // 2]

    if a.check:
        for name, call in calls.items():
            try:
                emit(check(torch, F, dev, name, call, HEAD_FIRST[name]))
            except Exception as e:
                emit({"check": name, "error": repr(e)})
            torch.cuda.empty_cache()
        if a.no_bench:
            return

    for d in ds:
        for t in ts:
            if t <= 0 or d <= 0 or a.tokens % t or a.hidden % d:
                for name in kernels:
                    emit({"kernel": name, "d": d, "t": t, "error": "shape does not divide the token / hidden budget"})
                continue
            b, h = a.tokens // t, a.hidden // d
            scale = d ** -0.5
            for name, call in calls.items():
                hf = HEAD_FIRST[name]
                shape = (b, h, t, d) if hf else (b, t, h, d)
                tensors = {}
                try:
                    torch.manual_seed(0)
                    q, k, v, do = [torch.randn(shape, device=dev, dtype=torch.bfloat16) for _ in range(4)]
                    log_f = gates(torch, F, dev, b, h, t, hf)
                    ins = [x.requires_grad_() for x in (q, k, v, log_f)]
                    tensors = dict(q=q, k=k, v=v, do=do, log_f=log_f)

                    def fwd():
                        with torch.no_grad():
                            call(q, k, v, log_f, scale)

                    def fwdbwd():
                        o = call(q, k, v, log_f, scale)
                        torch.autograd.grad(o, ins, do)

                    row = {"kernel": name, "d": d, "t": t, "b": b, "h": h, "fwd_ms": timeit(fwd)}
                    row["fwdbwd_ms"] = None if a.no_backward else timeit(fwdbwd)
                    emit(row)
                except Exception as e:  # unsupported head dim, out of memory, compile failure, ...
                    msg = repr(e)
                    if isinstance(e, torch.cuda.OutOfMemoryError):
                        msg = "out of memory: " + (str(e).splitlines() or [""])[0]
                    emit({"kernel": name, "d": d, "t": t, "error": msg[:2000]})
                finally:
                    tensors.clear()
                    q = k = v = do = log_f = ins = None
                    torch.cuda.empty_cache()


def gates(torch, F, dev, b, h, t, head_first, gen=None):
    """Mixed gates: log f = logsigmoid(bias_h + N(0,1)), bias_h linear over [-1, 9] (4 if H = 1); fp32."""
    if h > 1:
        bias = -1.0 + 10.0 * torch.arange(h, dtype=torch.float32) / (h - 1)
    else:
        bias = torch.full((1,), 4.0)
    bias = bias.to(dev)
    if head_first:
        logit = torch.randn(b, h, t, device=dev, generator=gen) + bias[None, :, None]
    else:
        logit = torch.randn(b, t, h, device=dev, generator=gen) + bias[None, None, :]
    return F.logsigmoid(logit.float())


def check(torch, F, dev, name, call, head_first):
    """One kernel's output and gradients against a plain fp32 PyTorch reference on a small shape."""
    b, h, t, d = 1, 2, 256, 64
    scale = d ** -0.5
    gen = torch.Generator(device=dev).manual_seed(1)
    # reference layout [B, H, T, D]; the kernel gets the same values in its own layout
    q, k, v, do = [torch.randn(b, h, t, d, device=dev, generator=gen).to(torch.bfloat16) for _ in range(4)]
    log_f = gates(torch, F, dev, b, h, t, True, gen)

    def to_kernel(x):  # [B, H, T, ...] -> the kernel's layout
        return x.contiguous() if head_first else x.transpose(1, 2).contiguous()

    def from_kernel(x):
        return x if head_first else x.transpose(1, 2)

    ins = [to_kernel(x).requires_grad_() for x in (q, k, v, log_f)]
    out = call(*ins, scale)
    grads = torch.autograd.grad(out, ins, to_kernel(do))
    got = [from_kernel(x).detach().float() for x in (out, *grads)]

    rq, rk, rv, rf = [x.detach().float().requires_grad_() for x in (q, k, v, log_f)]
    c = torch.cumsum(rf, dim=-1)
    s = (rq @ rk.transpose(-1, -2)) * scale + c[..., :, None] - c[..., None, :]
    causal = torch.ones(t, t, dtype=torch.bool, device=dev).tril()
    s = s.masked_fill(~causal, float("-inf"))
    ref = torch.softmax(s, dim=-1) @ rv
    ref_grads = torch.autograd.grad(ref, [rq, rk, rv, rf], do.float())
    want = [x.detach() for x in (ref, *ref_grads)]

    row = {"check": name, "b": b, "h": h, "t": t, "d": d}
    ok = True
    for label, g_, w in zip(["o", "dq", "dk", "dv", "dlogf"], got, want):
        if tuple(g_.shape) != tuple(w.shape):
            row[label + "_error"] = f"shape {tuple(g_.shape)} != {tuple(w.shape)}"
            ok = False
            continue
        err = float((g_ - w).abs().max())
        ref_max = float(w.abs().max())
        row[label + "_max_abs_err"] = err
        row[label + "_ref_max_abs"] = ref_max
        # bf16 inputs and outputs: relative to the largest reference entry, a few percent is bf16 noise
        ok = ok and err == err and err <= 0.05 * max(ref_max, 1e-6)
    row["ok"] = ok
    return row


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # report, don't crash the bench
        emit({"error": repr(e)})
    sys.exit(0)
