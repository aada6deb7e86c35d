"""``perflab run``'s page: ``OUT/report.html``, one self-contained file made from the run's report dict (run.json).

Nothing on it is fetched: its CSS and its plot (SVG, written here) are inline, and a Content-Security-Policy forbids
any load, so the page reads the same offline. Its tables are the console report's own (``report.program``'s drawers,
turned into HTML cells as the console prints them), so every figure is formatted as the console formats it; the
figures the console does not print (the per-step waits, the call sites, the processes) use the same formats.

The plot is the run's steps in order: the timed steps (untraced), the profiler's warm-up steps (thrown away) and the
traced steps, each a bar of its time; a timed step over the stall threshold is marked, and each timed step's waits for
input (exposed and hidden) and in synchronising calls are drawn inside its bar.
"""

from __future__ import annotations

import html
import math
from pathlib import Path

from rich.table import Table
from rich.text import Text

from perflab import units
from perflab.errors import PerflabError
from perflab.records.run_report import ABSENT, RUN_WHAT, AccountingNs, RunView, Scaling, load, read_dict
from perflab.report.fit import plain_table
from perflab.report.program import (communication_table, compiler_lines, compiler_table, first_lines, loop_table,
                                    run_lines, scaling_table, timing_table)
from perflab.report.trace_console import CPU_TERMS, GPU_TERMS, accounting_table, top_table

PAGE = "report.html"
PERFETTO = "https://ui.perfetto.dev"
# nothing may load: no script, font, image or style from anywhere but this file (a data: favicon, so none is asked for)
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


def _esc(text) -> str:
    return html.escape("" if text is None else str(text), quote=True)


def _cell_text(cell) -> str:
    """A rich table cell as the console shows it: a str is console markup, a Text its plain text."""
    if isinstance(cell, Text):
        return cell.plain
    if isinstance(cell, str):
        try:
            return Text.from_markup(cell).plain
        except Exception:  # not markup after all: the console would have refused it too; show it as it is
            return cell
    return str(cell)


def table_html(table: Table, table_id: str | None = None) -> str:
    """A rich Table (the console's) as an HTML table: its title, header, cells (as printed) and caption."""
    columns = table.columns
    cells = [[_cell_text(c) for c in column.cells] for column in columns]
    rows = max((len(c) for c in cells), default=0)
    out = [f'<figure class="tbl"{f" id={_attr(table_id)}" if table_id else ""}>']
    if table.title:
        out.append(f"<figcaption>{_esc(_cell_text(table.title))}</figcaption>")
    out.append("<table>")
    if table.show_header and any(_cell_text(c.header) for c in columns):
        out.append("<thead><tr>" + "".join(f'<th class="{_align(c.justify)}">{_esc(_cell_text(c.header))}</th>' for c in columns) + "</tr></thead>")
    out.append("<tbody>")
    for i in range(rows):
        out.append("<tr>" + "".join(f'<td class="{_align(col.justify)}">{_esc(cells[j][i] if i < len(cells[j]) else "")}</td>'
                                    for j, col in enumerate(columns)) + "</tr>")
    out.append("</tbody></table>")
    if table.caption:
        out.append(f'<p class="note">{_esc(_cell_text(table.caption))}</p>')
    out.append("</figure>")
    return "\n".join(out)


def _attr(value: str) -> str:
    return '"' + _esc(value) + '"'


def _align(justify) -> str:
    return "r" if justify == "right" else "l"


def _rows_html(header: list[str], rows: list[list[str]], title: str, right: set[int] = frozenset(), table_id: str | None = None,
               note: str | None = None) -> str:
    """A table of plain cells, for what the console has no table of."""
    table = plain_table(title, [(name, "right" if i in right else "left") for i, name in enumerate(header)], [[Text(str(c)) for c in row] for row in rows])
    if note:
        table.caption = Text(note)
    return table_html(table, table_id)


# --- the plot of step times ------------------------------------------------------------------------------------------

COLOURS = {"timed": "#4a78b5", "stall": "#d1453b", "warmup": "#b9b9b9", "traced": "#8a5cb8", "exposed": "#f2a33a",
           "hidden": "#f7d59a", "sync": "#3a9e6e", "median": "#222222", "threshold": "#d1453b"}


def _nice_ticks(top: float, count: int = 5) -> list[float]:
    if top <= 0:
        return [0.0]
    raw = top / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    return [i * step for i in range(int(top / step) + 1)]


