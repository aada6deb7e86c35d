"""``perflab run``'s report (``OUT/run.json``, and each rank's ``rankR/rank.json`` under torchrun): its builder.

The record is declared in ``records.run_report`` (``RunReport``, with ``load`` and ``save``, run.json's format);
it is built here alone, by ``build_run_report``, from what the recorder hands over (``recorder.Recorded``: the step
times, read once, and their summary) and what the run is (``RunContext``): the traced steps' analysis
(``analysis.program.program_report``, torch-free, from the traces the recorder wrote and, on a GPU, the measured
peaks and the modules' bytes), the run's own fields and the validity flags (``run_report_checks``). Under torchrun
this rank's DDP (or FSDP) layout and all-reduce sweep (``program.ranks.rank_fields``) are built in too; only rank 0's merge of
the ranks is set afterwards (``program.ranks.gather``, once this rank's report is saved: ``records.run_report`` says
why that is a second step). It is written through
``records.run_report.save``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from perflab.measure.checks import Check
from perflab.program.guard import say
from perflab.program.recorder import SHAPES_FILE, TRACE_FILE, Rank, Recorded, RunOptions, module_bytes, rank_dir
from perflab.records.run_report import RunReport, RunView


# the record's step times (in timing and traced) and the loop's raw columns (summed up in loop): not in recorded
STEP_TIMES = ("step_ms", "host_step_ms", "traced_step_ms", "timing", "timed_windows_ns", "loop", "busy")
MIN_STEPS = 5  # fewer timed steps: no median and CI worth the name (few_steps)


@dataclass
class RunContext:
    """What the run is, beside what it measured: the program, where its steps come from, its options, this rank."""

    program: str
    steps_from: str
    options: RunOptions
    rank: Rank
    run_id: str | None = None


def build_run_report(recorded: Recorded, context: RunContext, *, partial: bool, outcome=None, notes: list[str] | None = None,
                     rank_fields: dict | None = None, gpu: dict | None = None, measure_missing: bool = False) -> RunReport:
    """The report of one rank's run. ``partial``: the program ended before the traced steps did (no analysis);
    ``outcome``: the program's end when it is known (``script.Outcome``); ``notes``: perflab's own failures so far;
    ``rank_fields``: under torchrun, this rank's DDP (or FSDP) layout and all-reduce sweep (``program.ranks.rank_fields``);
    ``gpu``: ``gpu_facts`` taken in the program's process (where the report is made in another: ``program.report_job``,
    or a step before it is made); ``measure_missing``: the GPU's peaks missing from ``gpu`` are measured now (in the
    program's process only: never in the report's own, which must not touch the GPU)."""
    if gpu is not None and measure_missing and not partial:
        gpu = complete_gpu_facts(gpu, recorded, context)
    loop = whole_loop(recorded, context.options)
    report = RunReport(timing=recorded.timing, device=recorded.device) if partial else traced_report(recorded, context, loop, gpu)
    report.loop = loop
    options = context.options
    report.program, report.steps_from = context.program, context.steps_from
    report.options = dict(asdict(options), out_dir=str(options.out_dir))
    report.recorded = {k: v for k, v in vars(recorded).items() if k not in STEP_TIMES}
    report.partial, report.rank, report.world_size = partial, context.rank.rank, context.rank.world_size
    report.run_id = context.run_id
    report.flags = run_report_checks(report)
    if outcome is not None:
        report.exit_code = outcome.code
        report.ended_by = ("sigterm" if outcome.terminated else "interrupt" if outcome.interrupted
                           else "exception" if outcome.exception else "exit")
        if outcome.exception is not None and not outcome.interrupted:
            report.last_words = f"{type(outcome.exception).__name__}: {outcome.exception}"[:300]
        elif outcome.message:
            report.last_words = outcome.message[:300]
        if notes:
            report.perflab_notes = notes
    for name, value in (rank_fields or {}).items():
        setattr(report, name, value)
    return report


def whole_loop(recorded: Recorded, options: RunOptions) -> dict | None:
    """The timed steps' whole loop (``analysis.loop.loop_section``) from what the recorder watched."""
    from perflab.analysis.loop import loop_section

    raw = recorded.loop or {}
    return loop_section(recorded.step_ms, recorded.host_step_ms, recorded.timed_windows_ns, raw, recorded.busy,
                        stall_factor=options.stall_factor, batch_size=options.batch_size, seq_len=options.seq_len,
                        worker_batches=raw.get("worker_batches"))


