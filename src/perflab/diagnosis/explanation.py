"""``perflab explain``: why a case takes the time it takes, what would make it faster, and a check.

For each case (and the ``--vs`` case):
1. the untraced eager median (the harness, no profiler);
2. a profiled eager pass → exact accounting per step, and the profiler's inflation;
3. floors (compute, memory, launch, host) from the FLOPs, the bytes, the kernels per step, the CPU time
   to issue a step (measured untraced: the profiler slows the host about 2×, so the trace's issue time
   is reported beside it but not used as a floor), and this GPU's measured ceilings; the binding floor
   names the limit;
4. predictions for other modes, from the eager trace:
   - cudagraph: every kernel of a step replayed back to back: its duration plus the gap a graph leaves
     between kernels, and at least the minimal kernel interval, both measured on this GPU:
     Σ max(duration + gap, interval). No host time: one graph launch per step.
   - compile:reduce-overhead: the same graph model after fusion: GEMM, attention and selection kernels
     unchanged, the memory-bound "glue" kernels (elementwise, copy, norm, softmax, reduction,
     triton_fused, memset) assumed fused two into one (half the kernels, half their time). A heuristic;
     the table shows its error.
   Both model the GPU alone. A mode measured more than 15% from its prediction says why, from its own held timing
   (the host's issue time and the GPU's time per step, each measured with the other out of the way): a step whose
   host issue outlasts its GPU time is host-bound (a compiled graph's call runs dynamo's guards, AOT autograd's
   wrappers and the CUDA-graph tree's checks in Python, 0.1–0.45 ms a call on an H200 host), else the GPU term missed,
   and for compile:reduce-overhead the share of the glue kernels' time fusion actually removed is given against the
   model's half (``mode_miss``);
5. those modes measured with the untraced harness, prediction against measurement, with the seconds to
   their first step (compile or capture time) as a cost;
6. per-pass floors, for steps of several passes (a training step's forward, backward and optimizer;
   generate's prefill and decode steps): each pass's compute, memory, launch and host floors from its own
   FLOPs, least bytes (the family's ``pass_costs``), kernels and CPU issue time, the binding one named, and
   the profiled pass's GPU time against it; the step's floor is the sum of the passes' binding floors, and
   the step's MFU and MBU stand beside the best the floors allow;
7. fixes beyond the modes (``--fixes``; by default per family: the other AdamW implementations and
   activation checkpointing for an lm train_step, larger batches for decode), applied on the best mode
   measured (``--fixes-on best``, the default: eager and the modes are timed first, then the fixes on the
   fastest, timed together with it; or ``--fixes-on eager`` / a mode), each predicted from the profile and
   the base's measured host and GPU times with its model stated in one line (analysis.fixes: per pass,
   max(host, GPU)), then measured; a fix the base refuses is measured on eager and says so; "+" combines
   fixes (``compile:reduce-overhead+optimizer:in_backward_stream``: measured only, as given);
8. everything ranked by measured gain over eager.
A data-parallel case (``--parallel``) is explained by ``perflab.diagnosis.explain_parallel``: its communication against its
floor, and the communication fixes predicted, then measured.
With ``--vs``, the two eager traces are compared with the exact decomposition (perflab.analysis.compare).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from perflab.analysis.compare import StepProfile, TraceComparison, compare_traces, step_profile
from perflab.analysis.accounting import step_windows, window_of_activities
from perflab.analysis.fixes import (MISS, Fix, Prediction, StepTimes, batch_delta, checkpoint_delta, measured_host_ms, optimizer_delta, predict_step_ms,
                                   prediction_error, step_times_of_passes, step_times_of_row)
from perflab.analysis.floors import Floors, StepFloors, compute_floors, pass_floors
from perflab.analysis.launch import traced_host_issue_ms
from perflab.analysis.passes import pass_timing
from perflab.errors import PerflabError
from perflab.measure.host import host_issue_ms as measure_host_issue_ms
from perflab.measure.stages import Parts
from perflab.paths import make_out_dir
from perflab.spec import Case
from perflab.trace.categories import CATEGORIES

# Memory-bound kernels Inductor fuses with their neighbours (names from perflab.trace.categories).
GLUE_CATEGORIES = frozenset({"elementwise", "copy", "norm", "softmax", "reduction", "triton_fused", "memset"})
assert GLUE_CATEGORIES <= set(CATEGORIES), GLUE_CATEGORIES - set(CATEGORIES)
PREDICTED_MODES = ("cudagraph", "compile:reduce-overhead")


@dataclass
class CaseExplanation:
    case: Case
    eager_row: dict
    trace_path: Path
    profile: StepProfile
    traced_step_ms: float
    inflation: float
    floors: Floors
    host_issue_ms: float  # untraced
    traced_host_issue_ms: float
    predictions_ms: dict[str, float]
    glue_ms: float | None = None  # the glue kernels' time per step replayed as a graph, before fusion
    measured: dict[str, dict] = field(default_factory=dict)  # mode -> result row
    timing: dict = field(default_factory=dict)  # per pass of the profiled step (analysis.passes.pass_timing)
    step_floors: StepFloors | None = None  # per-pass floors, for steps of several passes
    fix_results: list[Fix] = field(default_factory=list)  # --fixes, predicted then measured
    modules: object = None  # --by-module: the module tree of the eager profile (analysis.modules), a DataFrame
    fix_context: object = None  # what the fixes' predictions read (FixContext)

    @property
    def eager_ms(self) -> float:
        return self.eager_row["median_ms"]

    def fixes(self) -> list[dict]:
        """Modes and fixes ranked by measured gain over eager (faster first), with what each cost before its
        first step (``first_step_s``: compile or capture) and its peak memory."""
        out = []
        measured = [(mode, {"mode": mode}, row, self.predictions_ms.get(mode)) for mode, row in self.measured.items()]
        measured += [(fx.name, {"on": fx.base, "eager_only": fx.eager_only}, fx.measured, fx.predicted_ms) for fx in self.fix_results]
        for name, extra, row, predicted in measured:
            common = dict(fix=name, **extra, first_step_s=row.get("first_step_s"), peak_mem_alloc_mb=row.get("peak_mem_alloc_mb"))
            if row.get("status") != "ok":
                out.append(dict(common, measured_ms=None, speedup=None, status=row.get("status"), message=row.get("message")))
                continue
            out.append(dict(common, measured_ms=row["median_ms"], speedup=self.eager_ms / row["median_ms"], predicted_ms=predicted, status="ok"))
        return sorted(out, key=lambda f: -(f["speedup"] or 0))

    def mode_misses(self) -> dict[str, str]:
        """Each measured mode whose prediction missed by more than 15%, with the reason (``mode_miss``)."""
        graph = self.measured.get("cudagraph") or {}
        measured_graph = graph.get("device_ms") if graph.get("status") == "ok" else None
        graph_ms = measured_graph if measured_graph is not None else self.predictions_ms.get("cudagraph")
        out = {}
        for mode, row in self.measured.items():
            reason = mode_miss(mode, self.predictions_ms.get(mode), row, graph_ms, self.glue_ms, graph_measured=measured_graph is not None)
            if reason:
                out[mode] = reason
        return out

    def to_dict(self) -> dict:
        return {
            "case": self.case.to_dict(),
            "label": self.case.label(),
            "eager_ms": self.eager_ms,
            "traced_step_ms": self.traced_step_ms,
            "profiler_inflation": self.inflation,
            "trace": str(self.trace_path),
            "modules": _module_records(self.modules),
            "per_step": {
                "wall_us": self.profile.wall_ns / 1e3,
                "gpu_busy_us": self.profile.busy_ns / 1e3,
                "idle_by_cause_us": {k: v / 1e3 for k, v in self.profile.idle_ns.items()},
                "kernels": self.profile.kernels,
                "mean_kernel_us": self.profile.mean_kernel_ns / 1e3,
                "category_us": {k: v / 1e3 for k, v in self.profile.category_ns.items()},
            },
            "host_issue_ms": self.host_issue_ms,
            "traced_host_issue_ms": self.traced_host_issue_ms,
            "floors": self.floors.to_dict(),
            "predictions_ms": self.predictions_ms,
            "measured_ms": {m: r.get("median_ms") for m, r in self.measured.items()},
            "glue_ms": self.glue_ms,
            "mode_misses": self.mode_misses(),
            "first_step_s": {"eager": self.eager_row.get("first_step_s"), **{m: r.get("first_step_s") for m, r in self.measured.items()}},
            "mfu": self.eager_row.get("mfu"),
            "mbu": self.eager_row.get("mbu"),
            "pass_timing_us": {name: {k: (v / 1e3 if k.endswith("_ns") else v) for k, v in t.items()} for name, t in self.timing.items()},
            "pass_floors": self.step_floors.to_dict() if self.step_floors else None,
            "fix_predictions": [fx.to_dict() for fx in self.fix_results],
            "fixes": self.fixes(),
        }


@dataclass
class Explanation:
    cases: list[CaseExplanation]
    comparison: TraceComparison | None
    ceilings: dict

    def to_dict(self) -> dict:
        return {
            "cases": [c.to_dict() for c in self.cases],
            "compare": self.comparison.to_dict() if self.comparison else None,
            "ceilings": self.ceilings,
        }


def predict_modes(trace, interval_us: float, gap_us: float) -> dict[str, float]:
    """Predicted ms per step under CUDA graphs and compile:reduce-overhead (see the module docstring)."""
    acts, n_steps = _step_activities(trace)
    graph, fused = _graph_models(acts, interval_us * 1e3, gap_us * 1e3)
    return {"cudagraph": graph / n_steps / 1e6, "compile:reduce-overhead": fused / n_steps / 1e6}


def glue_graph_ms(trace, interval_us: float, gap_us: float) -> float:
    """The glue kernels' ms per step replayed as a graph, before fusion: the part the reduce-overhead model halves."""
    acts, n_steps = _step_activities(trace)
    glue = acts[acts["category"].astype(str).isin(GLUE_CATEGORIES)]
    return _graph_models(glue, interval_us * 1e3, gap_us * 1e3)[0] / n_steps / 1e6