def _tick_label(value: float) -> str:
    return f"{value:g}" if value < 1e4 else f"{value:,.0f}"


def steps_svg(report: dict) -> str:
    """The run's steps in order as bars (ms): timed (a stall marked), the profiler's warm-up, traced; the median and the
    stall threshold as lines; each timed step's waits inside its bar. Each bar's tooltip gives its figures."""
    run = RunView.of(report)
    timing, loop, traced = run.timing, run.loop, run.traced
    timed = list(timing.samples_ms or [])
    warmup = list(traced.warmup_step_ms or [])
    traced_each = list(traced.step_ms_each or [])
    if not (timed or traced_each):
        return '<p class="note">No step was timed: nothing to plot.</p>'
    stall_steps = set(loop.stalls.steps or [])
    threshold = loop.stalls.threshold_ms
    median = timing.median_ms
    per_step = loop.per_step
    input_ms, exposed_ms, sync_ms = (list(series or []) for series in (per_step.input_ms, per_step.exposed_input_ms, per_step.sync_ms))

    groups = [("timed", "timed, untraced", timed)]
    if warmup:
        groups.append(("warmup", "profiler warm-up", warmup))
    if traced_each:
        groups.append(("traced", "traced", traced_each))
    n_bars = sum(len(g[2]) for g in groups)
    gap_bars = 1.5  # the space between two phases, in bars
    slots = n_bars + gap_bars * (len([g for g in groups if g[2]]) - 1)
    width, height = 1000, 320
    left, right, top, bottom = 64, 44, 44, 40
    plot_w, plot_h = width - left - right, height - top - bottom
    values = timed + warmup + traced_each + [v for v in (threshold, median) if v]
    y_top = max(values) * 1.06 if values else 1.0
    ticks = _nice_ticks(y_top)
    y_top = max(y_top, ticks[-1])
    slot = plot_w / max(slots, 1)
    bar = max(slot * 0.78, 0.6)

    def y(value: float) -> float:
        return top + plot_h - plot_h * max(value, 0.0) / y_top

    out = [f'<svg id="steps-plot" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="100%" role="img" '
           f'aria-label="step times over the run">',
           f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="#fbfbfb" stroke="#d0d0d0"/>']
    for tick in ticks:
        ty = y(tick)
        out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{ty:.1f}" y2="{ty:.1f}" stroke="#e6e6e6"/>'
                   f'<text x="{left - 6}" y="{ty + 4:.1f}" text-anchor="end" class="ax">{_tick_label(tick)}</text>')
    out.append(f'<text x="16" y="{top + plot_h / 2:.0f}" transform="rotate(-90 16 {top + plot_h / 2:.0f})" text-anchor="middle" class="ax">ms</text>')
    position = 0.0
    for kind, label, series in groups:
        if not series:
            continue
        x0 = left + position * slot
        span = len(series) * slot
        if kind != "timed":
            out.append(f'<rect x="{x0:.1f}" y="{top}" width="{span:.1f}" height="{plot_h}" fill="{"#f0f0f0" if kind == "warmup" else "#f3edf9"}"/>')
        label_y = top - 22 if kind == "warmup" else top - 8  # the two short phases side by side: their labels on two lines
        out.append(f'<text x="{x0 + span / 2:.1f}" y="{label_y}" text-anchor="middle" class="phase">{_esc(label)} ({len(series)})</text>')
        for i, value in enumerate(series):
            x = x0 + i * slot + (slot - bar) / 2
            colour = COLOURS["stall"] if kind == "timed" and i in stall_steps else COLOURS[kind]
            words = {"timed": f"timed step {i}", "warmup": f"profiler warm-up step {i}", "traced": f"traced step {i}"}[kind]
            tip = f"{words}: {units.ms(value)} ms"
            parts = []
            if kind == "timed":
                if i in stall_steps:
                    tip += " (a stall)"
                if i < len(input_ms) and input_ms[i]:
                    exposed = exposed_ms[i] if i < len(exposed_ms) and exposed_ms[i] is not None else input_ms[i]
                    tip += f"; waiting for input {units.ms(input_ms[i])} ms (exposed {units.ms(exposed)})"
                    parts += [("exposed", exposed), ("hidden", max(input_ms[i] - exposed, 0.0))]
                if i < len(sync_ms) and sync_ms[i]:
                    tip += f"; synchronising calls {units.ms(sync_ms[i])} ms"
                    parts.append(("sync", sync_ms[i]))
            out.append(f'<g class="bar {kind}{" stall" if colour == COLOURS["stall"] else ""}" data-step="{i}" data-ms="{value!r}">'
                       f'<title>{_esc(tip)}</title>'
                       f'<rect x="{x:.2f}" y="{y(value):.2f}" width="{bar:.2f}" height="{y(0) - y(value):.2f}" fill="{colour}"/>')
            base = 0.0
            for part, ms in parts:  # the waits inside the step, from its foot (never past its top)
                ms = min(ms, value - base)
                if ms <= 0:
                    continue
                inner = bar * 0.5
                out.append(f'<rect x="{x + (bar - inner) / 2:.2f}" y="{y(base + ms):.2f}" width="{inner:.2f}" '
                           f'height="{y(base) - y(base + ms):.2f}" fill="{COLOURS[part]}"/>')
                base += ms
            out.append("</g>")
        step_every = max(1, _nice_ticks(len(series), 8)[1] if len(series) > 8 else 1)
        for i in range(0, len(series), int(step_every)):
            out.append(f'<text x="{x0 + (i + 0.5) * slot:.1f}" y="{top + plot_h + 15}" text-anchor="middle" class="ax">{i}</text>')
        position += len(series) + gap_bars
    timed_span = len(timed) * slot
    if median and timed:
        out.append(f'<line x1="{left}" x2="{left + timed_span:.1f}" y1="{y(median):.1f}" y2="{y(median):.1f}" stroke="{COLOURS["median"]}" '
                   f'stroke-width="1.5"><title>median of the timed steps: {units.ms(median)} ms</title></line>')
    if threshold and timed:
        out.append(f'<line x1="{left}" x2="{left + timed_span:.1f}" y1="{y(threshold):.1f}" y2="{y(threshold):.1f}" stroke="{COLOURS["threshold"]}" '
                   f'stroke-dasharray="6 4" stroke-width="1.5"><title>stall threshold: {units.ms(threshold)} ms</title></line>')
    out.append(f'<text x="{left + plot_w / 2:.0f}" y="{top + plot_h + 32}" text-anchor="middle" class="ax">step, counted within each phase '
               f'(the run: --skip {_esc(run.options.skip if "skip" in run.options else "?")} steps first, untimed)</text>')
    legend = [("timed", "timed step"), ("stall", "stall")] if stall_steps else [("timed", "timed step")]
    if warmup:
        legend.append(("warmup", "profiler warm-up step, thrown away"))
    if traced_each:
        legend.append(("traced", "traced step"))
    if any(input_ms):
        legend += [("exposed", "its wait for input, exposed (the GPU idle)"), ("hidden", "its wait for input, hidden under GPU work")]
    if any(sync_ms):
        legend.append(("sync", "its synchronising calls"))
    keys = [f'<span><i style="background:{COLOURS[key]}"></i>{_esc(words)}</span>' for key, words in legend]
    if median and timed:
        keys.append(f'<span><i class="line" style="border-color:{COLOURS["median"]}"></i>median of the timed steps</span>')
    if threshold and timed:
        keys.append(f'<span><i class="line dash" style="border-color:{COLOURS["threshold"]}"></i>stall threshold</span>')
    out.append("</svg>")
    out.append('<p class="legend">' + "".join(keys) + "</p>")
    return "\n".join(out)


