"""The foxlm package's CPU path, with NumPy only (no torch needed).

Run by crates/foxlm-py/tests/python.rs (part of `cargo test --release --workspace`), which puts a
freshly built extension beside the package; by hand: `python3 test_cpu.py` with `foxlm`
importable. Also runs under pytest. Each test asserts values against an independent reference:
a float64 NumPy implementation of the same math, finite differences, or the authors' reference
outputs in tests/fixtures/official-fox-tiny.
"""

import json
import os
import struct
import sys

import numpy as np

import foxlm
from foxlm.ops import forgetting_attention_numpy as fa

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.environ.get("FOXLM_REPO", os.path.abspath(os.path.join(HERE, "..", "..", "..", "..")))
FIXTURES = os.path.join(REPO, "tests", "fixtures", "official-fox-tiny")


# ------------------------------------------------------------------------------------------
# reference: the math in float64, [B, T, H, D] layout


def ref_attention(q, k, v, g, scale, starts=None, window=None, dout=None):
    """Output (and with dout the gradients) of Forgetting Attention in float64. `starts` is
    [B, T]: the first visible key per query row (left padding or packed documents)."""
    q, k, v, g = (np.asarray(x, np.float64) for x in (q, k, v, g))
    b, t, h, d = q.shape
    hkv = k.shape[2]
    grp = h // hkv
    out = np.zeros((b, t, h, d))
    grads = [np.zeros_like(q), np.zeros_like(k), np.zeros_like(v), np.zeros_like(g)]
    for bi in range(b):
        for hi in range(h):
            kh = hi // grp
            c = np.cumsum(g[bi, :, hi])
            s = scale * q[bi, :, hi] @ k[bi, :, kh].T + c[:, None] - c[None, :]
            i, j = np.meshgrid(np.arange(t), np.arange(t), indexing="ij")
            vis = j <= i
            if starts is not None:
                vis &= j >= starts[bi][:, None]
            if window is not None:
                vis &= j > i - window
            s = np.where(vis, s, -np.inf)
            m = s.max(1, keepdims=True)
            has = np.isfinite(m)
            p = np.where(has, np.exp(s - np.where(has, m, 0)), 0.0)
            p /= np.maximum(p.sum(1, keepdims=True), 1e-300)
            o = p @ v[bi, :, kh]
            out[bi, :, hi] = o
            if dout is not None:
                do = np.asarray(dout[bi, :, hi], np.float64)
                grads[2][bi, :, kh] += p.T @ do
                dp = do @ v[bi, :, kh].T
                ds = p * (dp - (do * o).sum(1, keepdims=True))
                grads[0][bi, :, hi] = scale * ds @ k[bi, :, kh]
                grads[1][bi, :, kh] += scale * ds.T @ q[bi, :, hi]
                dc = ds.sum(1) - ds.sum(0)
                grads[3][bi, :, hi] = np.cumsum(dc[::-1])[::-1]
    return out if dout is None else (out, grads)


def rand_problem(seed, b=2, t=70, h=4, hkv=None, d=32, gate_shift=2.0):
    r = np.random.default_rng(seed)
    hkv = h if hkv is None else hkv
    q = r.standard_normal((b, t, h, d)).astype(np.float32)
    k = r.standard_normal((b, t, hkv, d)).astype(np.float32)
    v = r.standard_normal((b, t, hkv, d)).astype(np.float32)
    logits = r.standard_normal((b, t, h)) + gate_shift
    g = (-np.log1p(np.exp(-logits))).astype(np.float32)  # logsigmoid
    do = r.standard_normal((b, t, h, d)).astype(np.float32)
    return q, k, v, g, do


def close(name, got, want, tol):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"{name}: shape {got.shape} vs {want.shape}"
    err = np.abs(got - want).max() / max(np.abs(want).max(), 1e-6)
    assert err < tol, f"{name}: max |err| / max |ref| = {err:.3e} >= {tol}"
    return err


# ------------------------------------------------------------------------------------------
# the op


def test_forward_backward_match_reference():
    q, k, v, g, do = rand_problem(0)
    sc = 32**-0.5
    out, (dq, dk, dv, dg) = fa(q, k, v, g, dout=do)
    ro, (rq, rk, rv, rg) = ref_attention(q, k, v, g, sc, dout=do)
    for name, a, r in [("out", out, ro), ("dq", dq, rq), ("dk", dk, rk), ("dv", dv, rv), ("dlog_fgate", dg, rg)]:
        close(name, a, r, 1e-4)