def mode_miss(mode: str, predicted_ms: float | None, row: dict, graph_ms: float | None = None, glue_ms: float | None = None,
              graph_measured: bool = False) -> str | None:
    """Why a mode's measured step is more than ``MISS`` from its prediction, from the mode's held timing; None within it.

    The predictions model the GPU alone, so the measured host issue time (``host_held_ms``) and GPU time (``device_ms``)
    say which part missed: a host that takes longer to issue a step than the GPU takes to run it made the step
    host-bound; else, where the GPU's time is itself within ``MISS`` of the prediction, neither term missed and the line
    says the step as timed differs from both; else the GPU's time is set beside its prediction, and for
    compile:reduce-overhead the glue time fusion removed (the CUDA graph's GPU time ``graph_ms`` less this mode's)
    beside the ``glue_ms`` it was taken from.
    ``graph_measured``: ``graph_ms`` is the CUDA graph's measured GPU time, so the graph model's own error is not
    counted as fusion's; else it is the CUDA-graph prediction (the cudagraph mode not measured).
    """
    measured = row.get("median_ms") if row.get("status") == "ok" else None
    error = prediction_error(predicted_ms, measured)
    if error is None or abs(error) <= MISS:
        return None
    host, gpu = measured_host_ms(row), row.get("device_ms")
    head = f"predicted {predicted_ms:.3f} ms, measured {measured:.3f} ({error:+.1%})"
    if host is None or gpu is None:
        return f"{head}: no held timing split its host and GPU times, so which part missed is not known"
    if host > gpu and host >= measured * (1 - MISS):  # the host's time reaches the step: it is what the step waits on
        calls = " (a compiled call runs dynamo's guards, AOT autograd's wrappers and the CUDA-graph tree's checks in Python)" \
            if mode.startswith("compile") else ""
        return (f"{head}: host-bound: issuing a step takes the host {host:.3f} ms, its GPU time is {gpu:.3f} ms; the model "
                f"counts the GPU alone{calls}")
    if host > gpu:  # above the GPU's, yet short of the step: the host's issue time does not explain the miss either
        return (f"{head}: neither term reaches the step: the host issues it in {host:.3f} ms and the GPU runs it in {gpu:.3f} ms, "
                f"each held apart, against {measured:.3f} ms as timed; they overlapped less than the model, which counts the GPU "
                "alone, assumes")
    gpu_error = prediction_error(predicted_ms, gpu)
    if gpu_error is not None and abs(gpu_error) <= MISS:
        # the GPU term is on target: the step's miss is between the two timings, not in either term
        between = ("is longer than both, so its host issue and GPU work overlapped less than the model, which counts the "
                   "GPU alone, assumes") if measured > gpu else "is shorter than its GPU time held apart, so the two timings disagree"
        return (f"{head}: not the GPU term (predicted {predicted_ms:.3f}, measured {gpu:.3f} ms a step, {gpu_error:+.1%}) nor "
                f"the host's ({host:.3f} ms, below the GPU's): the step as timed {between}")
    why = f"{head}: the GPU term: predicted {predicted_ms:.3f}, measured {gpu:.3f} ms a step (host {host:.3f} ms)"
    if mode == "compile:reduce-overhead" and graph_ms and glue_ms:
        removed = (graph_ms - gpu) / glue_ms
        graph = f"the CUDA graph's measured GPU time {graph_ms:.3f} ms" if graph_measured else f"the CUDA-graph prediction {graph_ms:.3f} ms"
        why += (f"; fusion removed {removed:.0%} of the {glue_ms:.3f} ms the glue kernels take as a graph "
                f"({graph} less the measured GPU time), the model removes 50%")
    return why