def _steps_caption(report: dict) -> str:
    run = RunView.of(report)
    timing, loop, traced = run.timing, run.loop, run.traced
    stalls = loop.stalls
    parts = []
    if timing.median_ms is not None:
        parts.append(f'median <b id="median-ms">{units.ms(timing.median_ms)}</b> ms')
    mean = loop.mean_ms if "mean_ms" in loop else timing.mean_ms
    if mean is not None:
        parts.append(f'mean <b id="mean-ms">{units.ms(mean)}</b> ms')
    if stalls.threshold_ms is not None:
        parts.append(f'stall threshold {units.ms(stalls.threshold_ms)} ms ({stalls.factor or 0:g}× the median): '
                     f'<b id="stall-count">{len(stalls.steps or [])}</b> stall(s)' + (f', every {stalls.period}th step' if stalls.period else ""))
    if traced.step_ms is not None:
        parts.append(f"traced median {units.ms(traced.step_ms)} ms" + (f" (×{traced.inflation:.2f})" if traced.inflation else ""))
    return "; ".join(parts)

# --- the sections ----------------------------------------------------------------------------------------------------

def _verdict_section(report: dict) -> str:
    run = RunView.of(report)
    out = []
    raw = run.raw.get("verdict")  # step_verdict's dict; a sentence in a file of format 0
    message = run.verdict.message if run.verdict else raw if isinstance(raw, str) else None
    if message:
        out.append(f'<div class="verdict"><span class="tag">{_esc(run.verdict.verdict or "verdict")}</span> <span id="verdict-message">{_esc(message)}</span></div>')
    elif run.partial:
        out.append('<div class="verdict"><span id="verdict-message">No verdict: the program ended before its traced steps were analysed; '
                   'the timed steps are below.</span></div>')
    for line in first_lines(report):
        out.append(f'<p class="warn">{_esc(line)}</p>')
    if run.traced_verdict and run.traced_verdict != message:
        out.append(f'<p>traced steps{" (inflated: they describe the profiler, not the program)" if run.traced.inflated else ""}: '
                   f'<span id="traced-verdict">{_esc(run.traced_verdict)}</span></p>')
    flags = [f for f in run.flags if f.flag]  # a damaged entry (no mapping, no name) is not shown as "None"
    if flags:
        out.append('<ul class="flags">' + "".join(f'<li><code>{_esc(f.flag)}</code>: {_esc(f.message)}</li>' for f in flags) + "</ul>")
    if run.report_error:
        out.append(f'<p class="warn">perflab could not analyse the traced steps: {_esc(run.report_error)}</p>')
    return "\n".join(out)