def test_grouped_query_heads_head_first_and_scale():
    q, k, v, g, do = rand_problem(1, h=6, hkv=2, d=16)
    out, grads = fa(q, k, v, g, scale=0.3, dout=do)
    ro, rgr = ref_attention(q, k, v, g, 0.3, dout=do)
    close("gqa out", out, ro, 1e-4)
    for name, a, r in zip(["dq", "dk", "dv", "dlog_fgate"], grads, rgr):
        close("gqa " + name, a, r, 1e-4)
    # head_first=True: the same numbers with T and H swapped; sm_scale is the authors' name
    tr = lambda x: x.transpose(0, 2, 1, 3)  # noqa: E731
    out2, grads2 = fa(tr(q), tr(k), tr(v), g.transpose(0, 2, 1), head_first=True, sm_scale=0.3, dout=tr(do))
    close("head_first out", tr(out2), out, 1e-6)
    close("head_first dk", tr(grads2[1]), grads[1], 1e-6)
    close("head_first dlog_fgate", grads2[3].transpose(0, 2, 1), grads[3], 1e-6)


def test_left_padding_packed_sequences_and_window():
    q, k, v, g, do = rand_problem(2, b=2, t=50)
    sc = 32**-0.5
    # left padding (the authors' seq_start): row 1's first 13 positions are padding
    seq_start = np.array([0, 13])
    starts = np.stack([np.full(50, s) for s in seq_start])
    out, grads = fa(q, k, v, g, seq_start=seq_start, dout=do)
    ro, rgr = ref_attention(q, k, v, g, sc, starts=starts, dout=do)
    close("left-padded out (real rows)", out[1, 13:], ro[1, 13:], 1e-4)
    close("left-padded out row 0", out[0], ro[0], 1e-4)
    assert np.all(out[1, :13] == 0), "padded query rows output 0"
    close("left-padded dk (real keys)", grads[1][1, 13:], rgr[1][1, 13:], 1e-4)
    assert np.all(grads[3][1, :13] == 0), "no gradient reaches padded gates"
    # packed documents (fla's cu_seqlens, batch 1)
    q1, k1, v1, g1, do1 = (x[:1] for x in (q, k, v, g, do))
    cu = np.array([0, 7, 30, 50])
    st = np.repeat(cu[:-1], np.diff(cu))[None]
    out, grads = fa(q1, k1, v1, g1, None, None, cu, dout=do1)  # fla's positional order
    ro, rgr = ref_attention(q1, k1, v1, g1, sc, starts=st, dout=do1)
    close("cu_seqlens out", out, ro, 1e-4)
    for name, a, r in zip(["dq", "dk", "dv", "dlog_fgate"], grads, rgr):
        close("cu_seqlens " + name, a, r, 1e-4)
    # sliding window (fla's window_size: keys i - w < j <= i)
    out, grads = fa(q, k, v, g, window_size=9, dout=do)
    ro, rgr = ref_attention(q, k, v, g, sc, window=9, dout=do)
    close("window out", out, ro, 1e-4)
    close("window dq", grads[0], rgr[0], 1e-4)


def test_gradient_matches_finite_differences():
    # the kernels' gradient against their own forward (independent of the reference above)
    q, k, v, g, do = rand_problem(3, b=1, t=40, h=2, hkv=1, d=8, gate_shift=0.0)
    _, grads = fa(q, k, v, g, dout=do)
    loss = lambda *a: float((fa(*a).astype(np.float64) * do).sum())  # noqa: E731
    r = np.random.default_rng(9)
    for which, name in [(0, "q"), (1, "k"), (2, "v"), (3, "log_fgate")]:
        args = [x.copy() for x in (q, k, v, g)]
        for _ in range(3):
            idx = tuple(r.integers(0, n) for n in args[which].shape)
            eps = 1e-2
            args[which][idx] += eps
            up = loss(*args)
            args[which][idx] -= 2 * eps
            dn = loss(*args)
            args[which][idx] += eps
            fd = (up - dn) / (2 * eps)
            an = float(grads[which][idx])
            assert abs(fd - an) < 2e-2 * max(1.0, abs(an)), f"d{name}{idx}: finite difference {fd} vs {an}"


def test_acp_prunes_only_negligible_keys():
    # strong forgetting: ACP (tolerance e^-10) changes the output by at most ~e^-10 relative
    q, k, v, g, _ = rand_problem(4, b=1, t=300, h=2, d=16, gate_shift=-1.0)
    full = fa(q, k, v, g)
    pruned = fa(q, k, v, g, acp=-10.0)
    close("acp out", pruned, full, 1e-3)


