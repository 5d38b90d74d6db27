"""The benchmark scripts' one timer: median milliseconds of CUDA-event timings after warm-up."""
import statistics

import torch


def median_ms(fn, warmup=3, iters=20):
    """Calls `fn` `warmup` times, then times `iters` calls, each between two CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)
