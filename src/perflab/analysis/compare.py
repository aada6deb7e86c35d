"""Run-to-run comparison that closes exactly: where did the difference in step time come from?

For each step window of a trace (perflab.analysis.accounting), with GPU activities assigned to the window
in which their launch call started:

    wall = Σ_category GPU time − overlap + host_bound + kernel_gap + other

where GPU time sums activity durations per category, and ``overlap`` = Σ GPU time − busy is the time
counted twice because activities ran at once on several streams (plus any work that spilled across a
window edge; 0 for one stream with per-step synchronisation). The identity is exact in integer ns per
window, so per-step means of A and B give

    Δwall = Σ_category ΔGPU time − Δoverlap + Δhost_bound + Δkernel_gap + Δother

exactly (to float rounding of the means, far below a nanosecond). Steps are matched by position: the first
min(steps of A, steps of B) windows of each.

Two CPU-only traces (``Trace.cpu_only``: the work is torch's top-level operators) are compared in the same identity,
and said in CPU terms: operators and their time, the time between operators (the interpreter's), never kernels, GPU
time or "GPU-bound".

**Every Δ has an interval** from the traced steps' spread: Welch's t interval on the difference of the two sides'
per-step means (``stats.welch_difference``), for the total and each term. Where the total's interval holds 0 (or one
step a side gives no spread), the verdict is "cannot tell", with about how many traced steps a side would tell a
difference of this size (``stats.units_needed``). **What a trace describes** (``qualify``): a trace its run.json
flags ``trace_inflated`` (the traced steps ran much longer than the untraced ones) is named on the first line, and a
verdict from it says it describes the program under the profiler; where untraced timings of both sides exist (their
run.json, or the profiled cases' rows), the verdict comes from them (``analysis.regressions.compare_case``: two
runs, one process each, so within-run) and the traced Δ only attributes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from perflab.analysis.modules import has_module_ranges, module_deltas, module_tree
from perflab.analysis.accounting import IDLE_CAUSES, account, step_windows, window_of_activities
from perflab.analysis.devices import devices_of
from perflab.analysis.names import short_names
from perflab.errors import PerflabError
from perflab.records.run_report import RunReport, RunView
from perflab.records.run_report import read as read_run_report
from perflab.stats import LEVEL, Difference, units_needed, welch_difference
from perflab.trace.schema import WORK_KINDS, Trace

MOST_STEPS = 1000  # traced steps a side beyond which "cannot tell" stops offering a count


@dataclass
class StepProfile:
    """Per-step means of one trace over its first ``steps`` windows."""

    steps: int
    wall_ns: float
    busy_ns: float
    idle_ns: dict[str, float]
    category_ns: dict[str, float]  # GPU time per category (durations summed)
    overlap_ns: float
    kernels: float  # kernels (kind kernel) per step
    kernel_time_ns: float
    by_name: pd.DataFrame  # full kernel name -> count and time per step
    per_step: dict = field(default_factory=dict)  # each term's value in each step (ns): "wall", "category:NAME", "idle:CAUSE"

    @property
    def mean_kernel_ns(self) -> float:
        return self.kernel_time_ns / self.kernels if self.kernels else 0.0

    def closure_ns(self) -> float:
        """wall − (Σ GPU time − overlap + Σ idle): 0 up to float rounding."""
        return self.wall_ns - (sum(self.category_ns.values()) - self.overlap_ns + sum(self.idle_ns.values()))


@dataclass
class TraceComparison:
    """Two traces' mean steps (``StepProfile``), A's and B's, compared term by term: what the difference in step time
    came from."""

    a: StepProfile
    b: StepProfile
    labels: tuple[str, str]
    delta_wall_ns: float
    delta_by_category: dict[str, float]
    delta_overlap_ns: float
    delta_idle_by_cause: dict[str, float]
    added_kernels: pd.DataFrame
    removed_kernels: pd.DataFrame
    verdict: str
    items_per_step: tuple[int | None, int | None] = (None, None)  # what each side's throughput counts per step
    item: str | None = None  # what those items are ("img", "token"); None: unknown or not the same on both sides
    cpu_only: bool = False  # both traces are CPU-only: operators are the work
    extra: dict = field(default_factory=dict)
    intervals: dict = field(default_factory=dict)  # term ("wall", "category:NAME", "idle:CAUSE") → stats.Difference, None with one step a side
    steps_needed: int | None = None  # cannot tell: about how many traced steps a side would tell a difference of this size
    inflated: list = field(default_factory=list)  # [{"side": label, "inflation": traced ÷ untraced}] of traces flagged trace_inflated
    untraced: object = None  # analysis.regressions.CaseChange of the two sides' untraced timings, where both exist
    # each side's untraced loop from its run.json (``untraced_loop``: median with its CI, mean, steps, samples and tokens
    # a second), [] where neither side is a run; ``untraced_unit``: what the untraced verdict compares, the step, or the
    # time a sample (or a token) where the sides' samples (tokens) a step differ
    untraced_loop: list = field(default_factory=list)
    untraced_unit: str = "step"
    first_line: str | None = None  # what the result must say first (an inflated trace)

    @property
    def decided(self) -> bool:
        """Whether the traced steps tell the two apart: the total Δ's interval excludes 0."""
        wall = self.intervals.get("wall")
        return wall is not None and wall.decided

    @property
    def claims_difference(self) -> bool:
        """Whether the result says B is faster or slower: from the untraced timings where they exist, else from the
        traced steps."""
        if self.untraced is not None:
            return self.untraced.verdict in ("faster", "slower")
        return self.decided

    def closure_ns(self) -> float:
        parts = sum(self.delta_by_category.values()) - self.delta_overlap_ns + sum(self.delta_idle_by_cause.values())
        return self.delta_wall_ns - parts

    @property
    def words(self) -> "Words":
        return CPU_WORDS if self.cpu_only else GPU_WORDS

    @property
    def throughput_unit(self) -> str:
        return f"{self.item or 'items'}/s"

    def throughput_table(self) -> pd.DataFrame:
        """The token-reduction study's "GPU time vs throughput" table, in per-step units (a CPU trace's operators in the
        kernels' columns)."""
        rows = []
        for label, p, batch in zip(self.labels, (self.a, self.b), self.items_per_step):
            rows.append({
                "configuration": label,
                "gpu_time_ms_per_step": p.kernel_time_ns / 1e6,
                "kernels_per_step": p.kernels,
                "mean_kernel_us": p.mean_kernel_ns / 1e3,
                "wall_ms_per_step": p.wall_ns / 1e6,
                "gpu_busy_share": p.busy_ns / p.wall_ns if p.wall_ns else 0.0,
                "throughput_per_s": (batch * 1e9 / p.wall_ns) if batch and p.wall_ns else None,
            })
        return pd.DataFrame(rows)

    def to_dict(self) -> dict:
        us = lambda ns: ns / 1e3  # noqa: E731
        return {
            "labels": list(self.labels),
            "steps": [self.a.steps, self.b.steps],
            "wall_us": [us(self.a.wall_ns), us(self.b.wall_ns)],
            "gpu_busy_us": [us(self.a.busy_ns), us(self.b.busy_ns)],
            "delta_wall_us": us(self.delta_wall_ns),
            "delta_by_category": {k: us(v) for k, v in self.delta_by_category.items()},
            "delta_overlap_us": us(self.delta_overlap_ns),
            "delta_idle_by_cause": {k: us(v) for k, v in self.delta_idle_by_cause.items()},
            "closure_ns": self.closure_ns(),
            "kernels_per_step": [self.a.kernels, self.b.kernels],
            "mean_kernel_us": [us(self.a.mean_kernel_ns), us(self.b.mean_kernel_ns)],
            "added_kernels": _records(self.added_kernels),
            "removed_kernels": _records(self.removed_kernels),
            "verdict": self.verdict,
            "table": _records(self.throughput_table()),
            "throughput_unit": self.throughput_unit,
            "cpu_only": self.cpu_only,
            "modules": _records(self.extra["modules"]) if "modules" in self.extra else None,
            "delta_wall_ci_us": self._ci_us("wall"),
            "delta_by_category_ci_us": {k: self._ci_us(f"category:{k}") for k in self.delta_by_category},
            "delta_idle_by_cause_ci_us": {k: self._ci_us(f"idle:{k}") for k in self.delta_idle_by_cause},
            "decided": self.decided,
            "steps_needed": self.steps_needed,
            "inflated": self.inflated,
            "untraced": self.untraced.to_dict() if self.untraced is not None else None,
            "untraced_loop": self.untraced_loop,
            "untraced_unit": self.untraced_unit,
            "first_line": self.first_line,
            "claims_difference": self.claims_difference,
        }

    def _ci_us(self, term: str) -> list | None:
        d = self.intervals.get(term)
        return [d.low / 1e3, d.high / 1e3] if d is not None else None


