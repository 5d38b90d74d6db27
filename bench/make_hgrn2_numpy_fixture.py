#!/usr/bin/env python3
"""An HGRN2 reference in NumPy float64, written from the definitions (SPEC §7, fla's HGRN2Attention and
HGRN2Model read at commit bc3b101d; no fla code), for the configuration fla's own fixture does not cover:
the short convolutions (use_short_conv). Writes tests/fixtures/numpy-hgrn2-conv-tiny/:

  config.json          model_type "hgrn2" with use_short_conv true, conv_size 4, lower bounds
  model.safetensors    f32 weights under fla's names (each MLP's gate_proj and up_proj concatenated into one
                       gate_proj [2I, d], foxlm's layout), drawn here (seeded)
  expected.safetensors input_ids [2, T] int64 (row 1 left-padded by PAD positions, their ids arbitrary),
                       logits [2, T, V] f32 computed in float64 (0 at padding)
  expected.json        the mean next-token loss over the real positions, how it was made

The model, per row b from its first real position (padding takes no part, as fla's unpadded varlen path):
  x = embedding; per layer l: h = RMSNorm(x) (eps norm_eps, weight attn_norm);
    q_pre, f_pre, i_pre = h q_projᵀ, h f_projᵀ, h i_projᵀ; each through a causal depthwise conv1d of W taps
    (no bias, no activation; tap W-1 on the current position, zeros before the row's first token);
    q = q_c·sigmoid(q_c); g = log sigmoid(f_c); for l > 0, g = log(lb_l + (1 - lb_l)·sigmoid(f_c)) with
    lb = cumsum over layers of softmax over layers of lower_bounds, less row 0; k = 1 - exp(g); v = i_c;
    per head (K = expand_ratio): S_t = diag(exp(g_t)) S_{t-1} + k_t v_tᵀ, o_t = K^-1/2 S_tᵀ q_t;
    o = RMSNorm over the whole width (eps 1e-5, weight g_norm) then o_projᵀ; x = x + o;
    x = x + down(silu(gate(RMSNorm(x))) * up(RMSNorm(x)));
  logits = RMSNorm(x) (weight norm) lm_headᵀ.

Run anywhere with NumPy: python3 bench/make_hgrn2_numpy_fixture.py [--out DIR]; with
--check-fla tests/fixtures/fla-hgrn2-tiny/hgrn2 it runs (without convolutions) on fla's fixture instead and
prints the largest difference from fla's logits (1.7e-6).
"""
import argparse
import json
import os
import struct

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
V, D, L, E, W, I = 40, 16, 2, 8, 4, 24  # vocab, hidden, layers, expand_ratio (head width), conv taps, MLP width
B, T, PAD = 2, 70, 5  # T > 64: foxlm's chunked GLA crosses a chunk boundary
EPS, G_EPS = 1e-6, 1e-5


def rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def conv(x, w):
    """Causal depthwise conv: x [n, C], w [C, 1, W] -> [n, C]."""
    n, taps = x.shape[0], w.shape[-1]
    out = np.zeros_like(x)
    for t in range(n):
        for j in range(taps):
            s = t - (taps - 1) + j
            if s >= 0:
                out[t] += w[:, 0, j] * x[s]
    return out


