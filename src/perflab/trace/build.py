"""From the raw events a loader read to a :class:`~perflab.trace.schema.Trace`: linking, ranges, steps.

Both loaders (Kineto JSON, nsys SQLite) fill a :class:`RawEvents` (plain numpy columns, names as codes
into one name table) and call :func:`build_trace`, so the linking rules live in one place:

- a GPU activity is linked to the API call with the same correlation id *in the same process*
  (``process``; Kineto traces are one process, nsys exports can hold several whose ids collide). Kernels
  replayed from a CUDA graph carry the correlation id of their ``cudaGraphLaunch``, so they link to it.
- its ``range`` is the innermost CPU range (annotation / NVTX push-pop) on the launching thread that
  encloses the whole launch call. Ranges nest by time on one thread; an outer range such as
  ``ProfilerStep#3`` is only chosen when no inner one encloses the call.
- steps are the ranges named ``ProfilerStep#N``; if there are none, the ranges named exactly ``step``
  (perflab's profile pass wraps each step in ``record_function("step")``); with neither, no steps.
- a trace with no GPU activity but torch's operators (a CPU-only program, read with ``ops=True``) is accounted over
  its top-level operators: each one an activity of kind ``cpu_op`` on the CPU (device 0, stream = its thread),
  launched when it starts (schema.py says what that makes of the idle time).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from perflab.errors import PerflabError
from perflab.trace.categories import categorize
from perflab.trace.schema import KINDS, NOT_LINKED, OP_COLUMNS, STEP_COLUMNS, Trace

PROFILER_STEP = re.compile(r"^ProfilerStep#(\d+)$")
NO_GPU_ACTIVITY = ("this trace has no GPU activity (kernels, memcpy, memset) and no CPU operators to account instead: it was "
                   "recorded without CUDA activities (profile with ProfilerActivity.CUDA, or nsys --trace=cuda)")


@dataclass
class RawEvents:
    """Columns of the events a loader read. ``*_name`` arrays are codes into ``names``.

    gpu:  name, kind (index into KINDS), process, device, stream, start_ns, dur_ns, correlation, dims
          (an (n, 6) array: grid x, y, z, block x, y, z; -1 where unknown)
    api:  name, process, tid, start_ns, dur_ns, correlation
    ranges: name, process, tid, start_ns, dur_ns
    ops:  name, process, tid, start_ns, dur_ns, input_shapes, input_types, concrete_inputs (object arrays of the decoded
          ``Input Dims``, ``Input type`` and ``Concrete Inputs``: nested tuples, None where not recorded): torch's
          operators, where the loader was asked for them
    """

    names: list[str]
    gpu: dict[str, np.ndarray]
    api: dict[str, np.ndarray]
    ranges: dict[str, np.ndarray]
    # nsys: correlation ids restart in every process, so a link needs the same process too. Kineto: one
    # process per trace, and its GPU events carry the device in "pid", so link by correlation alone.
    correlation_per_process: bool = True
    ops: dict[str, np.ndarray] | None = None


CPU_OP = KINDS.index("cpu_op")


def build_trace(raw: RawEvents, meta: dict[str, Any]) -> Trace:
    """Link GPU activities to their launches and ranges; find the steps; return the Trace."""
    path = meta.get("path", "the trace")
    has_ops = raw.ops is not None and len(raw.ops["start_ns"]) > 0
    cpu_only = len(raw.gpu["start_ns"]) == 0
    if cpu_only and not has_ops:
        raise PerflabError(f"{path}: {NO_GPU_ACTIVITY}")
    raw = _merge_duplicate_names(raw)
    names = np.asarray(raw.names, dtype=object)
    ranges = _range_table(raw, names)
    ops = _op_table(raw, names) if raw.ops is not None else None
    if cpu_only:  # the top-level operators are the work, each launched by itself
        raw, launches, link = _ops_as_work(raw, ops)
    else:
        launches = _launch_table(raw, names)
        link = _link_by_correlation(raw.gpu, raw.api, raw.correlation_per_process)
    launch_range = _innermost_ranges(ranges, launches)
    kernels = _kernel_table(raw, names, launches, ranges, link, launch_range)
    steps = find_steps(ranges)
    if not len(steps) and meta.get("step_markers") in ("boundary", "call"):
        kernels, steps = steps_from_markers(kernels, meta["step_markers"])
    meta = dict(meta)
    meta["cpu_only"] = cpu_only
    meta.update(
        gpu_activities=len(kernels),
        kernels=int((kernels["kind"] == "kernel").sum()),
        unlinked=int((kernels["launch_tid"] == NOT_LINKED).sum()),
        launches=len(launches),
        ranges=len(ranges),
        steps=len(steps),
    )
    return Trace(kernels=kernels, launches=launches, ranges=ranges, steps=steps, meta=meta, ops=ops)


def _op_table(raw: RawEvents, names: np.ndarray) -> pd.DataFrame:
    """torch's operators, nested per thread (depth 0: not inside another operator), by start."""
    ops = raw.ops
    start = ops["start_ns"].astype(np.int64)
    end = _end(ops).astype(np.int64)
    parent, depth = _nest(_thread_key(ops["process"], ops["tid"]), start, end)
    inverse, used = _dense_codes(ops["name"], len(names))
    table = pd.DataFrame({
        "name": pd.Categorical.from_codes(inverse, categories=_unique_labels(names[used])),
        "pid": ops["process"].astype(np.int64), "tid": ops["tid"].astype(np.int64), "start_ns": start, "end_ns": end,
        "depth": depth, "parent": parent,
        "input_shapes": ops["input_shapes"], "input_types": ops["input_types"], "concrete_inputs": ops["concrete_inputs"],
    }, columns=list(OP_COLUMNS))
    return table


