"""foxlm.ops.forgetting_attention as a torch.autograd.Function on CPU tensors.

Needs torch (CI's machine has none: tests/python.rs runs this file only where python3 imports
torch, and says so). Checks the autograd plumbing that the CUDA path shares (layouts, head_first,
grouped-query heads, left padding, packed sequences, dtypes, gradients into every input) against
the float32 reference of crates/foxlm-py/python/tests/gpu_check.py, in float64 here.
"""

import functools
import os
import sys

import torch

import foxlm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_check import reference_fn  # noqa: E402

fa = foxlm.ops.forgetting_attention


def rel(a, r):
    return float((a.double() - r.double()).abs().max() / r.double().abs().max().clamp_min(1e-9))


def grads(fn, ins, do, *args, **kw):
    xs = [x.detach().clone().requires_grad_() for x in ins]
    out = fn(*xs, *args, **kw)
    return [out.detach()] + [g.detach() for g in torch.autograd.grad(out, xs, do)]


ref_fn = functools.partial(reference_fn, torch)


def problem(seed, b=2, t=96, h=4, hkv=None, d=16, head_first=False):
    gen = torch.Generator().manual_seed(seed)
    hkv = hkv or h
    shp = lambda hh: (b, hh, t, d) if head_first else (b, t, hh, d)  # noqa: E731
    q, k, v = torch.randn(shp(h), generator=gen), torch.randn(shp(hkv), generator=gen), torch.randn(shp(hkv), generator=gen)
    g = torch.nn.functional.logsigmoid(torch.randn((b, h, t) if head_first else (b, t, h), generator=gen) + 2)
    do = torch.randn(shp(h), generator=gen)
    return [q, k, v, g], do


def check(name, ours, ref, tol=1e-4, pick=None):
    for n, a, r in zip(["out", "dq", "dk", "dv", "dlog_fgate"], ours, ref):
        if pick is not None:
            a, r = pick(a), pick(r)
        e = rel(a, r)
        assert e < tol, f"{name} {n}: relative error {e:.2e}"


def test_plain_gqa_and_head_first():
    ins, do = problem(0)
    check("plain", grads(fa, ins, do), grads(ref_fn(scale=0.25), [x.double() for x in ins], do.double()))
    ins, do = problem(1, h=6, hkv=3)
    check("gqa", grads(fa, ins, do, scale=0.3), grads(ref_fn(scale=0.3), [x.double() for x in ins], do.double()))
    ins, do = problem(2, head_first=True)
    ours = grads(fa, ins, do, head_first=True, sm_scale=0.2)
    assert ours[0].shape == ins[0].shape and ours[4].shape == ins[3].shape
    check("head_first", ours, grads(ref_fn(head_first=True, scale=0.2), [x.double() for x in ins], do.double()))


def test_padding_packing_window_and_dtypes():
    ins, do = problem(3)
    st = torch.tensor([0, 17])
    do[1, :17] = 0
    real = lambda x: torch.cat([x[0].flatten(), x[1, 17:].flatten()])  # noqa: E731
    ours = grads(fa, ins, do, seq_start=st)
    check("seq_start", ours, grads(ref_fn(scale=0.25, seq_start=st), [x.double() for x in ins], do.double()), pick=real)
    ins, do = problem(4, b=1)
    cu = torch.tensor([0, 30, 31, 96])
    rs = torch.repeat_interleave(cu[:-1], cu[1:] - cu[:-1])[None]
    check("cu_seqlens", grads(fa, ins, do, None, None, cu), grads(ref_fn(scale=0.25, row_starts=rs), [x.double() for x in ins], do.double()))
    check("window", grads(fa, ins, do, window_size=10), grads(ref_fn(scale=0.25, window=10), [x.double() for x in ins], do.double()))
    # bf16 inputs: the output and gradients come back in the inputs' dtypes
    ins, do = problem(5)
    b16 = [x.bfloat16() for x in ins[:3]] + [ins[3]]
    ours = grads(fa, b16, do.bfloat16())
    assert ours[0].dtype == torch.bfloat16 and ours[1].dtype == torch.bfloat16 and ours[4].dtype == torch.float32
    check("bf16", ours, grads(ref_fn(scale=0.25), [x.double() for x in b16], do.bfloat16().double()), tol=2e-2)


def test_errors():
    ins, _ = problem(6)
    for kw, word in [(dict(adaptive_threshold="auto"), "adaptive_threshold"), (dict(window=0), "window")]:
        try:
            fa(*ins, **kw)
        except ValueError as e:
            assert word in str(e), str(e)
        else:
            raise AssertionError(f"{kw} accepted")
    try:
        fa(ins[0], ins[1][:, :50], ins[2][:, :50], ins[3])
    except ValueError as e:
        assert "length" in str(e)
    else:
        raise AssertionError("mismatched lengths accepted")


if __name__ == "__main__":
    from harness import run_tests

    sys.exit(run_tests(globals()))
