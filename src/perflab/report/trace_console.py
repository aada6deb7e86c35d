"""Rich tables for ``perflab analyze``: accounting, per-step accounting, top kernels, categories, ranges, launches."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from perflab.analysis.accounting import IDLE_CAUSES
from perflab.analysis.trace_report import TraceReport
from perflab.report.fit import text_table

MAX_STEP_ROWS = 20
MAX_RANGE_ROWS = 25
NAME_WIDTH = 70  # range names; kernel names are short already (analysis.names: at most 120 characters, unique per table)


def render_trace_report(console: Console, report: TraceReport) -> None:
    for table in trace_tables(report):
        console.print(table)
    console.print(report.verdict.message, markup=False, highlight=False)
    meta = report.trace.meta
    if meta.get("unlinked"):
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
    tables.append(launch_table(report))
    if report.modules is not None:
        tables.append(modules_table(report))
    return tables


MODULE_DEPTH = 3  # tree levels shown on the console (--json and CSV have every module)


def modules_table(report: TraceReport, max_depth: int = MODULE_DEPTH):
    return module_tree_table(report.modules, report.module_note, max_depth)


def module_tree_table(tree, note: str | None = None, max_depth: int = MODULE_DEPTH):
    """The module tree: GPU time per step by the innermost module that launched it, inclusive and exclusive,
    forward and backward apart; the unattributed rest closes each pass. Each pass is named once, a module by its last
    name indented under its parent, and numbered siblings of one class (a model's layers) are folded into one row
    (``analysis.modules.fold_repeats``): their times summed."""
    from perflab.analysis.modules import fold_repeats

    steps = tree.attrs.get("steps", 1)
    folded = fold_repeats(tree)
    header = ["pass", "module", "class", "inclusive µs", "share", "exclusive µs", "kernels"]
    rows, last_pass = [], None
    for row in folded.itertuples(index=False):
        if row.depth > max_depth:
            continue
        name = row.module.rsplit(".", 1)[-1]
        label = row.module if row.depth == 0 else "  " * (row.depth - 1) + name + (f" (×{row.instances})" if "–" in name else "")
        rows.append([row[0] if row[0] != last_pass else "", label, row[2], _us(row.inclusive_ns / steps), f"{100 * row.share_inclusive:.1f}%",
                     _us(row.exclusive_ns / steps), f"{row.kernels_inclusive / steps:g}"])
        last_pass = row[0]
    captions = [note] if note else []
    if (folded["instances"] > 1).any():
        captions.append("a–b (×n): n numbered modules of one class (a model's layers) in one row, their times summed; "
                        "below it, their children, summed alike (--json and --csv give each module)")
    # narrow, the class goes first (the module's name says most of it), then the exclusive times and the kernel counts
    return text_table(header, rows, f"GPU time by module (µs per step; tree to depth {max_depth}; shares of each pass's kernel time)",
                      ["pass", "module", "class"], [header[2], header[5], header[6]], captions)


def summary_table(report: TraceReport) -> Table:
    """Where the trace window's time goes, in µs and as a share of the wall (one unit a column, a header naming it);
    the counts and fractions that are no times go in its caption."""
    whole = report.trace_accounting
    stats = report.kernel_stats
    meta = report.trace.meta
    table = Table(title=f"{meta.get('path')} ({meta.get('format')}): where the time goes (µs, exact to the ns)", header_style="bold")
    table.add_column("whole trace", justify="left")
    table.add_column("µs", justify="right")
    table.add_column("% of wall", justify="right")
    wall = whole["wall_ns"]
    table.add_row("wall (trace window)", _us(wall), "100.0%")
    table.add_row("GPU busy (union of streams)", _us(whole["busy_ns"]), _pct(whole["busy_ns"], wall))
    for cause in IDLE_CAUSES:
        table.add_row(f"idle: {cause.replace('_', ' ')}", _us(whole[f"{cause}_ns"]), _pct(whole[f"{cause}_ns"], wall))
    table.add_row(f"kernel time, summed over {stats.kernels:,} kernels", _us(stats.kernel_time_ns), "")
    table.add_row("kernel time, mean", _us(stats.mean_ns), "")
    table.add_row("kernel time, median", _us(stats.median_ns), "")
    delay = report.launch_delay
    if delay["launches"]:
        table.add_row("launch → start delay, median", _us(delay["median_ns"]), "")
        table.add_row("launch → start delay, p90", _us(delay["p90_ns"]), "")
    caption = [f"GEMM: {report.gemm_fraction:.1%} of GPU busy; kernels under 5 µs: {stats.short_share:.0%} of kernels, "
               f"{stats.short_time_share:.0%} of kernel time"]
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
    table = Table(title="Accounting per device (whole trace, µs): wall = busy + host-bound + kernel gap + other, exact to the ns", header_style="bold")
    for column in ("device", "wall µs", "busy µs", "host-bound µs", "kernel gap µs", "other µs", "busy %"):
        table.add_column(column, justify="right")
    for row in report.devices.itertuples(index=False):
        table.add_row(str(row.device), _us(row.wall_ns), _us(row.busy_ns), _us(row.host_bound_ns), _us(row.kernel_gap_ns),
                      _us(row.other_ns), _pct(row.busy_ns, row.wall_ns))
    return table


def steps_table(report: TraceReport) -> Table:
    steps = report.steps
    title = "per step" if report.accounting.has_step_annotations else "whole trace (no step annotations)"
    table = Table(title=f"Accounting {title} (µs): wall = busy + host-bound + kernel gap + other, exact to the ns", header_style="bold")
    device = _device_column(report, table)
    for column in ("step", "wall µs", "busy µs", "host-bound µs", "kernel gap µs", "other µs", "busy %", "kernels"):
        table.add_column(column, justify="right")
    for row in steps.head(MAX_STEP_ROWS).itertuples(index=False):
        table.add_row(*_cells(device, row, str(row.name), _us(row.wall_ns), _us(row.busy_ns), _us(row.host_bound_ns), _us(row.kernel_gap_ns),
                              _us(row.other_ns), _pct(row.busy_ns, row.wall_ns), f"{row.kernels:,}"))
    if len(steps) > MAX_STEP_ROWS:
        table.caption = f"{len(steps) - MAX_STEP_ROWS} more steps in --json / --csv"
    return table


def top_kernels_table(report: TraceReport) -> Table:
    return _top_table(report, report.top_kernels, "kernels", "kernel")


def top_memory_ops_table(report: TraceReport) -> Table:
    return _top_table(report, report.top_memory_ops, "memory operations (memcpy, memset)", "operation")


def _top_table(report: TraceReport, rows, what: str, label: str) -> Table:
    table = Table(title=f"Top {rows['full_name'].nunique()} {what} by total time (share of all GPU activity time)", header_style="bold",
                  caption="kernel names shortened by one rule (README); --json gives each full_name" if label == "kernel" else None)
    device = _device_column(report, table)
    for column, justify in ((label, "left"), ("category", "left"), ("count", "right"), ("total µs", "right"), ("mean µs", "right"), ("share", "right")):
        table.add_column(column, justify=justify, overflow="fold" if column == label else "ellipsis")
    for row in rows.itertuples(index=False):
        table.add_row(*_cells(device, row, row.name, row.category, f"{row.count:,}", _us(row.total_ns), _us(row.mean_ns), f"{row.share:.1%}"))
    return table


def categories_table(report: TraceReport) -> Table:
    table = Table(title="GPU time by category", header_style="bold")
    device = _device_column(report, table)
    for column, justify in (("category", "left"), ("count", "right"), ("time µs", "right"), ("share", "right"), ("busy µs", "right")):
        table.add_column(column, justify=justify)
    for row in report.categories.itertuples(index=False):
        table.add_row(*_cells(device, row, row.category, f"{row.count:,}", _us(row.time_ns), f"{row.share:.1%}", _us(row.busy_ns)))
    return table


def ranges_table(report: TraceReport) -> Table:
    ranges = report.ranges[report.ranges["kernels"] > 0]
    table = Table(title="GPU time per CPU range (innermost range of each launch)", header_style="bold")
    device = _device_column(report, table)
    for column, justify in (("range", "left"), ("kernels", "right"), ("GPU µs", "right"), ("GEMM %", "right"),
                            ("instances", "right"), ("CPU wall µs", "right"), ("GPU projected µs", "right")):
        table.add_column(column, justify=justify)
    for row in ranges.head(MAX_RANGE_ROWS).itertuples(index=False):
        table.add_row(*_cells(device, row, _clip(row.range), f"{row.kernels:,}", _us(row.gpu_time_ns), f"{row.gemm_fraction:.0%}",
                              f"{row.instances:,}", _us(row.cpu_wall_ns), _us(row.gpu_projected_ns)))
    if len(ranges) > MAX_RANGE_ROWS:
        table.caption = f"{len(ranges) - MAX_RANGE_ROWS} more ranges in --json / --csv"
    return table


def launch_table(report: TraceReport) -> Table:
    table = Table(title="CUDA API calls (CPU time) and launch-to-start delay", header_style="bold")
    device = _device_column(report, table)
    for column in ("api", "calls", "total µs", "mean µs", "GPU activities", "delay median µs", "delay p90 µs"):
        table.add_column(column, justify="left" if column == "api" else "right")
    for row in report.launch_apis.itertuples(index=False):
        table.add_row(*_cells(device, row, row.api, f"{row.calls:,}", _us(row.total_ns), _us(row.mean_ns), f"{row.activities:,}",
                              _us(row.delay_median_ns), _us(row.delay_p90_ns)))
    return table


def _us(ns) -> str:
    if ns is None or ns != ns:  # NaN
        return "–"
    return f"{ns / 1000:,.1f}"


def _pct(part, whole) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "–"


def _clip(text: str) -> str:
    return text if len(text) <= NAME_WIDTH else text[: NAME_WIDTH - 1] + "…"