def step_profile(trace: Trace, steps: int | None = None) -> StepProfile:
    """Per-step means over the first ``steps`` step windows of ``trace`` (all of them by default)."""
    kernels = trace.kernels
    accounting = account(kernels, trace.steps)
    per_step = accounting.steps
    windows = step_windows(kernels, trace.steps)
    n = len(per_step) if steps is None else min(steps, len(per_step))
    per_step, windows = per_step.iloc[:n], windows.iloc[:n]
    window = window_of_activities(kernels, windows, whole_trace=len(trace.steps) == 0)
    inside = window >= 0
    acts = kernels[inside]
    categories = acts.groupby(acts["category"].astype(str), observed=True)["dur_ns"].sum()
    category_ns = {str(k): float(v) / n for k, v in categories.items() if v}
    terms = {"wall": per_step["wall_ns"].to_numpy(float)} | {f"idle:{c}": per_step[f"{c}_ns"].to_numpy(float) for c in IDLE_CAUSES}
    for category in category_ns:
        terms[f"category:{category}"] = np.zeros(n)
    by_window = acts.groupby([window[inside], acts["category"].astype(str)], observed=True)["dur_ns"].sum()
    for (w, category), v in by_window.items():
        if category in category_ns and 0 <= w < n:
            terms[f"category:{category}"][w] = v
    busy = float(per_step["busy_ns"].sum()) / n
    overlap = sum(category_ns.values()) - busy
    is_kernel = acts["kind"].isin(WORK_KINDS)
    names = acts[is_kernel].assign(full_name=acts.loc[is_kernel, "name"].astype(str))
    by_name = names.groupby("full_name").agg(count=("dur_ns", "size"), time_ns=("dur_ns", "sum"))
    by_name = by_name / n
    return StepProfile(
        steps=n,
        wall_ns=float(per_step["wall_ns"].sum()) / n,
        busy_ns=busy,
        idle_ns={cause: float(per_step[f"{cause}_ns"].sum()) / n for cause in IDLE_CAUSES},
        category_ns=category_ns,
        overlap_ns=overlap,
        kernels=float(is_kernel.sum()) / n,
        kernel_time_ns=float(acts.loc[is_kernel, "dur_ns"].sum()) / n,
        by_name=by_name,
        per_step=terms,
    )


