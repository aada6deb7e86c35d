"""Rich tables for ``perflab analyze``: accounting, per-step accounting, top kernels, categories, ranges, launches.
``perflab run`` draws its traced steps' accounting and top kernels with the same two drawers (``accounting_table``,
``top_table``), from run.json.

A CPU-only trace (``Trace.cpu_only``: its work is torch's top-level operators, each launched as it starts) is said in
CPU terms, as ``perflab run`` says it: operators and CPU time, the time between operators (the interpreter's), and no
CUDA API table (it would hold one empty row)."""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from perflab.analysis.accounting import IDLE_CAUSES
from perflab import units
from perflab.analysis.trace_report import TraceReport, top_records
from perflab.report.fit import fit_table, plain_table, text_table

MAX_STEP_ROWS = 20
MAX_RANGE_ROWS = 25
NAME_WIDTH = 70  # range names; kernel names are short already (analysis.names: at most 120 characters, unique per table)


@dataclass(frozen=True)
class Terms:
    """The words of a trace's tables: a GPU trace's kernels and GPU time, or a CPU-only trace's operators."""

    work: str  # one unit of work
    works: str
    time: str  # the work's time, in a title
    busy: str  # the accounting row of the work's union
    host_bound: str  # the accounting row of host-bound idle
    cpu_only: bool

    @property
    def busy_column(self) -> str:
        return "operators µs" if self.cpu_only else "busy µs"


GPU_TERMS = Terms("kernel", "kernels", "GPU time", "GPU busy (union of streams)", "idle: host bound", False)
CPU_TERMS = Terms("operator", "operators", "Operator time", "CPU operators (torch's top-level, per thread)",
                  "between operators (the interpreter)", True)


def terms_of(report: TraceReport) -> Terms:
    return CPU_TERMS if report.trace.cpu_only else GPU_TERMS


def render_trace_report(console: Console, report: TraceReport) -> None:
    for table in trace_tables(report):
        console.print(fit_table(table))  # fitted to the width: no number split, a name cut in its middle only where it must
    console.print(report.verdict.message, markup=False, highlight=False)
    meta = report.trace.meta
    if meta.get("unlinked") and not report.trace.cpu_only:
        console.print(f"{meta['unlinked']} GPU activities have no launch call in the trace (launch_api \"\")", markup=False)


def trace_tables(report: TraceReport) -> list[Table]:
    tables = [summary_table(report)]
    if _several_devices(report):
        tables.append(devices_table(report))
    tables += [steps_table(report), top_kernels_table(report)]
    if len(report.top_memory_ops):
        tables.append(top_memory_ops_table(report))
    tables.append(categories_table(report))
    if len(report.ranges) and not (len(report.ranges) == 1 and report.ranges["range"].iloc[0] == "(no range)"):
        tables.append(ranges_table(report))
    if not report.trace.cpu_only:  # a CPU trace calls no CUDA API: the table would be one empty row
        tables.append(launch_table(report))
    if report.modules is not None:
        tables.append(modules_table(report))
    return tables


MODULE_DEPTH = 3  # tree levels shown on the console (--json and CSV have every module)


def modules_table(report: TraceReport, max_depth: int = MODULE_DEPTH):
    return module_tree_table(report.modules, report.module_note, max_depth, terms_of(report))