def compiled_pass_ms(trace, name: str, interval_us: float, gap_us: float) -> float | None:
    """One pass's GPU ms per step after fusion (the compile:reduce-overhead model over that pass's kernels alone), or None
    when the trace has no such pass: what a compiled backward spends recomputing a checkpointed forward."""
    from perflab.analysis.passes import kernel_passes

    acts, n_steps = _step_activities(trace)
    in_pass = kernel_passes(acts, trace.ranges) == name
    if not in_pass.any():
        return None
    return _graph_models(acts[in_pass], interval_us * 1e3, gap_us * 1e3)[1] / n_steps / 1e6


def _step_activities(trace):
    """The trace's activities inside its step windows, and the number of steps."""
    kernels = trace.kernels
    windows = step_windows(kernels, trace.steps)
    window = window_of_activities(kernels, windows, whole_trace=len(trace.steps) == 0)
    return kernels[window >= 0], max(len(windows), 1)


def _graph_models(acts, interval_ns: float, gap_ns: float) -> tuple[float, float]:
    """(ns replayed as a graph, ns after fusion) of these activities: Σ max(duration + gap, interval); and the same with
    the glue kernels' count and time halved."""
    dur = acts["dur_ns"].to_numpy().astype(float)
    graph = np.maximum(dur + gap_ns, interval_ns).sum()
    glue = acts["category"].astype(str).isin(GLUE_CATEGORIES).to_numpy()
    kept = np.maximum(dur[~glue] + gap_ns, interval_ns).sum()
    glue_time, glue_count = dur[glue].sum() / 2, glue.sum() / 2
    return float(graph), float(kept + max(glue_time + glue_count * gap_ns, glue_count * interval_ns))