def compare_traces(a: Trace, b: Trace, labels: tuple[str, str] = ("A", "B"), items_per_step: tuple[int | None, int | None] = (None, None),
                   item: str | None = None) -> TraceComparison:
    for label, trace in zip(labels, (a, b)):
        devices = devices_of(trace.kernels)
        if len(devices) > 1:  # its steps are per device: one device's steps against the other trace's would not close
            raise PerflabError(f"{label} holds GPU work on {len(devices)} devices ({', '.join(map(str, devices))}); "
                               "compare compares one device's steps: analyze it for the per-device tables")
    if (len(a.steps) > 0) != (len(b.steps) > 0):
        with_steps, without = (labels[0], labels[1]) if len(a.steps) else (labels[1], labels[0])
        raise PerflabError(
            f"{with_steps} has step annotations and {without} has none, so a step would be compared with a whole trace; "
            "profile both with steps (perflab profile, or perflab.profile() in your loop) or compare two traces without them"
        )
    steps = min(_step_count(a), _step_count(b))
    pa, pb = step_profile(a, steps), step_profile(b, steps)
    comparison = compare_profiles(pa, pb, labels, items_per_step, item=item, cpu_only=a.cpu_only and b.cpu_only)
    if has_module_ranges(a.ranges) and has_module_ranges(b.ranges):
        # which modules changed: inclusive GPU time per step, each run averaged over its recorded steps
        trees = [module_tree(t.kernels, t.ranges, _step_count(t)) for t in (a, b)]
        comparison.extra["modules"] = module_deltas(trees[0], trees[1])
    return comparison


