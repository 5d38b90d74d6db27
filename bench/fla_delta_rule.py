# Same-device baseline for `fox-attn bench-delta`: fla 0.6.0's chunk_delta_rule and
# chunk_gated_delta_rule (Triton) at the 125M models' widths, bf16, q and k L2-normalised,
# β in (0.05, 0.95), g in [-0.4, -0.001]: forward medians of CUDA-event timings after warm-up (the
# backward is not timed: fla's gated chunk backward refuses on Triton 3.6 on Hopper, and its
# autotuning alone takes minutes). Usage: python3 bench/fla_delta_rule.py [B T H K V]; fla
# importable (PYTHONPATH).
import sys

import torch
import torch.nn.functional as F
from fla.ops.delta_rule import chunk_delta_rule
from fla.ops.gated_delta_rule import chunk_gated_delta_rule

from cuda_timing import median_ms

B, T, H, K, V = (int(x) for x in sys.argv[1:6]) if len(sys.argv) > 5 else (2, 16384, 6, 128, 128)

torch.manual_seed(0)
dt = torch.bfloat16
q = F.normalize(torch.randn(B, T, H, K, device="cuda"), dim=-1).to(dt)
k = F.normalize(torch.randn(B, T, H, K, device="cuda"), dim=-1).to(dt)
v = torch.randn(B, T, H, V, device="cuda", dtype=dt)
beta = (0.05 + 0.9 * torch.rand(B, T, H, device="cuda")).to(dt)
g = (-0.001 - 0.399 * torch.rand(B, T, H, device="cuda"))
scale = K**-0.5
dev = torch.cuda.get_device_name()
for name, f in [
    ("chunk_delta_rule", lambda: chunk_delta_rule(q, k, v, beta, scale=scale)),
    ("chunk_gated_delta_rule", lambda: chunk_gated_delta_rule(q, k, v, g, beta, scale=scale)),
]:
    with torch.no_grad():
        fwd = median_ms(f)
    print(f"fla {name} bf16 [B,T,H,K,V]={(B, T, H, K, V)} on {dev}: fwd {fwd:.3f} ms", flush=True)
