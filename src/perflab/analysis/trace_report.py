"""Everything ``perflab analyze`` computes about one trace, in one object.

    from perflab.trace import load_trace
    from perflab.analysis import analyze_trace
    report = analyze_trace(load_trace("trace.json.gz"))
    report.steps            # per-step accounting (DataFrame)
    report.to_dict()        # the JSON summary

DataFrame attributes: ``kernels`` (the KernelTable), ``steps`` (per-step accounting), ``top_kernels``
(kernels only), ``top_memory_ops`` (memcpy, memset), ``categories``, ``ranges``, ``launch_apis``,
``devices`` (whole-trace accounting per device); every one of them has a ``device`` column (a trace of
several GPUs is analysed per device). Plus ``trace_accounting`` (a Series, summed over devices), ``kernel_stats``,
``launch_delay``, ``verdict`` and ``gemm_fraction``. Every key that holds a time names its unit: in the
DataFrames integer ns (``total_ns``, ``busy_ns``), in the JSON summary µs (``total_us``, ``idle_by_cause_us``), except
``accounting_ns`` and a step's ``start_ns``/``end_ns``, exact ns there too.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Any

import pandas as pd

from perflab import units
from perflab.analysis.accounting import DEFAULT_KERNEL_GAP_NS, IDLE_CAUSES, Accounting, account
from perflab.analysis.breakdown import category_breakdown, gemm_fraction
from perflab.analysis.devices import by_device, devices_of, launching_threads
from perflab.analysis.kernels import KernelStats, kernel_stats, top_kernels, top_memory_ops, with_short_names
from perflab.analysis.modules import has_module_ranges, module_tree
from perflab.analysis.passes import attention_breakdown, pass_breakdown
from perflab.analysis.launch import LaunchVerdict, delay_summary, launch_api_stats, launch_delays, launch_verdict
from perflab.analysis.names import short_names
from perflab.analysis.ranges import range_breakdown
from perflab.trace.schema import Trace

DEFAULT_TOP = 10


@dataclass
class TraceReport:
    trace: Trace
    accounting: Accounting
    kernel_stats: KernelStats
    top_kernels: pd.DataFrame
    categories: pd.DataFrame
    ranges: pd.DataFrame
    launch_apis: pd.DataFrame
    launch_delay: dict[str, Any]
    verdict: LaunchVerdict
    gemm_fraction: float
    top_memory_ops: pd.DataFrame = field(default_factory=pd.DataFrame)
    meta: dict[str, Any] = field(default_factory=dict)
    passes: pd.DataFrame = field(default_factory=pd.DataFrame)  # per pass of a training step (analysis.passes)
    attention: dict[str, Any] | None = None  # softmax vs matmul inside explicit attention, per step
    modules: pd.DataFrame | None = None  # the module tree (analysis.modules), when the trace recorded module ranges
    module_note: str | None = None  # why part of the module attribution is missing (set by the capture)

    # Read-only views of what the trace and its accounting hold (the module docstring lists them).
    kernels = property(attrgetter("trace.kernels"), doc="The KernelTable (a DataFrame).")
    steps = property(attrgetter("accounting.steps"), doc="Per-step accounting (a DataFrame).")
    trace_accounting = property(attrgetter("accounting.trace"), doc="The whole trace's accounting, summed over devices (a Series).")
    devices = property(attrgetter("accounting.devices"), doc="Whole-trace accounting per device (a DataFrame).")

    def to_dict(self) -> dict[str, Any]:
        whole = self.accounting.trace
        steps = self.accounting.steps
        stats = self.kernel_stats
        n_steps = int(steps.groupby("device").size().max()) if self.accounting.has_step_annotations else 0  # per device
        summary = {
            "path": self.trace.meta.get("path"),
            "format": self.trace.meta.get("format"),
            "kernels": stats.kernels,
            "kernel_time_us": units.ns_to_us(stats.kernel_time_ns),
            "memcpy": stats.memcpy,
            "memset": stats.memset,
            "gpu_activities": stats.gpu_activities,
            "gpu_activity_time_us": units.ns_to_us(stats.gpu_activity_time_ns),
            "wall_us": units.ns_to_us(whole["wall_ns"]),
            "gpu_busy_us": units.ns_to_us(whole["busy_ns"]),
            "idle_us": units.ns_to_us(whole["idle_ns"]),
            "idle_by_cause_us": {cause: units.ns_to_us(whole[f"{cause}_ns"]) for cause in IDLE_CAUSES},
            "accounting_ns": {k: int(whole[k]) for k in ("start_ns", "end_ns", "wall_ns", "busy_ns", "idle_ns", "host_bound_ns", "kernel_gap_ns", "other_ns")},
            "kernel_gap_threshold_us": units.ns_to_us(self.accounting.kernel_gap_threshold_ns),
            "steps": n_steps,
            "kernels_per_step": (float(steps["kernels"].mean()) if n_steps else None),
            "mean_kernel_us": units.ns_to_us(stats.mean_ns),
            "median_kernel_us": units.ns_to_us(stats.median_ns),
            "short_kernel_share": stats.short_share,
            "short_kernel_time_share": stats.short_time_share,
            "top_kernels": top_records(self.top_kernels),
            "top_memory_ops": top_records(self.top_memory_ops),
            "categories_us": {c: units.ns_to_us(t) for c, t in self.categories.groupby("category", sort=False)["time_ns"].sum().items()},
            "categories_by_device": [
                {"device": int(r.device), "category": r.category, "count": int(r.count), "time_us": units.ns_to_us(r.time_ns), "busy_us": units.ns_to_us(r.busy_ns)}
                for r in self.categories.itertuples(index=False)
            ],
            "device_accounting": [
                {"device": int(r.device), "wall_us": units.ns_to_us(r.wall_ns), "gpu_busy_us": units.ns_to_us(r.busy_ns), "idle_us": units.ns_to_us(r.idle_ns),
                 "idle_by_cause_us": {cause: units.ns_to_us(getattr(r, f"{cause}_ns")) for cause in IDLE_CAUSES}}
                for r in self.accounting.devices.itertuples(index=False)
            ],
            "gemm_fraction": self.gemm_fraction,
            "ranges": [
                {"device": int(r.device), "range": r.range, "kernels": int(r.kernels), "gpu_time_us": units.ns_to_us(r.gpu_time_ns), "gpu_busy_us": units.ns_to_us(r.gpu_busy_ns),
                 "gemm_fraction": float(r.gemm_fraction), "instances": int(r.instances), "cpu_wall_us": units.ns_to_us(r.cpu_wall_ns),
                 "gpu_projected_us": units.ns_to_us(r.gpu_projected_ns)}
                for r in self.ranges.itertuples(index=False)
            ],
            "step_accounting": _step_records(steps),
            "launch": {
                "verdict": self.verdict.verdict,
                "launch_bound": self.verdict.launch_bound,
                "message": self.verdict.message,
                "delay_median_us": units.ns_to_us(self.launch_delay["median_ns"]),
                "delay_p90_us": units.ns_to_us(self.launch_delay["p90_ns"]),
                "launches": self.launch_delay["launches"],
                "apis": [
                    {"device": int(r.device), "api": r.api, "calls": int(r.calls), "total_us": units.ns_to_us(r.total_ns), "mean_us": units.ns_to_us(r.mean_ns), "activities": int(r.activities),
                     "delay_median_us": units.ns_to_us(r.delay_median_ns), "delay_p90_us": units.ns_to_us(r.delay_p90_ns)}
                    for r in self.launch_apis.itertuples(index=False)
                ],
            },
            "passes": _pass_records(self.passes),
            "attention": self.attention,
            "modules": _module_records(self.modules),
            "module_note": self.module_note,
            "unlinked_activities": int(self.trace.meta.get("unlinked", 0)),
            "meta": {k: v for k, v in self.trace.meta.items() if k not in ("devices",)},
            "devices": [d.get("name") for d in self.trace.meta.get("devices") or [] if isinstance(d, dict)],
        }
        return summary

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent, default=_jsonable)

    def write_csv(self, directory: str | Path, include_kernel_table: bool = True) -> list[Path]:
        """Write the tables as CSV files into ``directory``; returns the paths written."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        tables = {
            "steps.csv": self.accounting.steps,
            "trace_accounting.csv": self.accounting.trace.to_frame().T,
            "top_kernels.csv": self.top_kernels,
            "top_memory_ops.csv": self.top_memory_ops,
            "devices.csv": self.accounting.devices,
            "categories.csv": self.categories,
            "ranges.csv": self.ranges,
            "launch_apis.csv": self.launch_apis,
        }
        if self.modules is not None:
            tables["modules.csv"] = self.modules
        if include_kernel_table:
            tables["kernels.csv"] = self.trace.kernels
        written = []
        for name, table in tables.items():
            path = directory / name
            table.to_csv(path, index=False)
            written.append(path)
        return written


