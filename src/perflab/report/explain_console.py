"""Terminal rendering of compare, explain and ncu results (rich)."""

from __future__ import annotations

import math

from perflab import units
from perflab.report.explain_parallel import COLLECTIVE_HEADER, RANK_HEADER
from perflab.report.explain_parallel import FIX_HEADER as PARALLEL_FIX_HEADER
from perflab.report.explain_rows import (BATCH_HEADER, FIX_HEADER, FIXES_TITLE, FLOOR_HEADER, FLOORS_TITLE, MODE_HEADER, MODES_TITLE,
                                         PASS_HEADER, PASS_TITLE, batch_rows, compile_lines, fix_model_lines, fix_rows, floor_rows, floor_verdict,
                                         flops_line, mode_miss_lines, mode_rows, pass_rows, profile_lines, ranked_line, step_floor_lines)
from perflab.report.fit import plain_table, text_table


def _ci_ms(c, term: str) -> str:
    """A term's Δ interval over the traced steps (``TraceComparison.intervals``), in ms; "–" with one step a side."""
    d = c.intervals.get(term)
    return units.NONE if d is None else f"{units.ns_ms(d.low, signed=True)} to {units.ns_ms(d.high, signed=True)}"


def render_comparison(console, c) -> None:
    a, b = c.labels
    w = c.words  # a GPU trace's kernels and GPU time, or a CPU trace's operators
    if c.first_line:  # an inflated trace: said before anything drawn from it
        console.print(c.first_line, markup=False, highlight=False)
    header = ("term", a, b, "Δ", "Δ 95% CI")
    rows = [["wall", units.ns_ms(c.a.wall_ns), units.ns_ms(c.b.wall_ns), units.ns_ms(c.delta_wall_ns, signed=True), _ci_ms(c, "wall")]]
    for cat, delta in sorted(c.delta_by_category.items(), key=lambda kv: -abs(kv[1])):
        rows.append([f"  {w.time}: {cat}", units.ns_ms(c.a.category_ns.get(cat, 0.0)), units.ns_ms(c.b.category_ns.get(cat, 0.0)), units.ns_ms(delta, signed=True),
                     _ci_ms(c, f"category:{cat}")])
    if c.a.overlap_ns or c.b.overlap_ns:
        rows.append(["  − overlap (streams / spill)", units.ns_ms(-c.a.overlap_ns), units.ns_ms(-c.b.overlap_ns), units.ns_ms(-c.delta_overlap_ns, signed=True), ""])
    for cause, delta in c.delta_idle_by_cause.items():
        if c.cpu_only and cause != "host_bound" and not (delta or c.a.idle_ns[cause]):
            continue  # a CPU trace's operators launch themselves: no kernel gap
        label = w.idle if cause == "host_bound" and c.cpu_only else f"idle: {cause.replace('_', ' ')}"
        rows.append([f"  {label}", units.ns_ms(c.a.idle_ns[cause]), units.ns_ms(c.b.idle_ns[cause]), units.ns_ms(delta, signed=True), _ci_ms(c, f"idle:{cause}")])
    rows.append(["closure (wall − Σ terms)", "", "", f"{c.closure_ns():.2g} ns", ""])
    table = text_table(list(header), rows, f"Per step: {b} − {a} (ms; exact decomposition; the CI over the traced steps)", ["term"],
                       _drop_order(header, 1, 2, 4))
    table.columns[0].cells[0] = "[bold]wall[/bold]"  # the total, above the terms that make it up
    console.print(table)

    if any(c.untraced_loop):
        console.print(untraced_loop_table(c))

    records = c.throughput_table().to_dict(orient="records")
    known = [r["throughput_per_s"] is not None and not math.isnan(r["throughput_per_s"]) for r in records]
    header = ("configuration", "operators ms" if c.cpu_only else "GPU time ms", w.works, f"mean {w.work} µs", "wall ms",
              "in operators" if c.cpu_only else "GPU busy") + ((c.throughput_unit,) if any(known) else ())  # traces: no items known
    rows = []
    for r, has in zip(records, known):
        tp = [f"{r['throughput_per_s']:.1f}" if has else "–"] if any(known) else []
        rows.append([r["configuration"], f"{r['gpu_time_ms_per_step']:.4f}", f"{r['kernels_per_step']:.0f}", f"{r['mean_kernel_us']:.2f}",
                     f"{r['wall_ms_per_step']:.4f}", f"{r['gpu_busy_share']:.0%}", *tp])
    title = f"{w.time[0].upper() + w.time[1:]} vs throughput (the token-reduction study's table, per step)"
    console.print(text_table(list(header), rows, title, ["configuration"], _drop_order(header, 3, 2, *([6] if any(known) else []))))

    for title, frame in ((f"{w.works} added per step", c.added_kernels), (f"{w.works} removed per step", c.removed_kernels)):
        if len(frame):
            rows = [[str(r["name"]), f"{r['delta_count']:+.0f}", f"{r['delta_time_ns'] / 1e3:+.2f}"] for r in frame.head(10).to_dict(orient="records")]
            console.print(text_table([w.work, "Δ count", "Δ time µs"], rows, f"{title} ({b} vs {a})", [w.work], folds=True))
    modules = c.extra.get("modules")
    if modules is not None and len(modules):
        header = ("pass", "module", f"{a} µs", f"{b} µs", "Δ µs", "ratio")
        rows = [[r["pass"], r["module"], f"{r['a_ns'] / 1e3:.2f}", f"{r['b_ns'] / 1e3:.2f}", f"{r['delta_ns'] / 1e3:+.2f}",
                 f"{r['ratio']:.2f}×" if r["ratio"] == r["ratio"] else "new"] for r in modules.to_dict(orient="records")]
        console.print(text_table(list(header), rows, f"modules that changed (inclusive {w.time} per step, {b} vs {a})", ["pass", "module"],
                                 _drop_order(header, 2, 3)))
    console.print(f"[bold]Verdict:[/bold] {c.verdict}")