def _evidence_section(report: dict) -> str:
    """The untraced evidence the verdict rests on: the whole loop (the console's table), the figures the verdict held
    against each other, the synchronising call sites, the input's loaders and the fix."""
    run = RunView.of(report)
    out = []
    loop = loop_table(report)
    if loop is not None:
        out.append(table_html(loop, "loop-table"))
    ev = run.verdict_evidence
    if ev:
        rows = [["step: mean / median (untraced; under torchrun the slowest rank's median) ms", f"{units.ms(ev.mean_ms)} / {units.ms(ev.step_ms)}"]]
        if ev.busy_share is not None:
            rows.append(["GPU busy share (untraced)", f"{units.pct(ev.busy_share)} ({ev.busy_source or '?'})"])
        if ev.nvml_util is not None:
            rows.append(["NVML's utilization samples", units.pct(ev.nvml_util)])
        if ev.busy_ms is not None:
            rows.append(["GPU busy per traced step, ms" + (" (communication apart)" if ev.communication_apart else ""), units.ms(ev.busy_ms)])
        if ev.host_ms is not None:
            rows.append([f"host issue time per step, ms ({ev.host_source or '?'})", units.ms(ev.host_ms)])
        if ev.host_own_ms is not None:
            rows.append(["host's own time, less its waits, ms", units.ms(ev.host_own_ms)])
        if ev.input_exposed_share is not None:
            rows.append(["exposed waits for input, share of the wall time", units.pct(ev.input_exposed_share)])
        if ev.sync_blocked_ms is not None:
            rows.append(["blocked in synchronising calls, ms a step", f"{units.ms(ev.sync_blocked_ms)} ({ev.syncs_per_step or 0:.3g} calls)"])
        if ev.inflation is not None:
            rows.append(["traced ÷ untraced step", f"×{ev.inflation:.2f}" + (" (inflated)" if ev.inflated else "")])
        for name, ms in (ev.categories_ms or {}).items():
            rows.append([f"  traced {name}, ms a step", units.ms(ms)])
        out.append(_rows_html(["figure", "value"], rows, "the figures the verdict weighed", right={1}, table_id="evidence-table"))
    sites = run.loop.sync.sites
    if sites:
        rows = [[s.call, s.site, f"{s.per_step or 0:.3g}", units.ms(s.blocked_ms_per_step)] for s in sites]
        out.append(_rows_html(["call", "where (the program's line)", "calls a step", "ms blocked a step"], rows,
                              "synchronising calls, by source line (untraced)", right={2, 3}, table_id="sync-table"))
    inputs = run.loop.input
    if inputs.loaders:
        keys = ["dataset", "batch_size", "num_workers", "pin_memory", "prefetch_factor", "persistent_workers"]
        rows = [[_plain(getattr(loader, k)) for k in keys] for loader in inputs.loaders]
        out.append(_rows_html(keys, rows, "the DataLoaders waited on", right={1, 2, 4}, table_id="loaders-table"))
    fix = inputs.fix
    if fix.predicted_mean_ms is not None:
        out.append(f"<p>The input's fix: {_esc(fix.workers_needed)} workers (now {_esc(fix.num_workers)}, "
                   f"{units.ms(fix.batch_ms)} ms a batch each) would bring the mean step to {units.ms(fix.predicted_mean_ms)} ms "
                   f"(×{fix.speedup or 0:.2f}).</p>")
    return "\n".join(out)