def min_bytes(case: Case, row: dict) -> float:
    """The least DRAM traffic one step needs, as the case's workload family states it."""
    from perflab.workloads.implementations import implementation

    return implementation(case).min_bytes(case, row)


def pass_costs(case: Case, row: dict) -> dict | None:
    """FLOPs and least bytes per pass of a step with several passes, as the case's family states them, the FLOPs scaled
    to the row's counted ones (``analysis.floors.counted_pass_costs``: one FLOP count per row)."""
    from perflab.analysis.floors import counted_pass_costs
    from perflab.workloads.implementations import implementation

    costs = implementation(case).pass_costs(case, row)
    return counted_pass_costs(costs, (row.get("gflops_per_batch") or 0) * 1e9) if costs else costs


def default_fixes(case: Case) -> list[str]:
    """The fixes explain tries by default: the family's (workloads.base.Implementation.default_fixes)."""
    from perflab.workloads.implementations import implementation

    return implementation(case).default_fixes(case)


def parse_fix(spec: str) -> dict:
    """A fix's Case changes: parts joined by "+", each a mode (``compile:reduce-overhead``), ``optimizer:NAME``,
    ``checkpoint``, ``batch:N``, or a data-parallel mode with its options (``ddp:bucket_cap_mb=100``, ``fsdp``; its
    ``parallel`` change, merged with the case's own options by ``spec.merge_parallel``). PerflabError (one line) on
    anything else."""
    from perflab.spec import MODES, PARALLEL_OPTIONS, parse_parallel

    changes = {}
    for part in spec.split("+"):
        part = part.strip()
        kind, _, value = part.partition(":")
        if part in MODES:
            changes["mode"] = part
        elif kind in PARALLEL_OPTIONS:
            parse_parallel(part, flag="--fixes")
            changes["parallel"] = part
        elif kind == "optimizer" and value:
            changes["optimizer"] = value
        elif part == "checkpoint":
            changes["checkpoint_activations"] = True
        elif kind == "batch" and value.isdigit() and int(value) > 0:
            changes["batch_size"] = int(value)
        else:
            raise PerflabError(f"unknown fix {part!r} in {spec!r}: use a mode ({', '.join(MODES)}), optimizer:NAME, checkpoint, batch:N "
                               "or (with --parallel) ddp:OPTION=VALUE or fsdp, joined by + to combine")
    return changes


