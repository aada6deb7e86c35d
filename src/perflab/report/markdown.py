"""``DIR/report.md`` from a sweep's stored rows: the seeds' tables, with CIs and validity flags, and plots.

For each comparison (the spec's named ones; else each topk_/evit_ model against its baseline) and each
group of the fields it does not name (dtype and mode, one table each, as the seeds had one per setting):

- the batch sweep of seed 001, per input size: batch size, baseline and variant throughput, speedup,
  latency Δ, faster or slower (and whether the difference is beyond the CIs), flags;
- the combined table of seed 002 ("Hypothesis Validation"): input size, batch size, both throughputs,
  speedup, latency Δ, GFLOPs of each, tokens pre → post.

A failed cell says OOM, ERROR, TIMEOUT or INVALID; a case of the spec with no stored row says "not run".
Tables of eager cases show each side's host canary (µs, ``measure.canary``) beside the timings, so a
slower host can be told from a slower model; rows flagged ``host_drift`` ran on a host more than 15% off
their environment's median canary.
Then break-even analyses, the families' own tables (lm, decode) with a legend of the full kernel names behind
their short names (analysis.names), the environment, the command and spec that produced the rows, and every row.
"""

from __future__ import annotations

import numpy as np

import math
import re
import time
from pathlib import Path

from perflab import units
from perflab.analysis.names import MAX_SHORT_NAME, KernelNames
from perflab.measure.canary import CANARY_KEY, HOST_CONTENTION_FLAG, HOST_DRIFT_FLAG, HOST_DRIFT_THRESHOLD
from perflab.report import plots
from perflab.report.md import FAILED, escape as _escape, md_table
from perflab.report.md import num as _num
from perflab.report.md import formula_cell, gflops
from perflab.stats import ci_note
from perflab.report.cross_gpu import cross_gpu_section
from perflab.report.tables import pair
from perflab.sweep.experiment import ComparisonSpec, case_fields, default_comparisons
from perflab.sweep.store import NOT_FINISHED, load_stored, report_unreadable, status_counts, store_path
from perflab.workloads import FAMILIES, family_of_row, item_of

GROUP_FIELDS = ("model", "dtype", "mode", "attn", "device", "keep_rate", "reduction_loc", "seed")
ALWAYS_SHOWN = ("model", "dtype", "mode")  # in group headings, even when they do not vary


def write_report(out_dir, *, n_boot: int = 2000, spec=None, on_unreadable=None) -> Path:
    """Write ``out_dir/report.md`` and its PNGs; returns the report's path.

    ``spec``: an experiment (a YAML path or an Experiment) whose cases the report counts and marks "not run" where
    the store has no row; default, the experiment of the store's latest sweep (a sweep of a subset of a spec
    records the subset, and the report then counted that). Stored records that cannot be read are left out, named in
    the report's status section, and each passed to ``on_unreadable`` (``store.report_unreadable``)."""
    out_dir = Path(out_dir)
    stored = load_stored(out_dir)
    report_unreadable(stored.unreadable, on_unreadable, store_path(out_dir))
    if spec is not None:
        from perflab.sweep.spec import Experiment, read_experiment

        stored.experiment = spec if isinstance(spec, Experiment) else read_experiment(spec)
    text = build_report(stored, out_dir, n_boot=n_boot)
    path = out_dir / "report.md"
    path.write_text(text)
    return path


def build_report(stored, plot_dir: Path, *, n_boot: int = 2000) -> str:
    from perflab.report.versions import every_version_rows, is_program_store, latest_version_rows, shown_version_line, versions_sections

    unreadable = getattr(stored, "unreadable", [])
    missing = with_missing(stored.rows, stored.experiment, unreadable=[u.key for u in unreadable if u.what == "row"])
    rows = latest_version_rows(stored, missing)  # a store of versions: the last one's
    if is_program_store(stored):  # a program's ab or track: its own sections, none of the model cases' tables
        return "\n\n".join(p.rstrip() for p in program_store_sections(stored, missing, unreadable, plot_dir) if p) + "\n"
    experiment = stored.experiment
    comparisons = list(experiment.comparisons) if experiment and experiment.comparisons else default_comparisons(rows)
    common = common_flags(stored.rows)
    parts = [_header(stored, common, family_summary(rows))]
    parts += _status_section(rows, unreadable)
    parts += versions_sections(stored, plot_dir)
    parts += shown_version_line(stored)
    parts += cost_section(stored.rows)
    parts += autotune_section(getattr(stored, "all_rows", stored.rows))
    for comparison in comparisons:
        parts += comparison_section(comparison, rows, plot_dir, common)
    if experiment and experiment.breakevens:
        parts += _breakeven_sections(stored, plot_dir, n_boot)
    names = KernelNames()
    parts += family_sections(rows, plot_dir, names)
    parts += kernel_legend(names)
    parts += cross_gpu_section(getattr(stored, "all_rows", stored.rows), md_table, _row_label)
    parts += _environment_section(stored)
    parts += _provenance_section(stored)
    parts += _all_rows_section(every_version_rows(stored, missing), common)  # a store of versions: each row with its version
    return "\n\n".join(p.rstrip() for p in parts if p) + "\n"


