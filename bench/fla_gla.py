#!/usr/bin/env python3
"""fla's chunk_gla (flash-linear-attention's chunked gated linear attention, HGRN2's kernel there)
timed at the shape `fox-attn bench-gla` times foxlm's: bf16 q, k, v, g [B, T, H, K] with
g = logsigmoid(z + 2), z ~ N(0, 1) and k = 1 - exp(g) (HGRN2's tied key), no initial state.
Median of --iters CUDA-event timings after --warmup calls (fla's Triton autotuning runs in the
warm-up), forward alone, then forward + backward (its backward may refuse on some Triton versions:
the error is printed instead). Run it in the same call as `fox-attn bench-gla` and compare there.

    python3 bench/fla_gla.py [--shape 2,16384,6,128] [--iters 20] [--warmup 3] [--fwd-only]
"""
import argparse

import torch
import torch.nn.functional as F
from cuda_timing import median_ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="2,16384,6,128")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--fwd-only", action="store_true", help="skip the backward")
    a = ap.parse_args()
    B, T, H, D = (int(x) for x in a.shape.split(","))
    from fla.ops.gla import chunk_gla

    torch.manual_seed(1)
    dev, dt = "cuda", torch.bfloat16
    g = F.logsigmoid(torch.randn(B, T, H, D, device=dev) + 2.0)
    k = (1 - g.exp()).to(dt)
    q = torch.randn(B, T, H, D, device=dev, dtype=dt)
    v = torch.randn(B, T, H, D, device=dev, dtype=dt)
    g = g.to(dt)
    name = torch.cuda.get_device_name()
    with torch.no_grad():
        fwd = median_ms(lambda: chunk_gla(q, k, v, g, scale=D**-0.5), a.warmup, a.iters)
    print(f"fla chunk_gla on {name}, [B, T, H, K = V] = ({B}, {T}, {H}, {D}), bf16: forward {fwd:.3f} ms "
          f"(median of {a.iters}, CUDA events)", flush=True)
    if a.fwd_only:
        return
    qg, kg, vg, gg = (x.detach().clone().requires_grad_() for x in (q, k, v, g))
    do = torch.randn_like(v)

    def fb():
        o, _ = chunk_gla(qg, kg, vg, gg, scale=D**-0.5)
        o.backward(do)

    try:
        ms = median_ms(fb, a.warmup, a.iters)
        print(f"fla chunk_gla forward + backward {ms:.3f} ms", flush=True)
    except Exception as e:  # noqa: BLE001 - report whatever the backward raises
        print(f"fla chunk_gla backward failed: {type(e).__name__}: {str(e)[:300]}", flush=True)


if __name__ == "__main__":
    main()