def module_tree_table(tree, note: str | None = None, max_depth: int = MODULE_DEPTH, terms: Terms = GPU_TERMS):
    """The module tree: GPU time per step by the innermost module that launched it, inclusive and exclusive,
    forward and backward apart; the unattributed rest closes each pass. Each pass is named once, a module by its last
    name indented under its parent, and numbered siblings of one class (a model's layers) are folded into one row
    (``analysis.modules.fold_repeats``): their times summed."""
    from perflab.analysis.modules import fold_repeats

    steps = tree.attrs.get("steps", 1)
    folded = fold_repeats(tree)
    header = ["pass", "module", "class", "inclusive µs", "share", "exclusive µs", terms.works]
    rows, last_pass = [], None
    for row in folded.itertuples(index=False):
        if row.depth > max_depth:
            continue
        name = row.module.rsplit(".", 1)[-1]
        label = row.module if row.depth == 0 else "  " * (row.depth - 1) + name + (f" (×{row.instances})" if "–" in name else "")
        rows.append([row[0] if row[0] != last_pass else "", label, row[2], units.ns_us(row.inclusive_ns / steps), f"{100 * row.share_inclusive:.1f}%",
                     units.ns_us(row.exclusive_ns / steps), f"{row.kernels_inclusive / steps:g}"])
        last_pass = row[0]
    captions = [note] if note else []
    if (folded["instances"] > 1).any():
        captions.append("a–b (×n): n numbered modules of one class (a model's layers) in one row, their times summed; "
                        "below it, their children, summed alike (--json and --csv give each module)")
    # narrow, the class goes first (the module's name says most of it), then the exclusive times and the kernel counts
    return text_table(header, rows, f"{terms.time} by module (µs per step; tree to depth {max_depth}; shares of each pass's {terms.work} time)",
                      ["pass", "module", "class"], [header[2], header[5], header[6]], captions)


def accounting_table(whole, terms: Terms, title: str) -> Table:
    """Where a trace window's time goes, in µs and as a share of the wall, exact to the ns: the wall, the work's union
    and each idle cause. ``whole``: the window's accounting in ns (``wall_ns``, ``busy_ns`` and each cause's
    ``host_bound_ns`` ...: ``analysis.accounting``'s trace row, or run.json's ``accounting_ns``)."""
    table = plain_table(title, [("whole trace", "left"), ("µs", "right"), ("% of wall", "right")], header_style="bold")
    wall = whole["wall_ns"]
    table.add_row("wall (trace window)", units.ns_us(wall), "100.0%")
    table.add_row(terms.busy, units.ns_us(whole["busy_ns"]), units.pct_of(whole["busy_ns"], wall))
    for cause in IDLE_CAUSES:
        if cause == "host_bound":
            table.add_row(terms.host_bound, units.ns_us(whole[f"{cause}_ns"]), units.pct_of(whole[f"{cause}_ns"], wall))
        elif whole[f"{cause}_ns"] or not terms.cpu_only:  # a CPU trace's operators launch themselves: no kernel gap
            table.add_row(f"idle: {cause.replace('_', ' ')}", units.ns_us(whole[f"{cause}_ns"]), units.pct_of(whole[f"{cause}_ns"], wall))
    return table


def summary_table(report: TraceReport) -> Table:
    """Where the trace window's time goes (``accounting_table``), with the work's counts and times below; the counts and
    fractions that are no times go in its caption."""
    stats = report.kernel_stats
    meta = report.trace.meta
    terms = terms_of(report)
    table = accounting_table(report.trace_accounting, terms, f"{meta.get('path')} ({meta.get('format')}): where the time goes (µs, exact to the ns)")
    table.add_row(f"{terms.work} time, summed over {stats.kernels:,} {terms.works}", units.ns_us(stats.kernel_time_ns), "")
    table.add_row(f"{terms.work} time, mean", units.ns_us(stats.mean_ns), "")
    table.add_row(f"{terms.work} time, median", units.ns_us(stats.median_ns), "")
    delay = report.launch_delay
    if delay["launches"] and not terms.cpu_only:
        table.add_row("launch → start delay, median", units.ns_us(delay["median_ns"]), "")
        table.add_row("launch → start delay, p90", units.ns_us(delay["p90_ns"]), "")
    busy = "operator time" if terms.cpu_only else "GPU busy"
    caption = [f"GEMM: {report.gemm_fraction:.1%} of {busy}; {terms.works} under 5 µs: {stats.short_share:.0%} of {terms.works}, "
               f"{stats.short_time_share:.0%} of {terms.work} time"]
    if stats.memcpy or stats.memset:
        caption.append(f"memcpy {stats.memcpy:,}, memset {stats.memset:,}")
    table.caption = "; ".join(caption)
    return table


