"""``perflab run``'s report at the report floor, printed; ``analysis/program.py`` makes its figures.

The console report, from the report dict (``program.report.RunReport.to_dict``; ``OUT/run.json`` holds the same)."""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from perflab import units
from perflab.records.run_report import CompilePhase, RunView, Scaling, TimingSection
from perflab.report.fit import plain_table
from perflab.report.trace_console import CPU_TERMS, GPU_TERMS, accounting_table, top_table


def _against_growth(rank: dict, growth_ms: float | None) -> str:
    """A rank's exposed communication against the step's growth (``growth_ms``, None where it is not known), in a few
    words (``analysis.program._rank_against_growth``). A rank not judged says why: no growth to hold it against, or
    its traced steps' inflation."""
    if rank.get("within_growth") is None:
        inflation = rank.get("inflation")
        if growth_ms is None:
            return " (no growth: not judged)"
        return f" (traced ×{inflation:.2f}: not judged)" if inflation else " (not judged)"
    return "" if rank["within_growth"] else " (> growth)"


@dataclass(frozen=True)
class StderrRender:
    """``perflab run``'s console report on stderr, as a value another process can make again (``program.report_job``
    pickles it): a console made for the call, ``wide`` as the command line gave it."""

    wide: bool = False

    def __call__(self, report: dict) -> None:
        from perflab.report.terminal import TerminalConsole

        console = TerminalConsole(stderr=True)
        console.configure(wide=self.wide)
        render_run(console, report)


def render_run(console: Console, report: dict) -> None:
    for line in first_lines(report):
        console.print(line, markup=False, highlight=False)
    for table in run_tables(report):
        console.print(table)
    for line in run_lines(report):
        console.print(line, markup=False, highlight=False)


def ci_label(timing: dict) -> str:
    """What the step-time CI is and the coverage it may claim, as bench's rows say it: ``95% CI over stretches of the
    run``; from 3 steps ``≥75% CI over ...``; from 1 or 2 the order statistics, ``min–max of 2``."""
    from perflab.report.console import row_ci_note

    claim = row_ci_note(timing) or "95%"
    level = TimingSection(timing).ci_level
    if level == "pooled":
        return f"order-statistics interval (few stretches): {claim}"
    return f"{claim} CI over stretches of the run" if level == "time" else f"{claim} CI"


def first_lines(report: dict) -> list[str]:
    """What the user must read before the tables: stalls that take more than a tenth of the wall time (the median then
    hides what the program spends), and the verdict when it is about the whole loop (input)."""
    from perflab.analysis.loop import stall_line

    stall = stall_line(RunView.of(report).loop.raw)
    return [f"stalls: {stall}"] if stall else []


def loop_table(report: dict) -> Table | None:
    """The timed steps as the program lives them: the mean step (its wall time a step) beside the median, throughput,
    and what fills a step without a trace: the GPU's busy share, the waits for input (exposed and hidden), the
    synchronising calls, the host's own time."""
    loop = RunView.of(report).loop
    if not loop:
        return None
    table = plain_table("the whole loop, untraced (mean per timed step)", [("", "left"), ("", "right")], show_header=False)
    table.add_row("step: mean (wall time ÷ steps) / median ms", f"{units.ms(loop.mean_ms)} / {units.ms(loop.median_ms)}")
    thr = loop.throughput
    rate = [f"{loop.steps_per_s:.3g} steps/s"] if loop.steps_per_s else []
    if thr.samples_per_s:
        rate.append(f"{thr.samples_per_s:,.1f} samples/s")
    if thr.tokens_per_s:
        rate.append(f"{thr.tokens_per_s:,.0f} tokens/s")
    table.add_row("throughput" + (f" ({thr.source})" if thr.samples_per_s else ""), ", ".join(rate) or "–")
    busy = loop.busy
    if busy.busy_share is not None:
        check = f"; NVML's samples {units.pct(busy.nvml_util)}" if busy.nvml_util is not None and busy.gpm_graphics_util is not None else ""
        table.add_row("GPU busy (no profiler)", f"{units.pct(busy.busy_share)} ({'GPM' if busy.gpm_graphics_util is not None else 'NVML'}{check})")
    elif busy.why:
        table.add_row("GPU busy (no profiler)", "– (" + "; ".join(busy.why.values()) + ")")
    inputs = loop.input
    if inputs:
        table.add_row("waiting for input: waits / ms / exposed ms", f"{inputs.waits_per_step:.3g} / {units.ms(inputs.wait_ms_per_step)} / "
                      f"{units.ms(inputs.exposed_ms_per_step)} ({units.pct(inputs.exposed_share)} of the wall time)")
        if inputs.worker_batch_ms is not None:
            table.add_row("DataLoader workers: ms a batch (measured in them)", f"{units.ms(inputs.worker_batch_ms)} ({inputs.workers_seen} workers)")
    sync = loop.sync
    if sync:
        top = sync.sites[0]
        table.add_row("synchronising calls: calls / ms blocked", f"{sync.calls_per_step:.3g} / {units.ms(sync.blocked_ms_per_step)}")
        table.add_row("  most blocked", f"{top.call} at {top.site}")
    if loop.host_own_ms is not None:
        table.add_row("host's own time, less its waits, ms", units.ms(loop.host_own_ms))
    return table


