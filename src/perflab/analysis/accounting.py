"""Exact time accounting: where every nanosecond of a window goes.

Definitions (all integer ns, so the identity below holds exactly, not to rounding):

- **GPU activity**: every row of the KernelTable (kernels, memcpy, memset) with a duration above zero.
  ``cuda_sync`` events are not activity (the loaders drop them; counting them as busy is HTA's bug).
- **Whole-trace window**: [min(first step start, first activity start), max(last activity end, last step
  end)].
- **Step windows** tile the steps' stretch of the timeline: window k = [start of step k, start of step
  k+1); the last one ends at max(its annotation's end, the end of the last GPU activity launched in it).
  A GPU activity belongs to the step in whose window its launch call started (its start, if unlinked).
  Without step annotations there is one window, the whole trace.
- **busy_ns**: the length of the union, over the device's streams, of the activity intervals, clipped
  to the window.
- **idle_ns** = wall_ns − busy_ns, split by the cause of each gap (a maximal stretch of the whole trace
  with no activity), decided once for the whole gap and then clipped to the window:
  - **host_bound**: the activity that ends the gap was launched by a call that *started* at or after the
    gap's start: the GPU ran dry and waited for the CPU to launch more. A gap at the end of the trace,
    with no activity after it, is host-bound too (the GPU had nothing queued while the CPU ran on).
  - **kernel_gap**: not host-bound, and the gap is shorter than the threshold (default 5 µs): the
    launch was queued, and this is the GPU's back-to-back launch overhead.
  - **other**: everything else: the work was queued in time but waited on something (an event, a
    synchronisation, another stream, a launch whose call is not in the trace).
  With several activities starting at the gap's end, the earliest-launched one decides.
- Identity, per window and overall: ``wall_ns = busy_ns + host_bound_ns + kernel_gap_ns + other_ns``.
- **Several devices** (a file of merged ranks, or one process driving several GPUs): each device is
  accounted on its own, with the steps annotated by the threads that launched its work (all steps if
  none of them did); ``steps`` gets one row per device and step, ``devices`` one row per device, and
  the whole-trace figures are sums over the devices (device-ns: the identity still holds exactly).

The whole trace is cut once into segments (busy blocks and classified gaps) that tile it; a window's
figures are prefix-sum differences over those segments, so accounting many windows costs one sort.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pandas as pd

from perflab.analysis.devices import devices_of, launching_threads
from perflab.analysis.intervals import interval_at, sum_by_group, union_blocks
from perflab.trace.schema import WORK_KINDS

DEFAULT_KERNEL_GAP_NS = 5_000
SEGMENT_KINDS = ("busy", "host_bound", "kernel_gap", "other")
BUSY, HOST_BOUND, KERNEL_GAP, OTHER = range(4)
IDLE_CAUSES = ("host_bound", "kernel_gap", "other")


@dataclass(frozen=True)
class Timeline:
    """The whole-trace window cut into segments (busy blocks and classified gaps) that tile it exactly."""

    start_ns: int
    end_ns: int
    seg_start: np.ndarray
    seg_end: np.ndarray
    seg_kind: np.ndarray  # index into SEGMENT_KINDS

    @cached_property
    def _cumulative(self) -> np.ndarray:
        """Row i: ns of each segment kind in the segments before segment i."""
        lengths = self.seg_end - self.seg_start
        cumulative = np.zeros((len(lengths) + 1, len(SEGMENT_KINDS)), dtype=np.int64)
        for kind in range(len(SEGMENT_KINDS)):
            cumulative[1:, kind] = np.cumsum(np.where(self.seg_kind == kind, lengths, 0))
        return cumulative

    def totals_at(self, t: np.ndarray) -> np.ndarray:
        """ns of each segment kind in [start_ns, t), for each t (shape (len(t), 4))."""
        t = np.clip(np.asarray(t, dtype=np.int64), self.start_ns, self.end_ns)
        index = np.maximum(np.searchsorted(self.seg_start, t, side="right") - 1, 0)  # the segment holding t
        result = self._cumulative[index].copy()
        if len(self.seg_start):
            result[np.arange(len(t)), self.seg_kind[index]] += np.maximum(t - self.seg_start[index], 0)
        return result


@dataclass
class Accounting:
    """Accounting of the whole trace (``trace``: one row) and of each step window (``steps``)."""

    trace: pd.Series
    steps: pd.DataFrame  # one row per (device, step window)
    kernel_gap_threshold_ns: int
    has_step_annotations: bool
    devices: pd.DataFrame | None = None  # whole-trace accounting of each device


def activity_launch_time(kernels: pd.DataFrame) -> np.ndarray:
    """When each activity was launched: its launch call's start, or its own start if it is not linked."""
    launch = kernels["launch_start_ns"].to_numpy()
    return np.where(launch >= 0, launch, kernels["start_ns"].to_numpy())