def _ops_as_work(raw: RawEvents, ops: pd.DataFrame) -> tuple[RawEvents, pd.DataFrame, np.ndarray]:
    """A CPU-only trace: its top-level operators as the activities (``gpu``), each linked to a "launch" that is the
    operator itself (so a gap before it is host-bound: nothing was queued)."""
    top = np.flatnonzero(ops["depth"].to_numpy() == 0)
    o = raw.ops
    start, dur = o["start_ns"][top].astype(np.int64), o["dur_ns"][top].astype(np.int64)
    n = len(top)
    gpu = {"name": o["name"][top].astype(np.int64), "kind": np.full(n, CPU_OP, dtype=np.int64), "process": o["process"][top].astype(np.int64),
           "device": np.zeros(n, dtype=np.int64), "stream": o["tid"][top].astype(np.int64), "start_ns": start, "dur_ns": dur,
           "correlation": np.arange(n, dtype=np.int64), "dims": np.full((n, 6), -1, dtype=np.int64)}
    launches = pd.DataFrame({"name": pd.Categorical([""] * n), "pid": gpu["process"], "tid": gpu["stream"], "start_ns": start,
                             "end_ns": start, "correlation": gpu["correlation"]})
    raw = RawEvents(names=raw.names, gpu=gpu, api=raw.api, ranges=raw.ranges, correlation_per_process=False, ops=raw.ops)
    return raw, launches, np.arange(n, dtype=np.int64)


def _merge_duplicate_names(raw: RawEvents) -> RawEvents:
    """One code per distinct text (a name written once with and once without JSON escapes decodes alike)."""
    first: dict[str, int] = {}
    mapping = np.array([first.setdefault(name, i) for i, name in enumerate(raw.names)], dtype=np.int64)
    if len(first) == len(raw.names):
        return raw
    for group in (raw.gpu, raw.api, raw.ranges, *([raw.ops] if raw.ops is not None else [])):
        group["name"] = mapping[group["name"]]
    return raw


def _end(columns: dict[str, np.ndarray]) -> np.ndarray:
    return columns["start_ns"] + columns["dur_ns"]


def _dense_codes(codes: np.ndarray, n_names: int) -> tuple[np.ndarray, np.ndarray]:
    """Codes renumbered 0..k-1 over the names actually used, and those names' old codes (O(n), no sort)."""
    used = np.flatnonzero(np.bincount(codes, minlength=n_names)) if len(codes) else np.zeros(0, dtype=np.int64)
    renumber = np.full(max(n_names, 1), -1, dtype=np.int64)
    renumber[used] = np.arange(len(used))
    return renumber[codes], used


def _launch_table(raw: RawEvents, names: np.ndarray) -> pd.DataFrame:
    api = raw.api
    api_codes, api_names = _dense_codes(api["name"], len(names))
    return pd.DataFrame({
        "name": pd.Categorical.from_codes(api_codes, categories=_unique_labels(names[api_names])),
        "pid": api["process"].astype(np.int64),
        "tid": api["tid"].astype(np.int64),
        "start_ns": api["start_ns"].astype(np.int64),
        "end_ns": _end(api).astype(np.int64),
        "correlation": api["correlation"].astype(np.int64),
    })


