"""Timing of a step function: CUDA events on the GPU, perf_counter on the CPU.

The timed region is one continuous loop of ``n_blocks × block_iters`` steps. On CUDA an event is recorded
before the first step and after each block, and the host synchronises once at the end, so the loop is the
same as a bare event-timed loop; each block gives one sample (mean ms per step in that block).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from perflab.clock import StepClock
from perflab.runtime.device import synchronize


@dataclass(frozen=True)
class TimingPlan:
    n_blocks: int
    block_iters: int
    extra: int = 0  # the first `extra` blocks run one step more (an --iters that does not divide evenly)

    @property
    def block_sizes(self) -> list[int]:
        return [self.block_iters + (1 if b < self.extra else 0) for b in range(self.n_blocks)]

    @property
    def total_iters(self) -> int:
        return self.n_blocks * self.block_iters + self.extra


@dataclass(frozen=True)
class Timing:
    samples_ms: np.ndarray  # mean ms per step, one value per block
    plan: TimingPlan
    wall_s: float  # host wall-clock time of the whole timed loop, synchronised at both ends

    @property
    def timed_s(self) -> float:
        return float((self.samples_ms * np.array(self.plan.block_sizes)).sum() / 1000.0)


def estimate_step_s(step: Callable[[], object], device: str, iters: int = 3) -> float:
    """Seconds per step, from a few synchronised calls (after warm-up)."""
    synchronize(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    synchronize(device)
    return (time.perf_counter() - t0) / iters




def plan_timing(step_s: float, repeats: int, min_time: float, min_iters: int, iters: int | None) -> TimingPlan:
    """Split the timed work into ``repeats`` blocks.

    With ``iters`` the total is exactly ``iters`` steps (fewer blocks if iters < repeats; when the blocks
    cannot all be equal, the first ones take one step more). Otherwise the loop aims for ``min_time`` seconds
    (the steps that last it, from the estimate), and takes more only while that is short of ``min_iters``:
    up to twice the steps for the time (a margin for an estimate that was too slow), never more than
    ``min_iters``. So a fast step times about ``min_time`` (at least ``min_iters`` steps, as before), and a slow
    one stops once the ``short_timing`` rule (``min_time`` seconds *or* ``min_iters`` steps) is met twice over,
    instead of running ``min_iters`` long steps. The total is rounded up to the same whole number of steps in
    each of the ``repeats`` blocks (at least one). A 700 ms step with min_time 0.3 s and 10 repeats runs 10
    steps, not 50; a 1 ms step with min_time 1 s runs 1000.
    """
    if iters is not None:
        n_blocks = min(repeats, iters)
        return TimingPlan(n_blocks, iters // n_blocks, iters % n_blocks)
    for_time = math.ceil(min_time / max(step_s, 1e-9))
    total = max(for_time, min(min_iters, 2 * for_time))
    return TimingPlan(repeats, max(1, math.ceil(total / repeats)))


def time_step(step: Callable[[], object], plan: TimingPlan, device: str) -> Timing:
    """One continuous loop of the plan's blocks, a :class:`StepClock` stamp before the first step and after each block
    (CUDA events on the GPU, the host clock on the CPU), read after one synchronisation at the end."""
    clock = StepClock(device == "cuda")
    clock.reserve(plan.n_blocks + 1)
    sizes = plan.block_sizes
    synchronize(device)
    t0 = time.perf_counter()
    marks = [clock.stamp()]
    for b in range(plan.n_blocks):
        for _ in range(sizes[b]):
            step()
        marks.append(clock.stamp())
    synchronize(device)
    wall_s = time.perf_counter() - t0
    block_ms, _ = clock.read_marks(marks)
    return Timing(np.array(block_ms) / np.array(sizes), plan, wall_s)