def forward_row(p, ids, H=D // E):
    """Logits [n, V] of one row of real tokens (H heads; without conv weights, no convolutions)."""
    x = p["model.embeddings.weight"][ids]
    raw = p["model.lower_bounds"]
    sm = np.exp(raw - raw.max(0)) / np.exp(raw - raw.max(0)).sum(0)
    lb = np.cumsum(sm, 0) - sm[0]
    d, n_layers = x.shape[1], raw.shape[0]
    e = d // H if H else E
    for layer in range(n_layers):
        pre = "model.layers.%d." % layer
        h = rms(x, p[pre + "attn_norm.weight"], EPS)
        q, f, i = (h @ p[pre + "attn.%s_proj.weight" % c].T for c in "qfi")
        if pre + "attn.q_conv1d.weight" in p:
            q, f, i = (conv(y, p[pre + "attn.%s_conv1d.weight" % c]) for y, c in zip((q, f, i), "qfi"))
        q = q * sigmoid(q)
        if layer == 0:
            g = np.log(sigmoid(f))
        else:
            g = np.log(lb[layer] + (1.0 - lb[layer]) * sigmoid(f))
        k = 1.0 - np.exp(g)
        o = np.zeros_like(i)
        for hd in range(H):
            c = slice(hd * e, (hd + 1) * e)
            S = np.zeros((e, e))
            for t in range(len(ids)):
                S = np.exp(g[t, c])[:, None] * S + np.outer(k[t, c], i[t, c])
                o[t, c] = e ** -0.5 * (S.T @ q[t, c])
        x = x + rms(o, p[pre + "attn.g_norm.weight"], G_EPS) @ p[pre + "attn.o_proj.weight"].T
        h = rms(x, p[pre + "mlp_norm.weight"], EPS)
        gu = p[pre + "mlp.gate_proj.weight"]
        gate, up = h @ gu[: len(gu) // 2].T, h @ gu[len(gu) // 2 :].T
        x = x + (gate * sigmoid(gate) * up) @ p[pre + "mlp.down_proj.weight"].T
    return rms(x, p["model.norm.weight"], EPS) @ p["lm_head.weight"].T


def params(rng):
    out = {"model.embeddings.weight": rng.standard_normal((V, D)), "model.lower_bounds": 1.5 * rng.standard_normal((L, D))}
    for layer in range(L):
        pre = "model.layers.%d." % layer
        out[pre + "attn_norm.weight"] = 1 + 0.3 * rng.standard_normal(D)
        for c in "qfi":
            out[pre + "attn.%s_proj.weight" % c] = rng.standard_normal((D, D)) / np.sqrt(D) * (2.5 if c == "f" else 1)
        for c in "qfi":
            out[pre + "attn.%s_conv1d.weight" % c] = 0.5 * rng.standard_normal((D, 1, W))
        out[pre + "attn.g_norm.weight"] = 1 + 0.3 * rng.standard_normal(D)
        out[pre + "attn.o_proj.weight"] = rng.standard_normal((D, D)) / np.sqrt(D)
        out[pre + "mlp_norm.weight"] = 1 + 0.3 * rng.standard_normal(D)
        out[pre + "mlp.gate_proj.weight"] = rng.standard_normal((2 * I, D)) / np.sqrt(D)
        out[pre + "mlp.down_proj.weight"] = rng.standard_normal((D, I)) / np.sqrt(I)
    out["model.norm.weight"] = 1 + 0.3 * rng.standard_normal(D)
    out["lm_head.weight"] = rng.standard_normal((V, D)) / np.sqrt(D)
    return out


def save_safetensors(path, tensors):
    """The safetensors format: an 8-byte little-endian header length, the JSON header, the data."""
    header, blobs, off = {}, [], 0
    for name, (arr, dtype) in tensors.items():
        data = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def load_safetensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header, base = json.loads(raw[8 : 8 + n]), 8 + n
    dtypes = {"F32": np.float32, "I64": np.int64}
    return {k: np.frombuffer(raw[base + v["data_offsets"][0] : base + v["data_offsets"][1]], dtype=dtypes[v["dtype"]])
            .reshape(v["shape"]) for k, v in header.items() if k != "__metadata__"}


def check_fla(folder):
    """This reference (without convolutions) on fla's own fixture: max |logits - fla's| over row 0."""
    cfg = json.load(open(os.path.join(folder, "config.json")))
    p = {k: v.astype(np.float64) for k, v in load_safetensors(os.path.join(folder, "model.safetensors")).items()}
    e = load_safetensors(os.path.join(folder, "expected.safetensors"))
    lg = forward_row(p, e["input_ids"][0], H=cfg["hidden_size"] // cfg["expand_ratio"])
    print("max |logits - fla's| (row 0): %.2e" % np.abs(lg - e["logits"][0]).max())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(HERE), "tests", "fixtures", "numpy-hgrn2-conv-tiny"))
    ap.add_argument("--seed", type=int, default=31)
    ap.add_argument("--check-fla", metavar="DIR", help="instead: compare with fla's fixture (tests/fixtures/fla-hgrn2-tiny/hgrn2)")
    args = ap.parse_args()
    if args.check_fla:
        return check_fla(args.check_fla)
    rng = np.random.default_rng(args.seed)
    p = params(rng)
    p32 = {n: t.astype(np.float32) for n, t in p.items()}
    p64 = {n: t.astype(np.float64) for n, t in p32.items()}  # the reference runs on the stored f32 weights
    ids = rng.integers(0, V, size=(B, T))
    start = [0, PAD]
    logits = np.zeros((B, T, V))
    nll, count = 0.0, 0
    for b in range(B):
        lg = forward_row(p64, ids[b, start[b]:])
        logits[b, start[b]:] = lg
        lse = np.log(np.exp(lg[:-1] - lg[:-1].max(-1, keepdims=True)).sum(-1)) + lg[:-1].max(-1)
        nll += (lse - lg[np.arange(len(lg) - 1), ids[b, start[b] + 1:]]).sum()
        count += len(lg) - 1
    os.makedirs(args.out, exist_ok=True)
    config = dict(model_type="hgrn2", vocab_size=V, hidden_size=D, num_hidden_layers=L, expand_ratio=E,
                  num_heads=D // E, use_short_conv=True, conv_size=W, use_lower_bound=True, intermediate_size=I,
                  hidden_ratio=4, hidden_act="swish", norm_eps=EPS, tie_word_embeddings=False,
                  elementwise_affine=True, attn_mode="chunk", bos_token_id=None, eos_token_id=None)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    save_safetensors(os.path.join(args.out, "model.safetensors"), {n: (t, "F32") for n, t in p32.items()})
    save_safetensors(os.path.join(args.out, "expected.safetensors"),
                     {"input_ids": (ids.astype(np.int64), "I64"), "logits": (logits.astype(np.float32), "F32")})
    report = dict(loss=nll / count, start=start, made_by="bench/make_hgrn2_numpy_fixture.py (seed %d)" % args.seed,
                  numpy=np.__version__)
    with open(os.path.join(args.out, "expected.json"), "w") as f:
        json.dump(report, f, indent=1, sort_keys=True)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
