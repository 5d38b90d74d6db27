#!/usr/bin/env python3
"""Plain PyTorch generation with a static KV cache: the baseline `foxlm bench decode` is compared with.

What a PyTorch user would run, the way gpt-fast does it: a same-sized model with random bf16 weights,
preallocated caches, and one decode step (embedding, every block, final norm, head, greedy argmax on
the GPU) compiled with torch.compile(mode="reduce-overhead", fullgraph=True), i.e. Inductor kernels
replayed as a CUDA graph. As in gpt-fast the decode step runs with the math SDPA backend selected
(--decode-sdpa math) so Inductor generates the attention over the whole static cache itself.

Models (--model), both pre-norm, RMSNorm eps 1e-6 with learned weights, untied head, head_dim 64,
vocab 50257, no biases except the forget gate's:
  transformer  LLaMA-style: RoPE (theta 500000, rotate-half) on q and k; SwiGLU MLP with intermediate
               int(d*4*2/3) rounded up to a multiple of 256 (as bench/train_reference.py).
  fox          FoX (Pro) as /work/shared/SPEC.md: no RoPE; KV-shift (k_t = a_t k~_{t-1} + (1-a_t) k~_t,
               a_t = sigmoid(shift_proj(x_t)) per head, same for v); QK-norm (per-head RMSNorm over
               head_dim, eps 1e-5, weight of size d); forget gate log f_t = logsigmoid(fgate_proj(x_t)),
               fgate_proj d->H with bias, c = cumulative sum of log f (fp32); scores
               q_i.k_j/sqrt(D) + c_i - c_j for j <= i; per-head output RMSNorm (weight of size d) times
               sigmoid(ogate_proj(x)), then o_proj; SwiGLU MLP (gate_proj d->2I split [gate | up]) with
               I = int(d*3.5*2/3) rounded up to a multiple of 256.

Caches (gpt-fast style, allocated once for length round_up(prompt + new_tokens, 8)): k_cache, v_cache
[B, H, L, D] in the model dtype; for fox also c_cache [B, H, L] fp32 and the decode state (the last
unmixed k~ and v~ [B, H, D], the last c [B, H] fp32). A decode step writes position input_pos (a
device tensor, advanced in place between steps) and attends over the whole cache with a mask:
boolean j <= pos (transformer), or the float bias c_pos - c_j for j <= pos and -inf beyond (fox),
cast to the model dtype because SDPA takes a float mask in the query's dtype.

Prefill: one forward over the whole prompt [B, P] that fills the caches and computes the head on the
last position only (all a generation needs); attention through SDPA, is_causal (transformer) or with
the causally masked float bias c_i - c_j [B, H, P, P] (fox). Compiled separately with
torch.compile(mode="default", dynamic=False, fullgraph=True) (--prefill-compile default) or eager
(--prefill-compile eager). --no-compile runs everything eager (CPU smoke tests).

One generation = prefill (its argmax gives the first new token) then --new-tokens decode steps, each
feeding the previous token at the next position and taking the argmax. Tokens stay on the GPU (each
step's output is cloned, as gpt-fast does, because a CUDA-graph replay overwrites its outputs, and
input_pos += 1 runs eager: two tiny launches per step outside the graph, as in gpt-fast); the host
synchronises only at the end of each phase. Timing: torch.cuda.synchronize + time.perf_counter
around the prefill and around the whole decode loop, after --warmup untimed generations (compilation
and CUDA-graph recording happen there); the median over --repeats timed generations.
prefill_tok_s = B*P / prefill time; decode_tok_s = B*new_tokens / decode time; ms_per_token = decode
time / new_tokens (one step, whole batch). peak_gib = torch.cuda.max_memory_allocated over the whole
run (weights, caches, CUDA-graph pools, warm-up included) / 2^30.

--self-check runs one more generation keeping every step's logits and compares them with a plain
non-cached forward over prompt + generated tokens (explicit fp32 softmax attention, no SDPA, no
cache): the prefill's last-position logits and every decode step's logits must agree within --tol
relative to max |logit| (default 1e-3 in float32, 5e-2 in bfloat16); exits 1 otherwise.

Examples:
  GPU:   python3 bench/decode_reference.py --model fox --size 125m --json $OUT/ref-decode-fox-125m.json
  smoke: python3 bench/decode_reference.py --model fox --device cpu --no-compile --dtype float32 \\
             --layers 1 --prompt 16 --new-tokens 4 --warmup 0 --repeats 1 --self-check
"""
import argparse
import contextlib
import math
import statistics
import sys
import time