@dataclass
class FixContext:
    """What a fix's prediction reads: the eager case and its profile (per-pass GPU times, floors, the host and GPU per
    pass, the forward's GPU time after fusion) and the modes' predictions."""

    case: Case  # the eager case
    timing: dict
    step_floors: StepFloors | None
    eager_times: StepTimes | None
    mode_predictions: dict
    compiled_forward_ms: float | None = None


def predict_fix(ctx: FixContext, spec: str, changes: dict, base: str, base_row: dict) -> Prediction:
    """The prediction of one fix applied on ``base`` (a mode) whose measured row is ``base_row``: its Δ of host and
    GPU time per pass (``analysis.fixes``), on the eager profile's passes for an eager base and on the base row's
    measured host and GPU times for a compiled one. A fix that names a mode is predicted by the modes' graph models
    alone; a combination of several changes is measured only."""
    from perflab.workloads.lm import current_optimizer

    case = ctx.case
    if "mode" in changes:
        mode = changes["mode"]
        if len(changes) > 1:
            return Prediction(None, "a combination with a mode: measured only")
        predicted = ctx.mode_predictions.get(mode)
        return Prediction(predicted, "the modes' graph models (above)" if predicted is not None else "measured only")
    if len(changes) > 1:
        return Prediction(None, "a combination: measured only")
    (key, value), = changes.items()
    base_ms = base_row["median_ms"]
    compiled = base != "eager"
    times = step_times_of_row(base_row, f"the measured {base} step's host and GPU times") if compiled else ctx.eager_times
    if key == "optimizer":
        backward_memory = next((p.memory_ms for p in ctx.step_floors.passes if p.name == "backward"), 0.0) if ctx.step_floors else 0.0
        delta, why = optimizer_delta(value, current_optimizer(case), ctx.timing, backward_memory, times, compiled_base=compiled)
        return predict_step_ms(base_ms, times, delta, why)
    if key == "checkpoint_activations":
        if compiled and ctx.compiled_forward_ms is None:
            return Prediction(None, "no forward pass in the profile to fuse: nothing to predict from")
        delta, why = checkpoint_delta(ctx.timing, times, ctx.compiled_forward_ms if compiled else None)
        return predict_step_ms(base_ms, times, delta, why)
    if key == "batch_size":
        from perflab.workloads.implementations import implementation

        impl = implementation(case)
        base_bytes = impl.analytic(case).get("bytes_per_step")
        new_bytes = impl.analytic(replace(case, batch_size=value)).get("bytes_per_step")
        if not base_bytes or not new_bytes:
            return Prediction(None, "measured only (this workload states no bytes per step)")
        gpu = times.gpu_ms if times is not None else base_ms
        return predict_step_ms(base_ms, times, batch_delta(gpu, base_bytes, new_bytes, case.batch_size, value))
    return Prediction(None, "measured only")


def best_mode(eager_row: dict, measured: dict) -> str:
    """The fastest mode measured (eager included) with an ok row."""
    candidates = [("eager", eager_row)] + list(measured.items())
    ok = [(row["median_ms"], mode) for mode, row in candidates if row.get("status") == "ok" and row.get("median_ms")]
    return min(ok)[1] if ok else "eager"


def plan_fixes(case: Case, parsed, base: str) -> list[tuple[str, dict, Case, str, str | None]]:
    """(spec, changes, the case to measure, the base it is applied on, why it is eager only) per fix: a fix that names a
    mode is measured as given; any other on ``base``, or on eager where the base refuses it (validation's one line)."""
    from perflab.spec import validate_case

    eager = replace(case, mode="eager")
    out = []
    for spec, changes in parsed:
        if "mode" in changes or base == "eager":
            out.append((spec, changes, replace(eager, **changes), "eager" if "mode" not in changes else changes["mode"], None))
            continue
        on_base = replace(eager, mode=base, **changes)
        try:
            validate_case(on_base)
        except PerflabError as exc:
            out.append((spec, changes, replace(eager, **changes), "eager", f"eager only on {base}: {exc}"))
            continue
        out.append((spec, changes, on_base, base, None))
    return out


FIXES_ON = ("best", "eager")  # or a mode name