def expect_error(exc, words, f, *a, **kw):
    try:
        f(*a, **kw)
    except exc as e:
        msg = str(e)
        for w in words:
            assert w in msg, f"error message {msg!r} does not name {w!r}"
        return
    raise AssertionError(f"{f.__name__} accepted bad input (expected {exc.__name__} naming {words})")


def test_bad_arguments_raise_clear_errors():
    q, k, v, g, _ = rand_problem(5, b=1, t=8, h=4, hkv=4, d=8)
    expect_error(ValueError, ["divide"], fa, q, k[:, :, :3], v[:, :, :3], g)
    expect_error(ValueError, ["k and v", "length"], fa, q, k[:, :5], v[:, :5], g)
    expect_error(ValueError, ["log_fgate"], fa, q, k, v, g[:, :, :2])
    expect_error(ValueError, ["q must be 4-D"], fa, q[0], k, v, g)
    expect_error(ValueError, ["window"], fa, q, k, v, g, window=0)
    expect_error(ValueError, ["adaptive_threshold"], foxlm.ops._acp, None, "auto")
    expect_error(ValueError, ["acp"], fa, q, k, v, g, acp=3.0)
    expect_error(ValueError, ["seq_start"], fa, q, k, v, g, seq_start=[9])
    expect_error(ValueError, ["cu_seqlens"], fa, q, k, v, g, cu_seqlens=[0, 3, 7])
    q2, k2, v2, g2, _ = rand_problem(5, b=2, t=8, h=2, d=8)
    expect_error(ValueError, ["batch size 1"], fa, q2, k2, v2, g2, cu_seqlens=[0, 8, 16])
    expect_error(ValueError, ["scale"], fa, q, k, v, g, scale=0.5, sm_scale=0.25)


# ------------------------------------------------------------------------------------------
# models: the authors' tiny FoX (Pro) and its reference outputs


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    kinds = {"F32": "<f4", "I64": "<i8", "F64": "<f8"}
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype=kinds[e["dtype"]]).reshape(e["shape"])
    return out


def test_model_logits_loss_and_greedy_tokens_match_the_authors():
    d = os.path.join(FIXTURES, "fox_pro")
    exp = read_safetensors(os.path.join(d, "expected.safetensors"))
    meta = json.load(open(os.path.join(d, "expected.json")))
    m = foxlm.load(d)
    assert m.vocab_size == 512 and m.config["num_heads"] == 4
    ids = exp["input_ids"]
    logits = m.logits(ids)
    assert logits.shape == (2, 192, 512) and logits.dtype == np.float32
    close("logits", logits, exp["logits"], 1e-4)
    assert abs(m.loss(ids) - meta["loss"]) < 1e-5, f"loss {m.loss(ids)} vs the authors' {meta['loss']}"
    pp = m.token_losses(ids)
    assert pp.shape == (2, 191)
    close("per-position loss", pp.mean(0), exp["per_position_loss"], 1e-4)
    # left padding: the authors' logits at the real positions
    mask = exp["attention_mask_left_padded"]
    start = (mask == 0).argmin(1)
    assert start[1] > 0
    lp = m.logits(ids, start=start)
    want = exp["logits_left_padded"]
    for r, s in enumerate(start):
        close(f"left-padded logits row {r}", lp[r, s:], want[r, s:], 1e-4)
    # greedy continuation through the KV cache, token for token
    plen = meta["greedy_prompt_len"]
    got = m.generate(ids[0, :plen].tolist(), max_new_tokens=len(meta["greedy_new_tokens"]))
    assert got == meta["greedy_new_tokens"], f"greedy tokens {got} vs {meta['greedy_new_tokens']}"
    # the same prompt batched beside a longer one (left padding inside generate)
    both = m.generate([ids[1, :plen + 5].tolist(), ids[0, :plen].tolist()], max_new_tokens=len(got))
    assert both[1] == got


def test_model_errors_name_the_argument():
    m = foxlm.load(os.path.join(FIXTURES, "fox_pro"))
    expect_error(ValueError, ["tokens", "512"], m.logits, [[1, 2, 512]])
    expect_error(ValueError, ["T ≥ 2"], m.token_losses, [[5]])
    expect_error(ValueError, ["prompts[0]"], m.generate, [-1, 3], 4)
    expect_error(ValueError, ["GPT-2"], m.encode, "hello")
    expect_error(ValueError, ["device"], foxlm.load, os.path.join(FIXTURES, "fox_pro"), device="tpu")
    expect_error(ValueError, ["config.json"], foxlm.load, os.path.join(FIXTURES, "no_such_model"))


if __name__ == "__main__":
    from harness import run_tests

    sys.exit(run_tests(globals()))
