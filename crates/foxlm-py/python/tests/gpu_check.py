#!/usr/bin/env python3
"""The foxlm Python package on a GPU: checks and the swapped-in training benchmark.

Parts (--parts, default ops, model, attn and bench):
  ops    foxlm.ops.forgetting_attention (bf16, forward + backward) against a float32 PyTorch
         reference of the same math and against the FoX authors' Triton kernel on the same inputs:
         head dims 64 and 128, head_first, left padding (seq_start), grouped-query heads, packed
         sequences (cu_seqlens), a sliding window, ACP, and a side stream. Metric: max |a - r| /
         max |r| per tensor (out, dq, dk, dv, dlog_fgate); a row passes below --tol.
  model  the authors' FoX (Pro) model (their code, unmodified) with their kernel, then with
         foxlm's swapped in (one assignment: their module's `forgetting_attention`), then with the
         float32 reference: the same weights and tokens, loss and every parameter's gradient
         compared (relative L2 error per parameter; the largest is reported).
  attn   the attention alone at the benchmark's shape (B x 12 heads x T, head dim 64, head_first
         strided views as their model passes them), forward and forward + backward, both kernels.
  bench  the authors' 125M FoX (Pro) training step at T = 16384 (their recipe as in
         bench/authors_fox.py: bf16 autocast, fp32 weights, fused AdamW, clipping) with their
         kernel and with foxlm's, the same model init, the same batches, in this one process:
         median step time (CUDA events) after warm-up, tokens/s, and both loss curves.
  load   foxlm.load(--model-dir, device="cuda") in bf16 and f32 against the same folder on the
         CPU: logits with left padding, per-token losses, torch tensors in and out on the GPU,
         greedy generation of prompts of different lengths.

Needs: torch with a GPU, the authors' source (--authors-src: the folder holding the package
`forgetting_transformer`), einops and transformers (their model imports them), and `foxlm`
importable (built extension beside python/foxlm; bench/gpu_check.sh python assembles it).

    python3 gpu_check.py --authors-src .device-bundle/authors/src --json out.json
"""

import argparse
import functools
import json
import math
import os
import statistics
import sys
import time

# bench/authors_common.py: beside this file in bench/python_bundle.sh's bundle, else the repo's bench/.
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "..", "bench"))
from authors_common import authors_adamw, fox_pro_config, put_authors_src_on_path  # noqa: E402


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="ops,model,attn,bench")
    ap.add_argument("--authors-src", required=True, help="folder holding forgetting_transformer/")
    ap.add_argument("--tol", type=float, default=0.05, help="largest relative error that passes")
    ap.add_argument("--bench-context", type=int, default=16384)
    ap.add_argument("--bench-batch", type=int, default=2)
    ap.add_argument("--bench-warmup", type=int, default=4)
    ap.add_argument("--bench-steps", type=int, default=10)
    ap.add_argument("--bench-size", default="125m", choices=["125m", "tiny"])
    ap.add_argument("--json", default=None)
    ap.add_argument("--model-dir", default="tests/fixtures/official-fox-tiny/fox_pro",
                    help="a model folder for the load part (foxlm.load on the GPU against the CPU)")
    return ap.parse_args()


def import_authors(src):
    put_authors_src_on_path(src, "__init__.py")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import forgetting_transformer.model.forgetting_transformer.modeling_forgetting_transformer as modeling
        from forgetting_transformer.model.forgetting_transformer.configuration_forgetting_transformer import (
            ForgettingTransformerConfig,
        )
        from forgetting_transformer.ops.forgetting_attention import forgetting_attention as theirs
    return modeling, ForgettingTransformerConfig, theirs


def rel(a, r):
    a, r = a.detach().float(), r.detach().float()
    return float((a - r).abs().max() / r.abs().max().clamp_min(1e-6))


# ------------------------------------------------------------------------------------------------
# the float32 reference of the same math ([B, T, H, D] layout)