def _sessions(case: Case, modes, fixes, fixes_on: str):
    """The fixes parsed, the modes timed first, the base named (None: the best, once measured), the fixes timed in the
    first session (indices into the parsed) and those timed on the best mode after it."""
    parsed = [(spec, parse_fix(spec)) for spec in fixes]
    first = list(modes)
    known = fixes_on if fixes_on != "best" else ("eager" if not modes or not any("mode" not in c for _, c in parsed) else None)
    if known not in (None, "eager") and known not in first:
        first.append(known)  # the named base is timed with the rest
    now = [i for i, (_, c) in enumerate(parsed) if known is not None or "mode" in c]  # the fixes timed in the first session
    later = [parsed[i] for i in range(len(parsed)) if i not in now]
    return parsed, first, known, now, later


def case_parts(case: Case, modes, fixes=(), fixes_on: str = "best") -> int:
    """The parts of ``explain_case`` (its progress): the first timing session, the second where fixes wait for the best
    mode, the profile pass and the timing of the host's issue."""
    return 3 + bool(_sessions(case, modes, fixes, fixes_on)[4])


def explain_case(case: Case, out_dir: Path, ceilings: dict, steps: int, modes, run_cases, capture_case, load_trace, on_stage,
                 fixes=(), by_module: bool = False, fixes_on: str = "best", parts: Parts | None = None) -> CaseExplanation:
    """``run_cases(cases) -> rows``: cases timed by one call are timed together, interleaved (``measure.harness.run_cases``),
    so each measured mode and fix is paired in time with the step it is compared with, and a slow stretch of the host
    falls on all of them.

    ``fixes_on``: what the fixes are applied on. "best" (the default): eager and the modes are timed first, then each fix
    on the fastest of them, timed together with that base again (the fix's speedup over its base is paired); "eager", or
    a mode: one session, eager, the modes and the fixes on that base together. A fix the base refuses (its validation)
    is measured on eager and says so; a fix that names a mode is measured as given.

    ``parts``: where its parts are counted (``measure.stages.Parts``, which tells ``on_stage``); default: its own."""
    eager = replace(case, mode="eager")
    parsed, first, known, now, later = _sessions(case, list(modes), fixes, fixes_on)
    planned = plan_fixes(case, [parsed[i] for i in now], known or "eager")
    parts = parts if parts is not None else Parts(on_stage, case_parts(case, modes, fixes, fixes_on))
    parts.begin(f"{case.label()}: timing eager, {len(first)} mode(s) and {len(planned)} fix(es) together", cases=1 + len(first) + len(planned))
    row, *measured = run_cases([eager] + [replace(case, mode=m) for m in first] + [p[2] for p in planned])
    if row["status"] != "ok":
        raise PerflabError(f"{eager.label()} could not be measured ({row['status']}: {row.get('message')})")
    mode_rows = dict(zip(first, measured[:len(first)]))
    fix_rows = measured[len(first):]
    session = {"eager": row, **mode_rows}
    fix_bases = [session.get(p[3], {}) for p in planned]
    if later:  # the best mode is known now: the fixes on it, timed with it (and with eager for any it refuses)
        base = best_mode(row, mode_rows)
        more = plan_fixes(case, later, base)
        again = [replace(case, mode=base)] + ([eager] if base != "eager" and any(p[3] == "eager" for p in more) else [])
        parts.begin(f"{case.label()}: timing {len(more)} fix(es) on the best mode measured, {base}, together with it",
                    cases=len(again) + len(more))
        rows2 = run_cases(again + [p[2] for p in more])
        session = {c.mode: r for c, r in zip(again, rows2)}
        planned, fix_rows = planned + more, fix_rows + rows2[len(again):]
        fix_bases += [session.get(p[3], {}) for p in more]
    order = now + [i for i in range(len(parsed)) if i not in now]  # back to the order the fixes were given in
    planned, fix_rows, fix_bases = ([x for _, x in sorted(zip(order, seq), key=lambda t: t[0])] for seq in (planned, fix_rows, fix_bases))
    trace_path = out_dir / f"{case.id}_eager.json.gz"
    parts.begin(f"{case.label()}: profiling eager")
    # --by-module: the eager profile also records module ranges (hooks that time nothing; the traced host time
    # and inflation include their cost, the kernels and the predictions from them do not change)
    capture_case(eager, trace_path, steps=steps, **({"by_module": True} if by_module else {}))
    trace = load_trace(trace_path)
    prof = step_profile(trace)
    traced_ms = prof.wall_ns / 1e6
    parts.begin(f"{case.label()}: timing the CPU's issue of one step")
    issue_ms = measure_host_issue_ms(eager)
    interval, gap = ceilings["graph_kernel_interval_us"], ceilings["graph_kernel_gap_us"]
    floors = compute_floors(
        measured_ms=row["median_ms"],
        flops_per_step=row["gflops_per_batch"] * 1e9,
        matmul_tflops=ceilings["matmul_tflops"][case.dtype],
        bytes_per_step=min_bytes(case, row),
        copy_gbps=ceilings["copy_gbps"],
        kernels_per_step=prof.kernels,
        kernel_interval_us=interval,
        host_issue_ms=issue_ms,
        gpu_busy_ms=prof.busy_ns / 1e6,
    )
    explanation = CaseExplanation(
        case=case, eager_row=row, trace_path=trace_path, profile=prof, traced_step_ms=traced_ms,
        inflation=traced_ms / row["median_ms"], floors=floors, host_issue_ms=issue_ms, traced_host_issue_ms=traced_host_issue_ms(trace),
        predictions_ms=predict_modes(trace, interval, gap), glue_ms=glue_graph_ms(trace, interval, gap),
    )
    explanation.trace = trace
    explanation.timing = pass_timing(trace.kernels, trace.ranges, len(trace.steps))
    costs = pass_costs(case, row)
    if costs and explanation.timing:
        explanation.step_floors = pass_floors(
            costs=costs, timing=explanation.timing, measured_ms=row["median_ms"], matmul_tflops=ceilings["matmul_tflops"][case.dtype],
            copy_gbps=ceilings["copy_gbps"], kernel_interval_us=interval, host_issue_ms=issue_ms,
        )
    explanation.measured.update(mode_rows)
    times = step_times_of_passes(explanation.step_floors.passes) if explanation.step_floors else None
    if times is None:
        times = StepTimes({"step": issue_ms}, {"step": prof.busy_ns / 1e6}, "the untraced host issue time and the profiled GPU busy time")
    ctx = explanation.fix_context = FixContext(eager, explanation.timing, explanation.step_floors, times, explanation.predictions_ms,
                                               compiled_pass_ms(trace, "forward", interval, gap))
    for (spec, changes, _, base, eager_only), measured_row, base_row in zip(planned, fix_rows, fix_bases):
        if "mode" in changes or base_row.get("status") == "ok":
            prediction = predict_fix(ctx, spec, changes, base, base_row)
        else:
            prediction = Prediction(None, f"its base, {base}, could not be measured ({base_row.get('status') or 'not timed'})")
        fix = Fix(spec, changes, prediction.ms, prediction.model, base=base, base_row=base_row, eager_only=eager_only,
                  predicted_host_ms=prediction.host_ms, predicted_gpu_ms=prediction.gpu_ms)
        fix.measured = measured_row
        explanation.fix_results.append(fix)
    if by_module:
        from perflab.analysis.modules import has_module_ranges, module_tree

        if has_module_ranges(trace.ranges):
            explanation.modules = module_tree(trace.kernels, trace.ranges, max(len(trace.steps), 1))
    return explanation