def program_store_sections(stored, missing: list[dict], unreadable, plot_dir: Path) -> list[str]:
    """The report of a program's ab or track (``sweep.programs``): its versions' sections (the comparison or the
    series, then each side's rounds, throughput and verdict: every row the store holds), the environment and how it
    was produced."""
    from perflab.report.versions import versions_sections

    experiment = stored.experiment
    every = [r for r in missing if r.get("status") != "missing"]
    parts = [f"# {_escape(experiment.name if experiment else 'A program')}", _escape(experiment.description) if experiment else ""]
    parts += _status_section(every, unreadable)
    parts += versions_sections(stored, plot_dir)
    parts += _environment_section(stored)
    parts += _provenance_section(stored)
    return parts


def family_reports(rows: list[dict]):
    """(report module, its rows) for each family that names one (``FamilySpec.report``) and has rows here, in the
    families' order. The module is imported by the name the family registers, so this module names no family."""
    import importlib

    for name, spec in FAMILIES.items():
        mine = [r for r in rows if _family(r) == name]
        if spec.report and mine:
            yield importlib.import_module(spec.report), mine


def family_sections(rows: list[dict], plot_dir: Path, names: KernelNames | None = None) -> list[str]:
    """Each family's own tables (its report module's ``sections``) for its rows, in the families' order.
    Their kernel names go through ``names``, one short name per kernel over the whole report."""
    parts = []
    for module, mine in family_reports(rows):
        parts += module.sections(mine, plot_dir, names)
    return parts


def family_summary(rows: list[dict]) -> list[str]:
    """The findings of the families' studies in a few sentences with their numbers (the report module's ``summary``),
    which the report opens with; empty for a sweep without rows of such a family."""
    out = []
    for module, mine in family_reports(rows):
        out += module.summary(mine)
    return out


def kernel_legend(names: KernelNames) -> list[str]:
    """The full name of every short kernel name the report's tables used (analysis.names gives the rule)."""
    legend = names.legend()
    if not legend:
        return []
    lines = "\n".join(f"- `{short}`: `{full}`" for full, short in legend.items())
    return ["## Kernel names",
            f"The tables name kernels by a short name: the return type, argument list and namespaces dropped, the kernel's template "
            f"head kept with the functor that identifies it, at most {MAX_SHORT_NAME} characters (`…` marks a cut), and `#2`, `#3` "
            f"after a short name that two kernels share (README: kernel names). The full names of the {len(legend)} kernels named above:",
            f"<details><summary>Full kernel names</summary>\n\n{lines}\n\n</details>"]


def _family(row: dict) -> str:

    return family_of_row(dict(row, case=case_fields(row))).name


def with_missing(rows: list[dict], experiment, unreadable=()) -> list[dict]:
    """The stored rows plus a ``missing`` placeholder for each case of the spec that has no row (``unreadable``: case
    ids whose stored row could not be read: they ran, and the status section names them instead)."""
    if experiment is None:
        return list(rows)
    stored = {r.get("case_id") for r in rows} | set(unreadable)
    out = list(rows)
    for case in experiment.cases:
        if case.id not in stored:
            d = case.to_dict()
            out.append(dict(d, case=d, case_id=case.id, status="missing", method=case.method, tokens=None, flags=[], message="not run yet",
                            family=case.family, workload=case.workload, label=case.label()))
    return out


def common_flags(rows: list[dict]) -> set[str]:
    """Flags every ok row carries (e.g. no_power on a CPU); stated once instead of in every cell."""
    ok = [set(r.get("flags") or []) for r in rows if r.get("status") == "ok"]
    return set.intersection(*ok) if len(ok) > 1 else set()


# ---------------------------------------------------------------------------------------------------
# Comparisons: the seed tables


def comparison_section(comparison: ComparisonSpec, rows: list[dict], plot_dir: Path, common: set[str]) -> list[str]:
    base_label, var_label = comparison.labels
    entries = [dict(pair(b, v), base_row=b, var_row=v) for b, v in comparison.pairs(rows)]
    parts = [f"## {comparison.name}: {var_label} vs {base_label}",
             f"{base_label}: {_filter_text(comparison.baseline)}. {var_label}: {_filter_text(comparison.variant)}."]
    if not entries:
        return parts + ["No stored pair of cases for this comparison yet."]
    groups: dict[tuple, list[dict]] = {}
    for entry in entries:
        groups.setdefault(group_key(comparison, entry["var_row"]), []).append(entry)
    varying = _varying_fields(groups)
    speedup_panels = {}
    for key, group in groups.items():
        heading = _group_heading(key, varying)
        parts.append(f"### {heading}")
        for size in sorted({e["input_size"] for e in group}):
            parts += batch_sweep_table(comparison, [e for e in group if e["input_size"] == size], size, common)
        parts += combined_table(comparison, group, common)
        parts.append(_group_plots(comparison, heading, group, plot_dir))
        speedup_panels[heading] = _speedup_series(group)
    path = plots.speedup_vs_tokens(speedup_panels, plot_dir / f"speedup_vs_tokens_{_slug(comparison.name)}.png",
                                   f"{comparison.name}: {var_label} / {base_label} throughput", var_label)
    parts.append(f"![speedup vs tokens]({path.name})")
    return parts


