"""A case's profile pass and its Nsight Compute pass, after its untraced timing: what ``perflab profile``,
``perflab ncu`` and a sweep's worker run; a data-parallel case's profile on every rank (``profile --parallel``).
Capture (trace), analysis and the harness (measure) meet here, below the API and the sweep, which both call it.

Heavy modules (torch) are imported inside the functions that need them.
"""

from __future__ import annotations

from typing import Sequence

from perflab.errors import PerflabError
from perflab.spec import Case


def trace_report_of(path, top: int = 10):
    """A trace file's TraceReport (``api.analyze`` is the public face)."""
    from perflab.analysis.trace_report import analyze_trace
    from perflab.trace.load import load_trace

    return analyze_trace(load_trace(path), top=top)


def profile_pass(case: Case, out_dir, steps: int = 5, top: int = 10, pin: bool = True, by_module: bool = False) -> dict:
    """Time ``case`` with the harness (no profiler), then record ``steps`` steps of it and analyse them.

    Returns {"case", "row" (the untraced result row), "trace_path", "report" (TraceReport),
    "traced_step_ms" (median step window), "inflation" (traced ÷ untraced)}. The row is judged for
    ``host_contention`` (one row: no ``host_drift``); ``pin``: as for :func:`bench`. ``by_module``: the profiled
    pass also records module ranges, and ``report.modules`` is the module tree (eager mode).
    """
    from perflab.measure.harness import run_case
    from perflab.trace.capture import capture_case

    if case.device != "cuda":
        raise PerflabError("profiling a case accounts for its GPU time, so it needs a CUDA GPU (--device cuda); on the CPU, "
                           "perflab bench times it and perflab.profile() records a CPU trace of your own loop")
    from perflab.paths import make_out_dir

    if by_module and case.mode != "eager":
        raise PerflabError(f"--by-module needs eager mode: {case.mode} fuses kernels across modules, so no kernel belongs to one module")
    from perflab.measure.canary import mark_host_flags
    from perflab.measure.pinning import HostOptions

    trace_path = make_out_dir(out_dir) / f"{case.id}_{case.mode.replace(':', '-')}.json.gz"
    (row,) = mark_host_flags([run_case(case, host=HostOptions(pin=pin))])
    if row["status"] != "ok":
        return {"case": case, "row": row, "trace_path": None, "report": None, "traced_step_ms": None, "inflation": None}
    captured = capture_case(case, trace_path, steps=steps, by_module=by_module)
    report = trace_report_of(trace_path, top=top)
    if by_module and captured.module_note:
        report.module_note = captured.module_note
    traced = float(report.steps["wall_ns"].median()) / 1e6
    return {"case": case, "row": row, "trace_path": trace_path, "report": report, "traced_step_ms": traced, "inflation": traced / row["median_ms"]}


def profile_summary(trace_path, untraced_ms: float, top: int = 5) -> dict:
    """What a sweep row keeps of a case's profile pass: the traced step time and the profiler's inflation over the
    untraced median, kernels per step, the GEMM fraction, the top kernels, the per-pass breakdown and attention."""
    report = trace_report_of(trace_path, top=top)
    data = report.to_dict()
    traced = float(report.steps["wall_ns"].median()) / 1e6 if len(report.steps) else None
    return {
        "trace_path": str(trace_path),
        "traced_step_ms": traced,
        "inflation": traced / untraced_ms if traced and untraced_ms else None,
        "steps": data["steps"],
        "kernels_per_step": data["kernels_per_step"],
        "gemm_fraction": data["gemm_fraction"],
        "top_kernels": data["top_kernels"],
        "passes": data["passes"],
        "attention": data["attention"],
        "verdict": data["launch"]["verdict"],
    }


def ncu_case(case: Case, top: int = 10, out_dir="perflab-traces", per_config: int = 0):
    """Nsight Compute counters for the top-``top`` kernels of ``case``, joined with its kernel table.

    ``per_config``: launches ncu profiles per launch configuration, each weighted by the step's launches of its
    configuration; 0 profiles every launch. Returns (joined DataFrame, profile result). Raises PerflabError when
    ncu is absent.
    """
    from perflab.analysis.accounting import step_windows, window_of_activities
    from perflab.trace.ncu import attach_step_configs, attach_trace_names, find_ncu, join_counters, run_ncu

    find_ncu()  # fail before profiling when there is no ncu
    result = profile_pass(case, out_dir, steps=3, top=top)
    if result["report"] is None:
        raise PerflabError(f"{case.label()} could not be profiled ({result['row']['status']}: {result['row'].get('message')})")
    report = result["report"]
    kernels = report.top_kernels
    kernels = kernels[~kernels["category"].isin(["memcpy", "memset"])].head(top)
    launches = run_ncu(case, kernels["full_name"].tolist(), per_config=per_config)
    # One step of the trace, in launch order, to name ncu's launches (it profiled one step the same way).
    table = report.kernels
    window = window_of_activities(table, step_windows(table, report.trace.steps), whole_trace=len(report.trace.steps) == 0)
    first_step = table[(window == 0) & (table["kind"] == "kernel")].sort_values(["launch_start_ns", "start_ns"])
    if per_config > 0:
        named = attach_step_configs(launches, first_step[["name", "grid", "block"]])
    else:
        named = attach_trace_names(launches, [str(n) for n in first_step["name"]])
    return join_counters(kernels, named), result