def case_fixes(case: Case, fixes) -> list[str]:
    """The fixes to try on ``case``: ``fixes`` as given (None: the family's defaults; "none" alone: none)."""
    if fixes is None:
        return default_fixes(case)
    fixes = list(fixes)
    return [] if fixes == ["none"] else fixes


def explanation_of(case: Case, vs: Case | None, out_dir: Path, steps: int = 5, modes=PREDICTED_MODES, on_stage=lambda s: None,
            pin: bool = True, fixes=None, by_module: bool = False, fixes_on: str = "best", compile_budget_s: float | None = None,
            on_case=None) -> Explanation:
    """``fixes``: fix specs (see ``parse_fix``) tried on each case; None: each case's family defaults. ``fixes_on``:
    "best" (the fastest of eager and the modes, measured first), "eager" or a mode (see ``explain_case``).
    ``compile_budget_s``: a time limit on each compiled case's compile (``runtime.compile_budget``: it compiles first in
    a child process within the limit, filling inductor's caches; past the limit the case is a ``timeout`` row); its
    rows then carry ``compile_cold_s``, beside ``first_step_s`` (the compile from the caches).

    Progress: ``on_stage`` hears each part as it begins (a ``measure.stages.Stage`` of kind "part": the ceilings, then
    each case's timing sessions, profile pass and host timing) and what else runs; ``on_case`` the timing sessions'
    stages (``measure.harness.run_cases``'s)."""
    from perflab.spec import MODES, validate_case

    if fixes_on not in FIXES_ON + MODES:
        raise PerflabError(f"--fixes-on {fixes_on!r}: use best (the fastest mode measured), eager, or a mode ({', '.join(MODES[1:])})")
    if compile_budget_s is not None and not compile_budget_s > 0:
        raise PerflabError(f"--compile-budget must be a positive number of seconds, got {compile_budget_s!r}")
    for c in [case] + ([vs] if vs is not None else []):
        for spec in case_fixes(c, fixes):
            if "parallel" in parse_fix(spec):
                raise PerflabError(f"--fixes {spec}: a data-parallel fix applies to a --parallel case (add --parallel ddp with --gpus 0,1, "
                                   "or with --world-size 2 --device cpu)")
    if case.device != "cuda":
        raise PerflabError("explain reads GPU kernel traces and CUDA-graph timings, so it needs a CUDA GPU (--device cuda); on the CPU "
                           "it explains a --parallel case (--parallel ddp --world-size 2 --device cpu)")
    for c in [case] + ([vs] if vs is not None else []):
        for mode in modes:  # a bad mode is bad input: say so before minutes of profiling
            validate_case(replace(c, mode=mode))
        for spec in case_fixes(c, fixes):  # and so is a bad fix
            validate_case(replace(c, mode="eager", **parse_fix(spec)))
    from perflab.measure.ceilings import get_ceilings

    from perflab.measure.harness import run_cases
    from perflab.measure.pinning import HostOptions
    from perflab.trace.capture import capture_case
    from perflab.trace.load import load_trace

    out_dir = make_out_dir(out_dir)
    cases = [case] + ([vs] if vs is not None else [])
    parts = Parts(on_stage, 1 + sum(case_parts(c, modes, case_fixes(c, fixes), fixes_on) for c in cases))
    parts.begin("measuring this GPU's ceilings (cached after the first time)")
    ceilings = get_ceilings()
    def timed(together):  # one comparison group: every mode and fix sits next to eager in each round
        run = lambda cs: run_cases(cs, host=HostOptions(pin=pin), seed=cs[0].seed, groups=[0] * len(cs), on_case=on_case)  # noqa: E731
        return run_within_budget(together, run, compile_budget_s, on_stage) if compile_budget_s else run(together)

    explained = [explain_case(c, out_dir, ceilings, steps, modes, timed, capture_case, load_trace, on_stage, fixes=case_fixes(c, fixes),
                              by_module=by_module, fixes_on=fixes_on, parts=parts) for c in cases]
    comparison = None
    if vs is not None:
        base, variant = explained[1], explained[0]
        from perflab.workloads import item_of

        rows = [base.eager_row, variant.eager_row]
        comparison = compare_traces(base.trace, variant.trace, (vs.label(), case.label()),
                                    tuple(r.get("items_per_step") or c.batch_size for r, c in zip(rows, (vs, case))), item=item_of(rows))
    return Explanation(explained, comparison, ceilings)