def trace_window(kernels: pd.DataFrame, steps: pd.DataFrame) -> tuple[int, int]:
    starts = [int(kernels["start_ns"].min())] if len(kernels) else []
    ends = [int(kernels["end_ns"].max())] if len(kernels) else []
    if len(steps):
        starts.append(int(steps["start_ns"].min()))
        ends.append(int(steps["end_ns"].max()))
    if not starts:
        return 0, 0
    return min(starts), max(ends)


def step_windows(kernels: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """One window per step annotation (see the module docstring), or the whole trace when there are none."""
    if len(steps) == 0:
        start, end = trace_window(kernels, steps)
        return pd.DataFrame({"step": [0], "name": ["(whole trace)"], "start_ns": [start], "end_ns": [end]})
    steps = steps.sort_values("start_ns", kind="stable").reset_index(drop=True)
    starts = steps["start_ns"].to_numpy(np.int64)
    ends = np.append(starts[1:], 0)
    launched_in_last = activity_launch_time(kernels) >= starts[-1]
    last_activity_end = int(kernels["end_ns"].to_numpy()[launched_in_last].max()) if launched_in_last.any() else starts[-1]
    ends[-1] = max(int(steps["end_ns"].iloc[-1]), last_activity_end)
    return pd.DataFrame({"step": steps["step"].to_numpy(np.int64), "name": steps["name"].astype(str).to_numpy(), "start_ns": starts, "end_ns": ends})


def build_timeline(kernels: pd.DataFrame, start_ns: int, end_ns: int, kernel_gap_threshold_ns: int = DEFAULT_KERNEL_GAP_NS) -> Timeline:
    """Cut [start_ns, end_ns) into busy blocks and gaps classified by cause (activities are clipped to it)."""
    start = np.clip(kernels["start_ns"].to_numpy(np.int64), start_ns, end_ns)
    end = np.clip(kernels["end_ns"].to_numpy(np.int64), start_ns, end_ns)
    launch = kernels["launch_start_ns"].to_numpy(np.int64)
    keep = end > start
    start, end, launch = start[keep], end[keep], launch[keep]
    block_start, block_end, order = union_blocks(start, end)
    if len(block_start) == 0:
        return Timeline(start_ns, end_ns, np.array([start_ns]), np.array([end_ns]), np.array([HOST_BOUND]))

    # the earliest launch among the activities that start exactly where each block starts (an unlinked
    # activity counts as launched long ago: it cannot prove the GPU waited for the host)
    sorted_start = start[order]
    sorted_launch = np.where(launch[order] >= 0, launch[order], np.iinfo(np.int64).min)
    tied_from = np.searchsorted(sorted_start, block_start, side="left")
    tied_to = np.searchsorted(sorted_start, block_start, side="right")
    first_launch = _min_over_ranges(sorted_launch, tied_from, tied_to)

    gap_start = np.concatenate([[start_ns], block_end])
    gap_end = np.concatenate([block_start, [end_ns]])
    cause = np.empty(len(gap_start), dtype=np.int64)
    cause[:-1] = _gap_cause(gap_start[:-1], gap_end[:-1], first_launch, kernel_gap_threshold_ns)
    cause[-1] = HOST_BOUND  # nothing launched after the last activity: the GPU waited on the host

    seg_start = np.empty(len(gap_start) + len(block_start), dtype=np.int64)
    seg_end = np.empty_like(seg_start)
    seg_kind = np.empty_like(seg_start)
    seg_start[0::2], seg_end[0::2], seg_kind[0::2] = gap_start, gap_end, cause
    seg_start[1::2], seg_end[1::2], seg_kind[1::2] = block_start, block_end, BUSY
    nonempty = seg_end > seg_start
    return Timeline(start_ns, end_ns, seg_start[nonempty], seg_end[nonempty], seg_kind[nonempty])


def _min_over_ranges(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """min(values[lo[i]:hi[i]]) for each i, for sorted, disjoint, non-empty ranges."""
    bounds = np.empty(2 * len(lo), dtype=np.int64)
    bounds[0::2], bounds[1::2] = lo, hi
    padded = np.append(values, values[:1])  # reduceat needs every bound < len
    return np.minimum.reduceat(padded, bounds)[0::2]


def _gap_cause(gap_start, gap_end, next_launch, kernel_gap_threshold_ns) -> np.ndarray:
    host_bound = next_launch >= gap_start
    short = (gap_end - gap_start) < kernel_gap_threshold_ns
    return np.where(host_bound, HOST_BOUND, np.where(short, KERNEL_GAP, OTHER))


def account_windows(timeline: Timeline, start_ns: np.ndarray, end_ns: np.ndarray) -> pd.DataFrame:
    """wall, busy and idle by cause for each window [start_ns[i], end_ns[i]) (clipped to the timeline)."""
    start_ns = np.clip(np.asarray(start_ns, dtype=np.int64), timeline.start_ns, timeline.end_ns)
    end_ns = np.clip(np.asarray(end_ns, dtype=np.int64), timeline.start_ns, timeline.end_ns)
    end_ns = np.maximum(end_ns, start_ns)
    totals = timeline.totals_at(end_ns) - timeline.totals_at(start_ns)
    idle = totals[:, HOST_BOUND] + totals[:, KERNEL_GAP] + totals[:, OTHER]
    return pd.DataFrame({
        "start_ns": start_ns,
        "end_ns": end_ns,
        "wall_ns": end_ns - start_ns,
        "busy_ns": totals[:, BUSY],
        "idle_ns": idle,
        "host_bound_ns": totals[:, HOST_BOUND],
        "kernel_gap_ns": totals[:, KERNEL_GAP],
        "other_ns": totals[:, OTHER],
    })


def account(kernels: pd.DataFrame, steps: pd.DataFrame, kernel_gap_threshold_ns: int = DEFAULT_KERNEL_GAP_NS) -> Accounting:
    """Account the whole trace and each step window, per device (see the module docstring for the definitions)."""
    devices = devices_of(kernels)
    if len(devices) == 1:
        parts = [(devices[0], _account_device(kernels, steps, kernel_gap_threshold_ns))]
    else:
        parts = []
        for device in devices:
            mine = kernels[kernels["device"] == device]
            parts.append((device, _account_device(mine, device_steps(mine, steps), kernel_gap_threshold_ns)))
    per_device = pd.DataFrame([part.trace for _, part in parts]).reset_index(drop=True).astype(np.int64)
    per_device.insert(0, "device", np.array([device for device, _ in parts], dtype=np.int64))
    trace = per_device.drop(columns="device").sum()
    trace["start_ns"], trace["end_ns"] = per_device["start_ns"].min(), per_device["end_ns"].max()
    step_frames = []
    for device, part in parts:
        frame = part.steps.copy()
        frame.insert(0, "device", device)
        step_frames.append(frame)
    return Accounting(trace=trace.astype(np.int64), steps=pd.concat(step_frames, ignore_index=True),
                      kernel_gap_threshold_ns=int(kernel_gap_threshold_ns),
                      has_step_annotations=any(part.has_step_annotations for _, part in parts), devices=per_device)


def device_steps(kernels: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """The steps annotated by a thread that launched some of ``kernels`` (all steps if there are none)."""
    if len(steps) == 0 or "tid" not in steps:
        return steps
    own = steps[steps["tid"].isin(launching_threads(kernels))]
    return own if len(own) else steps


def _account_device(kernels: pd.DataFrame, steps: pd.DataFrame, kernel_gap_threshold_ns: int = DEFAULT_KERNEL_GAP_NS) -> Accounting:
    """One device's whole trace and step windows."""
    trace_start, trace_end = trace_window(kernels, steps)
    timeline = build_timeline(kernels, trace_start, trace_end, kernel_gap_threshold_ns)
    windows = step_windows(kernels, steps)
    per_step = account_windows(timeline, windows["start_ns"].to_numpy(), windows["end_ns"].to_numpy())
    per_step.insert(0, "name", windows["name"].to_numpy())
    per_step.insert(0, "step", windows["step"].to_numpy())
    counts, times = _activities_per_window(kernels, windows, whole_trace=len(steps) == 0)
    per_step["kernels"] = counts
    per_step["kernel_time_ns"] = times
    whole = account_windows(timeline, np.array([trace_start]), np.array([trace_end])).iloc[0]
    return Accounting(trace=whole, steps=per_step, kernel_gap_threshold_ns=int(kernel_gap_threshold_ns), has_step_annotations=len(steps) > 0)


def window_of_activities(kernels: pd.DataFrame, windows: pd.DataFrame, whole_trace: bool) -> np.ndarray:
    """For each activity, the index of the window its launch call started in (-1: none)."""
    if whole_trace:
        return np.zeros(len(kernels), dtype=np.int64)
    return interval_at(windows["start_ns"].to_numpy(np.int64), windows["end_ns"].to_numpy(np.int64), activity_launch_time(kernels))


def _activities_per_window(kernels: pd.DataFrame, windows: pd.DataFrame, whole_trace: bool) -> tuple[np.ndarray, np.ndarray]:
    """Kernels (kind kernel) launched in each window, and their summed duration (with ``whole_trace``, one window holds
    every kernel, even one launched before the first activity started)."""
    is_kernel = kernels["kind"].isin(WORK_KINDS).to_numpy()
    window = window_of_activities(kernels, windows, whole_trace)[is_kernel]
    duration = kernels["dur_ns"].to_numpy()[is_kernel]
    inside = window >= 0
    counts = np.bincount(window[inside], minlength=len(windows)).astype(np.int64)
    return counts, sum_by_group(duration[inside], window[inside], len(windows))


def check_identity(frame: pd.DataFrame) -> bool:
    """wall = busy + host_bound + kernel_gap + other, exactly, in every row."""
    parts = frame["busy_ns"] + frame["host_bound_ns"] + frame["kernel_gap_ns"] + frame["other_ns"]
    return bool((frame["wall_ns"] == parts).all() and (frame["idle_ns"] == frame["wall_ns"] - frame["busy_ns"]).all())
