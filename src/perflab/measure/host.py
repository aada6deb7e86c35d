"""The CPU time to issue one step, measured without the profiler.

A profiled pass slows the host about 2× (the profiler records every op and launch), so issue times read
from a trace overstate what the CPU needs. Here: synchronise, read the clock, run the step (which returns
once every kernel is launched, unless the launch queue fills), read the clock, synchronise; the median
over ``iters`` steps. The harness takes 3 such steps after warm-up for each row's ``host_issue_ms`` and
``host_bound_frac``: issue time ÷ the time of the same steps to their synchronise, both taken under the
same host conditions; on the CPU the step runs where it is issued, so 1. ``perflab explain`` takes 20 steps.

That ratio is fooled by a full launch queue: the host then waits for the GPU to drain it, and a GPU-bound
step reads as launch-bound. :func:`held_timing` measures the two apart instead (the GPU held by a sleep kernel
while the host issues): the row's ``host_held_ms``, ``device_ms`` and ``host_bound_frac`` come from it, the
issue-based ratio only where it fails.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
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


# ---------------------------------------------------------------------------------------------------
# The step's GPU time and its host time, each measured with the other out of the way.

_SLEEP_CYCLES_PER_S: float | None = None


def _sleep_rate() -> float:
    """Clock cycles per second of ``torch.cuda._sleep`` on this GPU (measured once per process)."""
    global _SLEEP_CYCLES_PER_S
    if _SLEEP_CYCLES_PER_S is None:
        import torch

        from perflab.clock import StepClock

        cycles = 20_000_000
        clock = StepClock(cuda=True)
        clock.reserve(2)
        torch.cuda._sleep(1_000_000)  # the clocks come up
        start = clock.stamp()
        torch.cuda._sleep(cycles)
        end = clock.stamp()
        _SLEEP_CYCLES_PER_S = cycles / (clock.read(start, end)[0] / 1000.0)
    return _SLEEP_CYCLES_PER_S


@dataclass(frozen=True)
class HeldTiming:
    """A step's time on the GPU with the host never in the way, and the host's time to issue it with the GPU
    never in the way (``device_s``/``host_s`` per step, None where it could not be measured), and why not."""

    device_s: float | None
    host_s: float | None
    steps: int
    note: str | None = None  # why a figure is missing: the host waited for the GPU while issuing
    sleep_s: float | None = None  # the sleep of the try that succeeded (one round)
    rounds: int = 1  # rounds run (held_timing)


def held_timing(step: Callable[[], object], device: str, issue_estimate_s: float, steps: int = 3, rounds: int = 3) -> HeldTiming:
    """The median over ``rounds`` rounds of :func:`held_round` (a round whose host waited for the GPU counts
    out): one round is one sample of 3 steps' issue time, and on a shared host one preemption of the issuing
    thread (a millisecond) would be the row's host time; seen on an H100, a graph replay's 1.28 ms issue.

    Bounded in time (issue 23, P9): a step that cannot be held (it synchronises, or holds more launches than the
    queue) fails every try of every round, and on the H100's lm_sizes grid most GPU-bound steps did; their failed
    round (sleeps of 9, 18 and 36 times the issue estimate, 7 steps) was most of a large case's warm-up (gpt_2.7b
    forward_backward fp32 seq 1024: 138 s of warm-up in a 190 s case, 21 s timed). So a first round that fails ends
    the measurement (the next would fail the same way, the step being what it is; a later round that fails after
    one succeeded counts out, as before); a round's tries are :func:`held_plan`'s (15 issue times of sleep at most, 4
    steps); and a later round starts with the try that succeeded in the first."""
    got = []
    first_sleep_s, n = None, steps
    for _ in range(rounds):
        held = held_round(step, device, issue_estimate_s, n, first_sleep_s=first_sleep_s)
        got.append(held)
        if held.host_s is None:
            if len(got) == 1:
                break
            continue
        if first_sleep_s is None:
            first_sleep_s, n = held.sleep_s, held.steps
    good = [h for h in got if h.host_s is not None]
    if not good:
        return got[-1]
    return HeldTiming(statistics.median(h.device_s for h in good), statistics.median(h.host_s for h in good),
                      sum(h.steps for h in good), rounds=len(got))


HELD_MARGIN = 3.0  # a try's sleep: this many times the estimated issue time of the steps issued behind it
MIN_SLEEP_S = 4e-3


def held_plan(steps: int, issue_estimate_s: float, first_sleep_s: float | None = None) -> list[tuple[int, float]]:
    """The tries of one held round, (steps issued, seconds of sleep) each: ``steps`` steps behind ``HELD_MARGIN`` times
    their estimated issue, then one step behind twice that margin (a host slower than its estimate, or a queue that
    holds one step's launches and not three). A later round (``first_sleep_s``): the try that succeeded in the first.

    Before issue 23's cut a round tried 3 steps behind 3x, then 6x their issue, then one step behind 12x: 63 issue
    times of sleep and 7 steps before a step that cannot be held was given up, 15 and 4 now."""
    if first_sleep_s is not None:
        return [(steps, first_sleep_s)]
    return [(steps, max(MIN_SLEEP_S, HELD_MARGIN * steps * issue_estimate_s)), (1, max(MIN_SLEEP_S, 2 * HELD_MARGIN * issue_estimate_s))]


def held_round(step: Callable[[], object], device: str, issue_estimate_s: float, steps: int = 3,
               first_sleep_s: float | None = None) -> HeldTiming:
    """Hold the GPU with a sleep kernel, issue ``steps`` steps behind it, and let it go.

    While the GPU sleeps, the host issues the steps without waiting for it: their host time is the pure cost of
    issuing (``host_s``). When the sleep ends the GPU finds them all queued and runs them back to back: the
    events around them give the step's pure GPU time (``device_s``), which no launch gap lengthens. Both are
    valid only if the host finished issuing before the sleep ended, which the start event tells (not yet
    reached); else the next try of :func:`held_plan` (one step, a longer sleep). A step that still waits for
    the GPU synchronises inside (``.item()``, a data-dependent shape) or holds more launches than the queue: then
    both are None and ``note`` says so.

    A full launch queue cannot fool this the way it fools issue-to-sync ratios (``issue_s``): with the GPU held,
    the queue is only the steps issued here. On the CPU there is no GPU time: (None, None).
    """
    import torch

    from perflab.clock import StepClock

    if device != "cuda":
        return HeldTiming(None, None, steps, "no GPU")
    rate = _sleep_rate()
    clock = StepClock(cuda=True)
    n = steps
    for n, sleep_s in held_plan(steps, issue_estimate_s, first_sleep_s):
        torch.cuda.synchronize()
        clock.reserve(2)
        torch.cuda._sleep(int(sleep_s * rate))
        start = clock.stamp()
        for _ in range(n):
            step()
        issued = clock.stamp(on_device=False)
        reached = clock.reached(start)  # True: the sleep was over before the last step was issued
        end = clock.stamp()
        device_ms, _ = clock.read(start, end)
        if not reached:
            return HeldTiming(device_ms / 1000.0 / n, clock.read(start, issued)[1] / 1000.0 / n, n, sleep_s=sleep_s)
    return HeldTiming(None, None, n, "the host waited for the GPU while issuing one step: the step synchronises with the GPU "
                                     "(.item(), a data-dependent shape) or holds more launches than the launch queue")