def side_labels(paths) -> list[str]:
    """Two files' labels by what tells them apart: the program and arguments of the ``perflab run`` that wrote each
    (``program`` of the run.json beside it) where both have one and they differ, else the shortest path suffixes that
    differ (``a/trace.json.gz`` and ``b/trace.json.gz``, not ``trace.json.gz`` twice)."""
    programs = [_run_program(Path(p).parent / "run.json") for p in paths]
    if all(programs) and len(set(programs)) == len(programs):
        return programs
    return path_suffixes(paths)


def path_suffixes(paths) -> list[str]:
    """The shortest trailing parts of each path (resolved) that differ between them; a path given twice is marked
    (A) and (B)."""
    parts = [Path(p).resolve().parts for p in paths]
    longest = max(len(p) for p in parts)
    for k in range(1, longest + 1):
        tails = [str(Path(*p[-k:])) for p in parts]
        if len(set(tails)) == len(tails):
            return tails
    return [f"{Path(paths[i]).name} ({'AB'[i] if i < 2 else i})" for i in range(len(paths))]


def run_record(path: Path) -> RunReport | None:
    """The run.json at ``path`` (``perflab run``'s report, ``records.run_report.read``), or None: no such file, or not
    a JSON object. One of a newer format than this perflab reads is one PerflabError line."""
    return read_run_report(path)


def _run_program(path: Path) -> str | None:
    """The program line a run.json records (``perflab run``'s ``program``), or None: no such file, or not run's."""
    report = run_record(path)
    program = report.program if report is not None else None
    return program if isinstance(program, str) and program.strip() else None


def _step_count(trace: Trace) -> int:
    return max(len(trace.steps), 1)


def compare_profiles(pa: StepProfile, pb: StepProfile, labels=("A", "B"), items_per_step=(None, None), item: str | None = None,
                     cpu_only: bool = False) -> TraceComparison:
    categories = sorted(set(pa.category_ns) | set(pb.category_ns))
    delta_cat = {c: pb.category_ns.get(c, 0.0) - pa.category_ns.get(c, 0.0) for c in categories}
    delta_idle = {cause: pb.idle_ns[cause] - pa.idle_ns[cause] for cause in IDLE_CAUSES}
    names = pa.by_name.merge(pb.by_name, how="outer", left_index=True, right_index=True, suffixes=("_a", "_b")).fillna(0.0)
    names["delta_count"] = names["count_b"] - names["count_a"]
    names["delta_time_ns"] = names["time_ns_b"] - names["time_ns_a"]
    names = names.reset_index()
    # short names unique over both runs' kernels, the busiest (A + B time) keeping the bare name
    busiest = names.assign(total=names["time_ns_a"] + names["time_ns_b"]).sort_values(["total", "full_name"], ascending=[False, True])
    short = short_names(busiest["full_name"])
    names.insert(0, "name", [short[n] for n in names["full_name"]])
    added = names[names["delta_count"] > 0].sort_values(["delta_count", "delta_time_ns"], ascending=False).reset_index(drop=True)
    removed = names[names["delta_count"] < 0].sort_values(["delta_count", "delta_time_ns"]).reset_index(drop=True)
    comparison = TraceComparison(
        a=pa, b=pb, labels=tuple(labels), delta_wall_ns=pb.wall_ns - pa.wall_ns, delta_by_category=delta_cat,
        delta_overlap_ns=pb.overlap_ns - pa.overlap_ns, delta_idle_by_cause=delta_idle, added_kernels=added,
        removed_kernels=removed, verdict="", items_per_step=tuple(items_per_step), item=item, cpu_only=cpu_only,
    )
    comparison.intervals = {term: _difference(pa.per_step.get(term), pb.per_step.get(term))
                            for term in ["wall"] + [f"category:{c}" for c in categories] + [f"idle:{c}" for c in IDLE_CAUSES]}
    wall = comparison.intervals["wall"]
    if wall is not None and not wall.decided:
        spread = float(np.hypot(np.std(pa.per_step["wall"], ddof=1), np.std(pb.per_step["wall"], ddof=1)))
        comparison.steps_needed = units_needed(spread, wall.delta, most=MOST_STEPS, dof_of=lambda n: 2 * n - 2)
    comparison.verdict = verdict(comparison)
    return comparison