def reference(torch, q, k, v, g, scale, seq_start=None, row_starts=None, window=None):
    """o_i = softmax_j(scale q_i.k_j + c_i - c_j) v_j over visible keys; fully masked rows give 0."""
    b, t, h, d = q.shape
    hkv = k.shape[2]
    q, k, v, g = q.float(), k.float(), v.float(), g.float()
    if hkv != h:
        k = k.repeat_interleave(h // hkv, dim=2)
        v = v.repeat_interleave(h // hkv, dim=2)
    qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))
    gh = g.transpose(1, 2)
    if seq_start is not None:
        pos = torch.arange(t, device=q.device)
        gh = gh * (pos[None, None, :] >= seq_start[:, None, None])  # padded gates count as 0
    c = torch.cumsum(gh, -1)
    s = scale * qh @ kh.transpose(-1, -2) + c[..., :, None] - c[..., None, :]
    i = torch.arange(t, device=q.device)
    vis = (i[None, :] <= i[:, None])[None, None]
    if seq_start is not None:
        vis = vis & (i[None, None, None, :] >= seq_start[:, None, None, None])
    if row_starts is not None:
        vis = vis & (i[None, None, None, :] >= row_starts[:, None, :, None])
    if window is not None:
        vis = vis & (i[None, :] > i[:, None] - window)[None, None]
    s = s.masked_fill(~vis, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return (p @ vh).transpose(1, 2)


def reference_fn(torch, head_first=False, **kw):
    """`reference` as a function of q, k, v and log_fgate alone, each [B, H, T, …] when head_first."""

    def f(q, k, v, g):
        if head_first:
            q, k, v, g = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), g.transpose(1, 2)
        o = reference(torch, q, k, v, g, **kw)
        return o.transpose(1, 2) if head_first else o

    return f


def run_case(torch, fn, ins, do, *args, **kw):
    xs = [x.detach().clone().requires_grad_() for x in ins]
    out = fn(*xs, *args, **kw)
    grads = torch.autograd.grad(out, xs, do)
    return [out.detach()] + [g.detach() for g in grads]