def gpu_facts(recorded: Recorded, context: RunContext, measure: bool = True, modules=None) -> dict:
    """What only the program's process can tell of its GPU: TF32 on or off (for matmuls, ``tf32``; for cuDNN's
    convolutions, ``tf32_conv``, on by torch's default), the bytes of its modules' weights, and the
    GPU's measured peaks (cached, or measured now on rank 0; ``measure`` False: cached or None). Nothing on the CPU.
    ``modules``: the program's modules as the recorder's ``ModuleWatch`` saw them (else the garbage collector's)."""
    if recorded.device != "cuda":
        return {"ceilings": None, "model_bytes": None, "tf32": False, "tf32_conv": False}
    import torch

    ceilings = _ceilings(context.rank) if measure else _cached_ceilings()
    return {"tf32": bool(torch.backends.cuda.matmul.allow_tf32),
            "tf32_conv": bool(torch.backends.cudnn.allow_tf32 and torch.backends.cudnn.enabled),
            "model_bytes": module_bytes("cuda", modules), "ceilings": ceilings}


def complete_gpu_facts(facts: dict, recorded: Recorded, context: RunContext) -> dict:
    """``gpu_facts`` taken earlier without measuring, with the peaks measured now where they were missing (on a GPU)."""
    if recorded.device != "cuda" or facts.get("ceilings") is not None:
        return facts
    return dict(facts, ceilings=_ceilings(context.rank))


def _cached_ceilings() -> dict | None:
    from perflab.measure import ceilings

    try:
        return ceilings.cached_ceilings()
    except Exception:  # an unreadable cache is measured again, later, as a missing one is
        return None


def traced_report(recorded: Recorded, context: RunContext, loop: dict | None = None, gpu: dict | None = None) -> RunReport:
    """The record with the traced steps' analysis: the traces the recorder wrote (read from the files the run names
    for them), on a GPU the measured peaks, the modules' bytes and TF32. perflab's own failure to analyse them must not
    end the user's program: the timing is kept, and the failure said (``report_error``)."""
    from perflab.analysis.program import program_report

    options = context.options
    try:
        trace, shapes, ceilings, model, tf32 = None, None, None, None, False
        if recorded.trace_path:
            from perflab.trace.kineto import load_kineto
            from perflab.trace.load import compress_trace

            folder = rank_dir(options.out_dir, context.rank)
            for name in (TRACE_FILE, SHAPES_FILE):  # the recorder wrote them plain (Tracer's compress_later): gzipped here
                compress_trace(folder / name)
            trace = load_kineto(folder / TRACE_FILE, ops=True)
            if recorded.shapes_trace_path:
                shapes = load_kineto(folder / SHAPES_FILE, ops=True)
        facts = gpu if gpu is not None else gpu_facts(recorded, context)
        ceilings, model, tf32 = facts["ceilings"], facts["model_bytes"], facts["tf32"]
        tf32_conv = bool(facts.get("tf32_conv"))  # facts taken by an earlier perflab have no such key: as before
        sections = program_report(timing=recorded.timing, device=recorded.device, traced_step_ms=recorded.traced_step_ms,
                                  trace_warmup=recorded.trace_warmup, inflation_limit=options.inflation_limit,
                                  trace=trace, shapes_trace=shapes, ceilings=ceilings, model_bytes=model, tf32=tf32, tf32_conv=tf32_conv, loop=loop)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        say(f"perflab: the traced steps could not be analysed ({error}); the timed steps are in {Path(options.out_dir) / 'run.json'}")
        return RunReport(timing=recorded.timing, device=recorded.device, report_error=error)
    note = None if ceilings or recorded.device != "cuda" else "no measured peaks: MFU, MBU and floors left out"
    return RunReport(**sections, model_bytes=model, ceilings_note=note)


