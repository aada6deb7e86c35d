"""GPU time per CPU range (annotation / NVTX range), by range name.

Each GPU activity belongs to the innermost range enclosing its launch call (the KernelTable's
``range``), so a range's figures count only the work launched directly inside it, not inside its
children; ``(no range)`` collects the rest. Per name:

- ``kernels``, ``gpu_time_ns`` (summed durations), ``gpu_busy_ns`` (union over streams),
  ``gemm_ns`` (union of its GEMMs) and ``gemm_fraction`` = gemm_ns ÷ gpu_busy_ns;
- ``instances`` and ``cpu_wall_ns``: how often the range ran on the CPU and its CPU duration, summed;
- ``gpu_projected_ns``: per instance, from the first to the last GPU activity launched inside it *or
  inside its children* (nsys's "projected" range), summed over instances; it can exceed the CPU time
  when the GPU runs behind.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from perflab.analysis.breakdown import GEMM
from perflab.analysis.intervals import sum_by_group, union_length_by_group

NO_RANGE = "(no range)"


def range_breakdown(kernels: pd.DataFrame, ranges: pd.DataFrame) -> pd.DataFrame:
    labels = [str(x) or NO_RANGE for x in kernels["range"].cat.categories]
    codes = kernels["range"].cat.codes.to_numpy().astype(np.int64)
    n = len(labels)
    start, end = kernels["start_ns"].to_numpy(), kernels["end_ns"].to_numpy()
    is_gemm = (kernels["category"] == GEMM).to_numpy()
    frame = pd.DataFrame({
        "range": labels,
        "kernels": np.bincount(codes, minlength=n).astype(np.int64),
        "gpu_time_ns": sum_by_group(kernels["dur_ns"].to_numpy(), codes, n),
        "gpu_busy_ns": union_length_by_group(start, end, codes, n),
        "gemm_ns": union_length_by_group(start[is_gemm], end[is_gemm], codes[is_gemm], n),
    })
    frame["gemm_fraction"] = np.where(frame["gpu_busy_ns"] > 0, frame["gemm_ns"] / frame["gpu_busy_ns"].clip(lower=1), 0.0)
    cpu = _cpu_side(ranges)
    projected = _projected_by_name(kernels, ranges)
    frame = frame.merge(cpu, on="range", how="outer").merge(projected, on="range", how="left")
    for column in ("kernels", "gpu_time_ns", "gpu_busy_ns", "gemm_ns", "instances", "cpu_wall_ns", "gpu_projected_ns"):
        frame[column] = frame[column].fillna(0).astype(np.int64)
    frame["gemm_fraction"] = frame["gemm_fraction"].fillna(0.0)
    return frame.sort_values(["gpu_time_ns", "cpu_wall_ns"], ascending=False, kind="stable").reset_index(drop=True)


def _cpu_side(ranges: pd.DataFrame) -> pd.DataFrame:
    if len(ranges) == 0:
        return pd.DataFrame({"range": pd.Series([], dtype=object), "instances": [], "cpu_wall_ns": []})
    labels = [str(x) for x in ranges["name"].cat.categories]
    codes = ranges["name"].cat.codes.to_numpy().astype(np.int64)
    return pd.DataFrame({
        "range": labels,
        "instances": np.bincount(codes, minlength=len(labels)).astype(np.int64),
        "cpu_wall_ns": sum_by_group((ranges["end_ns"] - ranges["start_ns"]).to_numpy(), codes, len(labels)),
    })


def _projected_by_name(kernels: pd.DataFrame, ranges: pd.DataFrame) -> pd.DataFrame:
    """Sum over each name's instances of [first, last) GPU activity launched inside the instance or its children."""
    if len(ranges) == 0:
        return pd.DataFrame({"range": pd.Series([], dtype=object), "gpu_projected_ns": []})
    n = len(ranges)
    first = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    last = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
    row = kernels["range_id"].to_numpy()
    inside = row >= 0
    np.minimum.at(first, row[inside], kernels["start_ns"].to_numpy()[inside])
    np.maximum.at(last, row[inside], kernels["end_ns"].to_numpy()[inside])
    # hand each instance's span up to its parent, deepest ranges first
    parent = ranges["parent"].to_numpy()
    depth = ranges["depth"].to_numpy()
    for level in range(int(depth.max()), 0, -1):
        child = np.flatnonzero((depth == level) & (parent >= 0))
        np.minimum.at(first, parent[child], first[child])
        np.maximum.at(last, parent[child], last[child])
    span = np.where(last >= first, last - first, 0)
    labels = [str(x) for x in ranges["name"].cat.categories]
    codes = ranges["name"].cat.codes.to_numpy().astype(np.int64)
    return pd.DataFrame({"range": labels, "gpu_projected_ns": sum_by_group(span, codes, len(labels))})
