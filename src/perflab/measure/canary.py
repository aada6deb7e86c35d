"""The host-speed canary: how fast this host runs the launch path's kind of work, around each timed loop; the host flags.

Launch-bound eager timings drift with the host CPU: the same DeiT-B bs1 eager case measured 2.0–3.1 ms
across processes on one machine and 4.2–5.6 ms on another, with the GPU's work unchanged. The canary
times a fixed single-threaded CPU micro-workload made of what an eager step spends its host time on, so
a row can say whether its host was slow, and a slower host can be told from a slower model:

- **Python**: ``PY_LOOPS`` iterations of interpreter work (a method call, attribute loads, integer
  arithmetic, a dict store), the kind of work ``nn.Module.__call__`` and argument handling cost per op;
- **dispatch**: ``TORCH_ITERS`` × 4 tiny torch ops on 8-element float32 CPU tensors (``add``, ``mul``,
  in-place ``add_``, a view and a slice): the Python binding, the dispatcher and a tensor allocation,
  which an eager CUDA op pays before its driver launch call. CPU tensors, so the canary is the same
  workload whatever device the case runs on, and the GPU is not touched.

One run takes 0.31–0.6 ms on the 2-core development VM; :func:`host_canary` does one untimed run, then
``REPEATS`` timed runs with the garbage collector off (as ``timeit`` does) and in a fixed autograd and
autocast state (the caller's ``no_grad`` or autocast would change the dispatch path), and returns the
**median µs per run** (4–7 ms in all), the fastest run, the thread's CPU time ÷ wall time over the timed
runs (well under 1: the canary was descheduled, its wall time is not the core's speed) and the CPU it ran
on. Lower is a faster host. The harness runs it twice, with no GPU work in flight and NVML's sampler
thread not running, on the timing thread's (pinned) core: just before the timed loop and just after it;
the row's ``host_canary_us`` is the faster of the two medians (:func:`canary_fields`; a transient at one
end does not count, a host slow over the loop reads slow at both ends), and both, the fastest run, the
CPU-time share and the CPUs are kept as diagnostics. The number is comparable only between rows of one
environment (same host, CPU, torch: another torch dispatches differently), which is how
:func:`mark_host_flags` uses it. It reads how fast a core runs this process (clock, hypervisor steal,
neighbours on the socket), not how much of a core the process gets: a few-ms canary fits in one scheduler
slice and its median drops a preempted run, so other processes time-sharing the cores slow the timings
without moving it (``benchmarks/host_canary.py``; ``docs/performance.md``). Time-sharing is read
directly instead, as ``host_contention`` (``measure.sched``).

**Host flags**, computed when rows are read (``perflab results``, ``perflab report``, ``api.bench``), never
stored, so they follow the rows present (a resumed sweep is judged as a whole) and the thresholds of the
code reading them, and cannot change a case id or a stored row:

- ``host_drift``: the row's canary differs from the median canary of the rows stored under its
  environment key by more than ``HOST_DRIFT_THRESHOLD`` (15%): its eager timing was taken on a host running
  at a different speed from the rest of the sweep;
- ``host_contention``: its timing thread waited for a CPU, or its VM had CPU time stolen, for more than
  a threshold share of the timed loop (``measure.sched``).

Neither applies to a **GPU-bound** row: one whose host needs under ``HOST_BOUND_THRESHOLD`` (half) of the
GPU's time to issue a step (``host_bound_frac``: the harness measures the two apart, holding the GPU with a
sleep kernel while the host issues, ``measure.host.held_timing``): the GPU stays busy while the host has
finished, so a host up to twice as slow, or held up, does not move the timing. Such rows get ``host_exempt`` (the
flags waived there, often none) and the reports say so in one line.
This module imports torch only inside :func:`host_canary`; reading and flagging need none.
"""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Iterable

from perflab.host_flags import HOST_CONTENTION_FLAG, HOST_DRIFT_FLAG, HOST_FLAGS

PY_LOOPS = 1000  # interpreter iterations per run
TORCH_ITERS = 25  # × 4 tiny torch CPU ops per run
REPEATS = 11  # timed runs; the median is reported