def batch_sweep_table(comparison: ComparisonSpec, entries: list[dict], input_size: int, common: set[str]) -> list[str]:
    """Seed 001: one input size, a row per batch size."""
    bl, vl = comparison.labels
    canary = shows_canary(entries)
    headers = ["Batch size", f"{bl} TP (img/s)", f"{vl} TP (img/s)", "Speedup", "Latency Δ", "Result"]
    headers += [f"Host µs ({bl} / {vl})"] if canary else []
    headers += ["Flags"]
    body = []
    for e in sorted(entries, key=lambda e: e["batch_size"]):
        body.append([str(e["batch_size"]), tp_cell(e["base_row"]), tp_cell(e["var_row"]), speedup_cell(e),
                     delta_cell(e), result_cell(e, comparison.labels)] + ([canary_pair_cell(e)] if canary else []) + [flags_cell(e, common)])
    lines = [f"#### Batch size sweep (input size {input_size})", md_table(headers, body)]
    lines.append(_flops_line(entries, comparison.labels) + " " + _mean_speedup_line(entries))
    return lines


def combined_table(comparison: ComparisonSpec, entries: list[dict], common: set[str]) -> list[str]:
    """Seed 002's "Hypothesis Validation": every input size and batch size in one table."""
    bl, vl = comparison.labels
    canary = shows_canary(entries)
    headers = ["Input size", "Batch size", f"{bl} TP (img/s)", f"{vl} TP (img/s)", "Speedup", "Latency Δ",
               f"{bl} GFLOPs", f"{vl} GFLOPs", "Tokens (pre → post)"]
    headers += [f"Host µs ({bl} / {vl})"] if canary else []
    headers += ["Flags"]
    body = []
    for e in sorted(entries, key=lambda e: (e["input_size"], e["batch_size"])):
        body.append([str(e["input_size"]), str(e["batch_size"]), tp_cell(e["base_row"]), tp_cell(e["var_row"]), speedup_cell(e),
                     delta_cell(e), gflops(e["baseline_gflops"]), gflops(e["variant_gflops"]), tokens_cell(e)]
                    + ([canary_pair_cell(e)] if canary else []) + [flags_cell(e, common)])
    return ["#### All input sizes (the token-reduction study's \"Hypothesis Validation\" shape)", md_table(headers, body)]


def group_key(comparison: ComparisonSpec, row: dict) -> tuple:
    case = case_fields(row)
    return tuple((f, _hashable(case.get(f))) for f in GROUP_FIELDS if f not in comparison.named_fields)


# -- cells


def tp_cell(row: dict) -> str:
    if row.get("status") != "ok":
        return status_cell(row)
    lo, hi = throughput_ci(row)
    ci = f" [{lo:.2f}–{hi:.2f}]" if lo is not None else ""
    return f"{row['throughput_per_s']:.2f}{ci}"


def throughput_ci(row: dict) -> tuple[float | None, float | None]:
    ci = row.get("ci95_ms")
    if not ci or None in ci or min(ci) <= 0:
        return None, None
    return row["batch_size"] * 1000.0 / ci[1], row["batch_size"] * 1000.0 / ci[0]


def speedup_ci(entry: dict) -> tuple[float | None, float | None]:
    """The speedup's CI where the two cases were timed together (``stats.paired_ratio``, through ``tables.pair``);
    none where they were not: two medians taken apart have no paired interval."""
    ci = entry.get("speedup_ci95")
    return (ci[0], ci[1]) if ci else (None, None)


def speedup_cell(entry: dict) -> str:
    if entry["speedup"] is None:
        return "–"
    lo, hi = speedup_ci(entry)
    if lo is None:
        return f"{entry['speedup']:.3f}× (unpaired)"
    note = ci_note(entry.get("speedup_ci_coverage"), entry.get("speedup_ci_range_of"))
    return f"{entry['speedup']:.3f}× [{lo:.3f}–{hi:.3f}]" + (f" {note}" if note else "")


def delta_cell(entry: dict) -> str:
    return "–" if entry["latency_delta"] is None else f"{100 * entry['latency_delta']:+.1f}%"