def run_tables(report: dict) -> list[Table]:
    run = RunView.of(report)
    tables = [timing_table(report)]
    loop = loop_table(report)
    if loop is not None:
        tables.append(loop)
    acc = run.accounting
    if acc:
        terms = CPU_TERMS if run.traced.cpu_only else GPU_TERMS
        top = acc.top_kernels
        tables += [accounting_table(acc.accounting_ns.raw, terms, "the traced steps: where the time goes (µs, exact to the ns)"),
                   top_table(top, terms, with_device=len({r["device"] for r in top}) > 1)]
    compiler = compiler_table(report)
    if compiler is not None:
        tables.append(compiler)
    if run.communication:
        tables.append(communication_table(report))
    return tables


def timing_table(report: dict) -> Table:
    run = RunView.of(report)
    timing, traced, recorded = run.timing, run.traced, run.recorded
    device = run.device or "?"
    clock = "CUDA events on the step's stream" if device == "cuda" else "the host clock"
    table = plain_table(f"perflab run: {run.program} — steps: {run.steps_from}", [("", "left"), ("", "right")], show_header=False)
    table.add_row("steps seen / timed / traced", f"{recorded.steps_seen or 0} / {timing.steps or 0} / {traced.steps or 0}")
    if timing.steps:
        ci = timing.ci95_ms or [None, None]
        table.add_row(f"step, median ms ({clock})", units.ms(timing.median_ms))
        table.add_row(ci_label(timing.raw), f"{units.ms(ci[0])}–{units.ms(ci[1])}")
        table.add_row("p10–p90 ms, CV", f"{units.ms(timing.p10_ms)}–{units.ms(timing.p90_ms)}, {units.pct(timing.cv)}")
        if device == "cuda" and timing.host_median_ms is not None:
            table.add_row("host clock, median ms", units.ms(timing.host_median_ms))
    if traced.step_ms:
        inflation = traced.inflation  # None without an untraced median to divide by: no ratio to print
        table.add_row("traced step, median ms (÷ untraced)", f"{units.ms(traced.step_ms)} ({'–' if inflation is None else f'×{inflation:.2f}'})")
        if traced.step_ms_each:
            table.add_row("traced steps, each ms", ", ".join(units.ms(x) for x in traced.step_ms_each))
        if traced.warmup_step_ms:
            table.add_row("profiler warm-up steps, thrown away, ms", ", ".join(units.ms(x) for x in traced.warmup_step_ms))
    if recorded.peak_allocated_bytes is not None:
        table.add_row("memory peak while timed: allocated / reserved",
                      f"{recorded.peak_allocated_bytes / 2**30:.2f} / {(recorded.peak_reserved_bytes or 0) / 2**30:.2f} GiB")
    elif recorded.peak_rss_bytes:
        table.add_row("memory peak of the process (RSS, whole run)", f"{recorded.peak_rss_bytes / 2**30:.2f} GiB")
    if "flops" in run and run.raw["flops"] is not None:
        flops = run.flops
        per = flops.flops_per_step or 0
        known = flops.known if "known" in flops else True
        value = "unknown" if not known else f"{per / 1e9:.4g} G" + ("" if flops.complete else " (lower bound)")
        table.add_row("FLOPs per step (from the traced operators' shapes)", value)
    util = run.utilisation
    if util:
        if util.peak_tflops:
            table.add_row(f"MFU ({util.dtype} peak {util.peak_tflops:.0f} TFLOP/s, measured)",
                          units.pct(util.mfu) + (" (at least)" if util.mfu_lower_bound and util.mfu else ""))
        else:  # a dtype is named only where FLOPs were counted: then it is the peak that is missing
            table.add_row("MFU", f"– (no measured {util.dtype} peak)" if util.dtype else "– (FLOPs unknown)")
        table.add_row(f"MBU ({util.bytes_per_step / 1e9:.3g} GB of weights and buffers, copy {util.copy_gbps:.0f} GB/s)", units.pct(util.mbu))
    return table