def untraced_loop_table(c):
    """Each run's untraced steps (its run.json): the median with its CI, the mean (its wall time a step), and steps,
    samples and tokens a second: what the verdict is drawn from, the throughput beside the step."""
    def cell(x, fmt):
        return "–" if x is None else format(x, fmt)

    rows = []
    for side, loop in zip(c.labels, c.untraced_loop):
        if loop is None:
            rows.append([side, "–", "–", "–", "–", "–"])
            continue
        ci = loop.get("ci_ms")
        rows.append([side, f"{loop['median_ms']:.4g}" + (f" ({ci[0]:.4g}–{ci[1]:.4g})" if ci else ""), cell(loop.get("mean_ms"), ".4g"),
                     cell(loop.get("steps_per_s"), ",.4g"), cell(loop.get("samples_per_s"), ",.4g"), cell(loop.get("tokens_per_s"), ",.4g")])
    header = ["run", "median ms (CI)", "mean ms", "steps/s", "samples/s", "tokens/s"]
    title = "The untraced steps (run.json): the verdict's evidence, throughput beside the step" + (
        f"; compared by the time a {c.untraced_unit}" if c.untraced_unit != "step" else "")
    return text_table(header, rows, title, ["run"], _drop_order(header, 3, 5))


def render_explanation(console, e) -> None:
    if getattr(e, "parallel", False):  # explain --parallel (explain_parallel.ParallelExplanation)
        from perflab.report.explain_parallel import render_parallel

        render_parallel(console, e, _print_table, _plain)
        return
    for ce in e.cases:
        console.rule(ce.case.label())
        for line in profile_lines(ce):
            console.print(line)
        _print_table(console, FLOORS_TITLE, FLOOR_HEADER, floor_rows(ce.floors))
        console.print(_plain(floor_verdict(ce.floors)))
        if ce.step_floors is not None:
            render_pass_floors(console, ce.step_floors)
        console.print(flops_line(ce.eager_row))
        _print_table(console, MODES_TITLE, MODE_HEADER, mode_rows(ce))
        for line in mode_miss_lines(ce):
            console.print(_plain(line))
        if ce.fix_results:
            render_fixes(console, ce)
        for line in compile_lines(ce):
            console.print(_plain(line))
        if ce.modules is not None:
            from perflab.report.trace_console import module_tree_table

            console.print(module_tree_table(ce.modules))
        ranked = ranked_line(ce)
        if ranked:
            console.print(f"[bold]Fixes and modes ranked by measured gain over eager:[/bold] {ranked.replace('`', '')}")
    if e.comparison is not None:
        console.rule("comparison (eager traces)")
        render_comparison(console, e.comparison)


