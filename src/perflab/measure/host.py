"""The CPU time to issue one step, measured without the profiler.

A profiled pass slows the host about 2× (the profiler records every op and launch), so issue times read
from a trace overstate what the CPU needs. Here: synchronise, read the clock, run the step (which returns
once every kernel is launched, unless the launch queue fills), read the clock, synchronise; the median
over ``iters`` steps.
"""

from __future__ import annotations

import statistics
import time



def host_issue_ms(case, iters: int = 20) -> float:
    from perflab.runtime.device import synchronize
    from perflab.runtime.workload import warm_workload

    samples = []
    with warm_workload(case) as work:
        for _ in range(iters):
            synchronize(case.device)
            t0 = time.perf_counter()
            work.step()
            samples.append(time.perf_counter() - t0)
            synchronize(case.device)
    return statistics.median(samples) * 1e3