def _several_devices(report: TraceReport) -> bool:
    return report.devices is not None and len(report.devices) > 1


def _device_column(report: TraceReport, table: Table) -> bool:
    """Tables get a device column when the trace has several devices."""
    if _several_devices(report):
        table.add_column("device", justify="right")
        return True
    return False


def _cells(with_device: bool, row, *cells: str) -> list[str]:
    return [str(row.device), *cells] if with_device else list(cells)


def devices_table(report: TraceReport) -> Table:
    table = plain_table("Accounting per device (whole trace, µs): wall = busy + host-bound + kernel gap + other, exact to the ns",
                        [(column, "right") for column in ("device", "wall µs", "busy µs", "host-bound µs", "kernel gap µs", "other µs", "busy %")],
                        header_style="bold")
    for row in report.devices.itertuples(index=False):
        table.add_row(str(row.device), units.ns_us(row.wall_ns), units.ns_us(row.busy_ns), units.ns_us(row.host_bound_ns), units.ns_us(row.kernel_gap_ns),
                      units.ns_us(row.other_ns), units.pct_of(row.busy_ns, row.wall_ns))
    return table


def steps_table(report: TraceReport) -> Table:
    steps = report.steps
    terms = terms_of(report)
    title = "per step" if report.accounting.has_step_annotations else "whole trace (no step annotations)"
    # a CPU trace's operators launch themselves: its idle is the time between them, and "other" only where there is any
    other = not terms.cpu_only or bool((steps["kernel_gap_ns"] + steps["other_ns"]).any())
    parts = f"operators + between operators{' + other' if other else ''}" if terms.cpu_only else "busy + host-bound + kernel gap + other"
    table = plain_table(f"Accounting {title} (µs): wall = {parts}, exact to the ns", header_style="bold")
    device = _device_column(report, table)
    columns = ((("step", "wall µs", terms.busy_column, "between µs") + (("other µs",) if other else ()) + ("in ops %", "ops"))
               if terms.cpu_only else ("step", "wall µs", "busy µs", "host-bound µs", "kernel gap µs", "other µs", "busy %", "kernels"))
    for column in columns:
        table.add_column(column, justify="right")
    if terms.cpu_only:
        table.caption = "ops: operators (torch's top-level, per thread); in ops %: their share of the step's wall"
    for row in steps.head(MAX_STEP_ROWS).itertuples(index=False):
        idle = ([units.ns_us(row.host_bound_ns)] + ([units.ns_us(row.kernel_gap_ns + row.other_ns)] if other else []) if terms.cpu_only else
                [units.ns_us(row.host_bound_ns), units.ns_us(row.kernel_gap_ns), units.ns_us(row.other_ns)])
        table.add_row(*_cells(device, row, str(row.name), units.ns_us(row.wall_ns), units.ns_us(row.busy_ns), *idle, units.pct_of(row.busy_ns, row.wall_ns),
                              f"{row.kernels:,}"))
    if len(steps) > MAX_STEP_ROWS:
        table.caption = "; ".join(filter(None, [table.caption, f"{len(steps) - MAX_STEP_ROWS} more steps in --json / --csv"]))
    return table


def top_kernels_table(report: TraceReport) -> Table:
    terms = terms_of(report)
    return _top_table(report, report.top_kernels, terms.works, terms.work)


def top_memory_ops_table(report: TraceReport) -> Table:
    return _top_table(report, report.top_memory_ops, "memory operations (memcpy, memset)", "operation")


def _top_table(report: TraceReport, rows, what: str, label: str) -> Table:
    return top_table(top_records(rows), terms_of(report), what=what, label=label, with_device=_several_devices(report))