def ops_part(torch, foxlm, theirs, tol):
    dev = torch.device("cuda")
    rows = []
    names = ["out", "dq", "dk", "dv", "dlog_fgate"]

    def inputs(seed, b, t, h, d, hkv=None, head_first=False):
        hkv = hkv or h
        gen = torch.Generator(device="cpu").manual_seed(seed)
        shp = lambda hh: (b, hh, t, d) if head_first else (b, t, hh, d)  # noqa: E731
        q = torch.randn(shp(h), generator=gen).to(dev, torch.bfloat16)
        k = torch.randn(shp(hkv), generator=gen).to(dev, torch.bfloat16)
        v = torch.randn(shp(hkv), generator=gen).to(dev, torch.bfloat16)
        do = torch.randn(shp(h), generator=gen).to(dev, torch.bfloat16)
        gs = (b, h, t) if head_first else (b, t, h)
        g = torch.nn.functional.logsigmoid(torch.randn(gs, generator=gen) + 3.0).to(dev)
        return [q, k, v, g], do

    def record(case, ours, ref, auth=None, mask=None):
        r = {"case": case}
        for i, n in enumerate(names):
            a, rr = ours[i], ref[i]
            if mask is not None and mask[i] is not None:
                a, rr = mask[i](a), mask[i](rr)
            r[n] = round(rel(a, rr), 5)
            if auth is not None:
                x = auth[i] if mask is None or mask[i] is None else mask[i](auth[i])
                r["authors_" + n] = round(rel(x, rr), 5)
                r["vs_authors_" + n] = round(rel(a, x), 5)
        worst = max(r[n] for n in names)
        r["ok"] = bool(worst < tol and all(math.isfinite(r[n]) for n in names))
        if auth is not None:
            r["ok"] = r["ok"] and all(r["vs_authors_" + n] < tol for n in names)
        rows.append(r)
        print(json.dumps(r), flush=True)

    ref_fn = functools.partial(reference_fn, torch)
    fa = foxlm.ops.forgetting_attention
    for case, (b, t, h, d) in [("mha d64", (2, 2048, 4, 64)), ("mha d128", (1, 2048, 4, 128))]:
        ins, do = inputs(1, b, t, h, d)
        sc = d**-0.5
        ours = run_case(torch, fa, ins, do)
        auth = run_case(torch, theirs, ins, do, sm_scale=sc)
        ref = run_case(torch, ref_fn(scale=sc), [x.float() for x in ins], do.float())
        record(case, ours, ref, auth)

    # head_first (the authors' model calls it so): [B, H, T, D] views of a [B, T, H, D] buffer
    ins, do = inputs(2, 2, 1024, 4, 64)
    hf = [x.transpose(1, 2) for x in ins]
    ours = run_case(torch, fa, hf, do.transpose(1, 2), head_first=True)
    auth = run_case(torch, theirs, hf, do.transpose(1, 2), head_first=True, sm_scale=0.125)
    ref = run_case(torch, ref_fn(head_first=True, scale=0.125), [x.float() for x in hf], do.transpose(1, 2).float())
    record("head_first strided d64", ours, ref, auth)

    # left padding: row 1's first 300 positions are padding; compare real rows and keys only
    ins, do = inputs(3, 2, 1024, 4, 64)
    st = torch.tensor([0, 300], device=dev)
    do = do.clone()
    do[1, :300] = 0
    ours = run_case(torch, fa, ins, do, seq_start=st)
    auth = run_case(torch, theirs, ins, do, seq_start=st, sm_scale=0.125)
    ref = run_case(torch, ref_fn(scale=0.125, seq_start=st), [x.float() for x in ins], do.float())
    real = lambda x: torch.cat([x[0].flatten(), x[1, 300:].flatten()])  # noqa: E731
    record("left padding (seq_start)", ours, ref, auth, mask=[real] * 5)

    # grouped-query heads (fla's layout): 8 query heads over 2 k/v heads
    ins, do = inputs(4, 2, 1024, 8, 64, hkv=2)
    ours = run_case(torch, fa, ins, do)
    ref = run_case(torch, ref_fn(scale=0.125), [x.float() for x in ins], do.float())
    record("gqa 8/2 d64", ours, ref)

    # packed sequences (fla's cu_seqlens), batch 1
    ins, do = inputs(5, 1, 2048, 4, 64)
    cu = torch.tensor([0, 500, 1300, 2048], device=dev)
    rs = torch.repeat_interleave(cu[:-1], cu[1:] - cu[:-1])[None]
    ours = run_case(torch, fa, ins, do, None, None, cu)
    ref = run_case(torch, ref_fn(scale=0.125, row_starts=rs), [x.float() for x in ins], do.float())
    record("cu_seqlens 3 docs", ours, ref)

    # sliding window (fla's window_size)
    ins, do = inputs(6, 1, 2048, 4, 64)
    ours = run_case(torch, fa, ins, do, window_size=256)
    ref = run_case(torch, ref_fn(scale=0.125, window=256), [x.float() for x in ins], do.float())
    record("window 256", ours, ref)

    # ACP at log tolerance -10 against the same call without it (strong forgetting)
    ins, do = inputs(7, 1, 4096, 4, 64)
    ins[3] = torch.nn.functional.logsigmoid(torch.randn_like(ins[3]) - 1.0)
    base = run_case(torch, fa, ins, do)
    pr = run_case(torch, fa, ins, do, acp=-10.0)
    record("acp -10 vs none", pr, base)

    # a side stream: inputs written on it just before the call, the op ordered after them
    ins, do = inputs(8, 2, 2048, 4, 64)
    want = run_case(torch, fa, ins, do)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        q2 = ins[0] * 1.0
        got = run_case(torch, fa, [q2] + ins[1:], do)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    record("side stream", got, want)
    return rows


# ------------------------------------------------------------------------------------------------
# the authors' model


def loss_of(torch, model, ids, labels):
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
        out = model(input_ids=ids, labels=labels, use_cache=False, return_dict=True)
        return out.loss.mean()


