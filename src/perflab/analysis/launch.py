"""Launch statistics, and whether the workload is launch-bound.

- **Launch-API CPU time**: the duration of each CUDA runtime/driver call, summed and averaged per API.
- **Launch-to-start delay**: per launch call, the start of the first GPU activity it launched minus the
  end of the call (for a cudaGraphLaunch, the graph's first kernel). Median and p90.
- **Verdict**. Over the step windows (the whole trace if there are no steps): the workload is
  *launch-bound* when host-bound idle exceeds busy time — the GPU spends longer waiting for the CPU to
  launch work than doing work; *partly launch-bound* when host-bound idle is at least a quarter of the
  wall time; otherwise *not launch-bound*. The message gives the numbers per step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from perflab import units
from perflab.analysis.accounting import Accounting
from perflab.analysis.intervals import interval_at, sum_by_group

PARTLY_LAUNCH_BOUND_SHARE = 0.25


@dataclass(frozen=True)
class LaunchVerdict:
    verdict: str  # launch-bound | partly launch-bound | not launch-bound
    launch_bound: bool
    host_bound_ns: float  # per step (or for the whole trace without steps)
    busy_ns: float
    wall_ns: float
    message: str


def launch_api_stats(launches: pd.DataFrame, kernels: pd.DataFrame, delays: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per API name: calls, total_ns, mean_ns (CPU time in the call), activities (GPU activities it
    launched), delay_median_ns and delay_p90_ns (launch-to-start). Sorted by total time.
    ``delays``: launch_delays(kernels), if already computed."""
    labels = list(launches["name"].cat.categories)
    codes = launches["name"].cat.codes.to_numpy().astype(np.int64)
    duration = (launches["end_ns"] - launches["start_ns"]).to_numpy()
    calls = np.bincount(codes, minlength=len(labels))
    total = sum_by_group(duration, codes, len(labels))
    frame = pd.DataFrame({"api": labels, "calls": calls.astype(np.int64), "total_ns": total, "mean_ns": total / np.maximum(calls, 1)})
    activities = kernels["launch_api"].value_counts()
    activities.index = activities.index.astype(str)
    frame["activities"] = frame["api"].map(activities).fillna(0).astype(np.int64)
    delays = launch_delays(kernels) if delays is None else delays
    grouped = delays.groupby("api", observed=True)["delay_ns"]
    frame["delay_median_ns"] = frame["api"].map(grouped.median())
    frame["delay_p90_ns"] = frame["api"].map(grouped.quantile(0.9))
    return frame[frame["calls"] > 0].sort_values("total_ns", ascending=False, kind="stable").reset_index(drop=True)