def _phases(run) -> dict[str, CompilePhase]:
    """The compiler's phases dynamo's counters were read over (``recorded.compile_phases``), each as its section."""
    return {name: CompilePhase(p) for name, p in (run.recorded.compile_phases or {}).items()}


def compiler_table(report: dict) -> Table | None:
    run = RunView.of(report)
    phases, hits = _phases(run), run.recorded.limit_hits
    if not any(p.frames for p in phases.values()) and not hits:
        return None
    table = plain_table("the compiler, as the program ran it (dynamo's counters)",
                        [(column, "left" if column == "phase" else "right")
                         for column in ("phase", "frames compiled", "graphs", "backend graphs", "graph breaks", "guard failures")])
    for name in ("skipped", "timed", "traced"):
        p = phases.get(name)
        if p:
            recompiles = sum(len(v) for v in (p.recompiles or {}).values())
            table.add_row(name, str(p.frames), str(p.graphs), str(p.backend_graphs), str(p.graph_breaks), str(recompiles))
    return table


def compiler_lines(report: dict) -> list[str]:
    """Per frame recompiled, the guard that failed last; each frame that hit the recompile limit; how much of the traced
    steps ran compiled."""
    run = RunView.of(report)
    phases = _phases(run)
    lines, frames = [], {}
    for name in ("skipped", "timed", "traced"):
        for frame, guards in (phases.get(name, CompilePhase()).recompiles or {}).items():
            frames.setdefault(frame, []).append((name, guards))
    for frame, seen in frames.items():
        counts = ", ".join(f"{len(g)} while {name}" for name, g in seen)
        lines.append(f"guard failures (each a recompile, until the limit): {frame}: {counts}; the last: {seen[-1][1][-1]}")
    for hit in run.recorded.limit_hits:
        lines.append(f"recompile limit: {hit.function} ({hit.where}) hit {hit.limit} ({hit.value}) at step {hit.step} and runs "
                     "eagerly from then on")
    compiled = run.compiled
    compiled_any = frames or any(p.frames for p in phases.values())
    if compiled.compiled_share is not None:
        top = compiled.eager_top or []
        eager = f" (most: {top[0]['name'][:60]})" if top else ""
        lines.append(f"the traced steps' work, communication apart: {units.pct(compiled.compiled_share)} in compiled regions, "
                     f"{units.pct(compiled.eager_share)} eager{eager}")
    elif compiled.unknown:
        if compiled_any:
            lines.append(f"how much of the traced steps ran compiled: unknown, {compiled.unknown}")
    elif compiled_any:
        lines.append("the traced steps ran no compiled region: all of their work ran eagerly")
    return lines