def run_within_budget(cases, run, budget_s: float, on_stage=lambda s: None, compile_in_child=None, cold: dict | None = None) -> list[dict]:
    """``run(cases)``'s rows, each compiled case first compiled in a child process within ``budget_s``
    (``runtime.compile_budget``): one that does not finish is not timed, its row says ``timeout`` (or ``error``); the
    others carry ``compile_cold_s`` (the child's compile, before inductor's caches held it). ``cold``: the children's
    results by case id, kept between calls (a case compiled before is not compiled again)."""
    if compile_in_child is None:
        from perflab.runtime.compile_budget import compile_in_child
    cold = _COLD if cold is None else cold
    rows: list[dict | None] = [None] * len(cases)
    for i, c in enumerate(cases):
        if not c.mode.startswith("compile"):
            continue
        if c.id not in cold:
            on_stage(f"{c.label()}: compiling in a child process within {budget_s:g} s")
            cold[c.id] = compile_in_child(c, budget_s)
        if cold[c.id]["status"] != "ok":
            rows[i] = {"status": cold[c.id]["status"], "message": cold[c.id]["message"], "median_ms": None, "label": c.label(),
                       "mode": c.mode, "batch_size": c.batch_size, "compile_cold_s": cold[c.id]["compile_s"]}
    keep = [i for i in range(len(cases)) if rows[i] is None]
    for i, row in zip(keep, run([cases[i] for i in keep]) if keep else []):
        rows[i] = row
        if cases[i].id in cold:
            row["compile_cold_s"] = cold[cases[i].id]["compile_s"]
    return rows


_COLD: dict = {}  # this process's cold compiles by case id


def _module_records(tree) -> list[dict] | None:
    from perflab.analysis.trace_report import _module_records as records

    return records(tree)