def result_cell(entry: dict, labels: tuple[str, str]) -> str:
    if entry["speedup"] is None:
        failed = [f"{label} {status_cell(row)}" for label, row in zip(labels, (entry["base_row"], entry["var_row"])) if row.get("status") != "ok"]
        return "— " + ", ".join(failed)
    verdict = "✓ Faster" if entry["faster"] else "✗ Slower"
    return verdict + (" (within noise)" if entry["significant"] is False else "")


def flags_cell(entry: dict, common: set[str]) -> str:
    flags = [f for f in entry["flags"] if f not in common]
    return ", ".join(flags) if flags else "–"


def shows_canary(entries: list[dict]) -> bool:
    """Whether a comparison table gets the host canary column: some eager row in it has a canary (launch-bound
    eager timings follow the host's speed; compiled and CUDA-graph steps much less)."""
    return any(row.get("mode") == "eager" and row.get(CANARY_KEY) is not None
               for e in entries for row in (e["base_row"], e["var_row"]))


def canary_pair_cell(entry: dict) -> str:
    """Both sides' host canaries, µs: ``310 / 402``."""
    return " / ".join(_num(row.get(CANARY_KEY), ".0f") for row in (entry["base_row"], entry["var_row"]))


def tokens_cell(entry: dict) -> str:
    tokens = entry["var_row"].get("tokens") or entry["base_row"].get("tokens")
    if not tokens:
        return "–"
    return f"{tokens[0]} → {tokens[-1]}"


def status_cell(row: dict) -> str:
    status = row.get("status") or "?"
    return FAILED.get(status, status.upper())


# -- group plots and summaries


def _group_plots(comparison: ComparisonSpec, heading: str, group: list[dict], plot_dir: Path) -> str:
    tp_series, ms_series = {}, {}
    for side, label in (("base_row", comparison.labels[0]), ("var_row", comparison.labels[1])):
        for e in group:
            row = e[side]
            if row.get("status") != "ok":
                continue
            name = f"{label}, {row['input_size']} px"
            lo, hi = throughput_ci(row)
            tp_series.setdefault(name, {})[row["batch_size"]] = (row["batch_size"], row["throughput_per_s"], lo, hi)
            ci = row.get("ci95_ms") or (None, None)
            ms_series.setdefault(name, {})[row["batch_size"]] = (row["batch_size"], row["median_ms"], ci[0], ci[1])
    if not tp_series:
        return "(no successful cases to plot)"
    slug = _slug(f"{comparison.name}-{heading}")
    by_size: dict[int, list[str]] = {}
    for name in sorted(tp_series, key=lambda n: (int(n.rsplit(", ", 1)[1].split()[0]), n.rsplit(", ", 1)[0] != comparison.labels[0])):
        by_size.setdefault(int(name.rsplit(", ", 1)[1].split()[0]), []).append(name)
    styles = plots.series_styles(by_size)
    ordered = [name for names in by_size.values() for name in names]
    tp_path = plots.throughput_vs_batch({k: list(tp_series[k].values()) for k in ordered}, plot_dir / f"throughput_{slug}.png",
                                        f"{comparison.name} ({heading}): throughput", styles)
    ms_path = plots.latency_vs_batch({k: list(ms_series[k].values()) for k in ordered}, plot_dir / f"latency_{slug}.png",
                                     f"{comparison.name} ({heading}): latency per batch", styles)
    return f"![throughput vs batch size]({tp_path.name}) ![latency with 95% CI]({ms_path.name})"


def _speedup_series(group: list[dict]) -> dict:
    series: dict[str, list] = {}
    for e in group:
        if e["speedup"] is None:
            continue
        tokens = (e["var_row"].get("tokens") or e["base_row"].get("tokens") or [None])[0]
        lo, hi = speedup_ci(e)
        series.setdefault(f"bs {e['batch_size']}", []).append((tokens if tokens is not None else e["input_size"], e["speedup"], lo, hi))
    return dict(sorted(series.items(), key=lambda kv: int(kv[0].split()[1])))


def _flops_line(entries: list[dict], labels: tuple[str, str]) -> str:
    base = next((e["baseline_gflops"] for e in entries if e["baseline_gflops"] is not None), None)
    var = next((e["variant_gflops"] for e in entries if e["variant_gflops"] is not None), None)
    if base is None or var is None:
        return "**FLOPs:** –."
    return f"**FLOPs:** {base:.2f} → {var:.2f} GFLOPs per image ({100 * (1 - var / base):.1f}% fewer)."


def _mean_speedup_line(entries: list[dict]) -> str:
    ok = [e["speedup"] for e in entries if e["speedup"] is not None]
    if not ok:
        return "**Mean speedup:** – (no batch size measured on both sides)."
    geo = math.exp(sum(math.log(s) for s in ok) / len(ok))
    return f"**Mean speedup:** {geo:.3f}× (geometric mean over {len(ok)} of {len(entries)} batch sizes)."


