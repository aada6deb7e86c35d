"""Per-pass kernel breakdowns (seed 003's tables b–e): which pass of a training step each kernel belongs to,
and, per pass, the top kernel, the top non-GEMM kernel and the GEMM fraction; and softmax against matmul
inside attention. ``pass_timing`` gives each pass's GPU time, busy time, span and CPU issue time per step
(explain's per-pass floors and fix predictions read it).

A pass is a CPU range named ``forward``, ``backward`` or ``optimizer`` (perflab's lm workloads mark them in
profile passes), or ``prefill`` and ``decode`` (the decode family's generate marks its prefill and each
decode step). A GPU activity belongs to the pass whose range was open, on any thread, when its launch
call started: the backward's kernels are launched by autograd's own thread, outside the main thread's
nesting, while the main thread waits inside ``backward``. Activities outside every pass belong to none.
Times are per step (the trace's totals over its annotated steps, divided by their number), integer ns.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from perflab.analysis.breakdown import GEMM
from perflab.analysis.intervals import interval_at, sum_by_group, union_length

PASSES = ("forward", "backward", "optimizer", "prefill", "decode")
ATTENTION_RANGES = ("attn.scores", "attn.softmax", "attn.final_matmul")


def kernel_passes(kernels: pd.DataFrame, ranges: pd.DataFrame) -> np.ndarray:
    """The pass of each row of the KernelTable ("" for none), by its launch time."""
    return kernel_pass_occurrences(kernels, ranges)[0]


def kernel_pass_occurrences(kernels: pd.DataFrame, ranges: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The pass of each row of the KernelTable ("" for none), by its launch time, and which occurrence of
    that pass's range (its index among the ranges of that name, in start order; -1 for none) held the launch."""
    out = np.full(len(kernels), "", dtype=object)
    occurrence = np.full(len(kernels), -1, dtype=np.int64)
    if len(ranges) == 0 or len(kernels) == 0:
        return out, occurrence
    names = ranges["name"].astype(str).to_numpy()
    launch = kernels["launch_start_ns"].to_numpy()
    has_launch = launch >= 0
    for name in PASSES:
        chosen = ranges[names == name]
        if len(chosen) == 0:
            continue
        order = np.argsort(chosen["start_ns"].to_numpy(), kind="stable")
        starts = chosen["start_ns"].to_numpy()[order]
        ends = chosen["end_ns"].to_numpy()[order]
        i = interval_at(starts, ends, launch)
        take = has_launch & (i >= 0) & (out == "")
        out[take] = name
        occurrence[take] = i[take]
    return out, occurrence