def _difference(a, b) -> Difference | None:
    """B − A of a term's per-step values with Welch's interval; None where a side has fewer than two steps (or the
    profile carries no per-step values). A term one side lacks is 0 in each of its steps."""
    if a is None and b is None:
        return None
    a = np.zeros(len(b)) if a is None else a
    b = np.zeros(len(a)) if b is None else b
    if len(a) < 2 or len(b) < 2:
        return None
    return welch_difference(a, b)


@dataclass(frozen=True)
class Words:
    """How a comparison names its terms: a GPU trace's kernels, or a CPU-only trace's operators."""

    work: str  # the unit of work
    works: str
    time: str  # the work's time
    idle: str  # host-bound idle
    bound_by_host: str  # the verdict when host time grows more than the work's
    bound_by_work: str
    both_by_host: str  # both steps spend more time waiting on the host than working


GPU_WORDS = Words("kernel", "kernels", "GPU time", "host-bound idle", "launch-bound", "GPU-bound",
                  "Both are launch-bound (host-bound idle exceeds GPU busy time)")
CPU_WORDS = Words("operator", "operators", "operator time", "time between operators", "interpreter-bound", "operator-bound",
                  "Both are interpreter-bound (the time between operators exceeds the time in them)")


def verdict(c: TraceComparison) -> str:
    """One sentence, in numbers, of why B's step is longer or shorter than A's."""
    a_label, b_label = c.labels
    w = c.words
    ms = lambda ns: f"{abs(ns) / 1e6:.3g} ms"  # noqa: E731
    d_busy = c.b.busy_ns - c.a.busy_ns
    d_host = c.delta_idle_by_cause["host_bound"]
    d_kernels = c.b.kernels - c.a.kernels
    movers = sorted(c.delta_by_category.items(), key=lambda kv: kv[1])
    savings = [(k, v) for k, v in movers if v < 0][:2]
    costs = [(k, v) for k, v in reversed(movers) if v > 0][:2]
    saved = ", ".join(f"{k} −{ms(v)}" for k, v in savings)
    added = ", ".join(f"{k} +{ms(v)}" for k, v in costs)
    launches = f"{abs(d_kernels):.0f} {'more' if d_kernels >= 0 else 'fewer'} {w.works} per step"
    direction = "slower" if c.delta_wall_ns > 0 else "faster"
    head = f"{b_label} is {ms(c.delta_wall_ns)} per step {direction} than {a_label}"
    if c.untraced is not None or not c.decided:  # the traced Δ decides nothing: it only says what it is made of
        longer = "longer" if c.delta_wall_ns > 0 else "shorter"
        head = f"{_undecided(c)}In the traced steps, {b_label}'s step is {ms(c.delta_wall_ns)} {longer} than {a_label}'s"
    elif c.inflated:
        head = f"Under the profiler, {head}"
    if both_launch_bound(c):
        return f"{head}. {_launch_bound_reason(c, d_busy, saved, launches)}"
    if c.delta_wall_ns > 0 and d_busy < 0 and d_host > 0:
        waits = "the interpreter's time between operators" if c.cpu_only else "the GPU waits for the CPU"
        return (f"{head}: it saves {ms(d_busy)} of {w.time} ({saved}) but adds {ms(d_host)} of {w.idle} "
                f"with {launches}: {w.bound_by_host} ({waits}).")
    if c.delta_wall_ns > 0:
        cause = w.bound_by_host if d_host > d_busy else w.bound_by_work
        return (f"{head}: {w.time} {'+' if d_busy >= 0 else '−'}{ms(d_busy)} ({added or saved}), {w.idle} "
                f"{'+' if d_host >= 0 else '−'}{ms(d_host)}, {launches}: {cause}.")
    work = f"it saves {ms(d_busy)} of {w.time} ({saved})" if d_busy < 0 else f"its {w.time} grows by {ms(d_busy)} ({added})"
    return f"{head}: {work}; {w.idle} {'+' if d_host >= 0 else '−'}{ms(d_host)}, {launches}."