def profile_ranks(case: Case, out_dir, steps: int = 5, gpus: Sequence[int] | None = None, all_reduce_sizes=None, explain: bool = False,
                     single: bool = True, paired=()) -> dict:
    """A data-parallel case timed on its ranks, then profiled on every rank and the ranks' traces merged and accounted
    (``perflab profile --parallel``; ``api.profile_parallel`` documents the result). ``all_reduce_sizes``, ``explain``,
    ``single``, ``paired``: as ``measure.parallel.run_parallel_case`` takes them (explain's floor and fixes)."""
    from perflab.measure.parallel import run_parallel_case

    row = run_parallel_case(case, gpus=gpus, profile_dir=out_dir, profile_steps=steps, all_reduce_sizes=all_reduce_sizes, explain=explain,
                            single=single, paired=paired)
    result = {"row": row, "trace_paths": row.get("rank_traces") or [], "accounts": [], "waits_per_step": [], "note": None, "steps": steps,
              "rank_passes": []}
    if row["status"] != "ok":
        return result
    result.update(account_rank_traces(result["trace_paths"], case.device, steps))
    return result


def account_rank_traces(paths: Sequence, device: str, steps: int) -> dict:
    """The ranks' traces merged and accounted: ``accounts`` (per rank, exact, over that rank's step windows, the
    ``ProfilerStep#n`` ranges, or the common window of a trace without them; where the ranks' collectives line up, its
    exposed communication split into waiting for a later rank and transfer, over the same windows), ``waits_per_step``,
    ``note``, ``step_ms`` (per rank, its mean step window, ms: what its per-step figures are held against) and
    ``rank_passes``: per rank, per step, each pass's time (``ms``: its kernels' GPU time, or on the CPU its range's wall
    time) and the GPU time of each kernel category outside communication (``category_ms``; none on the CPU). A GPU rank's
    table is its kernels; a CPU rank's, its main thread's operators and gloo's collectives (``trace.cpu_ranks``)."""
    from perflab.analysis.ranks import account_ranks, collective_waits, exposed_waiting_ns, merge_ranks, waits_per_step, within_windows

    tables, passes, windows = {}, [], {}
    for rank, path in enumerate(paths):
        if device == "cuda":
            tables[rank], per_pass, categories, windows[rank] = _gpu_rank(path, steps)
        else:
            from perflab.trace.cpu_ranks import cpu_rank_activities
            from perflab.trace.load import load_trace

            tables[rank], ranges = cpu_rank_activities(path)
            windows[rank] = _step_windows(load_trace(path))
            durations = (ranges["end_ns"] - ranges["start_ns"]).groupby(ranges["name"]).sum() if len(ranges) else {}
            per_pass, categories = {name: float(ns) / steps / 1e6 for name, ns in dict(durations).items()}, {}
        passes.append({"rank": rank, "ms": per_pass, "category_ms": categories})
    note = None if device == "cuda" else ("a CPU run: compute is each rank's main thread inside torch's operators, communication gloo's "
                                         "collectives on their own threads")
    merged = merge_ranks(tables)
    by_window = all(windows.get(r) for r in tables)
    if by_window:
        merged = within_windows(merged, windows)
        steps = min(len(w) for w in windows.values())
    else:
        windows = None
    accounts = account_ranks(merged, windows=windows)
    out = {"accounts": [a.to_dict() for a in accounts], "waits_per_step": [], "note": note, "rank_passes": passes, "steps": steps,
           "step_ms": {a.rank: a.window_ns / max(len(windows[a.rank]), 1) / 1e6 for a in accounts} if windows else None}
    try:
        waits = collective_waits(merged)
        out["waits_per_step"] = waits_per_step(waits, steps)
    except ValueError as exc:
        out["note"] = (f"{note}; " if note else "") + f"no per-step waits: {exc}"
    else:  # exposed communication = waiting for a later rank + transfer no compute hides
        waiting = exposed_waiting_ns(merged, waits, windows)
        for account in out["accounts"]:
            account["comm_exposed_waiting_ns"] = waiting.get(account["rank"], 0)
            account["comm_exposed_transfer_ns"] = account["comm_exposed_ns"] - account["comm_exposed_waiting_ns"]
    return out


def _gpu_rank(path, steps: int):
    """A GPU rank's kernels, its passes' GPU time per step and its non-communication kernels' time per category per step."""
    from perflab.analysis.passes import pass_timing
    from perflab.analysis.ranks import is_comm
    from perflab.trace.load import load_trace

    trace = load_trace(path)
    kernels = _launched_while_recorded(trace.kernels)
    per_pass = {name: t["gpu_ns"] / 1e6 for name, t in pass_timing(kernels, trace.ranges, steps).items()}
    compute = kernels[~kernels["name"].map(is_comm).astype(bool)]
    categories = {str(k): float(v) / steps / 1e6 for k, v in compute.groupby(compute["category"].astype(str))["dur_ns"].sum().items()}
    return kernels, per_pass, categories, _step_windows(trace)


def _launched_while_recorded(kernels):
    """The activities whose launch call the trace holds, where it holds any. An activity without one was launched before
    the profiler began recording and ran on into its first step: a previous step's all-reduces, still waiting for a later
    rank (two H200s: 10 such on rank 0, none on rank 1). Counted in the first window, they made the ranks' collectives
    disagree (52 against 42), so no collective could be matched across the ranks. A trace without launch links (a
    CPU-side collective table, an old format) is kept whole."""
    linked = kernels["launch_start_ns"].to_numpy() >= 0 if "launch_start_ns" in kernels else None
    if linked is None or not linked.any():
        return kernels
    return kernels[linked].reset_index(drop=True)


def _step_windows(trace) -> list[tuple[int, int]]:
    """The trace's step windows as the accounting cuts them (``analysis.accounting.step_windows``); none without steps."""
    from perflab.analysis.accounting import step_windows

    if not len(trace.steps):
        return []
    found = step_windows(trace.kernels, trace.steps)
    return list(zip(found["start_ns"].tolist(), found["end_ns"].tolist()))