def pass_timing(kernels: pd.DataFrame, ranges: pd.DataFrame, steps: int) -> dict[str, dict]:
    """Per pass present, per step (totals over the trace's steps ÷ their number), integer ns except ``kernels``:

    - ``kernels``: GPU activities launched in the pass;
    - ``gpu_ns``: the sum of their durations (the pass's GPU time, as ``pass_breakdown`` gives it);
    - ``busy_ns``: the union of their intervals (GPU time less overlap between streams);
    - ``span_ns``: first start to last end, per occurrence of the pass's range, summed;
    - ``idle_ns``: span − busy: the GPU idle inside the pass (waiting for the host, or for another pass's work);
    - ``issue_ns``: the CPU time to issue the pass: its range's start to the end of the last launch call
      of its activities, per occurrence, summed (traced, so inflated by the profiler).
    """
    steps = max(int(steps), 1)
    passes, occurrence = kernel_pass_occurrences(kernels, ranges)
    out: dict[str, dict] = {}
    if not len(kernels):
        return out
    names = ranges["name"].astype(str).to_numpy() if len(ranges) else np.array([], dtype=object)
    start = kernels["start_ns"].to_numpy()
    end = kernels["end_ns"].to_numpy()
    dur = kernels["dur_ns"].to_numpy()
    launch_end = kernels["launch_end_ns"].to_numpy()
    for name in PASSES:
        mask = passes == name
        if not mask.any():
            continue
        range_starts = np.sort(ranges.loc[names == name, "start_ns"].to_numpy(), kind="stable")
        span = issue = 0
        for occ in np.unique(occurrence[mask]):
            part = mask & (occurrence == occ)
            span += int(end[part].max() - start[part].min())
            ends = launch_end[part]
            ends = ends[ends >= 0]
            if len(ends):
                issue += int(ends.max() - range_starts[occ])
        busy = union_length(start[mask], end[mask])
        gpu = int(dur[mask].sum())
        out[name] = {"kernels": int(mask.sum()) / steps, "gpu_ns": gpu // steps, "busy_ns": busy // steps, "span_ns": span // steps,
                     "idle_ns": max(span // steps - busy // steps, 0), "issue_ns": issue // steps}
    return out


def pass_breakdown(kernels: pd.DataFrame, ranges: pd.DataFrame, steps: int) -> pd.DataFrame:
    """One row per pass present: kernels and GPU time per step, the top kernel and its share, the top non-GEMM
    kernel (share, time per step, launches per step), and the GEMM fraction (GEMM time ÷ the pass's time)."""
    steps = max(int(steps), 1)
    passes = kernel_passes(kernels, ranges)
    rows = []
    for name in PASSES:
        mask = passes == name
        if not mask.any():
            continue
        part = kernels[mask]
        codes = part["name"].cat.codes.to_numpy()
        labels = part["name"].cat.categories
        n = len(labels)
        total = sum_by_group(part["dur_ns"].to_numpy(), codes, n)
        count = np.bincount(codes, minlength=n)
        first_row = np.full(n, -1, dtype=np.int64)
        first_row[codes[::-1]] = np.arange(len(codes))[::-1]
        category = np.array([str(part["category"].iloc[r]) if r >= 0 else "" for r in first_row], dtype=object)
        pass_time = int(total.sum())
        top = int(np.argmax(total))
        non_gemm = np.flatnonzero((category != GEMM) & (count > 0))
        top_ng = int(non_gemm[np.argmax(total[non_gemm])]) if len(non_gemm) else None
        gemm_time = int(total[category == GEMM].sum())
        rows.append({
            "pass": name,
            "kernels_per_step": len(part) / steps,
            "gpu_time_ns": pass_time // steps,
            "top_kernel": str(labels[top]),
            "top_kernel_category": category[top],
            "top_kernel_share": float(total[top] / pass_time) if pass_time else 0.0,
            "top_non_gemm_kernel": str(labels[top_ng]) if top_ng is not None else None,
            "top_non_gemm_share": float(total[top_ng] / pass_time) if top_ng is not None and pass_time else None,
            "top_non_gemm_ns": int(total[top_ng]) // steps if top_ng is not None else None,
            "top_non_gemm_instances": float(count[top_ng] / steps) if top_ng is not None else None,
            "gemm_ns": gemm_time // steps,
            "gemm_fraction": gemm_time / pass_time if pass_time else 0.0,
        })
    return pd.DataFrame(rows, columns=["pass", "kernels_per_step", "gpu_time_ns", "top_kernel", "top_kernel_category", "top_kernel_share",
                                       "top_non_gemm_kernel", "top_non_gemm_share", "top_non_gemm_ns", "top_non_gemm_instances",
                                       "gemm_ns", "gemm_fraction"])


def attention_breakdown(kernels: pd.DataFrame, steps: int) -> dict | None:
    """GPU time per step launched inside the explicit attention's ranges: ``softmax_ns`` (attn.softmax) and
    ``matmul_ns`` (the GEMMs of attn.scores and attn.final_matmul), their ratio, and each range's total.
    None when the trace has no attention ranges (SDPA, compiled or graph modes)."""
    if len(kernels) == 0:
        return None
    rng = kernels["range"].astype(str).to_numpy()
    if not np.isin(rng, ATTENTION_RANGES).any():
        return None
    steps = max(int(steps), 1)
    dur = kernels["dur_ns"].to_numpy()
    gemm = (kernels["category"] == GEMM).to_numpy()
    per_range = {name: int(dur[rng == name].sum()) // steps for name in ATTENTION_RANGES}
    softmax = per_range["attn.softmax"]
    matmul = int(dur[np.isin(rng, ("attn.scores", "attn.final_matmul")) & gemm].sum()) // steps
    return {"softmax_ns": softmax, "matmul_ns": matmul, "softmax_to_matmul": softmax / matmul if matmul else None,
            "range_ns": per_range}


def softmax_flop_ratio(head_dim: int) -> float:
    """Softmax FLOPs ÷ attention matmul FLOPs per head: 5·T² : 4·T²·head_dim = 5 : (4·head_dim) (seed 003's count:
    max, subtract, exp, sum, divide per score)."""
    return 5.0 / (4.0 * head_dim)