def _varying_fields(groups: dict) -> set[str]:
    values: dict[str, set] = {}
    for key in groups:
        for field, value in key:
            values.setdefault(field, set()).add(value)
    return {f for f, v in values.items() if len(v) > 1}


def _group_heading(key: tuple, varying: set[str]) -> str:
    parts = []
    d = dict(key)
    for field, value in key:
        if field not in varying and field not in ALWAYS_SHOWN:
            continue
        if field in ("keep_rate", "reduction_loc"):
            continue
        parts.append(str(value))
    if d.get("keep_rate") and ("keep_rate" in varying or "model" in d):
        parts.append("keep " + "/".join(f"{r:g}" for r in d["keep_rate"]) + " @ " + ",".join(map(str, d.get("reduction_loc") or ())))
    return ", ".join(parts) or "all cases"


def _filter_text(filt: dict) -> str:
    return ", ".join(f"{k} = {v}" for k, v in filt.items())


# ---------------------------------------------------------------------------------------------------
# Break-even


def _breakeven_sections(stored, plot_dir: Path, n_boot: int) -> list[str]:
    from perflab.analysis.breakeven import analyze_rows

    parts = ["## Break-even",
             "Each cost is fitted as t(n) = a + b·n + c·n² (ms per batch; n = tokens = (size/16)² + 1) by least squares over "
             "the case medians. The crossover's CI comes from a bootstrap that resamples each case's timing samples "
             "(samples_ms) and refits; replicates without a crossover in range count as below or above it."]
    for i, b in enumerate(stored.experiment.breakevens):
        analysis = analyze_rows(b.name, stored.rows, [c.id for c in b.baseline], [c.id for c in b.variant],
                                patch_size=b.patch_size, n_boot=n_boot)
        parts += breakeven_section(analysis, plot_dir / f"breakeven_{i}_{_slug(b.name)}.png")
    return parts


def breakeven_section(analysis, plot_path: Path) -> list[str]:
    parts = [f"### {analysis.name}"]
    result = analysis.result
    if result is None:
        return parts + [f"No fit: {analysis.problem}."]
    parts.append(f"**{analysis.variant_model} vs {analysis.baseline_model}:** {result.summary()}.")
    fit_rows = []
    for label, fit in (("baseline", result.baseline), ("variant", result.variant)):
        ci = " · ".join(f"{name} ∈ [{lo:.3g}, {hi:.3g}]" for name, (lo, hi) in zip("abc", fit.coef_ci))
        fit_rows.append([label, fit.formula(), f"{fit.r2:.4f}", f"{100 * fit.max_rel_residual:.1f}%", ci])
    parts.append(md_table(["Model", "Fit t(n)", "R²", "Largest residual", "95% CI of coefficients"], fit_rows))
    if analysis.problem:
        parts.append(f"Note: {analysis.problem}.")
    by_size = {r["input_size"]: [r, None] for r in analysis.baseline_rows}
    for r in analysis.variant_rows:
        by_size.setdefault(r["input_size"], [None, None])[1] = r
    body = []
    for size in sorted(by_size):
        b, v = by_size[size]
        tokens = ((b or v).get("tokens") or [None])[0]
        speedup = f"{b['median_ms'] / v['median_ms']:.3f}×" if b and v else "–"
        body.append([str(size), str(tokens), _ms_cell(b), _ms_cell(v), speedup])
    parts.append(md_table(["Input size", "Tokens", "Baseline ms/batch [95% CI]", "Variant ms/batch [95% CI]", "Speedup"], body))
    path = plots.breakeven_plot(
        [((r.get("tokens") or [0])[0]) for r in analysis.baseline_rows], [_ms_triple(r) for r in analysis.baseline_rows],
        [((r.get("tokens") or [0])[0]) for r in analysis.variant_rows], [_ms_triple(r) for r in analysis.variant_rows],
        result.baseline, result.variant, result, plot_path, analysis.name,
        labels=(analysis.baseline_model, analysis.variant_model),
    )
    parts.append(f"![break-even]({path.name})")
    return parts


def _ms_cell(row) -> str:
    if row is None:
        return "–"
    return units.ms_ci(row["median_ms"], row.get("ci95_ms"))


def _ms_triple(row) -> tuple:
    ci = row.get("ci95_ms") or (row["median_ms"], row["median_ms"])
    return (row["median_ms"], ci[0], ci[1])


# ---------------------------------------------------------------------------------------------------
# Header, status, environment, provenance, all rows


def _short_ci_line(rows) -> str | None:
    """Where some rows' CIs come from fewer than 5 units (``stats.HierarchicalCI.coverage``), how many and what
    they cover; None where every CI is a 95% one."""
    from perflab.stats import ci_coverage_of

    coverages = [c for c in (ci_coverage_of(r) for r in rows if r.get("status") == "ok") if c is not None and c < 0.95]
    if not coverages:
        return None
    return (f"{len(coverages)} row(s) have a CI from fewer than 5 units (processes, or stretches of the run): not a 95% CI; "
            f"the brackets of those rows cover the median with at least {min(coverages):.0%} probability (what the units' "
            f"ranks guarantee; min–max of n values: 1 − 2^(1−n)).")


