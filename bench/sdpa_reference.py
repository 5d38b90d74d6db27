#!/usr/bin/env python3
"""PyTorch scaled_dot_product_attention (is_causal=True, no gate) on the attention bench's shapes.

Driven by `fox-attn bench` / `foxlm bench attention` (which pass the same shapes); prints one JSON
object per shape on stdout. Inputs bf16 [B, H, T, D] ~ N(0, 1); times with CUDA events after
warm-up, median of repeats; forward under no_grad, forward+backward with a random dO.
"""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", default="64,128")
    ap.add_argument("--t", default="1024,4096,16384")
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    a = ap.parse_args()
    import torch
    import torch.nn.functional as F

    if not torch.cuda.is_available():
        print(json.dumps({"error": "torch sees no GPU"}))
        return
    dev = torch.device("cuda")
    print(json.dumps({"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)}), flush=True)

    def timeit(fn):
        for _ in range(a.warmup):
            fn()
        ts = []
        for _ in range(a.iters):
            s = torch.cuda.Event(enable_timing=True)
            e = torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            ts.append(s.elapsed_time(e))
        ts.sort()
        return ts[len(ts) // 2]

    for d in [int(x) for x in a.d.split(",")]:
        for t in [int(x) for x in a.t.split(",")]:
            b, h = a.tokens // t, a.hidden // d
            torch.manual_seed(0)
            q = torch.randn(b, h, t, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
            k = torch.randn(b, h, t, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
            v = torch.randn(b, h, t, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
            do = torch.randn(b, h, t, d, device=dev, dtype=torch.bfloat16)

            def fwd():
                with torch.no_grad():
                    F.scaled_dot_product_attention(q, k, v, is_causal=True)

            def fwdbwd():
                # gradients returned, not accumulated into .grad (as the FoX references time it)
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                torch.autograd.grad(o, (q, k, v), do)

            row = {"d": d, "t": t, "b": b, "h": h, "fwd_ms": timeit(fwd), "fwdbwd_ms": timeit(fwdbwd)}
            print(json.dumps(row), flush=True)
            del q, k, v, do
            torch.cuda.empty_cache()


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # report, don't crash the bench
        print(json.dumps({"error": repr(e)}))
        sys.exit(0)
