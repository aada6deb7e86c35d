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
5. those modes measured with the untraced harness, prediction against measurement, with the seconds to
   their first step (compile or capture time) as a cost;
6. per-pass floors, for steps of several passes (a training step's forward, backward and optimizer;
   generate's prefill and decode steps): each pass's compute, memory, launch and host floors from its own
   FLOPs, least bytes (the family's ``pass_costs``), kernels and CPU issue time, the binding one named, and
   the profiled pass's GPU time against it; the step's floor is the sum of the passes' binding floors, and
   the step's MFU and MBU stand beside the best the floors allow;
7. fixes beyond the modes (``--fixes``; by default per family: the other AdamW implementations and
   activation checkpointing for an lm train_step, larger batches for decode), each predicted from the
   profile with its model stated in one line (analysis.fixes), then measured; "+" combines fixes
   (``compile:reduce-overhead+optimizer:in_backward_stream``: measured only);
8. everything ranked by measured gain over eager.
With ``--vs``, the two eager traces are compared with the exact decomposition (perflab.analysis.compare).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from perflab.analysis.compare import Comparison, StepProfile, compare_traces, step_profile, window_of_activities
from perflab.analysis.accounting import step_windows
from perflab.analysis.fixes import Fix, predict_batch, predict_checkpoint, predict_optimizer, with_host_term
from perflab.analysis.floors import Floors, StepFloors, compute_floors, pass_floors
from perflab.analysis.passes import pass_timing
from perflab.errors import PerflabError
from perflab.measure.host import host_issue_ms as measure_host_issue_ms
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
    measured: dict[str, dict] = field(default_factory=dict)  # mode -> result row
    timing: dict = field(default_factory=dict)  # per pass of the profiled step (analysis.passes.pass_timing)
    step_floors: StepFloors | None = None  # per-pass floors, for steps of several passes
    fix_results: list[Fix] = field(default_factory=list)  # --fixes, predicted then measured
    modules: object = None  # --by-module: the module tree of the eager profile (analysis.modules), a DataFrame

    @property
    def eager_ms(self) -> float:
        return self.eager_row["median_ms"]

    def fixes(self) -> list[dict]:
        """Modes and fixes ranked by measured gain over eager (faster first), with what each cost before its
        first step (``first_step_s``: compile or capture) and its peak memory."""
        out = []
        measured = [(mode, {"mode": mode}, row, self.predictions_ms.get(mode)) for mode, row in self.measured.items()]
        measured += [(fx.name, {}, fx.measured, fx.predicted_ms) for fx in self.fix_results]
        for name, extra, row, predicted in measured:
            common = dict(fix=name, **extra, first_step_s=row.get("first_step_s"), peak_mem_alloc_mb=row.get("peak_mem_alloc_mb"))
            if row.get("status") != "ok":
                out.append(dict(common, measured_ms=None, speedup=None, status=row.get("status"), message=row.get("message")))
                continue
            out.append(dict(common, measured_ms=row["median_ms"], speedup=self.eager_ms / row["median_ms"], predicted_ms=predicted, status="ok"))
        return sorted(out, key=lambda f: -(f["speedup"] or 0))

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
    comparison: Comparison | None
    ceilings: dict

    def to_dict(self) -> dict:
        return {
            "cases": [c.to_dict() for c in self.cases],
            "compare": self.comparison.to_dict() if self.comparison else None,
            "ceilings": self.ceilings,
        }


def host_issue_ms(trace) -> float:
    """Median over steps of the CPU time to issue one step in a trace: step start → end of its last
    launch call (profiled, so inflated; see measure.host for the untraced figure)."""
    kernels = trace.kernels
    windows = step_windows(kernels, trace.steps)
    window = window_of_activities(kernels, windows, whole_trace=len(trace.steps) == 0)
    launch_end = kernels["launch_end_ns"].to_numpy()
    starts = windows["start_ns"].to_numpy()
    issue = []
    for w in range(len(windows)):
        ends = launch_end[(window == w) & (launch_end >= 0)]
        if len(ends):
            issue.append(ends.max() - starts[w])
    return float(np.median(issue)) / 1e6 if issue else 0.0


def predict_modes(trace, interval_us: float, gap_us: float) -> dict[str, float]:
    """Predicted ms per step under CUDA graphs and compile:reduce-overhead (see the module docstring)."""
    kernels = trace.kernels
    windows = step_windows(kernels, trace.steps)
    window = window_of_activities(kernels, windows, whole_trace=len(trace.steps) == 0)
    n_steps = max(len(windows), 1)
    acts = kernels[window >= 0]
    interval_ns, gap_ns = interval_us * 1e3, gap_us * 1e3
    dur = acts["dur_ns"].to_numpy().astype(float)
    graph = np.maximum(dur + gap_ns, interval_ns).sum() / n_steps
    glue = acts["category"].astype(str).isin(GLUE_CATEGORIES).to_numpy()
    kept = np.maximum(dur[~glue] + gap_ns, interval_ns).sum()
    glue_time, glue_count = dur[glue].sum() / 2, glue.sum() / 2
    fused = kept + max(glue_time + glue_count * gap_ns, glue_count * interval_ns)
    return {"cudagraph": graph / 1e6, "compile:reduce-overhead": fused / n_steps / 1e6}


def min_bytes(case: Case, row: dict) -> float:
    """The least DRAM traffic one step needs, as the case's workload family states it."""
    from perflab.workloads.registry import implementation

    return implementation(case).min_bytes(case, row)


def pass_costs(case: Case, row: dict) -> dict | None:
    """FLOPs and least bytes per pass of a step with several passes, as the case's family states them."""
    from perflab.workloads.registry import implementation

    return implementation(case).pass_costs(case, row)


def default_fixes(case: Case) -> list[str]:
    """The fixes explain tries by default: the family's (workloads.base.Implementation.default_fixes)."""
    from perflab.workloads.registry import implementation

    return implementation(case).default_fixes(case)


def parse_fix(spec: str) -> dict:
    """A fix's Case changes: parts joined by "+", each a mode (``compile:reduce-overhead``), ``optimizer:NAME``,
    ``checkpoint`` or ``batch:N``. PerflabError (one line) on anything else."""
    from perflab.spec import MODES

    changes = {}
    for part in spec.split("+"):
        part = part.strip()
        kind, _, value = part.partition(":")
        if part in MODES:
            changes["mode"] = part
        elif kind == "optimizer" and value:
            changes["optimizer"] = value
        elif part == "checkpoint":
            changes["checkpoint_activations"] = True
        elif kind == "batch" and value.isdigit() and int(value) > 0:
            changes["batch_size"] = int(value)
        else:
            raise PerflabError(f"unknown fix {part!r} in {spec!r}: use a mode ({', '.join(MODES)}), optimizer:NAME, checkpoint or batch:N, "
                               "joined by + to combine")
    return changes


def predict_fix(case: Case, spec: str, changes: dict, eager_row: dict, timing: dict, step_floors: StepFloors | None,
                mode_predictions: dict) -> tuple[float | None, str]:
    """(predicted ms, the model in one line) of one fix; combinations are measured only. An eager fix's GPU-time model
    is bounded by the host's time to issue the step (``analysis.fixes.with_host_term``)."""
    predicted, model = _predict_fix(case, spec, changes, eager_row, timing, step_floors, mode_predictions)
    if changes.get("mode", case.mode) == "eager" and "mode" not in changes:
        return with_host_term(predicted, model, eager_row)
    return predicted, model


def _predict_fix(case: Case, spec: str, changes: dict, eager_row: dict, timing: dict, step_floors: StepFloors | None,
                 mode_predictions: dict) -> tuple[float | None, str]:
    if len(changes) > 1:
        return None, "a combination: measured only"
    (key, value), = changes.items()
    eager_ms = eager_row["median_ms"]
    if key == "mode":
        return mode_predictions.get(value), "the modes' graph models (above)" if value in mode_predictions else "measured only"
    if key == "optimizer":
        backward_memory = next((p.memory_ms for p in step_floors.passes if p.name == "backward"), 0.0) if step_floors else 0.0
        from perflab.workloads.lm import current_optimizer

        return predict_optimizer(value, current_optimizer(case), eager_ms, timing, backward_memory)
    if key == "checkpoint_activations":
        return predict_checkpoint(eager_ms, timing)
    if key == "batch_size":
        from perflab.workloads.registry import implementation

        impl = implementation(case)
        base_bytes = impl.analytic(case).get("bytes_per_step")
        new_bytes = impl.analytic(replace(case, batch_size=value)).get("bytes_per_step")
        if not base_bytes or not new_bytes:
            return None, "measured only (this workload states no bytes per step)"
        return predict_batch(eager_ms, base_bytes, new_bytes, case.batch_size, value)
    return None, "measured only"


def explain_case(case: Case, out_dir: Path, ceilings: dict, steps: int, modes, run_cases, profile_case, load_trace, on_stage,
                 fixes=(), by_module: bool = False) -> CaseExplanation:
    """``run_cases(cases) -> rows``: the eager case, each mode and each fix are timed by one call, so that the
    harness times them together, interleaved (``measure.harness.run_cases``): every measured mode and fix is then
    paired in time with the eager step it is compared with, and a slow stretch of the host falls on all of them."""
    eager = replace(case, mode="eager")
    parsed = [(spec, parse_fix(spec)) for spec in fixes]
    variants = [replace(case, mode=mode) for mode in modes] + [replace(eager, **changes) for _, changes in parsed]
    on_stage(f"{case.label()}: timing eager, {len(modes)} mode(s) and {len(parsed)} fix(es) together")
    row, *measured = run_cases([eager] + variants)
    if row["status"] != "ok":
        raise PerflabError(f"{eager.label()} could not be measured ({row['status']}: {row.get('message')})")
    trace_path = out_dir / f"{case.id}_eager.json.gz"
    on_stage(f"{case.label()}: profiling eager")
    # --by-module: the eager profile also records module ranges (hooks that time nothing; the traced host time
    # and inflation include their cost, the kernels and the predictions from them do not change)
    profile_case(eager, trace_path, steps=steps, **({"by_module": True} if by_module else {}))
    trace = load_trace(trace_path)
    prof = step_profile(trace)
    traced_ms = prof.wall_ns / 1e6
    on_stage(f"{case.label()}: timing the CPU's issue of one step")
    issue_ms = measure_host_issue_ms(eager)
    interval = ceilings["graph_kernel_interval_us"]
    floors = compute_floors(
        measured_ms=row["median_ms"],
        flops_per_step=row["gflops_per_batch"] * 1e9,
        matmul_tflops=ceilings["matmul_tflops"][case.dtype],
        bytes_per_step=min_bytes(case, row),
        copy_gbps=ceilings["copy_gbps"],
        kernels_per_step=prof.kernels,
        kernel_interval_us=interval,
        host_issue_ms=issue_ms,
    )
    explanation = CaseExplanation(
        case=case, eager_row=row, trace_path=trace_path, profile=prof, traced_step_ms=traced_ms,
        inflation=traced_ms / row["median_ms"], floors=floors, host_issue_ms=issue_ms, traced_host_issue_ms=host_issue_ms(trace),
        predictions_ms=predict_modes(trace, interval, ceilings["graph_kernel_gap_us"]),
    )
    explanation.trace = trace
    explanation.timing = pass_timing(trace.kernels, trace.ranges, len(trace.steps))
    costs = pass_costs(case, row)
    if costs and explanation.timing:
        explanation.step_floors = pass_floors(
            costs=costs, timing=explanation.timing, measured_ms=row["median_ms"], matmul_tflops=ceilings["matmul_tflops"][case.dtype],
            copy_gbps=ceilings["copy_gbps"], kernel_interval_us=interval, host_issue_ms=issue_ms,
        )
    for mode, measured_row in zip(modes, measured):
        explanation.measured[mode] = measured_row
    for (spec, changes), measured_row in zip(parsed, measured[len(modes):]):
        predicted, model = predict_fix(eager, spec, changes, row, explanation.timing, explanation.step_floors, explanation.predictions_ms)
        fix = Fix(spec, changes, predicted, model)
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


def explain(case: Case, vs: Case | None, out_dir: Path, steps: int = 5, modes=PREDICTED_MODES, on_stage=lambda s: None,
            pin: bool = True, fixes=None, by_module: bool = False) -> Explanation:
    """``fixes``: fix specs (see ``parse_fix``) tried on each case; None: each case's family defaults."""
    if case.device != "cuda":
        raise PerflabError("explain reads GPU kernel traces and CUDA-graph timings, so it needs a CUDA GPU (--device cuda)")
    from perflab.spec import validate_case

    for c in [case] + ([vs] if vs is not None else []):
        for mode in modes:  # a bad mode is bad input: say so before minutes of profiling
            validate_case(replace(c, mode=mode))
        for spec in case_fixes(c, fixes):  # and so is a bad fix
            validate_case(replace(c, mode="eager", **parse_fix(spec)))
    from perflab.measure.ceilings import get_ceilings

    from perflab.measure.harness import run_cases
    from perflab.measure.pinning import HostOptions
    from perflab.trace.capture import profile_case
    from perflab.trace.load import load_trace

    out_dir = make_out_dir(out_dir)
    on_stage("measuring this GPU's ceilings (cached after the first time)")
    ceilings = get_ceilings()
    cases = [case] + ([vs] if vs is not None else [])
    def timed(together):  # one comparison group: every mode and fix sits next to eager in each round
        return run_cases(together, host=HostOptions(pin=pin), seed=together[0].seed, groups=[0] * len(together))

    explained = [explain_case(c, out_dir, ceilings, steps, modes, timed, profile_case, load_trace, on_stage, fixes=case_fixes(c, fixes),
                              by_module=by_module) for c in cases]
    comparison = None
    if vs is not None:
        base, variant = explained[1], explained[0]
        comparison = compare_traces(base.trace, variant.trace, (vs.label(), case.label()), (vs.batch_size, case.batch_size))
    return Explanation(explained, comparison, ceilings)


def _module_records(tree) -> list[dict] | None:
    from perflab.analysis.trace_report import _module_records as records

    return records(tree)