def _unit_of(rows) -> str:

    return {"img": "images", "token": "tokens"}.get(item_of(rows), "items")


def _header(stored, common: set[str], summary: list[str] | None = None) -> str:
    experiment = stored.experiment
    name = experiment.name if experiment else stored.out_dir.name
    lines = [f"# {name}"]
    if experiment and experiment.description:
        lines.append(experiment.description.strip())
    if summary:
        lines += ["## Summary", " ".join(summary), "## How to read the tables"]
    lines.append(
        ("" if summary else "How to read the tables: ") + f"TP is throughput ({_unit_of(stored.rows)}/s) from the median step time, with its CI in brackets (95% unless said below) "
        "(from the distribution-free CI of the median). Speedup = variant TP / baseline TP (>1: the variant is faster); its "
        "bracket pairs the CI ends. Latency Δ = variant / baseline latency per batch − 1. \"Within noise\": the two CIs overlap. "
        "Flags are the harness's validity checks (see the README)."
    )
    if common:
        lines.append(f"Flags raised on every successful case (not repeated in the tables): {', '.join(sorted(common))}.")
    short_ci = _short_ci_line(stored.rows)
    if short_ci:
        lines.append(short_ci)
    canary_line = _canary_line(stored.rows)
    if canary_line:
        lines.append(canary_line)
    if stored.other_env_keys:
        lines.append(f"This directory also holds rows from {len(stored.other_env_keys)} other environment(s) "
                     f"({', '.join(stored.other_env_keys)}); only environment {stored.env_key} is shown.")
    return "\n\n".join(lines)


def _canary_line(rows: list[dict]) -> str | None:
    """What the host canary columns and the host flags mean, how many rows carry them, and which rows were exempt."""
    if not any(r.get(CANARY_KEY) is not None for r in rows):
        return None  # rows stored before the canary existed: nothing to explain
    from perflab.measure.sched import HOST_STEAL_THRESHOLD, HOST_WAIT_THRESHOLD
    from perflab.report.console import exempt_line

    drifted = sum(HOST_DRIFT_FLAG in (r.get("flags") or []) for r in rows)
    contended = sum(HOST_CONTENTION_FLAG in (r.get("flags") or []) for r in rows)
    line = (
        "Host speed: around each case's timed loop the harness times a fixed CPU micro-workload (Python and tiny torch CPU ops, "
        "what an eager step spends its host time on); \"Host µs\" is its median µs per run (the faster of the readings before and "
        "after the loop), lower is a faster host. "
        f"`{HOST_DRIFT_FLAG}` marks a row whose canary is more than {HOST_DRIFT_THRESHOLD:.0%} off the median of its environment's rows: "
        "its launch-bound (eager) timing reflects a slower or faster host, not only the model. "
        + (f"{drifted} row(s) carry it. " if drifted else "No row carries it. ")
    )
    if any(r.get("host_wait_frac") is not None or r.get("host_steal_frac") is not None for r in rows):
        line += (f"`{HOST_CONTENTION_FLAG}` marks a row whose timing thread waited for a CPU more than {HOST_WAIT_THRESHOLD:.0%} of its "
                 f"timed loop, or lost more than {HOST_STEAL_THRESHOLD:.0%} to VM steal: "
                 + (f"{contended} row(s) carry it. " if contended else "no row carries it. "))
    exempt = exempt_line(rows)
    return line.rstrip() + (f" {exempt}" if exempt else "")


