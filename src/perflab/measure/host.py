"""The CPU time to issue one step, measured without the profiler.

A profiled pass slows the host about 2× (the profiler records every op and launch), so issue times read
from a trace overstate what the CPU needs. Here: synchronise, read the clock, run the step (which returns
once every kernel is launched, unless the launch queue fills), read the clock, synchronise; the median
over ``iters`` steps.
"""

from __future__ import annotations

import statistics
import time

import torch


def host_issue_ms(case, iters: int = 20) -> float:
    from perflab.models.registry import build_model
    from perflab.runtime.device import synchronize
    from perflab.runtime.inputs import image_batch
    from perflab.runtime.modes import make_step
    from perflab.runtime.precision import precision

    torch.manual_seed(case.seed)
    model, _ = build_model(case)
    model = model.to(case.device)
    x = image_batch(case.batch_size, case.input_size, case.device, case.seed)
    samples = []
    with torch.no_grad(), precision(case.dtype, case.device):
        step = make_step(model, x, case.mode)
        for _ in range(case.warmup + 1):
            step()
        for _ in range(iters):
            synchronize(case.device)
            t0 = time.perf_counter()
            step()
            samples.append(time.perf_counter() - t0)
            synchronize(case.device)
    return statistics.median(samples) * 1e3
