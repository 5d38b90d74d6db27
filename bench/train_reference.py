#!/usr/bin/env python3
"""Plain PyTorch LLaMA-style training step: the baseline `foxlm bench train` is compared with.

What a PyTorch user would write: embedding, pre-norm blocks (RMSNorm eps 1e-6), attention with RoPE
(theta 500000, rotate-half) through F.scaled_dot_product_attention(is_causal=True), SwiGLU MLP
(intermediate int(d*4*2/3) rounded up to a multiple of 256), untied output head, no biases. fp32
weights under bf16 autocast, F.cross_entropy on the [B*T, V] logits, grad clipping at 1.0, fused
AdamW (betas 0.9/0.95, wd 0.1 on matrices and embeddings, lr 1e-3). Random token ids.

Timing: CUDA events around each whole step (zero_grad, forward, backward, clip, optimizer step)
after --warmup untimed steps; the median of --steps timed steps. tokens/s = batch*context/median.
peak_gib = torch.cuda.max_memory_allocated over the whole run (warm-up included) / 2^30.

Example (GPU): python3 bench/train_reference.py --size 125m --compile --json $OUT/ref-125m.json
"""
import argparse
import json
import math
import statistics
import sys
import time

SIZES = {
    # name: (hidden, layers, heads); head_dim 64 in both
    "125m": (768, 12, 12),
    "760m": (1536, 24, 24),
}
VOCAB = 50257
ROPE_THETA = 500000.0
NORM_EPS = 1e-6


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_options(ap, "torch.compile the model", "activation checkpointing per block")
    add_step_options(ap)
    ap.add_argument("--device", default="cuda", help="cuda (benchmark) or cpu (smoke test only)")
    ap.add_argument("--layers", type=int, default=None, help="override the layer count (smoke tests)")
    a = ap.parse_args()
    check_sizes(ap, a)
    return a


def add_model_options(ap, compile_help, checkpoint_help):
    """--size, --context, --batch, --compile and --checkpoint, the model and batch options of the
    training benchmarks in bench/ (this one and authors_fox.py)."""
    ap.add_argument("--size", choices=sorted(SIZES), default="125m")
    ap.add_argument("--context", type=int, default=16384)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--compile", action="store_true", help=compile_help)
    ap.add_argument("--checkpoint", action="store_true", help=checkpoint_help)


def add_step_options(ap):
    """--steps and --warmup (what timed_steps runs), --json (where finish_train writes) and --seed."""
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--json", default=None, help="write the result as JSON to this path")
    ap.add_argument("--seed", type=int, default=0)


def check_sizes(ap, a):
    """--context, --batch, --steps >= 1 and --warmup >= 0, else the parser's error (the training
    benchmarks in bench/ share these options)."""
    for name in ("context", "batch", "steps"):
        if getattr(a, name) < 1:
            ap.error(f"--{name} must be >= 1")
    if a.warmup < 0:
        ap.error("--warmup must be >= 0")


def timed(torch, dev, f):
    """(f(), seconds it took on the device): CUDA events on a GPU, the wall clock on the CPU."""
    if dev.type != "cuda":
        t0 = time.perf_counter()
        out = f()
        return out, time.perf_counter() - t0
    s = torch.cuda.Event(enable_timing=True)
    e = torch.cuda.Event(enable_timing=True)
    s.record()
    out = f()
    e.record()
    e.synchronize()
    return out, s.elapsed_time(e) / 1e3


def rope_tables(torch, head_dim, length):
    """cos and sin [length, head_dim] (float32, on the CPU) of RoPE with theta ROPE_THETA for
    positions 0..length-1, in the rotate-half layout."""
    inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    freqs = torch.outer(torch.arange(length, dtype=torch.float32), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def rope_attention(torch, d, n_heads, head_dim):
    """The LLaMA attention module of both PyTorch baselines (this one and decode_reference.py's
    transformer): q, k, v and o projections without bias, RoPE (rotate-half) on q and k; called
    with x [B, T, d] and the rope_tables rows of its positions, it attends causally through SDPA."""
    nn, F = torch.nn, torch.nn.functional

    def rotate_half(x):
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.wq = nn.Linear(d, d, bias=False)
            self.wk = nn.Linear(d, d, bias=False)
            self.wv = nn.Linear(d, d, bias=False)
            self.wo = nn.Linear(d, d, bias=False)

        def project(self, x, cos, sin):
            """q, k, v [B, H, T, D], q and k rotated by cos, sin [T, D]."""
            b, t, _ = x.shape
            q = self.wq(x).view(b, t, n_heads, head_dim).transpose(1, 2)
            k = self.wk(x).view(b, t, n_heads, head_dim).transpose(1, 2)
            v = self.wv(x).view(b, t, n_heads, head_dim).transpose(1, 2)
            cos = cos.to(q.dtype)
            sin = sin.to(q.dtype)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            return q, k, v

        def out(self, o):
            """The heads' outputs o [B, H, T, D] through wo: [B, T, d]."""
            b, _, t, _ = o.shape
            return self.wo(o.transpose(1, 2).reshape(b, t, d))

        def forward(self, x, cos, sin):
            q, k, v = self.project(x, cos, sin)
            return self.out(F.scaled_dot_product_attention(q, k, v, is_causal=True))

    return Attention


def build(a):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    d, n_layers, n_heads = SIZES[a.size]
    if a.layers is not None:
        n_layers = a.layers
    head_dim = d // n_heads
    inter = int(d * 4 * 2 / 3)
    inter = 256 * ((inter + 255) // 256)
    Attention = rope_attention(torch, d, n_heads, head_dim)

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.w1 = nn.Linear(d, inter, bias=False)  # gate
            self.w3 = nn.Linear(d, inter, bias=False)  # up
            self.w2 = nn.Linear(inter, d, bias=False)  # down

        def forward(self, x):
            return self.w2(F.silu(self.w1(x)) * self.w3(x))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn_norm = nn.RMSNorm(d, eps=NORM_EPS)
            self.attn = Attention()
            self.mlp_norm = nn.RMSNorm(d, eps=NORM_EPS)
            self.mlp = MLP()

        def forward(self, x, cos, sin):
            x = x + self.attn(self.attn_norm(x), cos, sin)
            return x + self.mlp(self.mlp_norm(x))

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, d)
            self.layers = nn.ModuleList([Block() for _ in range(n_layers)])
            self.norm = nn.RMSNorm(d, eps=NORM_EPS)
            self.head = nn.Linear(d, VOCAB, bias=False)
            cos, sin = rope_tables(torch, head_dim, a.context)
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)
            for m in self.modules():
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(m.weight, mean=0.0, std=0.02)

        def forward(self, ids, targets):
            t = ids.shape[1]
            cos, sin = self.cos[:t], self.sin[:t]
            x = self.embed(ids)
            for blk in self.layers:
                if a.checkpoint and self.training:
                    x = checkpoint(blk, x, cos, sin, use_reentrant=False)
                else:
                    x = blk(x, cos, sin)
            logits = self.head(self.norm(x))
            return F.cross_entropy(logits.view(-1, VOCAB), targets.reshape(-1))

    return LM(), dict(hidden=d, layers=n_layers, heads=n_heads, head_dim=head_dim, intermediate=inter)


