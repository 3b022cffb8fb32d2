"""The time of one piece of device work, for the benchmarks of loco.torch (bench/torch_gpu.py,
bench/torch_sync_parts.py)."""
import statistics
import time

import torch


def median_seconds(f, device, runs):
    """f()'s seconds, the median of `runs` runs after an untimed one: on CUDA between two events
    on the current stream (the device's time, the host not waited for between them), else on the
    host's clock."""
    f()
    out = []
    for _ in range(runs):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            f()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b) / 1000)
        else:
            t0 = time.perf_counter()
            f()
            out.append(time.perf_counter() - t0)
    return statistics.median(out)