def model_part(torch, foxlm, modeling, Config, theirs, tol):
    dev = torch.device("cuda")
    torch.manual_seed(0)
    cfg = fox_pro_config(Config, 512, 4, 8)
    with torch.device(dev):
        model = modeling.ForgettingTransformerForCausalLM(cfg)
    model = model.to(device=dev, dtype=torch.float32).train()
    gen = torch.Generator(device="cpu").manual_seed(1)
    toks = torch.randint(0, cfg.vocab_size, (2, 2049), generator=gen).to(dev)
    ids, labels = toks[:, :-1].contiguous(), toks[:, 1:].contiguous()

    def ref_attention(q, k, v, log_fgate, head_first=False, seq_start=None, sm_scale=None, adaptive_threshold=None):
        assert head_first and seq_start is None and adaptive_threshold is None
        o = reference(torch, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), log_fgate.transpose(1, 2), sm_scale)
        return o.transpose(1, 2).to(q.dtype)

    results = {}
    for name, fn in [("authors", theirs), ("foxlm", foxlm.ops.forgetting_attention), ("reference", ref_attention)]:
        modeling.forgetting_attention = fn  # the one-line swap
        model.zero_grad(set_to_none=True)
        loss = loss_of(torch, model, ids, labels)
        loss.backward()
        results[name] = (float(loss.detach()), {n: p.grad.detach().clone() for n, p in model.named_parameters()})
    modeling.forgetting_attention = theirs

    def grad_err(a, b):
        errs = {n: float((a[n] - b[n]).norm() / b[n].norm().clamp_min(1e-12)) for n in b}
        worst = max(errs, key=errs.get)
        return round(errs[worst], 5), worst, round(statistics.median(errs.values()), 5)

    la, ga = results["authors"]
    lf, gf = results["foxlm"]
    lr, gr = results["reference"]
    r = {
        "shape": "FoX (Pro) d=512, 4 layers, 8 heads (head dim 64), batch 2 x 2048 tokens, bf16 autocast",
        "loss_authors": la,
        "loss_foxlm": lf,
        "loss_reference_fp32_attention": lr,
    }
    for tag, (a, b) in {"foxlm_vs_authors": (gf, ga), "foxlm_vs_reference": (gf, gr), "authors_vs_reference": (ga, gr)}.items():
        worst, wname, med = grad_err(a, b)
        r[tag + "_grad_rel_l2_max"] = worst
        r[tag + "_grad_worst_param"] = wname
        r[tag + "_grad_rel_l2_median"] = med
    r["ok"] = bool(abs(lf - la) < 0.01 and r["foxlm_vs_authors_grad_rel_l2_max"] < tol)
    print(json.dumps(r), flush=True)
    del model
    torch.cuda.empty_cache()
    return r


# ------------------------------------------------------------------------------------------------
# the benchmark: their 125M training step with their kernel and with ours