# bench/ is this script's folder; the sizes and the transformer's attention are train_reference.py's.
from train_reference import NORM_EPS, SIZES, VOCAB, rope_attention, rope_tables, torch_on_device, write_result

QK_NORM_EPS = 1e-5


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["transformer", "fox"], default="fox")
    ap.add_argument("--size", choices=sorted(SIZES), default="125m")
    ap.add_argument("--prompt", type=int, default=2048, help="prompt tokens per row")
    ap.add_argument("--new-tokens", type=int, default=128, help="decode steps (greedy, no stop token)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=2, help="untimed generations first (compilation happens here)")
    ap.add_argument("--repeats", type=int, default=3, help="timed generations; the median is reported")
    ap.add_argument("--no-compile", action="store_true", help="run prefill and decode eager")
    ap.add_argument("--prefill-compile", choices=["default", "eager"], default="default")
    ap.add_argument(
        "--decode-sdpa",
        choices=["math", "auto"],
        default="math",
        help="SDPA backend during decode: math (gpt-fast: Inductor generates the attention) or PyTorch's choice",
    )
    ap.add_argument("--cd-tuning", action="store_true", help="Inductor coordinate-descent tuning (gpt-fast sets it)")
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    ap.add_argument("--self-check", action="store_true", help="compare cached logits with a non-cached forward")
    ap.add_argument("--tol", type=float, default=None, help="self-check tolerance relative to max |logit|")
    ap.add_argument("--json", default=None, help="write the result as JSON to this path")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda", help="cuda (benchmark) or cpu (smoke test only)")
    ap.add_argument("--layers", type=int, default=None, help="override the layer count (smoke tests)")
    a = ap.parse_args()
    for name in ("prompt", "new_tokens", "batch", "repeats"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if a.warmup < 0:
        ap.error("--warmup must be >= 0")
    if a.layers is not None and a.layers < 1:
        ap.error("--layers must be >= 1")
    if a.tol is None:
        a.tol = 1e-3 if a.dtype == "float32" else 5e-2
    return a


def build(a, max_len, dtype, device):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    d, n_layers, n_heads = SIZES[a.size]
    if a.layers is not None:
        n_layers = a.layers
    hd = d // n_heads
    ratio = 3.5 if a.model == "fox" else 4.0
    inter = int(d * ratio * 2 / 3)
    inter = 256 * ((inter + 255) // 256)
    fox = a.model == "fox"

    def head_rms(x, w, eps):
        # x [..., H, D], w [H, D]: RMSNorm over each head's head_dim slice.
        return F.rms_norm(x, (hd,), eps=eps) * w

    def reference_attention(q, k, v, bias):
        # q, k, v [B, H, T, D]; bias [B, H, T, T] or None. Explicit fp32 causal softmax.
        t = q.shape[2]
        s = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(hd)
        if bias is not None:
            s = s + bias
        causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~causal, float("-inf"))
        return (s.softmax(-1) @ v.float()).to(q.dtype)

    class FoxAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = nn.Linear(d, d, bias=False)
            self.k_proj = nn.Linear(d, d, bias=False)
            self.v_proj = nn.Linear(d, d, bias=False)
            self.k_shift = nn.Linear(d, n_heads, bias=False)
            self.v_shift = nn.Linear(d, n_heads, bias=False)
            self.fgate_proj = nn.Linear(d, n_heads, bias=True)
            self.q_norm = nn.Parameter(torch.ones(n_heads, hd))
            self.k_norm = nn.Parameter(torch.ones(n_heads, hd))
            self.out_norm = nn.Parameter(torch.ones(n_heads, hd))
            self.ogate_proj = nn.Linear(d, d, bias=False)
            self.o_proj = nn.Linear(d, d, bias=False)

        def setup_cache(self, b):
            self.register_buffer("k_cache", torch.zeros(b, n_heads, max_len, hd, dtype=dtype, device=device), False)
            self.register_buffer("v_cache", torch.zeros(b, n_heads, max_len, hd, dtype=dtype, device=device), False)
            self.register_buffer("c_cache", torch.zeros(b, n_heads, max_len, dtype=torch.float32, device=device), False)
            self.register_buffer("k_last", torch.zeros(b, n_heads, hd, dtype=dtype, device=device), False)
            self.register_buffer("v_last", torch.zeros(b, n_heads, hd, dtype=dtype, device=device), False)
            self.register_buffer("c_last", torch.zeros(b, n_heads, dtype=torch.float32, device=device), False)

        def project(self, h, k_prev, v_prev):
            # h [B, T, d]; k_prev, v_prev [B, 1, H, D]: the unmixed k~, v~ before the first of these tokens.
            b, t, _ = h.shape
            q = self.q_proj(h).view(b, t, n_heads, hd)
            kt = self.k_proj(h).view(b, t, n_heads, hd)
            vt = self.v_proj(h).view(b, t, n_heads, hd)
            ak = torch.sigmoid(self.k_shift(h)).unsqueeze(-1)  # [B, T, H, 1]
            av = torch.sigmoid(self.v_shift(h)).unsqueeze(-1)
            kb = k_prev if t == 1 else torch.cat([k_prev, kt[:, :-1]], dim=1)
            vb = v_prev if t == 1 else torch.cat([v_prev, vt[:, :-1]], dim=1)
            k = ak * kb + (1 - ak) * kt
            v = av * vb + (1 - av) * vt
            q = head_rms(q, self.q_norm, QK_NORM_EPS)
            k = head_rms(k, self.k_norm, QK_NORM_EPS)
            logf = F.logsigmoid(self.fgate_proj(h).float())  # [B, T, H] fp32
            return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), kt, vt, logf

        def finish(self, o, h):
            # o [B, H, T, D] -> output norm per head, output gate, o_proj.
            b, _, t, _ = o.shape
            o = head_rms(o.transpose(1, 2), self.out_norm, NORM_EPS).reshape(b, t, d)
            return self.o_proj(o * torch.sigmoid(self.ogate_proj(h)))

        def zeros_prev(self, h):
            return h.new_zeros(h.shape[0], 1, n_heads, hd)

        def prefill(self, h, positions):
            t = h.shape[1]
            z = self.zeros_prev(h)
            q, k, v, kt, vt, logf = self.project(h, z, z)
            c = logf.cumsum(1).transpose(1, 2)  # [B, H, T]
            self.k_cache[:, :, :t] = k
            self.v_cache[:, :, :t] = v
            self.c_cache[:, :, :t] = c
            self.k_last.copy_(kt[:, -1])
            self.v_last.copy_(vt[:, -1])
            self.c_last.copy_(c[:, :, -1])
            causal = positions[:t, None] >= positions[None, :t]
            bias = (c[..., :, None] - c[..., None, :]).masked_fill(~causal, float("-inf"))
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype))
            return self.finish(o, h)

        def decode(self, h, input_pos, positions):
            q, k, v, kt, vt, logf = self.project(h, self.k_last.unsqueeze(1), self.v_last.unsqueeze(1))
            c = self.c_last + logf[:, 0]  # [B, H]
            self.k_cache[:, :, input_pos] = k
            self.v_cache[:, :, input_pos] = v
            self.c_cache[:, :, input_pos] = c.unsqueeze(-1)
            self.k_last.copy_(kt[:, 0])
            self.v_last.copy_(vt[:, 0])
            self.c_last.copy_(c)
            valid = positions <= input_pos  # [L]
            bias = (c.unsqueeze(-1) - self.c_cache).masked_fill(~valid, float("-inf"))
            o = F.scaled_dot_product_attention(q, self.k_cache, self.v_cache, attn_mask=bias.unsqueeze(2).to(q.dtype))
            return self.finish(o, h)

        def reference(self, h):
            z = self.zeros_prev(h)
            q, k, v, _, _, logf = self.project(h, z, z)
            c = logf.cumsum(1).transpose(1, 2)
            return self.finish(reference_attention(q, k, v, c[..., :, None] - c[..., None, :]), h)

    class RopeAttention(rope_attention(torch, d, n_heads, hd)):
        def setup_cache(self, b):
            self.register_buffer("k_cache", torch.zeros(b, n_heads, max_len, hd, dtype=dtype, device=device), False)
            self.register_buffer("v_cache", torch.zeros(b, n_heads, max_len, hd, dtype=dtype, device=device), False)

        def prefill(self, h, cos, sin):
            t = h.shape[1]
            q, k, v = self.project(h, cos[:t], sin[:t])
            self.k_cache[:, :, :t] = k
            self.v_cache[:, :, :t] = v
            return self.out(F.scaled_dot_product_attention(q, k, v, is_causal=True))

        def decode(self, h, input_pos, positions, cos, sin):
            q, k, v = self.project(h, cos[input_pos], sin[input_pos])
            self.k_cache[:, :, input_pos] = k
            self.v_cache[:, :, input_pos] = v
            mask = (positions <= input_pos).view(1, 1, 1, -1)
            return self.out(F.scaled_dot_product_attention(q, self.k_cache, self.v_cache, attn_mask=mask))

        def reference(self, h, cos, sin):
            t = h.shape[1]
            q, k, v = self.project(h, cos[:t], sin[:t])
            return self.out(reference_attention(q, k, v, None))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj = nn.Linear(d, 2 * inter, bias=False)  # [gate | up]
            self.down_proj = nn.Linear(inter, d, bias=False)

        def forward(self, x):
            gate, up = self.gate_proj(x).chunk(2, dim=-1)
            return self.down_proj(F.silu(gate) * up)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn_norm = nn.RMSNorm(d, eps=NORM_EPS)
            self.attn = FoxAttention() if fox else RopeAttention()
            self.mlp_norm = nn.RMSNorm(d, eps=NORM_EPS)
            self.mlp = MLP()

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, d)
            self.layers = nn.ModuleList([Block() for _ in range(n_layers)])
            self.norm = nn.RMSNorm(d, eps=NORM_EPS)
            self.head = nn.Linear(d, VOCAB, bias=False)
            g = torch.Generator().manual_seed(a.seed)
            for name, p in self.named_parameters():
                with torch.no_grad():
                    if name.endswith("bias"):
                        p.zero_()
                    elif p.ndim == 1 or "norm" in name:
                        # norm weights near 1, not exactly 1, so the self-check sees their layout
                        p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
                    else:
                        p.copy_(0.02 * torch.randn(p.shape, generator=g))
            self.to(device=device, dtype=dtype)
            self.register_buffer("positions", torch.arange(max_len, device=device), False)
            if not fox:
                cos, sin = rope_tables(torch, hd, max_len)
                self.register_buffer("cos", cos.to(device), False)
                self.register_buffer("sin", sin.to(device), False)

        def setup_cache(self, b):
            for blk in self.layers:
                blk.attn.setup_cache(b)

        def _run(self, ids, attn):
            x = self.embed(ids)
            for blk in self.layers:
                x = x + attn(blk.attn, blk.attn_norm(x))
                x = x + blk.mlp(blk.mlp_norm(x))
            return self.norm(x)

        def prefill(self, ids):
            """Fill the caches from the prompt [B, P]; logits of the last position [B, V]."""
            if fox:
                x = self._run(ids, lambda m, h: m.prefill(h, self.positions))
            else:
                x = self._run(ids, lambda m, h: m.prefill(h, self.cos, self.sin))
            return self.head(x[:, -1])

        def decode(self, ids, input_pos):
            """One token per row [B, 1] at position input_pos [1]; logits [B, V]."""
            if fox:
                x = self._run(ids, lambda m, h: m.decode(h, input_pos, self.positions))
            else:
                x = self._run(ids, lambda m, h: m.decode(h, input_pos, self.positions, self.cos, self.sin))
            return self.head(x[:, -1])

        def reference(self, ids):
            """Non-cached forward over [B, T]; logits [B, T, V] in fp32."""
            if fox:
                x = self._run(ids, lambda m, h: m.reference(h))
            else:
                x = self._run(ids, lambda m, h: m.reference(h, self.cos, self.sin))
            return self.head(x).float()

    model = LM()
    model.eval()
    model.requires_grad_(False)
    shape = dict(hidden=d, layers=n_layers, heads=n_heads, head_dim=hd, intermediate=inter, cache_len=max_len)
    return model, shape