def training_step(torch, model, fwd, dev, batch, context, seed):
    """One optimizer step as a user trains: AdamW (decay on the matrices only, fused on a GPU), bf16
    autocast, clipping at 1.0, on a fixed random batch of `batch` windows of `context` tokens drawn
    with `seed`. `fwd` is the model as called (compiled, or wrapped in DDP); returns step()."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=1e-3,
        betas=(0.9, 0.95),
        fused=dev.type == "cuda",
    )
    g = torch.Generator(device="cpu").manual_seed(seed)
    toks = torch.randint(0, VOCAB, (batch, context + 1), generator=g).to(dev)
    ids, targets = toks[:, :-1].contiguous(), toks[:, 1:].contiguous()
    params = list(model.parameters())

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
            loss = fwd(ids, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return loss

    return step


def torch_on_device(a, hint):
    """torch and --device, seeded with --seed and TF32 matmuls allowed ("high"); when --device is
    cuda and torch sees no GPU, an error line that ends with `hint` and exit status 2."""
    import torch

    dev = torch.device(a.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print(f"error: torch sees no GPU ({hint})", file=sys.stderr)
        raise SystemExit(2)
    torch.manual_seed(a.seed)
    torch.set_float32_matmul_precision("high")
    return torch, dev


def timed_steps(torch, dev, a, step, result):
    """--warmup untimed calls of `step` (which returns the loss), then --steps timed ones: their
    times in ms and the last loss; out of memory goes into `result` (the times so far, no loss)."""
    times = []
    try:
        for _ in range(a.warmup):
            loss = step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        for _ in range(a.steps):
            loss, sec = timed(torch, dev, step)
            times.append(sec * 1e3)
        return times, float(loss.detach().float().item())
    except torch.cuda.OutOfMemoryError as exc:
        result["error"] = "out of memory: " + str(exc).splitlines()[0]
        return times, None


def finish_train(torch, dev, a, result, times, final_loss):
    """The end of a training benchmark (this one and authors_fox.py): the median step, tokens/s
    and final loss into `result` (an error when the loss is not finite), the peak memory, one
    summary line, then `result` written as --json; the exit code."""
    if times and final_loss is not None:
        med = statistics.median(times)
        result["step_ms_median"] = round(med, 3)
        result["step_ms_all"] = [round(t, 3) for t in times]
        result["tokens_per_s"] = round(a.batch * a.context / (med / 1e3), 1)
        result["loss"] = final_loss
        if not math.isfinite(final_loss):
            result["error"] = "loss is not finite"
    else:
        result["step_ms_median"] = None
        result["tokens_per_s"] = None
    result["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3) if dev.type == "cuda" else None

    print(
        f"{result['name']} {a.size} ctx={a.context} batch={a.batch} compile={a.compile} "
        f"checkpoint={a.checkpoint}: "
        + (
            f"{result['tokens_per_s']:.0f} tok/s, {result['step_ms_median']:.1f} ms/step, "
            f"peak {result['peak_gib']} GiB, loss {final_loss:.3f}"
            if result["tokens_per_s"] is not None
            else f"FAILED ({result.get('error')}), peak {result['peak_gib']} GiB"
        ),
        flush=True,
    )
    return write_result(a, result)


def write_result(a, result):
    """`result` as JSON to --json (when given); the exit code: 1 when it holds an error."""
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0 if "error" not in result else 1


def main():
    a = parse_args()
    torch, dev = torch_on_device(a, "use --device cpu only for a smoke test")

    model, shape = build(a)
    model = model.to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    fwd = torch.compile(model) if a.compile else model
    model.train()
    step = training_step(torch, model, fwd, dev, a.batch, a.context, a.seed)

    result = {
        "name": "pytorch-llama-sdpa",
        "size": a.size,
        "context": a.context,
        "batch": a.batch,
        "compile": a.compile,
        "checkpoint": a.checkpoint,
        "params": n_params,
        "shape": shape,
        "torch_version": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu",
    }
    times, final_loss = timed_steps(torch, dev, a, step, result)
    return finish_train(torch, dev, a, result, times, final_loss)


if __name__ == "__main__":
    sys.exit(main())