def launch_delays(kernels: pd.DataFrame) -> pd.DataFrame:
    """One row per launch call that launched GPU work: api, launch_start_ns, launch_end_ns, first_start_ns, delay_ns."""
    linked = (kernels["launch_tid"] >= 0).to_numpy()
    tid = kernels["launch_tid"].to_numpy()[linked]
    correlation = kernels["correlation"].to_numpy()[linked]
    # a launch call is its thread and correlation id (a graph launch has many activities)
    codes, uniques = pd.factorize((tid << 32) | (correlation & 0xFFFFFFFF))
    rows = np.flatnonzero(linked)
    one_row = np.empty(len(uniques), dtype=np.int64)
    one_row[codes] = rows
    start = np.full(len(uniques), np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(start, codes, kernels["start_ns"].to_numpy()[linked])
    rows = one_row
    launch_end = kernels["launch_end_ns"].to_numpy()[rows]
    api = kernels["launch_api"]
    return pd.DataFrame({
        "api": pd.Categorical.from_codes(api.cat.codes.to_numpy()[rows], categories=[str(c) for c in api.cat.categories]),
        "launch_start_ns": kernels["launch_start_ns"].to_numpy()[rows],
        "launch_end_ns": launch_end,
        "first_start_ns": start,
        "delay_ns": start - launch_end,
    })


def delay_summary(kernels: pd.DataFrame, delays: pd.DataFrame | None = None) -> dict[str, float | None]:
    delays = (launch_delays(kernels) if delays is None else delays)["delay_ns"].to_numpy()
    if len(delays) == 0:
        return {"launches": 0, "median_ns": None, "p90_ns": None}
    return {"launches": int(len(delays)), "median_ns": float(np.median(delays)), "p90_ns": float(np.percentile(delays, 90))}


def launch_verdict(accounting: Accounting, cpu_only: bool = False) -> LaunchVerdict:
    """Launch-bound or not, in numbers (see the module docstring for the rule). ``cpu_only``: a CPU-only trace, whose
    work is its operators: the same rule, said of the interpreter's time between operators."""
    steps = accounting.steps
    n = max(len(steps), 1)
    host = float(steps["host_bound_ns"].sum()) / n
    busy = float(steps["busy_ns"].sum()) / n
    wall = float(steps["wall_ns"].sum()) / n
    scope = "of each step" if accounting.has_step_annotations else "of the trace"
    per = " per step" if accounting.has_step_annotations else ""
    share = host / wall if wall else 0.0
    numbers = f"(host-bound idle {units.duration(host)} vs {units.duration(busy)} busy{per})"
    if cpu_only:
        numbers = f"({units.duration(busy)} in operators, {units.duration(host)} between them{per})"
        busy_share = busy / wall if wall else 0.0
        if host > busy:
            verdict, message = "interpreter-bound", f"interpreter-bound: {share:.0%} {scope} is Python between torch's operators {numbers}"
        else:
            verdict, message = "operator-bound", f"operator-bound: torch's operators run {busy_share:.0%} {scope} {numbers}"
        return LaunchVerdict(verdict, host > busy, host, busy, wall, message)
    if host > busy:
        verdict = "launch-bound"
        message = f"launch-bound: the GPU is idle {share:.0%} {scope} waiting for launches {numbers}"
    elif wall and share >= PARTLY_LAUNCH_BOUND_SHARE:
        verdict = "partly launch-bound"
        message = f"partly launch-bound: the GPU waits for launches {share:.0%} {scope} {numbers}"
    else:
        verdict = "not launch-bound"
        busy_share = busy / wall if wall else 0.0
        message = f"not launch-bound: the GPU is busy {busy_share:.0%} {scope} {numbers}"
    return LaunchVerdict(verdict, verdict == "launch-bound", host, busy, wall, message)


SYNC_CALLS = re.compile(r"Synchronize|^cudaMemcpy$|^cuMemcpyDtoH")  # calls in which the host waits for the GPU
# A launch call whose work started this long after the call returned found the GPU behind the host: its queue held
# that much work already. Such a call that took long was blocked on a full launch queue (CUDA's queue holds about a
# thousand launches), waiting for the GPU to free a slot, not issuing.
BACKED_UP_NS = 100_000
UNBLOCKED_CALL_NS = 10_000  # a launch call's own cost where no call of its API ran unblocked (a typical one's, profiled)


def blocked_launch_ns(kernels: pd.DataFrame) -> pd.DataFrame:
    """Per launch call that launched GPU work (``launch_delays``' rows): ``launch_start_ns``, ``launch_end_ns`` and
    ``blocked_ns``, the part of the call spent waiting on a full launch queue: for a call whose work started
    ``BACKED_UP_NS`` or more after it returned, its duration beyond the median duration of its API's calls that found the
    GPU caught up (``UNBLOCKED_CALL_NS`` where none did); 0 for every other call."""
    calls = launch_delays(kernels)
    api = calls["api"].astype(str).to_numpy()
    duration = (calls["launch_end_ns"] - calls["launch_start_ns"]).to_numpy()
    backed_up = (calls["delay_ns"] >= BACKED_UP_NS).to_numpy()
    blocked = np.zeros(len(calls), dtype=np.int64)
    for name in np.unique(api[backed_up]).tolist():
        mine = api == name
        free = duration[mine & ~backed_up]
        typical = int(np.median(free)) if len(free) else UNBLOCKED_CALL_NS
        waited = mine & backed_up
        blocked[waited] = np.clip(duration[waited] - typical, 0, None)
    return pd.DataFrame({"launch_start_ns": calls["launch_start_ns"].to_numpy(), "launch_end_ns": calls["launch_end_ns"].to_numpy(),
                         "blocked_ns": blocked})


def idle_after_syncs(trace) -> dict | None:
    """The GPU's idle time that follows each synchronising call in a trace's step windows (a ``loss.item()``: the host
    waited until the GPU ran dry, so until the host launches again the GPU has nothing to do): per call, from its return
    (or the end of the last GPU activity before it, if later) to the start of the next GPU activity, within its window.
    Returns {"calls_per_step", "idle_ms_per_step", "steps"}, or None where the trace has no step windows; the calls
    are the CUDA runtime's (``SYNC_CALLS``), so a CPU trace has none."""
    from perflab.analysis.accounting import step_windows

    kernels = trace.kernels
    if trace.cpu_only or kernels is None or not len(kernels) or not len(trace.steps):
        return None
    windows = step_windows(kernels, trace.steps)
    starts_w, ends_w = windows["start_ns"].to_numpy(np.int64), windows["end_ns"].to_numpy(np.int64)
    calls = trace.launches
    is_sync = calls["name"].astype(str).str.contains(SYNC_CALLS.pattern, regex=True).to_numpy()
    call_end = calls["end_ns"].to_numpy(np.int64)[is_sync]
    order = np.argsort(kernels["start_ns"].to_numpy(np.int64), kind="stable")
    k_start = kernels["start_ns"].to_numpy(np.int64)[order]
    k_end_so_far = np.maximum.accumulate(kernels["end_ns"].to_numpy(np.int64)[order])
    idle = np.zeros(len(windows))
    count = np.zeros(len(windows))
    for t, w in zip(call_end.tolist(), interval_at(starts_w, ends_w, call_end).tolist()):
        if w < 0:
            continue  # outside every step (perflab's own synchronisation after the last traced step)
        j = int(np.searchsorted(k_start, t, side="right"))
        drained_at = max(t, int(k_end_so_far[j - 1]) if j > 0 else t)
        next_start = min(int(k_start[j]) if j < len(k_start) else ends_w[w], ends_w[w])
        idle[w] += max(next_start - drained_at, 0)
        count[w] += 1
    return {"calls_per_step": float(count.mean()), "idle_ms_per_step": float(idle.mean()) / 1e6, "steps": int(len(windows))}


def traced_host_issue_ms(trace, without_waits: bool = False) -> float:
    """Median over steps of the CPU time to issue one step in a trace: step start → end of its last
    launch call (profiled, so inflated; see measure.host for the untraced figure). ``without_waits``: less the time
    the host spent waiting for the GPU in that stretch: inside synchronising calls (a program's ``loss.item()`` each
    step waits for the GPU there) and inside launch calls blocked on a full launch queue (``blocked_launch_ns``: a
    GPU-bound step's host runs ahead until the queue fills, then every launch waits for a kernel to finish). That wait
    is the GPU's time, not the host's."""
    from perflab.analysis.accounting import step_windows, window_of_activities

    kernels = trace.kernels
    windows = step_windows(kernels, trace.steps)
    window = window_of_activities(kernels, windows, whole_trace=len(trace.steps) == 0)
    launch_end = kernels["launch_end_ns"].to_numpy()
    starts = windows["start_ns"].to_numpy()
    waits = blocked = None
    if without_waits:
        calls = trace.launches
        is_wait = calls["name"].astype(str).str.contains(SYNC_CALLS.pattern, regex=True).to_numpy()
        waits = (calls["start_ns"].to_numpy()[is_wait], calls["end_ns"].to_numpy()[is_wait])
        blocked = blocked_launch_ns(kernels)
        blocked = blocked[blocked["blocked_ns"] > 0]
    issue = []
    for w in range(len(windows)):
        ends = launch_end[(window == w) & (launch_end >= 0)]
        if len(ends):
            last = ends.max()
            waited = 0
            if waits is not None:
                waited = int(np.clip(np.minimum(waits[1], last) - np.maximum(waits[0], starts[w]), 0, None).sum())
                inside = (blocked["launch_start_ns"].to_numpy() >= starts[w]) & (blocked["launch_end_ns"].to_numpy() <= last)
                waited += int(blocked["blocked_ns"].to_numpy()[inside].sum())
            issue.append(max(last - starts[w] - waited, 0))
    return float(np.median(issue)) / 1e6 if issue else 0.0