def _ceilings(rank: Rank) -> dict | None:
    """This GPU's measured peaks: cached, or measured now (seconds), on rank 0's GPU; other ranks read the cache only."""
    from perflab.measure import ceilings

    try:
        return ceilings.get_ceilings() if rank.rank == 0 else ceilings.cached_ceilings()
    except Exception as exc:  # a peak that cannot be measured leaves MFU out, it does not lose the run's report
        say(f"perflab: the GPU's peaks could not be measured ({type(exc).__name__}: {exc}); MFU, MBU and floors left out")
        return None


def run_report_checks(report: RunReport | dict) -> list[dict]:
    """The run's validity flags: the timed steps were not the steady state (compiled while timed, a frame fell back to
    eager past its recompile limit), too few or too noisy, graph breaks, FLOPs that missed part of the work.
    ``report``: the record being built, or ``program_report``'s dict (only ``get`` is read)."""
    from perflab.measure.checks import CV_THRESHOLD, compile_checks, spread_checks

    recorded = report.get("recorded") or {}
    phases = recorded.get("compile_phases") or {}
    compiled = [phases[p] for p in ("skipped", "timed") if phases.get(p)]
    reasons: dict[str, int] = {}
    for phase in compiled:
        for r in phase.get("break_reasons") or []:
            reasons[r["reason"]] = reasons.get(r["reason"], 0) + r["count"]
    stats = {"frames_compiled_while_timed": (phases.get("timed") or {}).get("frames", 0),
             "graph_breaks": sum(p["graph_breaks"] for p in compiled), "graphs": sum(p["graphs"] for p in compiled),
             "break_reasons": [{"reason": r, "count": n} for r, n in sorted(reasons.items(), key=lambda kv: -kv[1])[:3]]}
    checks = compile_checks(stats)
    for hit in recorded.get("limit_hits") or []:
        checks.append(Check("fell_back_to_eager", f"{hit['function']} ({hit['where']}) hit dynamo's {hit['limit']} ({hit['value']}) at step "
                                                  f"{hit['step']}: from then on it runs eagerly (last guard that failed: {hit['last_reason'] or 'not said'})"))
    traced = report.get("traced") or {}
    if traced.get("inflated"):
        checks.append(Check("trace_inflated", f"the traced steps took ×{traced['inflation']:.2f} the untraced ones (limit ×{traced['inflation_limit']:.2f}): "
                                              "their accounting describes the profiler as much as the program; the verdict rests on the untraced "
                                              "step and the kernels' own time, and the host's issue time is left out (raise --trace-warmup)"))
    timing = report.get("timing") or {}
    loop = report.get("loop") or {}
    stalls = loop.get("stalls") or {}
    if stalls.get("said"):
        from perflab.analysis.loop import stall_line

        checks.append(Check("stalls", stall_line(loop)))
    if timing.get("steps"):
        if stalls.get("said"):
            # the stalls are the program's own (said above): only the spread of the steps between them can be the machine's
            typical = stalls.get("typical_cv")
            if timing.get("modes"):  # stalls every other step are two modes: the median lies between them, no step took it
                checks += [c for c in spread_checks(timing["cv"], timing["modes"], timing.get("median_ms")) if c.flag == "bimodal"]
            if typical is not None and typical > CV_THRESHOLD:
                checks.append(Check("high_cv", f"the steps between the stalls vary by CV {typical:.1%} (threshold {CV_THRESHOLD:.0%}; "
                                               f"all steps: {timing['cv']:.1%}, most of it the stalls); the machine may be busy or the step too short"))
        else:  # two modes (a step that synchronises every other time) are said as such, not blamed on the machine
            checks += spread_checks(timing["cv"], timing.get("modes"), timing.get("median_ms"))
        if timing["steps"] < MIN_STEPS:
            checks.append(Check("few_steps", f"only {timing['steps']} timed steps: raise --steps for a median and CI worth the name"))
    checks += own_work_checks(report)
    flops = report.get("flops")
    if flops and not flops["complete"]:
        why = []
        if not flops["shapes_recorded"]:
            why.append("no operator shapes were recorded")
        if flops["uncounted_ops"] and flops["shapes_recorded"]:  # without shapes no operator could be counted: not a formula missing
            # (or one whose arguments were not recorded: a convolution traced without its stride)
            why.append("operators with no FLOP formula, or not the shapes and arguments it needs: "
                       + ", ".join(f"{k} ×{v}" for k, v in flops["uncounted_ops"].items()))
        if flops["uncounted_heavy_share"]:
            why.append(f"{flops['uncounted_heavy_share']:.0%} of the matmul, convolution and attention kernels' GPU time was launched "
                       "from no counted operator (a Triton template, a CUDA graph replay)")
        lead = "FLOPs are a lower bound: " if flops["known"] else "FLOPs unknown (and MFU left out): "
        checks.append(Check("flops_incomplete", lead + "; ".join(why)))
    return [{"flag": c.flag, "message": c.message} for c in checks if c is not None]


