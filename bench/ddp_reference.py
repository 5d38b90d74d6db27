#!/usr/bin/env python3
"""Data-parallel PyTorch training step: the reference `foxlm bench train --gpus N` is compared with.

What a PyTorch user would run on N GPUs of one machine: the LLaMA-style model of
bench/train_reference.py (imported from it, so both benchmarks time the same model),
DistributedDataParallel over NCCL, torch.compile of the DDP-wrapped model, bf16 autocast, fp32
weights, grad clipping at 1.0, fused AdamW (betas 0.9/0.95, wd 0.1 on matrices and embeddings).
Each rank trains on its own random tokens, --batch sequences per GPU (global batch N x --batch).

Timing: CUDA events around each whole step after --warmup untimed steps; each rank's median over
--steps, and the slowest rank's median is the step time. tokens/s = N*batch*context/step time.
peak_gib: the largest torch.cuda.max_memory_allocated over the ranks / 2^30.

With N >= 2 also an NCCL all-reduce probe: --allreduce-mb MB of fp32 summed in place over the
ranks; median of 10 after 3 warm-up; bus bandwidth = 2(N-1)/N x bytes / time (NCCL's busbw).

NVLink multicast stays off: NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and
NVSHMEM_DISABLE_NVLS=1 are set here when unset (before torch is imported).

Example: torchrun --standalone --nproc_per_node 2 bench/ddp_reference.py --json $OUT/ref-ddp-2.json
Smoke test without GPUs (gloo, eager, tiny): torchrun --standalone --nproc_per_node 2
bench/ddp_reference.py --device cpu --no-compile --layers 1 --context 64 --batch 1 --allreduce-mb 4
"""
import argparse
import json
import math
import os
import statistics
import sys

# A program that uses NVLink multicast can put a shared host's GPUs out of service.
for _var, _val in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_var, _val)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_reference  # noqa: E402  (the model; bench/ is this script's folder)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=sorted(train_reference.SIZES), default="125m")
    ap.add_argument("--context", type=int, default=16384)
    ap.add_argument("--batch", type=int, default=2, help="sequences per GPU")
    ap.add_argument("--no-compile", action="store_true", help="eager mode (smoke tests)")
    ap.add_argument("--checkpoint", action="store_true", help="activation checkpointing per block")
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--allreduce-mb", type=float, default=650.0, help="size of the all-reduce probe (N >= 2)")
    ap.add_argument("--json", default=None, help="write the result as JSON to this path (rank 0)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=None, help="override the layer count (smoke tests)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="cuda (NCCL; the benchmark) or cpu (gloo; smoke tests only)")
    a = ap.parse_args()
    train_reference.check_sizes(ap, a)
    if a.allreduce_mb <= 0:
        ap.error("--allreduce-mb must be > 0")
    a.compile = not a.no_compile
    return a