def _undecided(c: TraceComparison) -> str:
    """The sentence before a traced Δ that decides nothing: the untraced timings' verdict where there is one, else why
    the traced steps cannot tell (and how many steps would)."""
    a_label, b_label = c.labels
    if c.untraced is not None:
        u = c.untraced
        r = u.ratio
        key = f"{c.untraced_unit}s_per_step"
        per = "" if c.untraced_unit == "step" else (
            f", the time a {c.untraced_unit} (their {c.untraced_unit}s a step differ: {' and '.join(f'{x[key]:g}' for x in c.untraced_loop)})")
        return (f"From the untraced steps{per}: {b_label} ÷ {a_label} {r.ratio:.3f}× ({r.low:.3f}–{r.high:.3f}, each run's own "
                f"{LEVEL:.0%} CI), {u.verdict_text}. ")
    wall = c.intervals.get("wall")
    n = min(c.a.steps, c.b.steps)
    whether = f"whether {b_label} is faster or slower than {a_label}"
    if wall is None:
        return f"Cannot tell from {n} traced step{'s' if n != 1 else ''} a side {whether}: one step gives no spread to judge by (trace 5 or more). "
    text = (f"Cannot tell from {n} traced steps a side {whether}: Δ {wall.delta / 1e6:+.3g} ms a step, {LEVEL:.0%} CI "
            f"{wall.low / 1e6:+.3g} to {wall.high / 1e6:+.3g} ms; ")
    if c.steps_needed:
        return text + f"about {c.steps_needed} traced steps a side would tell a difference of this size. "
    return text + f"more than {MOST_STEPS} traced steps a side would not tell one of this size. "


def qualify(c: TraceComparison, runs=(None, None), untraced_rows=(None, None), threshold: float = 0.05) -> TraceComparison:
    """What ``c`` describes, from outside its traces: ``runs`` (each side's run.json, ``records.run_report.RunReport``, or None) name a trace
    flagged ``trace_inflated`` on the first line; untraced timings of both sides (``untraced_rows``: result rows, or
    each run.json's ``timing``) give the verdict (``analysis.regressions.compare_case``), the traced Δ then only
    attributing it. The verdict is written again."""
    from perflab.analysis.regressions import compare_case

    for label, run in zip(c.labels, runs):
        traced = _view(run).traced
        inflation = traced.inflation
        if "trace_inflated" in _flag_names(run) or traced.inflated is True:
            c.inflated.append({"side": label, "inflation": float(inflation) if _positive(inflation) else None})
    if c.inflated:
        each = "; ".join(f"{x['side']}'s traced steps took ×{x['inflation']:.2f} its untraced ones" if x["inflation"] else
                         f"{x['side']}'s traced steps ran longer than its untraced ones" for x in c.inflated)
        c.first_line = (f"Inflated trace{'s' if len(c.inflated) > 1 else ''} (run.json: trace_inflated): {each}. The traced Δ "
                        "describes the program under the profiler, not as it runs.")
    if any(run is not None for run in runs):
        c.untraced_loop = [untraced_loop(run, label) for run, label in zip(runs, c.labels)]
        c.untraced_unit = work_unit(*c.untraced_loop)
    per = {"sample": "samples_per_step", "token": "tokens_per_step"}.get(c.untraced_unit)
    rows = [row if row is not None else _timing_row(run, label, (loop or {}).get(per) if per else None)
            for row, run, label, loop in zip(untraced_rows, runs, c.labels, c.untraced_loop or [None, None])]
    if all(rows):
        change = compare_case(*rows, threshold)
        c.untraced = change if change.ratio is not None else None
    c.verdict = verdict(c)
    return c


def _timing_row(run: RunReport | None, label: str, per_step: float | None = None) -> dict | None:
    """A run.json's untraced timing as a result row ``compare_case`` reads (its median, its CI, its flags), or None
    where it holds none that is a positive median inside a positive interval. ``per_step``: the samples (or tokens) a
    step, where the time a sample (token) is compared: the median and its CI divided by it."""
    timing = _view(run).timing
    median, ci = timing.median_ms, timing.ci_ms or timing.ci95_ms
    if not _positive(median) or not isinstance(ci, list) or len(ci) != 2 or not all(map(_positive, ci)) or not ci[0] <= median <= ci[1]:
        return None
    scale = float(per_step) if _positive(per_step) else 1.0
    return {"case_id": "run", "label": label, "status": "ok", "median_ms": float(median) / scale, "ci95_ms": [float(x) / scale for x in ci],
            "flags": _flag_names(run)}