HOST_SETS_THE_STEP = ("launch-bound", "synchronisation-bound")  # verdicts where the host's every millisecond is the step's


def own_work_checks(report: RunReport | dict) -> list[Check]:
    """``perflab_slowed_a_step`` on a GPU, where the host sets the step, when perflab's own work at a step boundary
    (``recorded.own_work``) took longer than the median step: the program's own clock reads that step about twice its
    neighbours or more, outside every timed and traced step. On a host-bound compiled loop the stop of the pass with shapes does (43 ms against a 33 ms
    step on an H200: torch's own stop, docs/performance/run.md); the flag says where and how much, and what leaves it out.
    Not for a GPU-bound program: its queued GPU work hides part of perflab's, so the median plus the work is no floor
    (the spawned ResNet-50 on an H200: a 111.4 ms stop against a 62.4 ms median, and its own clock read 150.5 ms there,
    not 173.8; ×1.89 its neighbours)."""
    run = RunView.of(report)
    median = run.timing.median_ms
    if run.recorded.device != "cuda" or not median or run.verdict.verdict not in HOST_SETS_THE_STEP:
        return []  # a GPU-bound program's queued GPU work hides part of perflab's: no floor can be given (see the docstring)
    # the first boundary's work (the profiler's warm-up) lands in the program's first step, which holds its own start-up
    slow = [w for w in run.recorded.own_work if (w.ms or 0) > median and (w.step or 0) > 1]
    if not slow:
        return []
    worst = max(slow, key=lambda w: w.ms)
    part = max((worst.parts or {}).items(), key=lambda kv: kv[1], default=("perflab's work", worst.ms))[0]
    shapes = " (--no-shapes leaves out the pass with shapes, whose stop is the costliest on a host-bound program, and the FLOPs with it)" \
        if run.options.record_shapes else ""
    more = f", and at {len(slow) - 1} more boundar{'y' if len(slow) == 2 else 'ies'}" if len(slow) > 1 else ""
    return [Check("perflab_slowed_a_step", f"perflab's own work at the boundary after its step {worst.step} ({part}, {worst.ms:.1f} ms in all) "
                                           f"took longer than the median step ({median:.3f} ms){more}: the program's own clock reads that step at least about "
                                           f"{median + worst.ms:.1f} ms, ×{1 + worst.ms / median:.1f} the median; no timed or traced step "
                                           f"holds it{shapes}")]