def bench_part(torch, foxlm, modeling, Config, theirs, a):
    dev = torch.device("cuda")
    d, layers, heads = (768, 12, 12) if a.bench_size == "125m" else (256, 2, 4)
    cfg = fox_pro_config(Config, d, layers, heads)
    torch.manual_seed(0)
    with torch.device(dev):
        model = modeling.ForgettingTransformerForCausalLM(cfg)
    init = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    del model
    n_steps = a.bench_warmup + a.bench_steps
    gen = torch.Generator(device="cpu").manual_seed(2)
    batches = [torch.randint(0, cfg.vocab_size, (a.bench_batch, a.bench_context + 1), generator=gen) for _ in range(n_steps)]
    out = {
        "model": f"authors' FoX (Pro) {a.bench_size}: d={d}, {layers} layers, {heads} heads",
        "context": a.bench_context,
        "batch": a.bench_batch,
        "warmup": a.bench_warmup,
        "timed_steps": a.bench_steps,
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
    }
    for name, fn in [("authors", theirs), ("foxlm", foxlm.ops.forgetting_attention)]:
        modeling.forgetting_attention = fn
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        with torch.device(dev):
            model = modeling.ForgettingTransformerForCausalLM(cfg)
        model.load_state_dict(init)
        model = model.to(device=dev, dtype=torch.float32).train()
        opt = authors_adamw(torch, model, fused=True)
        params = list(model.parameters())
        losses, times = [], []
        for i, bt in enumerate(batches):
            toks = bt.to(dev)
            ids, labels = toks[:, :-1].contiguous(), toks[:, 1:].contiguous()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            opt.zero_grad(set_to_none=True)
            loss = loss_of(torch, model, ids, labels)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            e.record()
            losses.append(loss.detach())
            e.synchronize()
            if i >= a.bench_warmup:
                times.append(s.elapsed_time(e))
        med = statistics.median(times)
        out[name] = {
            "step_ms_median": round(med, 2),
            "step_ms_all": [round(x, 2) for x in times],
            "tokens_per_s": round(a.bench_batch * a.bench_context / (med / 1e3), 1),
            "losses": [round(float(x), 5) for x in losses],
            "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
        }
        print(name, json.dumps(out[name]), flush=True)
        del model, opt, params
    modeling.forgetting_attention = theirs
    la, lf = out["authors"]["losses"], out["foxlm"]["losses"]
    out["speedup"] = round(out["foxlm"]["tokens_per_s"] / out["authors"]["tokens_per_s"], 3)
    out["loss_curve_max_abs_diff"] = round(max(abs(x - y) for x, y in zip(la, lf)), 5)
    print("bench", json.dumps({k: v for k, v in out.items() if k not in ("authors", "foxlm")}), flush=True)
    return out


# ------------------------------------------------------------------------------------------------
# the attention alone, as the 125M model calls it (what the step's difference is made of)


def attn_part(torch, foxlm, theirs, a):
    dev = torch.device("cuda")
    b, t, h, d = a.bench_batch, a.bench_context, 12, 64
    gen = torch.Generator(device="cpu").manual_seed(3)
    # head_first views of [B, T, H*D] projections, as their model passes them
    q, k, v, do = [torch.randn(b, t, h * d, generator=gen).to(dev, torch.bfloat16).view(b, t, h, d).transpose(1, 2) for _ in range(4)]
    g = torch.nn.functional.logsigmoid(torch.randn(b, t, h, generator=gen) + 3.0).to(dev).transpose(1, 2)
    out = {"shape": f"B={b} H={h} T={t} D={d}, head_first strided, bf16", "gpu": torch.cuda.get_device_name(0)}
    for name, fn in [("authors", theirs), ("foxlm", foxlm.ops.forgetting_attention)]:
        xs = [x.detach().clone().requires_grad_() for x in (q, k, v, g)]
        fwd, both = [], []
        for i in range(13):
            s0, s1, s2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            s0.record()
            o = fn(*xs, head_first=True, sm_scale=d**-0.5)
            s1.record()
            torch.autograd.grad(o, xs, do)
            s2.record()
            s2.synchronize()
            if i >= 3:
                fwd.append(s0.elapsed_time(s1))
                both.append(s0.elapsed_time(s2))
        out[name] = {"fwd_ms": round(statistics.median(fwd), 3), "fwd_bwd_ms": round(statistics.median(both), 3)}
    out["speedup_fwd_bwd"] = round(out["authors"]["fwd_bwd_ms"] / out["foxlm"]["fwd_bwd_ms"], 3)
    print("attn", json.dumps(out), flush=True)
    return out