def untraced_loop(run: RunReport | None, label: str) -> dict | None:
    """A run.json's untraced steps as ``compare`` shows them beside its verdict: the median with its CI, the mean (the
    program's wall time a step), and the throughput (``loop``: steps, samples and tokens a second, and a step); None
    where the run holds no timing."""
    run_view = _view(run)
    timing, loop = run_view.timing, run_view.loop
    if not _positive(timing.median_ms):
        return None
    throughput = loop.throughput
    number = lambda x: float(x) if _positive(x) else None  # noqa: E731
    ci = timing.ci_ms or timing.ci95_ms
    return {"side": label, "median_ms": float(timing.median_ms),
            "ci_ms": [float(x) for x in ci] if isinstance(ci, list) and len(ci) == 2 and all(map(_positive, ci)) else None,
            "mean_ms": number(loop.mean_ms), "steps_per_s": number(loop.steps_per_s),
            **{key: number(getattr(throughput, key)) for key in ("samples_per_step", "tokens_per_step", "samples_per_s", "tokens_per_s")}}


def work_unit(a: dict | None, b: dict | None) -> str:
    """What two runs' untraced steps are compared by: the step, where their work a step is the same or unknown; the time
    a token where both count tokens and theirs differ (or their samples do); else a sample where their samples differ."""
    if a is None or b is None:
        return "step"
    differ = lambda key: a.get(key) is not None and b.get(key) is not None and a[key] != b[key]  # noqa: E731
    both = lambda key: a.get(key) is not None and b.get(key) is not None  # noqa: E731
    if both("tokens_per_step") and (differ("tokens_per_step") or differ("samples_per_step")):
        return "token"
    return "sample" if differ("samples_per_step") else "step"


def _view(run: RunReport | None) -> RunView:
    """A side's run.json read by attribute (an empty one where the side has none)."""
    return RunView.of(run) if run is not None else RunView()


def _flag_names(run: RunReport | None) -> list[str]:
    return run.flag_names() if run is not None else []


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x < float("inf")


def both_launch_bound(c: TraceComparison) -> bool:
    return all(p.idle_ns["host_bound"] > p.busy_ns for p in (c.a, c.b))


def _launch_bound_reason(c: TraceComparison, d_busy: float, saved: str, launches: str) -> str:
    """Both steps wait on the CPU: the step costs about (wall time per kernel) × kernels, where the wall
    time per kernel is, in a launch-bound step, the CPU's time to issue one kernel (its op, its launch).

    The CPU's speed can drift between two profiled runs (a shared or virtual host), so the wall-clock
    difference alone can mislead; compare the kernels at one CPU speed, A's.
    """
    per_launch_a = c.a.wall_ns / c.a.kernels if c.a.kernels else 0.0
    per_launch_b = c.b.wall_ns / c.b.kernels if c.b.kernels else 0.0
    extra = (c.b.kernels - c.a.kernels) * per_launch_a
    w = c.words
    text = (f"{w.both_by_host}. {w.time[0].upper() + w.time[1:]} {'−' if d_busy < 0 else '+'}{abs(d_busy) / 1e6:.3g} ms"
            f"{f' ({saved})' if d_busy < 0 and saved else ''}, {launches}; at {c.labels[0]}'s wall time per {w.work} ({per_launch_a / 1e3:.1f} µs), "
            f"that is {'+' if extra >= 0 else '−'}{abs(extra) / 1e6:.3g} ms of host time per step")
    drift = per_launch_b / per_launch_a - 1 if per_launch_a else 0.0
    if abs(drift) > 0.1:
        text += (f" (the wall time per {w.work} differed by {drift:+.0%} between the two runs: host speed drifted, so compare "
                 f"{w.works}, not wall time)")
    return text + "."


def _records(frame: pd.DataFrame) -> list[dict]:
    """The frame's rows as JSON values: a NaN (a module's ratio where A had none of it) is null, which strict JSON
    readers take."""
    out = []
    for rec in frame.to_dict(orient="records"):
        out.append({k: (None if v != v else float(v)) if isinstance(v, (float, np.floating, np.integer)) else v for k, v in rec.items()})
    return out
