"""``perflab explain --parallel`` at the diagnosis floor, measured; ``report/explain_parallel.py`` renders its result.

``perflab explain --parallel``: a data-parallel training step's communication against its floor, and the
communication fixes predicted, then measured.

1. The bus bandwidth: on GPUs, ``perflab ceilings``' all-reduce sweep of these GPUs (cached; measured once when the
   cache has none); on the CPU, gloo all-reduces of a few sizes swept by the ranks in the base's own launch (gloo
   has no cached sweep). Per-call latency α: the sweep's two smallest sizes (``analysis.comm.call_latency_us``).
2. The base: one launch times the step on every rank (the slowest rank's median, as ``bench --parallel``), times
   the same case on one device (scaling efficiency), profiles ``steps`` steps per rank (``profiling.profile_ranks``)
   and reports DDP's buckets as it rebuilt them and the copy bandwidth. The ranks' traces give, per rank, its
   communication, exposed communication and overlap fraction (``analysis.ranks``), and its passes' times.
3. The communication section: the bytes per step per collective (``analysis.comm``: gradients and parameters in the
   dtype they have), the bus bandwidth at the mean message (a bucket), the floor (bus bytes ÷ busbw), and per rank
   the measured communication ÷ the floor.
4. The fixes (``ddp:OPTION=VALUE``, ``fsdp``, ``fsdp:reshard=false``, ``compile``): each measured and profiled in a
   launch of its own (so its exposed communication is measured too), and in that launch the base is built again
   beside it and the two are timed in interleaved blocks (``measure.parallel``: a launch is a fresh set of
   processes, and a shared host's speed moves within one): the fix's measured step and its speedup (the ratio of
   blocks of the same round, with a 95% CI) are from that session. Each is predicted from the base's profile (its
   exposed communication, passes, buckets; ``analysis.comm_fixes``, the model in one line) anchored at the paired
   base's step, never from the fix's own figures; a miss past 15% names the term (compute or exposed
   communication) that missed.

A profile's times are of traced steps, longer than untraced ones; the models read them as shares of the traced
step (exposed communication ÷ the profiled window, per step), applied to the untimed step they are compared with,
so compute = step − exposed is never negative. The exposed communication they read is the transfer no compute hides,
without the time a rank spent waiting for a later one (on two H200s, under the profiler, one rank's host fell behind
and the other's exposed communication was mostly that wait); the rank table shows both.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from perflab.analysis.comm import MIB, call_latency_us, communication_section
from perflab.analysis.comm_fixes import CommPrediction, CommStep, ParallelFix, fix_step_ms, predict_comm_fix
from perflab.errors import PerflabError
from perflab.diagnosis.explanation import GLUE_CATEGORIES
from perflab.measure.stages import Parts
from perflab.spec import Case, merge_parallel, parse_parallel

# gloo on the CPU: the sizes the ranks sweep in the base's launch (small ones for the per-call latency)
CPU_ALL_REDUCE_SIZES = (4096, 16384, 262144, 1 << 20)


@dataclass
class ParallelExplanation:
    case: Case
    row: dict  # the base's row (measure.parallel)
    profile: dict  # profiling.profile_ranks's result, less the row
    communication: dict
    step: CommStep | None
    fix_results: list[ParallelFix] = field(default_factory=list)
    parallel: bool = True

    def to_dict(self) -> dict:
        return {"case": self.case.to_dict(), "label": self.case.label(), "parallel": self.case.parallel, "world_size": self.case.world_size,
                "device": self.case.device, "row": self.row, "communication": self.communication,
                "rank_accounts": self.profile.get("accounts"), "waits_per_step": self.profile.get("waits_per_step"),
                "rank_passes": self.profile.get("rank_passes"), "note": self.profile.get("note"), "steps": self.profile.get("steps"),
                "trace_paths": self.profile.get("trace_paths"), "fix_predictions": [fx.to_dict() for fx in self.fix_results]}


def default_parallel_fixes(case: Case) -> list[str]:
    """DDP: buckets 4× larger, gradients as bucket views, 4 micro-batches per all-reduce, FSDP; FSDP: the other
    resharding, DDP. (compile is left to ``--fixes compile``: minutes of compiling per rank.)"""
    mode, options = parse_parallel(case.parallel)
    if mode == "fsdp":
        return [f"fsdp:reshard={str(not options['reshard']).lower()}", "ddp"]
    out = [f"ddp:bucket_cap_mb={options['bucket_cap_mb'] * 4:g}"]
    out += [] if options["grad_view"] else ["ddp:grad_view=true"]
    out += ["ddp:no_sync=4"] if options["no_sync"] == 1 else []
    return out + ["fsdp"]


def plan_parallel_fixes(case: Case, fixes) -> list[tuple[str, Case]]:
    """(spec, the case after it) per fix, each validated: PerflabError (one line) before anything is measured."""
    from perflab.diagnosis.explanation import parse_fix
    from perflab.spec import validate_case

    out = []
    for spec in fixes:
        changes = parse_fix(spec)
        other = sorted(set(changes) - {"parallel", "mode"})
        if other:
            raise PerflabError(f"--fixes {spec}: with --parallel the fixes are ddp:OPTION=VALUE, fsdp, fsdp:reshard=false and compile; "
                               f"{', '.join(other)} is a one-GPU fix")
        fixed = replace(case, parallel=merge_parallel(case.parallel, changes["parallel"]) if "parallel" in changes else case.parallel,
                        mode=changes.get("mode", case.mode))
        validate_case(fixed)
        out.append((spec, fixed))
    return out


def check_parallel_explain(case: Case, vs, by_module: bool, fixes_on: str, compile_budget_s, modes) -> None:
    steps = case.family_spec.optimizer_workloads
    if case.workload not in steps:
        raise PerflabError(f"explain --parallel explains a training step's communication (the gradients reduced, then the optimizer's "
                           f"step): use --workload {' or '.join(steps) or '(none of this family)'}, not {case.workload}")
    for given, what in ((vs is not None, "--vs"), (by_module, "--by-module"), (fixes_on != "best", "--fixes-on"),
                        (compile_budget_s is not None, "--compile-budget"), (bool(modes), "--modes")):
        if given:
            raise PerflabError(f"{what} applies to a one-GPU explain, not with --parallel (its fixes: --fixes ddp:OPTION=VALUE, fsdp, compile)")


def explain_parallel(case: Case, out_dir, steps: int = 3, gpus=None, fixes=None, on_stage=lambda s: None) -> ParallelExplanation:
    """The communication of ``case`` (a --parallel train_step) against its floor, and ``fixes`` (None: the defaults;
    ["none"]: none) predicted then measured. ``gpus``: the ranks' GPUs (None on the CPU). ``on_stage`` hears each part
    as it begins (``measure.stages.Stage``: the all-reduce sweep on GPUs, then each launch of the ranks)."""
    from perflab.paths import make_out_dir
    from perflab.spec import validate_case

    case = validate_case(case)
    if case.device == "cuda":
        gpus = list(gpus) if gpus else list(range(case.world_size))  # as measure.parallel's default
    fixes = default_parallel_fixes(case) if fixes is None else ([] if list(fixes) == ["none"] else list(fixes))
    planned = plan_parallel_fixes(case, fixes)
    out_dir = make_out_dir(Path(out_dir))
    sweep, sizes = None, None
    parts = Parts(on_stage, (case.device == "cuda") + 1 + len(planned))  # the all-reduce sweep (GPUs), then each launch of the ranks
    if case.device == "cuda":
        from perflab.measure.ceilings import cache_path, get_all_reduce

        parts.begin(f"the all-reduce bus bandwidth of GPUs {gpus} (perflab ceilings' sweep; cached after the first time)")
        sweep = dict(get_all_reduce(list(gpus)), source=f"perflab ceilings' all-reduce sweep of GPUs {','.join(map(str, gpus))}, cached in {cache_path()}")
    else:
        sizes = CPU_ALL_REDUCE_SIZES
    from perflab.diagnosis.profiling import profile_ranks

    parts.begin(f"{case.label()}: timing on {case.world_size} ranks (and on one device), profiling {steps} steps on each")
    result = profile_ranks(case, out_dir / "base", steps=steps, gpus=gpus, all_reduce_sizes=sizes, explain=True)
    row = result.pop("row")
    if row["status"] != "ok":
        raise PerflabError(f"{case.label()} could not be measured ({row['status']}: {row.get('message')})")
    if sweep is None:
        sweep = dict(row["all_reduce"], source=f"gloo all-reduces of {', '.join(_size(b) for b in sizes)} swept by the {case.world_size} CPU "
                                               "ranks in this run")
    communication = case_communication(case, row, result, sweep)
    step = comm_step(case, row, result, sweep)
    explanation = ParallelExplanation(case, row, result, communication, step)
    for i, (spec, fixed) in enumerate(planned, 1):
        parts.begin(f"fix {i} of {len(planned)}, {spec}: timing and profiling {fixed.label()}, then timing the base again beside it")
        measured = profile_ranks(fixed, out_dir / f"fix{i}", steps=steps, gpus=gpus, single=False, paired=[case])
        fix_row = measured.pop("row")
        base_row = (fix_row.get("paired") or [{}])[0]
        exposed = None
        if fix_row.get("status") == "ok" and measured["accounts"]:
            account = measured["accounts"][fix_row["slowest_rank"]]
            exposed = account[exposed_key(account)] * untraced_scale(account, steps, fix_step_ms(fix_row))
        anchored = step.anchored(base_row["median_ms"]) if base_row.get("median_ms") else step
        explanation.fix_results.append(ParallelFix(spec, fixed.parallel, fixed.mode, predict_fix(anchored, case, fixed), fix_row, exposed,
                                                   base_row))
    return explanation


def predict_fix(step: CommStep, case: Case, fixed: Case):
    """The fix's prediction from the base ``step`` (``analysis.comm_fixes``): a change of data-parallel mode or options,
    or of mode (compile); both at once is measured only."""
    changed = fixed.parallel != case.parallel
    if changed and fixed.mode != case.mode:
        return CommPrediction(None, "a combination (mode and data-parallel options): measured only")
    new_mode, new_options = parse_parallel(fixed.parallel) if changed else (None, None)
    return predict_comm_fix(step, new_mode, new_options, compile_mode=fixed.mode != case.mode)


def _size(nbytes: int) -> str:
    return f"{nbytes / MIB:g} MiB" if nbytes >= MIB else f"{nbytes / 1024:g} KiB"


def _slowest(row: dict, profile: dict) -> dict | None:
    accounts = profile.get("accounts") or []
    return accounts[row["slowest_rank"]] if len(accounts) > row["slowest_rank"] else None


def comm_step(case: Case, row: dict, profile: dict, sweep: dict | None) -> CommStep:
    """The base as the fixes' models read it: the slowest rank's step, exposed communication and passes."""
    mode, options = parse_parallel(case.parallel)
    steps = profile.get("steps") or 1
    slowest = _slowest(row, profile)
    passes = next((p for p in profile.get("rank_passes") or [] if p["rank"] == row["slowest_rank"]), {})
    categories = passes.get("category_ms") or {}
    step_ms = row["median_ms"]
    scale = untraced_scale(slowest, steps, step_ms) * steps * 1e6 if slowest else 1.0  # ms a traced step → ms of the untraced one
    optimizer = (passes.get("ms") or {}).get("optimizer")
    return CommStep(mode=mode, options=options, world_size=case.world_size, step_ms=step_ms,
                    exposed_ms=slowest[exposed_key(slowest)] * untraced_scale(slowest, steps, step_ms) if slowest else None,
                    optimizer_ms=optimizer * scale if optimizer is not None else None, grad_bytes=row["grad_bytes"], param_bytes=row["param_bytes"],
                    sweep=sweep, latency_us=call_latency_us(sweep) if sweep else 0.0, ready_sizes=tuple(row.get("ready_grad_bytes") or ()),
                    buckets=tuple(row.get("ddp_buckets") or ()), units=row.get("shard_units") or row.get("fsdp_units") or 1,
                    copy_gbps=row.get("copy_gbps"), glue_ms=sum(categories.get(c, 0.0) for c in GLUE_CATEGORIES) * scale if categories else None)


def exposed_key(account: dict) -> str:
    """The exposed communication the models read: the transfer no compute hides, without the time spent waiting for a
    later rank (``analysis.ranks.exposed_waiting_ns``: a straggler's cost, which the profiler's own overhead on one
    rank's host can make), where the ranks' collectives lined up; else all of it."""
    return "comm_exposed_transfer_ns" if "comm_exposed_transfer_ns" in account else "comm_exposed_ns"


def untraced_scale(account: dict, steps: int, step_ms: float) -> float:
    """ms of an untraced step of ``step_ms`` per ns of a profiled rank's window of ``steps`` traced steps: a time of
    the profile as its share of the window, times the step (the profiler lengthens every step it records); without
    a window, ns per traced step as ms."""
    window = account.get("window_ns")
    return step_ms / window if window else 1.0 / steps / 1e6


def case_communication(case: Case, row: dict, profile: dict, sweep: dict) -> dict:
    """The case's communication against its floor (``analysis.comm.communication_section``, the one section
    ``perflab run`` gives too), with what explain adds beside it: the options, the sweep, the step and its scaling."""
    mode, options = parse_parallel(case.parallel)
    steps = profile.get("steps") or 1
    section = communication_section(mode=mode, world_size=case.world_size, grad_bytes=row["grad_bytes"], param_bytes=row["param_bytes"], sweep=sweep,
                           accounts=profile.get("accounts") or [], steps=steps, rank_step_ms=dict(enumerate(row["rank_median_ms"])),
                           step_ms=row["median_ms"], bucket_cap_mb=options.get("bucket_cap_mb"), buckets=row.get("ddp_buckets"),
                           fsdp_units=row.get("fsdp_units"), reshard=options.get("reshard", True))
    return dict(section, options=options, sweep=sweep, step_ms=row["median_ms"], slowest_rank=row["slowest_rank"],
                dtype_note="gradients and parameters in the dtype they have (the parameters' dtype: fp32 under autocast)",
                single_ms=row.get("single_gpu_ms"), step_beside_single_ms=row.get("step_ms_beside_single"),
                scaling_efficiency=row.get("scaling_efficiency"), scaling_efficiency_ci95=row.get("scaling_efficiency_ci95"),
                not_in_floor=section.get("not_in_floor"))