def analyze_trace(trace: Trace, top: int = DEFAULT_TOP, kernel_gap_threshold_ns: int = DEFAULT_KERNEL_GAP_NS) -> TraceReport:
    kernels = trace.kernels
    accounting = account(kernels, trace.steps, kernel_gap_threshold_ns)
    delays = launch_delays(kernels)
    several = len(devices_of(kernels)) > 1

    def launch_apis(mine: pd.DataFrame) -> pd.DataFrame:
        # with several devices, a device's calls are those of the threads that launched its work
        launches = trace.launches[trace.launches["tid"].isin(launching_threads(mine))] if several else trace.launches
        return launch_api_stats(launches, mine, launch_delays(mine) if several else delays)

    return TraceReport(
        trace=trace,
        accounting=accounting,
        kernel_stats=kernel_stats(kernels),
        top_kernels=with_short_names(by_device(kernels, lambda mine: top_kernels(mine, top))),
        top_memory_ops=by_device(kernels, lambda mine: top_memory_ops(mine, top)),
        categories=by_device(kernels, category_breakdown),
        ranges=by_device(kernels, lambda mine: range_breakdown(mine, trace.ranges)),
        launch_apis=by_device(kernels, launch_apis),
        launch_delay=delay_summary(kernels, delays),
        verdict=launch_verdict(accounting, cpu_only=trace.cpu_only),
        gemm_fraction=gemm_fraction(kernels),
        passes=pass_breakdown(kernels, trace.ranges, _annotated_steps(trace)),
        attention=attention_breakdown(kernels, _annotated_steps(trace)),
        modules=module_tree(kernels, trace.ranges, _annotated_steps(trace)) if has_module_ranges(trace.ranges) else None,
    )


