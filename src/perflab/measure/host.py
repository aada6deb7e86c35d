"""The CPU time to issue one step, measured without the profiler.

A profiled pass slows the host about 2× (the profiler records every op and launch), so issue times read
from a trace overstate what the CPU needs. Here: synchronise, read the clock, run the step (which returns
once every kernel is launched, unless the launch queue fills), read the clock, synchronise; the median
over ``iters`` steps. The harness takes 3 such steps after warm-up for each row's ``host_issue_ms`` and
``host_bound_frac``: issue time ÷ the time of the same steps to their synchronise, both taken under the
same host conditions. Near 1 the step is launch-bound (the GPU waits for the host); well under 1 the GPU
is busy while the host is done (GPU-bound); on the CPU the step runs where it is issued, so 1.
``perflab explain`` takes 20 steps.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable


def issue_s(step: Callable[[], object], device: str, iters: int = 3) -> tuple[float, float]:
    """(median seconds for the host to issue one step of a warm ``step``, median seconds of the same steps to
    their synchronise): each step starts on an idle device and is synchronised after."""
    from perflab.runtime.device import synchronize

    issued, done = [], []
    for _ in range(iters):
        synchronize(device)
        t0 = time.perf_counter()
        step()
        issued.append(time.perf_counter() - t0)
        synchronize(device)
        done.append(time.perf_counter() - t0)
    return statistics.median(issued), statistics.median(done)


def host_issue_ms(case, iters: int = 20) -> float:
    from perflab.runtime.workload import warm_workload

    with warm_workload(case) as work:
        return issue_s(work.step, case.device, iters)[0] * 1e3