CANARY_KEY = "host_canary_us"  # the row's field: median µs per canary run
RATIO_KEY = "host_canary_ratio"  # set when rows are read: canary ÷ the median of its environment's rows
HOST_DRIFT_THRESHOLD = 0.15  # |canary ÷ median − 1| above this flags the row
HOST_DRIFT_MIN_ROWS = 3  # fewer canaries in an environment give no reference (with 2, which one drifted?)
# GPU-bound exemption. host_bound_frac = the host's time to issue one step ÷ the GPU's time to run it, measured
# apart. Below this the host runs ahead of the GPU: a host up to 1 / 0.5 = 2× slower, or held up for up to half
# a step, still issues the next step before the GPU needs it, so the host flags do not apply.
HOST_BOUND_KEY = "host_bound_frac"
HOST_BOUND_THRESHOLD = 0.5
EXEMPT_KEY = "host_exempt"  # set when rows are read on GPU-bound rows: the host flags waived there (often none)
_WARNING_PREFIX = "host speed:"
_CONTENTION_PREFIX = "host contention:"
_WARNING_PREFIXES = (_WARNING_PREFIX, _CONTENTION_PREFIX)


@dataclass(frozen=True)
class Canary:
    median_us: float  # µs per run, the median of the timed runs
    min_us: float
    samples_us: tuple[float, ...]
    cpu_frac: float | None = None  # thread CPU time ÷ wall time over the timed runs (well under 1: descheduled)
    cpu: int | None = None  # the CPU the thread ran on at the start (None where /proc does not say)
    cpu_end: int | None = None  # ... and at the end (another one: the thread migrated meanwhile)


class _Node:
    __slots__ = ("value", "scale")

    def __init__(self, value: int):
        self.value = value
        self.scale = 3

    def forward(self, x: int) -> int:
        return (x * self.scale + self.value) & 0xFFFF


def _python_work(loops: int) -> int:
    node, table, acc = _Node(7), {}, 0
    for i in range(loops):
        acc = node.forward(acc + i)
        table[i & 31] = acc
    return acc


def _dispatch_work(torch, iters: int):
    a = torch.ones(8)
    b = torch.full((8,), 0.5)
    for _ in range(iters):
        c = torch.add(a, b)
        c = c * b
        c.add_(1.0)
        a = c.view(-1)[:8]
    return a


def host_canary(repeats: int = REPEATS) -> Canary:
    """Time the canary: one untimed run, then ``repeats`` timed runs (µs each); see the module docstring."""
    import torch

    from perflab.clock import host_samples_ns
    from perflab.measure.sched import current_cpu

    def run():
        _python_work(PY_LOOPS)
        _dispatch_work(torch, TORCH_ITERS)

    gc_was_enabled = gc.isenabled()
    gc.disable()
    cpu = current_cpu()
    try:
        with torch.inference_mode(False), torch.no_grad(), torch.autocast("cpu", enabled=False):
            run()  # the first run warms the code paths and caches
            wall0, cpu0 = time.perf_counter_ns(), time.thread_time_ns()
            samples = [ns / 1e3 for ns in host_samples_ns(run, repeats)]
            wall, cpu_ns = time.perf_counter_ns() - wall0, time.thread_time_ns() - cpu0
    finally:
        if gc_was_enabled:
            gc.enable()
    return Canary(statistics.median(samples), min(samples), tuple(samples), cpu_ns / wall if wall > 0 else None, cpu, current_cpu())


def canary_fields(before: Canary, after: Canary | None = None) -> dict:
    """The row's canary keys from the canary before the timed loop and the one after it.

    ``host_canary_us``, the value ``host_drift`` judges, is the faster of the two medians: a transient
    slowdown at one end of the loop does not count, a host slow over the whole loop reads slow at both ends.
    The rest are diagnostics: each median, the fastest single run of both, the lower CPU-time share of the two
    (wall time the thread was not on a CPU lowers it: a descheduled canary, not a slow one) and the CPUs."""
    both = [c for c in (before, after) if c is not None]
    cpu_fracs = [c.cpu_frac for c in both if c.cpu_frac is not None]
    return {
        CANARY_KEY: min(c.median_us for c in both),
        "host_canary_before_us": before.median_us,
        "host_canary_after_us": after.median_us if after is not None else None,
        "host_canary_min_us": min(c.min_us for c in both),
        "host_canary_cpu_frac": min(cpu_fracs) if cpu_fracs else None,
        "host_cpu": before.cpu,
        "host_cpu_after": after.cpu_end if after is not None else before.cpu_end,
    }


# ---------------------------------------------------------------------------------------------------
# Host flags when rows are read: host_drift (against the environment's median canary), host_contention
# (the row's own run-queue wait and steal), both waived on GPU-bound rows.


def host_exempt(row: dict, bound_threshold: float = HOST_BOUND_THRESHOLD) -> bool:
    """Whether the row is GPU-bound enough that the host's speed cannot move its timing: its host issue time is
    under ``bound_threshold`` of its step time (``host_bound_frac``; rows without one are not exempt)."""
    frac = _number(row.get(HOST_BOUND_KEY))
    return frac is not None and frac < bound_threshold