def _module_records(tree: pd.DataFrame | None) -> list[dict[str, Any]] | None:
    """The module tree as JSON records: totals over the recorded steps in µs, and per step."""
    if tree is None:
        return None
    steps = tree.attrs.get("steps", 1)
    return [
        {"pass": r.pass_, "module": r.module, "class": r.cls, "depth": int(r.depth), "exclusive_us": units.ns_to_us(r.exclusive_ns),
         "inclusive_us": units.ns_to_us(r.inclusive_ns), "inclusive_us_per_step": units.ns_to_us(r.inclusive_ns / steps), "kernels": int(r.kernels),
         "kernels_inclusive": int(r.kernels_inclusive), "share_exclusive": float(r.share_exclusive), "share_inclusive": float(r.share_inclusive)}
        for r in tree.rename(columns={"pass": "pass_", "class": "cls"}).itertuples(index=False)
    ]


def _annotated_steps(trace: Trace) -> int:
    return max(len(trace.steps), 1)


def top_records(table: pd.DataFrame) -> list[dict[str, Any]]:
    """A top-kernels (or memory operations) table as JSON records, µs: what run.json and ``analyze --json`` hold and the
    console's top table draws (``report.trace_console.top_table``)."""
    return [
        {"device": int(r.device), "name": r.name, "full_name": r.full_name, "category": r.category, "total_us": units.ns_to_us(r.total_ns),
         "count": int(r.count), "share": float(r.share)}
        for r in table.itertuples(index=False)
    ]


def _pass_records(passes: pd.DataFrame) -> list[dict[str, Any]]:
    """The per-pass table as JSON records (µs), each kernel's full name with its short name beside it."""
    records = passes.to_dict(orient="records")
    short = short_names(n for r in records for n in (r.get("top_kernel"), r.get("top_non_gemm_kernel")) if n)
    out = []
    for record in records:
        rec = {(k[:-3] + "_us" if k.endswith("_ns") else k): (units.ns_to_us(v) if k.endswith("_ns") else v) for k, v in record.items()}
        for key in ("top_kernel", "top_non_gemm_kernel"):
            rec[f"{key}_short"] = short.get(record.get(key)) if record.get(key) else None
        out.append(rec)
    return out


def _step_records(steps: pd.DataFrame) -> list[dict[str, Any]]:
    """Per-step accounting as JSON records (vectorised: a trace can have thousands of steps)."""
    us = {c: (steps[f"{c}_ns"].to_numpy() / 1000).round(3).tolist() for c in ("wall", "busy", "idle", "kernel_time", *IDLE_CAUSES)}
    devices = steps["device"].tolist()
    return [
        {"device": devices[i], "step": step, "name": name, "start_ns": start, "end_ns": end, "wall_us": us["wall"][i], "gpu_busy_us": us["busy"][i],
         "idle_us": us["idle"][i], "idle_by_cause_us": {c: us[c][i] for c in IDLE_CAUSES}, "kernels": kernels,
         "kernel_time_us": us["kernel_time"][i]}
        for i, (step, name, start, end, kernels) in enumerate(zip(
            steps["step"].tolist(), steps["name"].astype(str).tolist(), steps["start_ns"].tolist(), steps["end_ns"].tolist(),
            steps["kernels"].tolist()))
    ]


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)
    return str(value)