def autotune_section(rows: list[dict]) -> list[str]:
    """The kernels max-autotune chose: per case of a max-autotune mode with a recorded choice (``autotune``), its
    processes or rows (a case measured in several processes by ``bench --processes``, or stored by several
    environments), their medians and choices; where they differ or their medians spread over 3%, the statement
    that the mode's kernel choice (or time) varies (``measure.checks.autotune_check``)."""
    from perflab.measure.checks import autotune_check

    by_case: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("status") == "ok" and (r.get("autotune") or r.get("autotune_processes")):
            by_case.setdefault(r.get("case_id"), []).append(r)
    if not by_case:
        return []
    body, said = [], []
    for group in by_case.values():
        records = [p for r in group for p in (r.get("autotune_processes") or [r.get("autotune")])]
        medians = [m for r in group for m in (r.get("process_medians_ms") or [r.get("median_ms")])]
        mode = case_fields(group[0]).get("mode") or group[0].get("mode")
        check = autotune_check(mode, records, medians) if len(group) > 1 else next(
            (autotune_check(mode, r["autotune_processes"], r.get("process_medians_ms") or []) for r in group if r.get("autotune_processes")), None)
        signatures = [p.get("signature") or "cached" if p else "–" for p in records]
        margins = [p["closest_margin"] for p in records if p and p.get("closest_margin") is not None]
        body.append([_row_label(group[0]), str(len(medians)), " / ".join(f"{m:.3f}" for m in medians), ", ".join(signatures),
                     f"{100 * min(margins):.1f}%" if margins else "–", "varies" if check else "same"])
        if check:
            said.append(f"- {_row_label(group[0])}: {_escape(check.message)}")
    lines = ["## Kernels chosen by max-autotune",
             "Each process that compiled a max-autotune case recorded the kernel inductor's autotuning kept for every tuned op (a "
             "signature: equal signatures, equal kernels; the row's `autotune` holds each op's choice, its time and the runner-up's). "
             "\"Closest call\": how much slower the runner-up was in the closest of them; a choice a few percent apart can flip "
             "from one process to the next. \"cached\": inductor's FX graph cache served that process's compiled graph, with the "
             "kernels of the compile that filled it.",
             md_table(["Case", "Processes", "Median ms", "Choice signature", "Closest call", "Kernels / time"], body)]
    if said:
        lines += ["Where the mode's kernel choice or time varies (flag `max_autotune_varies`):", "\n".join(said)]
    return lines


def cost_section(rows: list[dict]) -> list[str]:
    """What a case costs (P9): the sweep's wall time in its workers, cases per minute, and the split of a case's
    wall time by stage (each worker's ``cost_s``): per stage, the cases that ran it, their median, the total and its
    share. Rows stored before perflab recorded it: none."""
    from perflab.sweep.store import COST_ORDER, cost_stage

    costed = []
    for r in rows:
        if isinstance(r.get("cost_s"), dict) and r["cost_s"].get("total"):
            cost: dict[str, float] = {}
            for key, value in r["cost_s"].items():
                cost[cost_stage(key)] = cost.get(cost_stage(key), 0.0) + value
            costed.append(cost)
    if not costed:
        return []
    total = sum(c["total"] for c in costed)
    known = [s for s in COST_ORDER if any(s in c for c in costed)]
    other = sorted({k for c in costed for k in c} - set(COST_ORDER) - {"total"})
    body = []
    for stage in known + other:
        values = [c[stage] for c in costed if stage in c]
        body.append([stage.replace("_", " "), str(len(values)), f"{np.median(values):.2f}", f"{sum(values):.1f}",
                     f"{100 * sum(values) / total:.1f}%"])
    body.append(["total", str(len(costed)), f"{np.median([c['total'] for c in costed]):.2f}", f"{total:.1f}", "100%"])
    timed = sum(c.get("timed", 0.0) for c in costed)
    ranks = sum(c.get("ranks", 0.0) for c in costed)
    line = (f"{len(costed)} case(s) with a recorded split took {total / 60:.1f} min in their workers: {60 * len(costed) / total:.2f} cases "
            f"per minute, one at a time; the timed loop is {100 * timed / total:.0f}% of it (the rest: the process, its imports, building, "
            "checking and counting, compiling, warming up, and the profile and ncu passes).")
    if ranks:
        line += (f" The data-parallel cases' rank processes (start, build, warm-up, the timed blocks and the one-GPU step beside "
                 f"them) are one stage, `ranks`: {100 * ranks / total:.0f}% of it.")
    return ["## What a case costs", line, "A stage's median is over the cases that ran it.",
            md_table(["stage", "cases", "median s", "total s", "share"], body)]


def short_message(message: str, limit: int = 110) -> str:
    """A failure's message for a table cell: its first sentence, cut at ``limit`` characters (the store keeps it whole).
    torch's OOM message runs to 600 characters of advice."""
    first = message.split(". ")[0].strip()
    return first if len(first) <= limit else first[: limit - 1].rstrip() + "…"


def _status_section(rows: list[dict], unreadable=()) -> list[str]:
    counts = status_counts(rows)
    line = ", ".join(f"{n} {'not run' if status == 'missing' else status}" for status, n in sorted(counts.items()))
    parts = ["## Status", f"{len(rows)} cases: {line}."]
    failed = [r for r in rows if r.get("status") not in ("ok", "missing")]
    if failed:
        body = [[_row_label(r), status_cell(r), _escape(short_message(r.get("message") or ""))] for r in failed]
        parts.append(md_table(["Case", "Status", "Message"], body))
    if unreadable:
        n_rows = sum(u.what == "row" for u in unreadable)
        parts.append(f"{len(unreadable)} stored record(s) could not be read and are left out of this report "
                     f"({n_rows} result row(s) among them, not counted above):")
        parts.append(md_table(["Record", "Key", "What is wrong"], [[u.what, f"`{u.key}`", _escape(u.problem)] for u in unreadable]))
    return parts


