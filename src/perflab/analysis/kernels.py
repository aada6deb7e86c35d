"""Kernel statistics and the top kernels by total time, with readable short names (analysis.names).

A "kernel" here is a row of kind ``kernel``. memcpy and memset rows are GPU activities too, but not
kernels: they have their own top list (``top_memory_ops``; nsys separates cuda_gpu_kern_sum from
cuda_gpu_mem_time_sum the same way) and are not in the kernel counts. Shares in both lists are of all GPU
activity time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from perflab.analysis.intervals import sum_by_group
from perflab.analysis.names import short_names
from perflab.trace.schema import WORK_KINDS

SHORT_KERNEL_NS = 5_000


@dataclass(frozen=True)
class KernelStats:
    kernels: int
    kernel_time_ns: int
    mean_ns: float
    median_ns: float
    short_share: float  # share of kernels shorter than SHORT_KERNEL_NS
    short_time_share: float  # their share of kernel time
    memcpy: int
    memset: int
    gpu_activities: int
    gpu_activity_time_ns: int


def kernel_stats(kernels: pd.DataFrame) -> KernelStats:
    is_kernel = kernels["kind"].isin(WORK_KINDS).to_numpy()
    duration = kernels["dur_ns"].to_numpy()[is_kernel]
    total = int(duration.sum())
    short = duration < SHORT_KERNEL_NS
    kinds = kernels["kind"].value_counts()
    return KernelStats(
        kernels=int(is_kernel.sum()),
        kernel_time_ns=total,
        mean_ns=float(duration.mean()) if len(duration) else 0.0,
        median_ns=float(np.median(duration)) if len(duration) else 0.0,
        short_share=float(short.mean()) if len(duration) else 0.0,
        short_time_share=float(duration[short].sum() / total) if total else 0.0,
        memcpy=int(kinds.get("memcpy", 0)),
        memset=int(kinds.get("memset", 0)),
        gpu_activities=len(kernels),
        gpu_activity_time_ns=int(kernels["dur_ns"].sum()),
    )


MEMORY_KINDS = ("memcpy", "memset")


def top_kernels(kernels: pd.DataFrame, n: int | None = 10) -> pd.DataFrame:
    """Kernels (kind ``kernel``) grouped by full name, by total time: name (short, unique within the table),
    full_name, category, count, total_ns, mean_ns, share (of all GPU activity time). ``n=None`` keeps every name."""
    return _top_by_name(kernels, kernels["kind"].isin(WORK_KINDS).to_numpy(), n)


def top_memory_ops(kernels: pd.DataFrame, n: int | None = 10) -> pd.DataFrame:
    """memcpy and memset activities grouped by name, by total time (the columns of ``top_kernels``)."""
    return _top_by_name(kernels, kernels["kind"].isin(MEMORY_KINDS).to_numpy(), n)


def _top_by_name(kernels: pd.DataFrame, chosen: np.ndarray, n: int | None) -> pd.DataFrame:
    grand_total = int(kernels["dur_ns"].sum())
    kernels = kernels[chosen]
    codes = kernels["name"].cat.codes.to_numpy()
    labels = kernels["name"].cat.categories
    n_names = len(labels)
    count = np.bincount(codes, minlength=n_names)
    total = sum_by_group(kernels["dur_ns"].to_numpy(), codes, n_names)
    present = np.flatnonzero(count)
    alphabetical = np.empty(n_names, dtype=np.int64)
    alphabetical[np.argsort(np.asarray(labels, dtype=object).astype(str), kind="stable")] = np.arange(n_names)
    # by total time, ties by name (so that the order does not depend on the order of the file)
    ranked = present[np.lexsort((alphabetical[present], -total[present]))][: n if n is not None else None]
    # a name has one category (it was decided from the name and the kind)
    first_row = np.full(n_names, -1, dtype=np.int64)
    first_row[codes[::-1]] = np.arange(len(codes))[::-1]
    category = kernels["category"].to_numpy()[first_row[ranked]] if len(ranked) else np.array([], dtype=object)
    full = [str(labels[i]) for i in ranked]
    short = short_names(full)  # one-to-one within the table; the busiest keeps the bare name
    return pd.DataFrame({
        "name": [short[x] for x in full],
        "full_name": full,
        "category": [str(c) for c in category],
        "count": count[ranked].astype(np.int64),
        "total_ns": total[ranked].astype(np.int64),
        "mean_ns": total[ranked] / np.maximum(count[ranked], 1),
        "share": total[ranked] / grand_total if grand_total else np.zeros(len(ranked)),
    })


def with_short_names(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` (rows with ``full_name``, e.g. top kernels of several devices stacked) with ``name`` set to short
    names unique over the whole table: one full name, one short name, in every row."""
    if not len(table):
        return table
    short = short_names(table["full_name"].astype(str))
    return table.assign(name=[short[str(x)] for x in table["full_name"]])