def load_part(torch, foxlm, model_dir, tol):
    """foxlm.load(dir, device="cuda") against the same folder on the CPU: logits in bf16 and f32
    (left padding included), per-token losses, and greedy generation of a batch of prompts of
    different lengths (equal tokens wherever the CPU's top two logits are not near a tie)."""
    import numpy as np

    cpu = foxlm.load(model_dir, device="cpu")
    gpu16 = foxlm.load(model_dir, device="cuda", dtype="bf16")
    gpu32 = foxlm.load(model_dir, device="cuda", dtype="f32")
    v = cpu.vocab_size
    rng = np.random.default_rng(0)
    ids = rng.integers(0, v, size=(3, 96)).astype(np.int64)
    start = [0, 5, 40]
    want = cpu.logits(ids, start=start)
    rows = []

    def record(name, err, limit):
        rows.append({"case": name, "err": float(err), "tol": limit, "ok": bool(err <= limit)})
        print(f"  {'ok  ' if err <= limit else 'FAIL'} {name}: {err:.3e} (tol {limit:g})", flush=True)

    def real(a):  # the positions after each row's padding
        return np.concatenate([a[b, s:].reshape(-1) for b, s in enumerate(start)])

    for name, m, limit, loss_limit in [("f32", gpu32, 1e-4, 1e-3), ("bf16", gpu16, tol, 0.25)]:
        got = m.logits(ids, start=start)
        err = np.linalg.norm(real(got) - real(want)) / max(np.linalg.norm(real(want)), 1e-12)
        record(f"load cuda {name}: logits rel L2 (left padding 0/5/40)", err, limit)
        lc, lg = cpu.token_losses(ids), m.token_losses(ids)
        record(f"load cuda {name}: per-token losses max |diff| (nats)", float(np.abs(lg - lc).max()), loss_limit)
    # torch tensors in (here on the GPU), torch tensors out.
    tt = gpu16.logits(torch.from_numpy(ids[:1]).cuda())
    record("load cuda: torch in -> torch out", 0.0 if torch.is_tensor(tt) and tt.shape == (1, 96, v) else 1.0, 0.0)
    prompts = [list(map(int, ids[0, :7])), list(map(int, ids[1, :30])), list(map(int, ids[2, :18]))]
    g_cpu = cpu.generate(prompts, max_new_tokens=12)
    g_gpu = gpu32.generate(prompts, max_new_tokens=12)
    parted = 0
    for p, a, b in zip(prompts, g_cpu, g_gpu):
        k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if k is None and len(a) == len(b):
            continue
        k = k if k is not None else min(len(a), len(b))
        top = np.sort(cpu.logits(np.array([p + a[:k]]))[0, -1])[-2:]
        parted += int(top[1] - top[0] > 1e-3)  # a real difference, not a near tie
    record("load cuda f32: greedy tokens of 3 prompts unlike the CPU's (near ties excepted)", float(parted), 0.0)
    return {"rows": rows, "ok": all(r["ok"] for r in rows)}


def main():
    a = parse_args()
    import torch

    import foxlm

    if not torch.cuda.is_available():
        print("error: torch sees no GPU", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = True
    modeling, Config, theirs = import_authors(a.authors_src)
    parts = [p.strip() for p in a.parts.split(",") if p.strip()]
    res = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime())}
    ok = True
    for p in parts:
        t0 = time.time()
        print(f"=== {p}", flush=True)
        try:
            if p == "ops":
                rows = ops_part(torch, foxlm, theirs, a.tol)
                res["ops"] = rows
                ok &= all(r["ok"] for r in rows)
            elif p == "model":
                r = model_part(torch, foxlm, modeling, Config, theirs, a.tol)
                res["model"] = r
                ok &= r["ok"]
            elif p == "attn":
                res["attn"] = attn_part(torch, foxlm, theirs, a)
            elif p == "bench":
                res["bench"] = bench_part(torch, foxlm, modeling, Config, theirs, a)
            elif p == "load":
                r = load_part(torch, foxlm, a.model_dir, a.tol)
                res["load"] = r
                ok &= r["ok"]
            else:
                raise ValueError(f"unknown part {p} (ops, model, attn, bench, load)")
        except Exception as e:  # report and go on to the next part
            import traceback

            traceback.print_exc()
            res[p + "_error"] = f"{type(e).__name__}: {e}"
            ok = False
        print(f"=== {p}: {time.time() - t0:.1f} s", flush=True)
    res["ok"] = bool(ok)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