def allreduce_probe(torch, dist, dev, world, mb):
    """Median time of an in-place fp32 all-reduce of `mb` MB; (bytes, seconds, bus GB/s)."""
    n = int(mb * 1e6) // 4
    buf = torch.ones(n, dtype=torch.float32, device=dev)
    for _ in range(3):
        dist.all_reduce(buf)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    times = [train_reference.timed(torch, dev, lambda: dist.all_reduce(buf))[1] for _ in range(10)]
    # the slowest rank's median: the collective is done when every rank is
    t = torch.tensor([statistics.median(times)], device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    secs = float(t.item())
    nbytes = 4 * n
    return nbytes, secs, 2 * (world - 1) / world * nbytes / secs / 1e9


def nccl_version(torch):
    v = torch.cuda.nccl.version()  # a tuple in recent PyTorch, an int in older ones
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def main():
    a = parse_args()
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        print("error: start this with torchrun, e.g. torchrun --standalone --nproc_per_node 2 "
              "bench/ddp_reference.py", file=sys.stderr)
        return 2
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    cuda = a.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("error: torch sees no GPU (--device cpu only for a smoke test)", file=sys.stderr)
        return 2
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    if cuda:
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
        dist.init_process_group(backend="nccl", device_id=dev)
    else:
        dev = torch.device("cpu")
        dist.init_process_group(backend="gloo")
    torch.manual_seed(a.seed)  # the same initial weights on every rank (DDP also broadcasts them)
    torch.set_float32_matmul_precision("high")

    model, shape = train_reference.build(a)
    model = model.to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    ddp = DDP(model, device_ids=[local] if cuda else None)
    fwd = torch.compile(ddp) if a.compile else ddp
    model.train()
    # each rank its own tokens, as each GPU reads its own slice of the data
    step = train_reference.training_step(torch, model, fwd, dev, a.batch, a.context, a.seed + 1 + rank)

    result = {
        "name": "pytorch-llama-ddp",
        "size": a.size,
        "context": a.context,
        "batch_per_gpu": a.batch,
        "gpus": world,
        "global_batch": world * a.batch,
        "compile": a.compile,
        "checkpoint": a.checkpoint,
        "params": n_params,
        "shape": shape,
        "torch_version": torch.__version__,
        "nccl_version": nccl_version(torch) if cuda else None,
        "gpu": torch.cuda.get_device_name(dev) if cuda else "cpu",
        "nvls": {v: os.environ.get(v) for v in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                                                "NVSHMEM_DISABLE_NVLS")},
    }
    # An exception (out of memory, say) ends this rank; torchrun then stops the others.
    times = []
    for _ in range(a.warmup):
        loss = step()
    if cuda:
        torch.cuda.synchronize()
    for _ in range(a.steps):
        loss, sec = train_reference.timed(torch, dev, step)
        times.append(sec * 1e3)
    final_loss = float(loss.detach().float().item())
    error = None if math.isfinite(final_loss) else "loss is not finite"
    med = statistics.median(times)
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0
    stats = torch.tensor([med, peak], device=dev, dtype=torch.float64)
    dist.all_reduce(stats, op=dist.ReduceOp.MAX)
    step_ms, peak = float(stats[0].item()), float(stats[1].item())
    if error is None and math.isfinite(step_ms):
        result["step_ms_median"] = round(step_ms, 3)
        result["step_ms_all_rank0"] = [round(t, 3) for t in times]
        result["tokens_per_s"] = round(world * a.batch * a.context / (step_ms / 1e3), 1)
        result["tokens_per_s_per_gpu"] = round(result["tokens_per_s"] / world, 1)
        result["loss_rank0"] = final_loss
    else:
        result["error"] = error or "a rank's loss is not finite"
        result["step_ms_median"] = None
        result["tokens_per_s"] = None
    result["peak_gib"] = round(peak, 3) if cuda else None

    if world >= 2:
        nbytes, secs, busbw = allreduce_probe(torch, dist, dev, world, a.allreduce_mb)
        result["allreduce"] = {"bytes": nbytes, "ms": round(secs * 1e3, 3), "algbw_gb_s": round(nbytes / secs / 1e9, 1),
                               "busbw_gb_s": round(busbw, 1), "dtype": "float32"}

    if rank == 0:
        line = (f"{result['name']} {a.size} ctx={a.context} batch={a.batch}/GPU gpus={world} "
                f"compile={a.compile} checkpoint={a.checkpoint}: ")
        if result["tokens_per_s"] is not None:
            line += (f"{result['tokens_per_s']:.0f} tok/s ({result['tokens_per_s_per_gpu']:.0f} per GPU), "
                     f"{result['step_ms_median']:.1f} ms/step, peak {result['peak_gib']} GiB, loss {final_loss:.3f}")
        else:
            line += f"FAILED ({result['error']}), peak {result['peak_gib']} GiB"
        print(line, flush=True)
        if "allreduce" in result:
            r = result["allreduce"]
            print(f"{dist.get_backend()} all-reduce {r['bytes'] / 1e6:.0f} MB fp32 over {world} ranks: {r['ms']:.2f} ms, "
                  f"algbw {r['algbw_gb_s']:.0f} GB/s, busbw {r['busbw_gb_s']:.0f} GB/s", flush=True)
        else:
            print("all-reduce probe skipped: one rank", flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(result, f, indent=1)
    dist.destroy_process_group()
    return 0 if "error" not in result else 1


if __name__ == "__main__":
    sys.exit(main())