def render_pass_floors(console, sf) -> None:
    """Per-pass floors: each pass's four floors, the binding one, and the profiled pass's GPU time against it."""
    _print_table(console, PASS_TITLE, PASS_HEADER, pass_rows(sf))
    for line in step_floor_lines(sf):
        console.print(_plain(line))


def render_fixes(console, ce) -> None:
    """Fixes predicted, then measured, on their base; decode's batch fixes also as throughput against latency."""
    _print_table(console, FIXES_TITLE, FIX_HEADER, fix_rows(ce))
    for line in fix_model_lines(ce):
        console.print("  " + _plain(line))
    batches = batch_rows(ce)
    if batches:
        _print_table(console, "Batch size as a fix: throughput against latency (measured)", BATCH_HEADER, batches)


def _plain(line: str) -> str:
    """A markdown line for the terminal: bold stays bold, code marks go."""
    parts = line.replace("`", "").split("**")
    return "".join(f"[bold]{p}[/bold]" if i % 2 else p for i, p in enumerate(parts))


def _drop_order(header: list[str], *indices: int) -> tuple[str, ...]:
    return tuple(header[i] for i in indices)


# Where a table is too wide, the columns given up first, in order (by place, so a header's wording may change): what
# can be worked out from the columns kept or is said below the table, before what tells rows apart and the measured answer.
DROPS = {tuple(FIX_HEADER): _drop_order(FIX_HEADER, 10, 11, 12, 5, 8, 9, 6),
         tuple(MODE_HEADER): _drop_order(MODE_HEADER, 6, 3, 5),
         tuple(PASS_HEADER): _drop_order(PASS_HEADER, 2, 3, 4, 1, 7, 8, 6, 5),
         tuple(BATCH_HEADER): _drop_order(BATCH_HEADER, 4, 1),
         tuple(PARALLEL_FIX_HEADER): _drop_order(PARALLEL_FIX_HEADER, 9, 10, 7, 3, 2),  # never 4, the base beside it: the ratio's denominator
         tuple(RANK_HEADER): _drop_order(RANK_HEADER, 8, 5, 4, 7),
         tuple(COLLECTIVE_HEADER): _drop_order(COLLECTIVE_HEADER, 5, 2)}
LEFT = ("fix", "on", "binding", "mode", "parallel after", "collective")


def _print_table(console, title: str, header: list[str], rows: list[list[str]]) -> None:
    left = [col for i, col in enumerate(header) if i == 0 and col != "#" or col in LEFT]
    console.print(text_table(header, [[c.replace("`", "") for c in r] for r in rows], title, left, DROPS.get(tuple(header), ()),
                             numbered=["fix"]))


def render_ncu(console, table, label: str) -> None:
    t = plain_table(f"Nsight Compute: top kernels of {label}", header_style="bold")
    from perflab.trace.ncu import kernel_library

    table = table.assign(library=[kernel_library(n) for n in table["full_name"]])
    if "dram_bytes" in table.columns:
        table = table.assign(dram_gbps=table["dram_bytes"] / table["duration_ns"])
    cols = [("kernel", "name"), ("library", "library"), ("share", "share"), ("ncu µs", "duration_ns"), ("SM %", "sm_throughput_pct"),
            ("mem %", "memory_throughput_pct"), ("DRAM %", "dram_throughput_pct"), ("DRAM GB/s", "dram_gbps"), ("occupancy %", "achieved_occupancy_pct"),
            ("L1 hit %", "l1_hit_rate_pct"), ("L2 hit %", "l2_hit_rate_pct"), ("class", "roofline")]
    for title, _ in cols:
        t.add_column(title, justify="left" if title in ("kernel", "library", "class") else "right")
    for r in table.to_dict(orient="records"):
        cells = []
        for _, key in cols:
            v = r.get(key)
            if key == "name":
                cells.append(str(v))
            elif key == "share":
                cells.append(f"{v:.1%}")
            elif key == "duration_ns":
                cells.append("–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v / 1e3:.2f}")
            elif isinstance(v, float):
                cells.append("–" if math.isnan(v) else f"{v:.1f}")
            else:
                cells.append("–" if v is None else str(v))
        t.add_row(*cells)
    console.print(t)
