"""GPU time by kernel category (one rule table: perflab.trace.categories), and the GEMM fraction.

``time_ns`` sums durations; ``busy_ns`` is the union of the category's intervals over all streams (what
the category alone would keep the GPU busy). GEMM fraction = GEMM busy ÷ GPU busy (both unions, so
GEMMs overlapping each other on two streams are not counted twice and the fraction stays ≤ 1).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from perflab.analysis.devices import devices_of
from perflab.analysis.intervals import sum_by_group, union_length, union_length_by_group

GEMM = "gemm"


def category_breakdown(kernels: pd.DataFrame) -> pd.DataFrame:
    """One row per category present: category, count, time_ns, share (of GPU activity time), busy_ns."""
    labels = list(kernels["category"].cat.categories)
    codes = kernels["category"].cat.codes.to_numpy().astype(np.int64)
    count = np.bincount(codes, minlength=len(labels))
    time_ns = sum_by_group(kernels["dur_ns"].to_numpy(), codes, len(labels))
    busy_ns = union_length_by_group(kernels["start_ns"].to_numpy(), kernels["end_ns"].to_numpy(), codes, len(labels))
    total = int(time_ns.sum())
    frame = pd.DataFrame({
        "category": labels,
        "count": count.astype(np.int64),
        "time_ns": time_ns,
        "share": time_ns / total if total else np.zeros(len(labels)),
        "busy_ns": busy_ns,
    })
    frame = frame[frame["count"] > 0]
    return frame.sort_values("time_ns", ascending=False, kind="stable").reset_index(drop=True)


def gemm_fraction(kernels: pd.DataFrame) -> float:
    """GEMM busy time ÷ GPU busy time (0 when the GPU was never busy); each summed over the devices."""
    busy = gemm = 0
    for device in devices_of(kernels):
        mine = kernels[kernels["device"] == device] if "device" in kernels else kernels
        start, end = mine["start_ns"].to_numpy(), mine["end_ns"].to_numpy()
        is_gemm = (mine["category"] == GEMM).to_numpy()
        busy += union_length(start, end)
        gemm += union_length(start[is_gemm], end[is_gemm])
    return gemm / busy if busy else 0.0
