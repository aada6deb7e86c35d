"""The host-speed canary: how fast this host runs the launch path's kind of work, just before each timed loop.

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
**median µs per run**: 4–7 ms in all. Lower is a faster host. The number is comparable only between
rows of one environment (same host, CPU, torch: another torch dispatches differently), which is how
:func:`mark_host_drift` uses it. It reads how fast a core runs this process (clock, hypervisor steal,
neighbours on the socket), not how much of a core the process gets: a few-ms canary fits in one scheduler
slice and its median drops a preempted run, so other processes time-sharing the cores slow the timings
without moving it (``benchmarks/host_canary.py``; ``docs/performance.md``).

**host_drift.** A row whose canary differs from the median canary of the rows stored under its
environment key by more than ``HOST_DRIFT_THRESHOLD`` (15%) is flagged ``host_drift``: its eager timing
was taken on a host running at a different speed from the rest of the sweep. The flag is computed when
rows are read (``perflab results``, ``perflab report``, ``api.bench``), never stored, so it follows the
rows present (a resumed sweep is judged as a whole) and cannot change a case id or a stored row.
This module imports torch only inside :func:`host_canary`; reading and flagging need none.
"""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Iterable

PY_LOOPS = 1000  # interpreter iterations per run
TORCH_ITERS = 25  # × 4 tiny torch CPU ops per run
REPEATS = 11  # timed runs; the median is reported

CANARY_KEY = "host_canary_us"  # the row's field: median µs per canary run
RATIO_KEY = "host_canary_ratio"  # set when rows are read: canary ÷ the median of its environment's rows
HOST_DRIFT_FLAG = "host_drift"
HOST_DRIFT_THRESHOLD = 0.15  # |canary ÷ median − 1| above this flags the row
HOST_DRIFT_MIN_ROWS = 3  # fewer canaries in an environment give no reference (with 2, which one drifted?)
_WARNING_PREFIX = "host speed:"


@dataclass(frozen=True)
class Canary:
    median_us: float  # µs per run, the median of the timed runs
    min_us: float
    samples_us: tuple[float, ...]


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

    samples = []
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        with torch.inference_mode(False), torch.no_grad(), torch.autocast("cpu", enabled=False):
            for i in range(repeats + 1):
                t0 = time.perf_counter_ns()
                _python_work(PY_LOOPS)
                _dispatch_work(torch, TORCH_ITERS)
                elapsed_us = (time.perf_counter_ns() - t0) / 1e3
                if i:  # the first run warms the code paths and caches
                    samples.append(elapsed_us)
    finally:
        if gc_was_enabled:
            gc.enable()
    return Canary(statistics.median(samples), min(samples), tuple(samples))


# ---------------------------------------------------------------------------------------------------
# host_drift: rows against the median canary of their environment


def mark_host_drift(rows: Iterable[dict], threshold: float = HOST_DRIFT_THRESHOLD,
                    group: Callable[[dict], object] = lambda row: row.get("env_key")) -> list[dict]:
    """The rows, each with a canary carrying ``host_canary_ratio`` (canary ÷ the median canary of its group's
    rows) and, for ``ok`` rows beyond ``threshold``, the flag ``host_drift`` and a warning.

    Groups are environment keys by default (rows without one form one group, as a bench run's rows do).
    The median is over every row of the group that has a canary, whatever its status (the canary runs
    before the case, so a failed case's canary is as good a sample of the host); only ``ok`` rows are
    flagged (a failed row has no timing to doubt). Rows without a canary (old stores, rows the sweep's
    parent wrote for a timed-out or crashed worker) are never flagged and do not count; a group of fewer
    than ``HOST_DRIFT_MIN_ROWS`` canaries has no reference. Rows that change are copies; a ``host_drift``
    already on a row is recomputed, not repeated.
    """
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
        stale = HOST_DRIFT_FLAG in (row.get("flags") or [])
        if value is None or (group(row) not in reference and not stale):
            out.append(row)
            continue
        row = dict(row, flags=[f for f in row.get("flags") or [] if f != HOST_DRIFT_FLAG],
                   warnings=[w for w in row.get("warnings") or [] if not str(w).startswith(_WARNING_PREFIX)])
        row.pop(RATIO_KEY, None)
        median = reference.get(group(row))
        if median is not None:
            ratio = value / median
            row[RATIO_KEY] = ratio
            if row.get("status") == "ok" and abs(ratio - 1.0) > threshold:
                row["flags"].append(HOST_DRIFT_FLAG)
                row["warnings"].append(
                    f"{_WARNING_PREFIX} the host canary took {value:.0f} µs, {ratio:.2f}× the median {median:.0f} µs of this "
                    f"environment's rows (threshold ±{threshold:.0%}); launch-bound timings of this case reflect the host's speed"
                )
        out.append(row)
    return out


def _canary(row: dict) -> float | None:
    value = row.get(CANARY_KEY)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        return None
    return float(value)