def _plain(value) -> str:
    return "–" if value is None else str(value)


def _accounting_bar(acc_ns: dict, terms) -> str:
    """The traced window's accounting as one bar of shares (its parts add up to the wall, exactly)."""
    acc = AccountingNs(acc_ns)
    wall = acc.wall_ns or 0
    if wall <= 0:
        return ""
    parts = [(terms.busy, acc.busy_ns or 0, "#4a78b5"), (terms.host_bound, acc.host_bound_ns or 0, "#f2a33a"),
             ("idle: kernel gap", acc.kernel_gap_ns or 0, "#9bbbe0"), ("idle: other", acc.other_ns or 0, "#cccccc")]
    width, x = 1000, 0.0
    out = [f'<svg id="accounting-bar" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} 46" width="100%" role="img" aria-label="accounting">']
    legend_x = 0
    for name, ns, colour in parts:
        w = width * ns / wall
        if w > 0:
            out.append(f'<rect x="{x:.2f}" y="0" width="{w:.2f}" height="24" fill="{colour}"><title>{_esc(name)}: '
                       f'{units.us(ns / 1000)} µs ({100 * ns / wall:.1f}%)</title></rect>')
        x += w
        if ns:
            label = f"{name} {100 * ns / wall:.1f}%"
            out.append(f'<rect x="{legend_x}" y="32" width="10" height="10" fill="{colour}"/><text x="{legend_x + 14}" y="41" class="ax">{_esc(label)}</text>')
            legend_x += 24 + 6.2 * len(label)
    out.append("</svg>")
    return "\n".join(out)

def _time_section(report: dict) -> str:
    run = RunView.of(report)
    acc = run.accounting
    if not acc:
        return '<p class="note">No traced steps were accounted (no trace, or the program ended before them).</p>'
    terms = CPU_TERMS if run.traced.cpu_only else GPU_TERMS
    out = [_accounting_bar(acc.accounting_ns.raw, terms),
           table_html(accounting_table(acc.accounting_ns.raw, terms, "the traced steps: where the time goes (µs, exact to the ns)"), "accounting-table")]
    top = acc.top_kernels or []
    if top:
        out.append(table_html(top_table(top, terms, with_device=len({r["device"] for r in top}) > 1), "kernels-table"))
    categories = acc.categories_us or {}
    if categories:
        total = sum(categories.values()) or 1.0
        rows = [[name, units.us(us), f"{us / total:.1%}"] for name, us in categories.items()]
        out.append(_rows_html(["category", "µs", "share"], rows, f"{terms.time} of the traced steps by category", right={1, 2},
                              table_id="categories-table"))
    return "\n".join(out)

def _compiler_section(report: dict) -> str | None:
    table = compiler_table(report)
    lines = compiler_lines(report)
    if table is None and not lines:
        return None
    out = [table_html(table, "compiler-table")] if table is not None else []
    out += [f"<p>{_esc(line)}</p>" for line in lines]
    return "\n".join(out)


def _ranks_section(report: dict, scaling: dict | None) -> str | None:
    run = RunView.of(report)
    out = []
    if run.ranks:
        rows = [[f"{r.rank}{'*' if r.rank == run.slowest_rank else ''}", units.ms(r.median_ms),
                 "–" if not r.ci95_ms else f"{units.ms(r.ci95_ms[0])}–{units.ms(r.ci95_ms[1])}", _plain(r.steps_seen),
                 ", ".join(r.flags or []) or "–"] for r in run.ranks]
        note = "* the slowest rank: its median is the run's step" + (f"; ranks that wrote no report: {run.ranks_missing}"
                                                                       if run.ranks_missing else "")
        out.append(_rows_html(["rank", "step, median ms", "CI ms", "steps seen", "flags"], rows, f"per rank ({run.world_size} ranks)",
                              right={1, 2, 3}, table_id="ranks-table", note=note))
    if run.communication:
        out.append(table_html(communication_table(report), "communication-table"))
    elif run.communication_note:
        out.append(f'<p class="note">{_esc(run.communication_note)}</p>')
    if scaling:
        out.append(table_html(scaling_table(scaling), "scaling-table"))
    return "\n".join(out) or None