def top_table(records: list[dict], terms: Terms, *, what: str | None = None, label: str | None = None, with_device: bool = False) -> Table:
    """The top kernels (a CPU trace's operators), or memory operations, by total time: ``records`` as
    ``analysis.trace_report.top_records`` gives them (µs; run.json's ``top_kernels``); the mean is total ÷ count, as
    ``analysis.kernels.top_kernels`` has it."""
    what, label = what or terms.works, label or terms.work
    whole = "operator time" if terms.cpu_only else "GPU activity time"
    table = plain_table(f"Top {len({r['full_name'] for r in records})} {what} by total time (share of all {whole})", header_style="bold",
                        caption="kernel names shortened by one rule (README); --json gives each full_name" if label == "kernel" else None)
    if with_device:
        table.add_column("device", justify="right")
    for column, justify in ((label, "left"), ("category", "left"), ("count", "right"), ("total µs", "right"), ("mean µs", "right"), ("share", "right")):
        table.add_column(column, justify=justify, overflow="fold" if column == label else "ellipsis")
    for r in records:
        cells = [r["name"], r["category"], f"{r['count']:,}", units.us(r["total_us"]), units.us(r["total_us"] / max(r["count"], 1)), f"{r['share']:.1%}"]
        table.add_row(*([str(r["device"])] if with_device else []), *cells)
    return table


def categories_table(report: TraceReport) -> Table:
    table = plain_table(f"{terms_of(report).time} by category", header_style="bold")
    device = _device_column(report, table)
    for column, justify in (("category", "left"), ("count", "right"), ("time µs", "right"), ("share", "right"), ("busy µs", "right")):
        table.add_column(column, justify=justify)
    for row in report.categories.itertuples(index=False):
        table.add_row(*_cells(device, row, row.category, f"{row.count:,}", units.ns_us(row.time_ns), f"{row.share:.1%}", units.ns_us(row.busy_ns)))
    return table


def ranges_table(report: TraceReport) -> Table:
    ranges = report.ranges[report.ranges["kernels"] > 0]
    terms = terms_of(report)
    where = "innermost range of each operator" if terms.cpu_only else "innermost range of each launch"
    table = plain_table(f"{terms.time} per CPU range ({where})", header_style="bold")
    device = _device_column(report, table)
    count, time, projected = ("ops", "ops µs", "projected µs") if terms.cpu_only else ("kernels", "GPU µs", "GPU projected µs")
    for column, justify in (("range", "left"), (count, "right"), (time, "right"), ("GEMM %", "right"),
                            ("instances", "right"), ("CPU wall µs", "right"), (projected, "right")):
        table.add_column(column, justify=justify)
    for row in ranges.head(MAX_RANGE_ROWS).itertuples(index=False):
        table.add_row(*_cells(device, row, _clip(row.range), f"{row.kernels:,}", units.ns_us(row.gpu_time_ns), f"{row.gemm_fraction:.0%}",
                              f"{row.instances:,}", units.ns_us(row.cpu_wall_ns), units.ns_us(row.gpu_projected_ns)))
    if len(ranges) > MAX_RANGE_ROWS:
        table.caption = f"{len(ranges) - MAX_RANGE_ROWS} more ranges in --json / --csv"
    return table


def launch_table(report: TraceReport) -> Table:
    table = plain_table("CUDA API calls (CPU time) and launch-to-start delay", header_style="bold")
    device = _device_column(report, table)
    for column in ("api", "calls", "total µs", "mean µs", "GPU activities", "delay median µs", "delay p90 µs"):
        table.add_column(column, justify="left" if column == "api" else "right")
    for row in report.launch_apis.itertuples(index=False):
        table.add_row(*_cells(device, row, row.api, f"{row.calls:,}", units.ns_us(row.total_ns), units.ns_us(row.mean_ns), f"{row.activities:,}",
                              units.ns_us(row.delay_median_ns), units.ns_us(row.delay_p90_ns)))
    return table


def _clip(text: str) -> str:
    return text if len(text) <= NAME_WIDTH else text[: NAME_WIDTH - 1] + "…"