def prefill_step(model, ids):
    logits = model.prefill(ids)
    return logits.argmax(-1, keepdim=True), logits


def decode_one_token(model, ids, input_pos):
    logits = model.decode(ids, input_pos)
    return logits.argmax(-1, keepdim=True), logits


def main():
    a = parse_args()
    torch, dev = torch_on_device(a, "use --device cpu only for a smoke test")
    cuda = dev.type == "cuda"
    dtype = getattr(torch, a.dtype)
    if a.cd_tuning:
        import torch._inductor.config as ind

        ind.coordinate_descent_tuning = True

    max_len = 8 * ((a.prompt + a.new_tokens + 7) // 8)
    model, shape = build(a, max_len, dtype, dev)
    model.setup_cache(a.batch)
    n_params = sum(p.numel() for p in model.parameters())

    if a.no_compile:
        prefill_fn, decode_fn, compile_desc = prefill_step, decode_one_token, "none"
    else:
        decode_fn = torch.compile(decode_one_token, mode="reduce-overhead", fullgraph=True)
        if a.prefill_compile == "default":
            prefill_fn = torch.compile(prefill_step, mode="default", dynamic=False, fullgraph=True)
        else:
            prefill_fn = prefill_step
        compile_desc = "reduce-overhead"

    def decode_ctx():
        if a.decode_sdpa == "math":
            from torch.nn.attention import SDPBackend, sdpa_kernel

            return sdpa_kernel(SDPBackend.MATH)
        return contextlib.nullcontext()

    def sync():
        if cuda:
            torch.cuda.synchronize()

    g = torch.Generator(device="cpu").manual_seed(a.seed)
    prompt = torch.randint(0, VOCAB, (a.batch, a.prompt), generator=g).to(dev)
    start_pos = torch.tensor([a.prompt], dtype=torch.long, device=dev)

    def generate(keep_logits=False):
        """One generation; (prefill s, decode s, tokens [B, new], logits list or None)."""
        sync()
        t0 = time.perf_counter()
        tok, logits = prefill_fn(model, prompt)
        tok = tok.clone()
        kept = [logits.clone()] if keep_logits else None
        sync()
        t1 = time.perf_counter()
        pos = start_pos.clone()
        toks = []
        with decode_ctx():
            for _ in range(a.new_tokens):
                toks.append(tok)
                nxt, logits = decode_fn(model, tok, pos)
                if keep_logits:
                    kept.append(logits.clone())
                tok = nxt.clone()
                pos += 1
        sync()
        t2 = time.perf_counter()
        return t1 - t0, t2 - t1, torch.cat(toks, dim=1), kept

    result = {
        "name": f"pytorch-{a.model}-static-cache",
        "model": a.model,
        "size": a.size,
        "batch": a.batch,
        "prompt": a.prompt,
        "new_tokens": a.new_tokens,
        "dtype": a.dtype,
        "compile": compile_desc,
        "prefill_compile": "eager" if a.no_compile else a.prefill_compile,
        "decode_sdpa": a.decode_sdpa,
        "cd_tuning": a.cd_tuning,
        "params": n_params,
        "shape": shape,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(dev) if cuda else "cpu",
    }
    prefill_s, decode_s = [], []
    try:
        with torch.no_grad():
            for _ in range(a.warmup):
                generate()
            for _ in range(a.repeats):
                p, dsec, _, _ = generate()
                prefill_s.append(p)
                decode_s.append(dsec)
            if a.self_check:
                _, _, toks, kept = generate(keep_logits=True)
                ref = model.reference(torch.cat([prompt, toks], dim=1))  # [B, P+new, V]
                got = torch.stack([k.float() for k in kept], dim=1)  # [B, 1+new, V]
                want = ref[:, a.prompt - 1 :]
                scale = max(1.0, float(want.abs().max()))
                err = float((got - want).abs().max()) / scale
                result["self_check_rel_err"] = err
                result["self_check_tol"] = a.tol
                result["self_check_ok"] = err <= a.tol
                if not err <= a.tol:
                    result["error"] = f"self-check failed: cached logits differ by {err:.3g} (relative) > {a.tol}"
    except torch.cuda.OutOfMemoryError as exc:
        result["error"] = "out of memory: " + str(exc).splitlines()[0]

    if prefill_s and decode_s and len(decode_s) == a.repeats:
        pm, dm = statistics.median(prefill_s), statistics.median(decode_s)
        result["prefill_ms"] = [round(t * 1e3, 3) for t in prefill_s]
        result["decode_ms"] = [round(t * 1e3, 3) for t in decode_s]
        result["prefill_tok_s"] = round(a.batch * a.prompt / pm, 1)
        result["decode_tok_s"] = round(a.batch * a.new_tokens / dm, 1)
        result["ms_per_token"] = round(dm / a.new_tokens * 1e3, 4)
    else:
        result["prefill_tok_s"] = result["decode_tok_s"] = result["ms_per_token"] = None
    result["peak_gib"] = round(torch.cuda.max_memory_allocated(dev) / 2**30, 3) if cuda else None
    try:
        from torch._dynamo.utils import counters

        # Non-zero means Inductor fell back from CUDA graphs for some graph: the number is then suspect.
        result["cudagraph_skips"] = int(counters["inductor"]["cudagraph_skips"])
    except Exception:  # counters moved or absent in this torch version: leave the field out
        pass

    print(
        f"{result['name']} {a.size} B={a.batch} prompt {a.prompt} + {a.new_tokens} new, {a.dtype}, "
        f"compile={compile_desc}: "
        + (
            f"prefill {result['prefill_tok_s']:.0f} tokens/s; decode {result['decode_tok_s']:.0f} tokens/s "
            f"({result['ms_per_token']:.3f} ms/step), peak {result['peak_gib']} GiB"
            if result["decode_tok_s"] is not None
            else "FAILED"
        )
        + (f"; self-check rel err {result['self_check_rel_err']:.2e}" if "self_check_rel_err" in result else "")
        + (f" ({result['error']})" if "error" in result else ""),
        flush=True,
    )
    return write_result(a, result)


if __name__ == "__main__":
    sys.exit(main())