def _environment_section(stored) -> list[str]:
    envs: dict[tuple, int] = {}
    for row in stored.rows:
        env = row.get("env") or {}
        key = (row.get("device_name") or env.get("gpu_name") or "?", env.get("driver"), env.get("torch"), env.get("cuda"),
               env.get("host"), env.get("python"), env.get("perflab"))
        envs[key] = envs.get(key, 0) + 1
    parent = stored.environments.get(stored.env_key) or {}
    lines = []
    for (device, driver, torch_v, cuda, host, python, perflab_v), n in envs.items():
        driver = driver or parent.get("driver")
        lines.append(f"- **{device}** · driver {driver or '–'} · CUDA {cuda or '–'} · torch {torch_v or '–'} · "
                     f"Python {python or '–'} · host {host or '–'} · perflab {perflab_v or '–'} ({n} rows)")
    if not lines:
        lines.append("- no rows stored yet")
    lines.append(f"- environment key `{stored.env_key}` (hash of host, CPU, GPU names, driver, torch, CUDA, perflab: `--resume` reuses rows only under the same key)")
    return ["## Environment", "\n".join(lines)]


def _provenance_section(stored) -> list[str]:
    parts = ["## How this was produced"]
    if not stored.sweeps:
        return parts + ["No sweep record: these rows were stored by other means."]
    lines = []
    for s in stored.sweeps:
        started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(s["started_at"])) if s["started_at"] is not None else "start unknown"
        outcome = s.get("outcome") or NOT_FINISHED
        lines.append(f"- `{s.get('command') or '?'}` — {started}, {outcome}; {s.get('n_done') or 0} case(s) run, "
                     f"{s.get('n_skipped') or 0} already stored, of {s.get('n_cases')}")
    parts.append("\n".join(lines))
    latest = stored.sweeps[-1]
    if latest.get("spec_text"):
        parts.append(f"<details><summary>Spec: {latest.get('spec_source')}</summary>\n\n```yaml\n{latest['spec_text'].rstrip()}\n```\n\n</details>")
    elif latest.get("spec_source"):
        parts.append(f"Spec: {latest.get('spec_source')}.")
    return parts


def _all_rows_section(rows: list[dict], common: set[str]) -> list[str]:
    from perflab.report.console import shape_label
    from perflab.report.versions import version_cell, version_header

    classify = item_of(rows) == "img"  # image models' rows alone: the token-reduction study's image columns
    version = version_header(rows)  # ab and track: each row's revision or interpreter
    headers = ([version.capitalize()] if version else []) + ["Model", "Size" if classify else "Shape", "BS", "dtype", "mode", "Status", "ms/batch [95% CI]" if classify else "ms/step [95% CI]",
               "ms/img" if classify else "ms/sample", "img/s" if classify else "items/s", "GFLOPs/img" if classify else "GFLOPs/sample",
               "Tokens" if classify else "MFU (counted FLOPs)"] + ([] if classify else ["MFU by the formula (×counted ÷ formula)"]) + ["CV"]
    canary = any(r.get(CANARY_KEY) is not None for r in rows)
    headers += ["Host µs"] if canary else []
    headers += ["Flags / message"]
    body = []
    for r in rows:
        ok = r.get("status") == "ok"
        flags = [f for f in (r.get("flags") or []) if f not in common]
        note = ", ".join(flags) if ok else _escape(short_message(r.get("message") or ""))
        body.append(([_escape(version_cell(r.get("version")))] if version else []) + [
            _model_label(r), str(r.get("input_size")) if classify else shape_label(r), str(r.get("batch_size")), str(r.get("dtype")),
            str(r.get("mode")), "ok" if ok else status_cell(r), _ms_cell(r) if ok else "–", _num(r.get("latency_ms_per_sample"), ".4g"),
            _num(r.get("throughput_per_s") if classify else r.get("items_per_s"), ".2f"), gflops(r.get("gflops")),
            ("→".join(map(str, r["tokens"])) if r.get("tokens") else "–") if classify else _num(r.get("mfu"), ".1%"),
        ] + ([] if classify else [formula_cell(r)]) + [
            _num(r.get("cv"), ".1%"),
        ] + ([_canary_cell(r)] if canary else []) + [note or "–"])
    return ["## All cases", md_table(headers, body)]


# ---------------------------------------------------------------------------------------------------
# Markdown helpers






def _model_label(row: dict) -> str:
    label = row.get("model") or "?"
    if row.get("keep_rate"):
        label += " kr" + "/".join(f"{r:g}" for r in row["keep_rate"]) + "@" + ",".join(map(str, row.get("reduction_loc") or ()))
    return label


def _canary_cell(row: dict) -> str:
    from perflab.report.console import canary_cell

    return canary_cell(row)


def _row_label(row: dict) -> str:
    from perflab.report.console import row_label

    return row_label(row)


def _hashable(value):
    return tuple(value) if isinstance(value, list) else value


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_").lower()[:80] or "plot"