def _processes_section(report: dict) -> str | None:
    run = RunView.of(report)
    if not run.processes:
        return None
    rows = []
    for p in run.processes:
        pids = p.pids or []
        pid = f"{pids[0]} and {len(pids) - 1} more" if len(pids) > 1 else _plain(p.pid)
        rows.append([pid, p.kind or "?", (p.target or "")[:120], "yes" if p.followed else f"no: {p.why or '?'}",
                     _plain(p.rank), _plain(p.steps_seen), _plain(p.timed_steps), _plain(p.exit_code),
                     _plain(p.count if "count" in p else 1)])
    note = f"the program stepped in {run.steps_in}; this page is the report of {run.report_of}" if run.steps_in else None
    return _rows_html(["pid", "kind", "what it ran", "followed", "rank", "steps seen", "timed", "exit code", "count"], rows,
                      "the program and the processes it started", right={4, 5, 6, 7, 8}, table_id="processes-table", note=note)

def _trace_section(report: dict, out_dir: Path | None) -> str:
    run = RunView.of(report)
    paths = [p for p in (run.traced.trace_path or run.recorded.trace_path, run.recorded.shapes_trace_path) if p]
    if not paths:
        return '<p class="note">This run wrote no trace.</p>'
    ranks = []  # under torchrun every rank traced its own steps, beside rank 0's
    if out_dir is not None and (run.world_size or 1) > 1:
        ranks = [str(p) for r in range(1, run.world_size) if (p := Path(out_dir) / f"rank{r}" / Path(paths[0]).name).is_file()]
    items = []
    for path in paths + ranks:
        shown = path
        if out_dir is not None:
            try:
                shown = str(Path(path).relative_to(out_dir))
            except ValueError:
                pass
        what = ("the traced steps" + (" (rank 0)" if ranks else "") if path == paths[0] else
                f"rank {Path(path).parent.name[4:]}'s traced steps" if path in ranks else "the pass with shapes (operators and their input shapes)")
        items.append(f'<li><code class="path">{_esc(path)}</code>: {what}' +
                     (f' (<a href="{_esc(shown)}">{_esc(shown)}</a>, beside this page)' if shown != path else "") + "</li>")
    return ("<p>Open the trace in Perfetto: go to <a href=\"" + PERFETTO + "\" target=\"_blank\" rel=\"noopener noreferrer\">"
            + PERFETTO + "</a> and drag the file onto the page (or use <i>Open trace file</i>). Perfetto reads the file in the "
            "browser; nothing is uploaded. Chrome's <code>chrome://tracing</code> opens it too.</p><ul>" + "".join(items) + "</ul>")