def mark_host_flags(rows: Iterable[dict], threshold: float = HOST_DRIFT_THRESHOLD,
                    group: Callable[[dict], object] = lambda row: row.get("env_key"),
                    wait_threshold: float | None = None, steal_threshold: float | None = None,
                    bound_threshold: float = HOST_BOUND_THRESHOLD) -> list[dict]:
    """The rows, judged for the host flags; rows that change are copies, flags already on a row are recomputed.

    **host_drift**: each row with a canary gets ``host_canary_ratio`` (canary ÷ the median canary of its group's
    rows); an ``ok`` row beyond ``threshold`` gets the flag and a warning. Groups are environment keys by
    default (rows without one form one group, as a bench run's rows do). The median is over every row of the
    group that has a canary, whatever its status (the canary is as good a sample of the host for a failed
    case); rows without a canary (old stores, rows the sweep's parent wrote for a timed-out or crashed
    worker) are never flagged and do not count; a group of fewer than ``HOST_DRIFT_MIN_ROWS`` canaries has
    no reference.

    **host_contention**: an ``ok`` row whose ``host_wait_frac`` or ``host_steal_frac`` exceeds its threshold
    (``measure.sched``); rows without them are never flagged.

    **GPU-bound rows** (:func:`host_exempt`) get neither flag: ``host_exempt`` lists the flags waived (often
    none). Their canary still counts in the median.
    """
    from perflab.measure.sched import HOST_STEAL_THRESHOLD, HOST_WAIT_THRESHOLD, STEAL_KEY, WAIT_KEY

    wait_threshold = HOST_WAIT_THRESHOLD if wait_threshold is None else wait_threshold
    steal_threshold = HOST_STEAL_THRESHOLD if steal_threshold is None else steal_threshold
    rows = list(rows)
    canaries: dict[object, list[float]] = {}
    for row in rows:
        value = _canary(row)
        if value is not None:
            canaries.setdefault(group(row), []).append(value)
    reference = {key: statistics.median(values) for key, values in canaries.items() if len(values) >= HOST_DRIFT_MIN_ROWS}
    out = []
    for row in rows:
        value = _canary(row)
        stale = any(f in HOST_FLAGS for f in row.get("flags") or []) or RATIO_KEY in row or EXEMPT_KEY in row
        median = reference.get(group(row)) if value is not None else None
        wait, steal = _number(row.get(WAIT_KEY)), _number(row.get(STEAL_KEY))
        exempt = row.get("status") == "ok" and host_exempt(row, bound_threshold)
        if median is None and not stale and wait is None and steal is None and not exempt:
            out.append(row)
            continue
        row = dict(row, flags=[f for f in row.get("flags") or [] if f not in HOST_FLAGS],
                   warnings=[w for w in row.get("warnings") or [] if not str(w).startswith(_WARNING_PREFIXES)])
        row.pop(RATIO_KEY, None)
        row.pop(EXEMPT_KEY, None)
        raised: list[tuple[str, str]] = []
        if median is not None:
            ratio = value / median
            row[RATIO_KEY] = ratio
            if row.get("status") == "ok" and abs(ratio - 1.0) > threshold:
                raised.append((HOST_DRIFT_FLAG,
                    f"{_WARNING_PREFIX} the host canary took {value:.0f} µs, {ratio:.2f}× the median {median:.0f} µs of this "
                    f"environment's rows (threshold ±{threshold:.0%}); launch-bound timings of this case reflect the host's speed"
                ))
        if row.get("status") == "ok":
            busy = []
            if wait is not None and wait > wait_threshold:
                busy.append(f"the timing thread waited for a CPU {wait:.1%} of the timed loop (threshold {wait_threshold:.0%})")
            if steal is not None and steal > steal_threshold:
                busy.append(f"the hypervisor stole {steal:.1%} of its CPU time (threshold {steal_threshold:.0%})")
            if busy:
                raised.append((HOST_CONTENTION_FLAG, f"{_CONTENTION_PREFIX} {'; '.join(busy)}: other work shared the host, "
                                                     "and launch-bound timings of this case include the wait"))
        if exempt:
            row[EXEMPT_KEY] = [flag for flag, _ in raised]
        else:
            for flag, message in raised:
                row["flags"].append(flag)
                row["warnings"].append(message)
        out.append(row)
    return out


def _number(value) -> float | None:
    """A real number (not a bool, not NaN), else None: the check every stored figure read here needs."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return None
    return float(value)


def _canary(row: dict) -> float | None:
    value = _number(row.get(CANARY_KEY))
    return value if value is not None and value > 0 else None