def _unique_labels(labels) -> list[str]:
    """Categorical labels (unique: _merge_duplicate_names gave each text one code)."""
    labels = [str(x) for x in labels]
    assert len(set(labels)) == len(labels), "duplicate names in a name table"
    return labels


def _range_table(raw: RawEvents, names: np.ndarray) -> pd.DataFrame:
    rng = raw.ranges
    start = rng["start_ns"].astype(np.int64)
    end = _end(rng).astype(np.int64)
    thread = _thread_key(rng["process"], rng["tid"])
    parent, depth = _nest(thread, start, end)
    inverse, used = _dense_codes(rng["name"], len(names))
    return pd.DataFrame({
        "name": pd.Categorical.from_codes(inverse, categories=_unique_labels(names[used])),
        "pid": rng["process"].astype(np.int64),
        "tid": rng["tid"].astype(np.int64),
        "start_ns": start,
        "end_ns": end,
        "depth": depth,
        "parent": parent,
    })


def _thread_key(process: np.ndarray, tid: np.ndarray) -> np.ndarray:
    return (process.astype(np.int64) << 32) | (tid.astype(np.int64) & 0xFFFFFFFF)


def _nest(thread: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Parent (the innermost enclosing range on the same thread, -1 if none) and depth of each range.

    Ranges are visited by (thread, start, longest first); a stack holds the open ranges, and a range
    pops every open one that ends before it does (those cannot enclose it).
    """
    n = len(start)
    parent = np.full(n, -1, dtype=np.int64)
    depth = np.zeros(n, dtype=np.int64)
    order = np.lexsort((-end, start, thread)).tolist()
    thread_l, end_l = thread.tolist(), end.tolist()
    parent_l, depth_l = [-1] * n, [0] * n
    stack: list[int] = []
    current_thread = None
    for i in order:
        if thread_l[i] != current_thread:
            stack.clear()
            current_thread = thread_l[i]
        while stack and end_l[stack[-1]] < end_l[i]:
            stack.pop()
        if stack:
            parent_l[i] = stack[-1]
            depth_l[i] = depth_l[stack[-1]] + 1
        stack.append(i)
    parent[:] = parent_l
    depth[:] = depth_l
    return parent, depth


def _innermost_ranges(ranges: pd.DataFrame, launches: pd.DataFrame) -> np.ndarray:
    """For each launch call, the row of the innermost range on its thread enclosing it (-1 if none)."""
    result = np.full(len(launches), -1, dtype=np.int64)
    if len(ranges) == 0 or len(launches) == 0:
        return result
    r_thread = _thread_key(ranges["pid"].to_numpy(), ranges["tid"].to_numpy())
    r_start, r_end = ranges["start_ns"].to_numpy(), ranges["end_ns"].to_numpy()
    parent = ranges["parent"].to_numpy()
    p_thread = _thread_key(launches["pid"].to_numpy(), launches["tid"].to_numpy())
    p_start, p_end = launches["start_ns"].to_numpy(), launches["end_ns"].to_numpy()
    order = np.lexsort((-r_end, r_start, r_thread))
    for thread in np.intersect1d(np.unique(r_thread), np.unique(p_thread)):
        rows = order[r_thread[order] == thread]  # this thread's ranges by start, outer before inner
        points = np.flatnonzero(p_thread == thread)
        # the last range starting at or before the call; if it ends before the call does, its parent
        # may still enclose the call, so climb until one does (or none is left)
        pos = np.searchsorted(r_start[rows], p_start[points], side="right") - 1
        candidate = np.where(pos >= 0, rows[np.maximum(pos, 0)], -1)
        while True:
            outside = (candidate >= 0) & (r_end[np.maximum(candidate, 0)] < p_end[points])
            if not outside.any():
                break
            candidate[outside] = parent[candidate[outside]]
        result[points] = candidate
    return result


def _link_by_correlation(gpu: dict[str, np.ndarray], api: dict[str, np.ndarray], per_process: bool) -> np.ndarray:
    """Row of the API call with the same correlation id (and process) as each GPU activity, or -1."""
    if len(api["correlation"]) == 0:
        return np.full(len(gpu["correlation"]), -1, dtype=np.int64)
    if per_process:
        api_key = _thread_key(api["process"], api["correlation"])
        gpu_key = _thread_key(gpu["process"], gpu["correlation"])
    else:
        api_key, gpu_key = api["correlation"].astype(np.int64), gpu["correlation"].astype(np.int64)
    order = np.argsort(api_key, kind="stable")
    sorted_keys = api_key[order]
    pos = np.searchsorted(sorted_keys, gpu_key)
    pos_clipped = np.minimum(pos, len(sorted_keys) - 1)
    found = sorted_keys[pos_clipped] == gpu_key
    return np.where(found, order[pos_clipped], -1)


def _kernel_table(raw, names, launches, ranges, link, launch_range) -> pd.DataFrame:
    gpu = raw.gpu
    start = gpu["start_ns"].astype(np.int64)
    dur = gpu["dur_ns"].astype(np.int64)
    # by start (ties in the order the reader met them)
    order = np.argsort(start, kind="stable")
    linked = link >= 0
    safe = np.maximum(link, 0)

    def launch_column(values: np.ndarray) -> np.ndarray:
        if len(values) == 0:  # no API calls in the trace at all: nothing is linked
            return np.full(len(link), NOT_LINKED, dtype=np.int64)
        return np.where(linked, values[safe], NOT_LINKED).astype(np.int64)

    name_codes, name_used = _dense_codes(gpu["name"], len(names))
    name_labels = _unique_labels(names[name_used])
    kind = gpu["kind"].astype(np.int64)
    category_codes, category_labels = _categories(name_labels, name_codes, kind)

    api_codes = launches["name"].cat.codes.to_numpy().astype(np.int64)
    launch_api, api_labels = _subset_labels(
        np.where(linked, api_codes[safe] if len(api_codes) else -1, -1), list(launches["name"].cat.categories))

    range_row = np.where(linked, launch_range[safe] if len(launch_range) else -1, -1)
    range_codes = ranges["name"].cat.codes.to_numpy().astype(np.int64)
    range_name, range_labels = _subset_labels(
        np.where(range_row >= 0, range_codes[np.maximum(range_row, 0)] if len(range_codes) else -1, -1),
        list(ranges["name"].cat.categories))

    grid, block = _dims_columns(gpu["dims"])
    table = pd.DataFrame({
        "name": pd.Categorical.from_codes(name_codes[order], categories=name_labels),
        "category": pd.Categorical.from_codes(category_codes[order], categories=category_labels),
        "kind": pd.Categorical.from_codes(kind[order], categories=list(KINDS)),
        "device": gpu["device"].astype(np.int64)[order],
        "stream": gpu["stream"].astype(np.int64)[order],
        "start_ns": start[order],
        "end_ns": (start + dur)[order],
        "dur_ns": dur[order],
        "correlation": gpu["correlation"].astype(np.int64)[order],
        "launch_api": pd.Categorical.from_codes(launch_api[order], categories=api_labels),
        "launch_start_ns": launch_column(launches["start_ns"].to_numpy())[order],
        "launch_end_ns": launch_column(launches["end_ns"].to_numpy())[order],
        "launch_tid": launch_column(launches["tid"].to_numpy())[order],
        "range": pd.Categorical.from_codes(range_name[order], categories=range_labels),
        "range_id": range_row.astype(np.int64)[order],
        "grid": grid[order],
        "block": block[order],
    })
    return table


def _subset_labels(codes: np.ndarray, labels: list[str]) -> tuple[np.ndarray, list[str]]:
    """Codes into ``labels`` (-1: none) → codes into the labels used, plus "" for none."""
    dense, used = _dense_codes(np.where(codes >= 0, codes, len(labels)), len(labels) + 1)
    return dense, [labels[i] if i < len(labels) else "" for i in used.tolist()]


def _categories(name_labels: list[str], name_codes: np.ndarray, kind: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Category code per row, deciding each distinct (name, kind) once."""
    pair = name_codes * len(KINDS) + kind
    pairs, inverse = np.unique(pair, return_inverse=True)
    labels = [categorize(name_labels[p // len(KINDS)], KINDS[p % len(KINDS)]) for p in pairs.tolist()]
    categories = sorted(set(labels))
    index = {c: i for i, c in enumerate(categories)}
    return np.asarray([index[c] for c in labels], dtype=np.int64)[inverse.reshape(-1)], categories


def _dims_columns(dims: np.ndarray) -> tuple[pd.Categorical, pd.Categorical]:
    """grid and block as "(x, y, z)" categoricals ("" where unknown), formatting each distinct value once."""
    columns = []
    for part in (dims[:, :3], dims[:, 3:]):
        part = part.astype(np.int64)
        known = (part >= 0).all(axis=1)
        # x fits 31 bits, y and z 16 bits (CUDA's limits), so one int64 identifies a triple
        key = np.where(known, (part[:, 0] << 32) | ((part[:, 1] & 0xFFFF) << 16) | (part[:, 2] & 0xFFFF), -1)
        codes, uniques = pd.factorize(key)
        labels = [f"({k >> 32}, {(k >> 16) & 0xFFFF}, {k & 0xFFFF})" if k >= 0 else "" for k in uniques.tolist()]
        columns.append(pd.Categorical.from_codes(codes, categories=labels))
    return columns[0], columns[1]


STEP_MARKER = re.compile(r"spin_kernel")  # torch.cuda._sleep's kernel: perflab's step marker in a CUDA-only trace


def steps_from_markers(kernels: pd.DataFrame, kind: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A CUDA-only trace has no CPU ranges, so perflab's tracer marks each step boundary with a one-cycle kernel of its
    own (``torch.cuda._sleep(1)``) and says so in the trace's metadata. The steps are then cut at those kernels' launch
    calls, on the host's timeline as ``ProfilerStep#n`` ranges are: ``boundary``, each marker to the next; ``call``,
    markers in pairs (a step's start and end). The marker kernels are dropped from the table: they are not the
    program's work."""
    names = kernels["name"].astype(str)
    marker = names.str.contains(STEP_MARKER.pattern, regex=True).to_numpy() & (kernels["launch_tid"].to_numpy() >= 0)
    marks = kernels[marker].sort_values("launch_start_ns", kind="stable")
    starts, tids = marks["launch_start_ns"].to_numpy(np.int64), marks["launch_tid"].to_numpy(np.int64)
    if kind == "call":
        pairs = [(starts[i], starts[i + 1], tids[i]) for i in range(0, len(starts) - 1, 2)]
    else:
        pairs = [(starts[i], starts[i + 1], tids[i]) for i in range(len(starts) - 1)]
    steps = pd.DataFrame({"step": np.arange(len(pairs), dtype=np.int64), "name": [f"ProfilerStep#{i}" for i in range(len(pairs))],
                          "start_ns": np.array([p[0] for p in pairs], dtype=np.int64), "end_ns": np.array([p[1] for p in pairs], dtype=np.int64),
                          "tid": np.array([p[2] for p in pairs], dtype=np.int64)})
    return kernels[~marker].reset_index(drop=True), steps


def find_steps(ranges: pd.DataFrame) -> pd.DataFrame:
    """Step annotations: ``ProfilerStep#N`` ranges, else ranges named ``step``, else none (sorted by start)."""
    # decide on each distinct name, not on each of (maybe) a million rows
    labels = [str(x) for x in ranges["name"].cat.categories]
    codes = ranges["name"].cat.codes.to_numpy()
    step_number = np.array([int(m.group(1)) if (m := PROFILER_STEP.match(x)) else -1 for x in labels] + [-1], dtype=np.int64)
    numbers = step_number[codes]
    chosen = ranges[numbers >= 0].copy()
    if len(chosen):
        chosen["step"] = numbers[numbers >= 0]
    else:
        is_step = np.array([x == "step" for x in labels] + [False])[codes]
        chosen = ranges[is_step].copy()
        chosen["step"] = np.arange(len(chosen), dtype=np.int64)
    if len(chosen) == 0:
        return pd.DataFrame({c: pd.Series([], dtype="int64" if c != "name" else "object") for c in STEP_COLUMNS})
    chosen = chosen.sort_values("start_ns", kind="stable")
    if PROFILER_STEP.match(str(chosen["name"].iloc[0])) is None:
        chosen["step"] = np.arange(len(chosen), dtype=np.int64)
    return pd.DataFrame({
        "step": chosen["step"].to_numpy(np.int64),
        "name": chosen["name"].astype(str).to_numpy(),
        "start_ns": chosen["start_ns"].to_numpy(np.int64),
        "end_ns": chosen["end_ns"].to_numpy(np.int64),
        "tid": chosen["tid"].to_numpy(np.int64),  # the annotating thread: whose steps these are, in a file of several ranks
    })