CSS = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;color:#1d1d1f;margin:0;background:#fff}
main{max-width:1180px;margin:0 auto;padding:12px 24px 48px}
h1{font-size:20px;margin:14px 0 2px;word-break:break-all}h2{font-size:16px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:3px}
nav{position:sticky;top:0;background:#f6f6f6;border-bottom:1px solid #ddd;padding:6px 24px;font-size:13px;z-index:1}
nav a{margin-right:14px;color:#2a5d9f;text-decoration:none}
.sub{color:#555;margin:0 0 8px}.note{color:#555;font-size:12.5px;margin:4px 0}.warn{color:#8a3a00;background:#fff4e5;padding:6px 10px;border-radius:4px}
.verdict{background:#eef4fb;border-left:4px solid #4a78b5;padding:8px 12px;margin:8px 0;font-size:15px}
.tag{display:inline-block;background:#4a78b5;color:#fff;border-radius:3px;padding:0 6px;font-size:12.5px;margin-right:4px}
figure.tbl{margin:10px 0 16px;overflow-x:auto}figcaption{font-weight:600;margin-bottom:4px}
table{border-collapse:collapse;font-variant-numeric:tabular-nums;font-size:13px}
th,td{padding:3px 10px;border-bottom:1px solid #e7e7e7;vertical-align:top}th{background:#f3f3f3;border-bottom:1px solid #ccc}
tbody tr:nth-child(even){background:#fafafa}td.r,th.r{text-align:right;white-space:nowrap}td.l,th.l{text-align:left}
svg text{font:11px system-ui,sans-serif;fill:#333}svg text.phase{font-weight:600;font-size:12px}
svg .bar:hover rect{opacity:.8}code{font-size:12.5px;background:#f3f3f3;padding:0 3px;border-radius:3px}code.path{word-break:break-all}
ul.flags{margin:6px 0;padding-left:20px}
.legend{font-size:12px;color:#333;margin:2px 0 10px}.legend span{margin-right:16px;white-space:nowrap}
.legend i{display:inline-block;width:10px;height:10px;margin-right:5px;vertical-align:-1px}.legend i.line{height:0;width:18px;border-top:2px solid;vertical-align:3px}.legend i.dash{border-top-style:dashed}.lines p{margin:3px 0;font-size:13px;color:#444}
"""


def run_page_html(report: dict, *, scaling: dict | None = None, out_dir: Path | None = None) -> str:
    """The page of one run: ``report`` is run.json's dict; ``scaling``: scaling.json's (``--nproc 1,2``) where there is
    one; ``out_dir``: the run's directory (trace files under it are linked relative to the page)."""
    run = RunView.of(report)
    sections = [("verdict", "The verdict", _verdict_section(report)),
                ("steps", "Step times over the run",
                 f'<p class="sub" id="steps-caption">{_steps_caption(report)}</p>' + steps_svg(report) +
                 table_html(timing_table(report), "timing-table")),
                ("evidence", "The verdict's evidence: the whole loop, untraced", _evidence_section(report) or '<p class="note">No timed steps.</p>'),
                ("time", "Where the time goes (the traced steps)", _time_section(report))]
    for key, title, body in (("compiler", "The compiler", _compiler_section(report)),
                             ("ranks", "Ranks and scaling", _ranks_section(report, scaling)),
                             ("processes", "The processes seen", _processes_section(report))):
        if body:
            sections.append((key, title, body))
    sections.append(("trace", "The trace, in Perfetto", _trace_section(report, out_dir)))
    # the console's closing lines, less those shown above (the compiler's lines, the verdicts, the flags)
    shown = set(compiler_lines(report)) | {f"{f.flag}: {f.message}" for f in run.flags if f.flag}
    lines = [line for line in run_lines(report) if line not in shown and not line.startswith(("verdict: ", "traced steps"))]
    lines += [f"perflab: {note}" for note in run.perflab_notes or []]
    if run.last_words:
        lines.append(f"the program's last words: {run.last_words}")
    sections.append(("notes", "Notes", '<div class="lines">' + "".join(f"<p>{_esc(x)}</p>" for x in lines) + "</div>"))
    ended = f", the program ended by {run.ended_by} (exit code {run.exit_code})" if run.ended_by else ""
    sub = (f"steps: {_esc(run.steps_from)} · device {_esc(run.device)} · "
           f"{_esc(run.timing.steps or 0)} timed, {_esc(run.traced.steps or 0)} traced"
           + (f" · {run.world_size} ranks" if (run.world_size or 1) > 1 else "")
           + f" · run {_esc(run.run_id)}" + (" · partial: the program ended before the traced steps" if run.partial else "")
           + _esc(ended))
    body = "\n".join(f'<section id="{key}"><h2>{_esc(title)}</h2>\n{content}\n</section>' for key, title, content in sections)
    nav = "".join(f'<a href="#{key}">{_esc(title.split(":")[0].split(" (")[0])}</a>' for key, title, _ in sections)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1"><link rel="icon" href="data:,">'
            f"<title>perflab run: {_esc(run.program)}</title><style>{CSS}</style></head>\n"
            f'<body><nav>{nav}</nav><main>\n<h1>perflab run: <span id="program">{_esc(run.program)}</span></h1>'
            f'<p class="sub">{sub}</p>\n<p class="note">Made from {_esc(run.options.out_dir if "out_dir" in run.options else "OUT")}/run.json by perflab; '
            f"every figure here is run.json's, formatted as the console report formats it.</p>\n{body}\n</main></body></html>\n")


def scaling_page_html(section: dict, runs: dict[int, dict], out_dir: Path | None = None) -> str:
    """The page of ``perflab run --nproc 1,2``: the scaling table, and per rank count its step, its verdict and a link
    to its own page (``nprocN/report.html``)."""
    rows = []
    for n, report in runs.items():
        run = RunView.of(report)
        raw = run.raw.get("verdict")  # step_verdict's dict; a sentence in a file of format 0
        message = run.verdict.message if run.verdict else raw if isinstance(raw, str) else None
        rows.append(f'<tr><td class="r">{n}</td><td class="r">{units.ms(run.step_ms or run.timing.median_ms)}</td>'
                    f'<td class="l">{_esc(message or "–")}</td><td class="l"><a href="nproc{n}/{PAGE}">nproc{n}/{PAGE}</a></td></tr>')
    runs_table = ('<figure class="tbl"><figcaption>each rank count\'s run</figcaption><table><thead><tr><th class="r">ranks</th>'
                  '<th class="r">step ms</th><th class="l">verdict</th><th class="l">its page</th></tr></thead><tbody>'
                  + "".join(rows) + "</tbody></table></figure>")
    program = next((RunView.of(r).program for r in runs.values() if RunView.of(r).program), "?")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f'<link rel="icon" href="data:,"><title>perflab run --nproc: {_esc(program)}</title><style>{CSS}</style></head>\n'
            f'<body><main><h1>perflab run: <span id="program">{_esc(program)}</span></h1>'
            f'<p class="sub">at {", ".join(str(n) for n in Scaling(section).counts or [])} rank(s); the scaling over {_esc(Scaling(section).base)}</p>\n'
            f'<section id="scaling"><h2>Scaling</h2>{table_html(scaling_table(section), "scaling-table")}\n{runs_table}</section>'
            f"</main></body></html>\n")


# --- reading a run directory and writing its page --------------------------------------------------------------------

def read_json_report(path: Path, what: str) -> dict:
    """A scaling.json (a JSON object) read, or one PerflabError line saying what is wrong with it."""
    return read_dict(path, what)


def load_run(path: Path) -> dict:
    """A run.json read (``records.run_report.load``: its format checked) as the page reads it, or one PerflabError line
    saying what is wrong with it."""
    report = load(path, RUN_WHAT)
    if not isinstance(report.timing, dict) or report.device is ABSENT:
        raise PerflabError(f"{path}: not a `perflab run` report (no timing or device); {RUN_WHAT}")
    return report.to_dict()


def write_run_page(out_dir, report: dict | None = None) -> Path:
    """Write ``OUT/report.html`` for the run in ``out_dir``: from ``report`` (run.json's dict) or run.json read there;
    scaling.json beside it is shown too. A ``--nproc 1,2`` run's directory (scaling.json and ``nprocN/run.json``, no
    run.json of its own) gets the scaling page, and each count's run its own page. Returns the page's path."""
    out = Path(out_dir)
    run_json, scaling_json = out / "run.json", out / "scaling.json"
    scaling = read_json_report(scaling_json, "`perflab run --nproc 1,2` writes it") if scaling_json.is_file() else None
    if report is None and not run_json.is_file():
        if scaling is None:
            raise PerflabError(f"{out}: no run.json here: give the --out directory of a `perflab run`")
        runs = {}
        for n in Scaling(scaling).counts or []:
            path = out / f"nproc{n}" / "run.json"
            if path.is_file():
                runs[n] = load_run(path)
                _write(out / f"nproc{n}" / PAGE, run_page_html(runs[n], out_dir=out / f"nproc{n}"))
        return _write(out / PAGE, scaling_page_html(scaling, runs, out))
    if report is None:
        report = load_run(run_json)
        try:
            page = run_page_html(report, scaling=scaling, out_dir=out.resolve())
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            raise PerflabError(f"{run_json}: damaged, a field is missing or of the wrong type ({type(exc).__name__}: {exc}); {RUN_WHAT}") from None
    else:
        page = run_page_html(report, scaling=scaling, out_dir=out.resolve())
    return _write(out / PAGE, page)


def _write(path: Path, page: str) -> Path:
    """The page written whole or not at all."""
    tmp = path.with_suffix(".tmp.html")
    try:
        tmp.write_text(page, encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise PerflabError(f"{path}: could not be written ({exc.strerror or exc})") from None
    return path