def communication_table(report: dict) -> Table:
    run = RunView.of(report)
    comm = run.communication
    floor = comm.floor_ms
    title = f"communication per step on {comm.world_size} ranks"
    if floor is not None and comm.mode == "fsdp":
        title += (": " + " + ".join(f"{c['collective'].replace('_', '-')} of {c['bus_bytes'] / 1e6:.1f} MB bus bytes in {c['calls']} call(s)"
                                    for c in comm.collectives or []) + f", busbw {comm.busbw_gbps:.1f} GB/s → floor {floor:.3f} ms")
    elif floor is not None:
        title += (f": all-reduce of {comm.bus_bytes / 1e6:.1f} MB bus bytes in {comm.calls} bucket(s), busbw {comm.busbw_gbps:.1f} GB/s "
                  f"→ floor {floor:.3f} ms")
    table = plain_table(title + " (ms per step)",
                        [(column, "right") for column in ("rank", "step", "traced step", "comm", "exposed", "waiting", "transfer", "hidden", "overlap", "÷ floor")])
    for r in comm.ranks:
        table.add_row(f"{r.rank}{'*' if r.rank == run.slowest_rank else ''}", units.ms(r.step_ms), units.ms(r.traced_step_ms), units.ms(r.comm_ms),
                      units.ms(r.exposed_ms), units.ms(r.waiting_ms), units.ms(r.transfer_ms), units.ms(r.overlapped_ms), units.pct(r.overlap_fraction),
                      f"{r.measured_over_floor:.2f}" if r.measured_over_floor else "–")
    notes = [n for n in ("* the slowest rank; step: untraced; traced step: the windows the rest is counted over, of which each is a part; "
                         "waiting: for a later rank; hidden: under compute", comm.busbw_source, comm.floor_note, comm.note) if n]
    if notes:
        table.caption = "; ".join(notes)
    return table


def run_lines(report: dict) -> list[str]:
    run = RunView.of(report)
    lines = compiler_lines(report)
    message = run.verdict.message  # analysis.program.step_verdict's dict
    if run.verdict:
        lines.append(f"verdict: {message}")
    if run.traced_verdict and run.traced_verdict != message:
        inflated = run.traced.inflated
        lines.append(f"traced steps{' (inflated: they describe the profiler, not the program)' if inflated else ''}: {run.traced_verdict}")
    said = set(first_lines(report))  # the stalls, said before the tables: not again among the flags
    for flag in (f for f in run.flags if f.flag):  # a damaged entry (no mapping, no name) is not printed as "None"
        line = f"{flag.flag}: {flag.message}"
        if line not in said:
            lines.append(line)
    if run.recorded.trace_note:
        lines.append(run.recorded.trace_note)
    if run.ceilings_note:
        lines.append(run.ceilings_note)
    out = run.options.out_dir if "out_dir" in run.options else "perflab-run"
    trace = run.traced.trace_path
    lines.append(f"written: {out}/run.json, its page {out}/report.html" + (f" and {trace} (open it in https://ui.perfetto.dev)" if trace else ""))
    return lines


def render_scaling(console: Console, section: dict) -> None:
    console.print(scaling_table(section))


def scaling_table(section: dict) -> Table:
    """``perflab run --nproc 1,2``'s scaling table: per rank count the step, the work per rank, the step expected at that
    work from the first count's, the growth and the efficiency (expected ÷ step), and each rank's exposed communication."""
    scaling = Scaling(section)
    table = plain_table(f"scaling over {scaling.base} rank(s) (ms per step; efficiency = expected ÷ step)",
                        [(column, "right") for column in ("ranks", "step", "work per rank", "expected", "growth", "efficiency", "exposed comm by rank")])
    for row in scaling.rows:
        exposed = ", ".join(f"r{r['rank']} {units.ms(r['exposed_ms'])}{_against_growth(r, row.growth_ms)}" for r in row.ranks) or "–"
        work = f"×{row.work_ratio:.2f}" if row.work_ratio is not None else "–"
        table.add_row(str(row.nproc), units.ms(row.step_ms), work, units.ms(row.expected_ms), units.ms(row.growth_ms),
                      f"{row.efficiency:.3f}" if row.efficiency else "–", exposed)
    if scaling.note:
        table.caption = scaling.note
    return table
