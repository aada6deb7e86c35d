"""Markdown pieces every report module shares: tables, escaping, the cell of a failed case, the few words about
rows every report says (ok, on which GPU, how many of each status, a range of values). A leaf: it imports no other
report module, so the family reports and the report that gathers them (markdown) import it, not each other."""

from __future__ import annotations

import re

from perflab.sweep.store import status_counts
from perflab.units import gflops, num, pct  # noqa: F401  (the report modules' cells: one set of formatters, perflab.units)

FAILED = {"oom": "OOM", "error": "ERROR", "timeout": "TIMEOUT", "invalid": "INVALID", "missing": "not run"}


def md_table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(escape(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# Every line break str.splitlines knows (\r\n as one): a cell keeps its row on one line for any reader.
_LINE_BREAK = re.compile("\r\n|[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")


def escape(text: str) -> str:
    return _LINE_BREAK.sub(" ", str(text).replace("|", "\\|"))


def with_ci(value, ci, spec: str, unit: str = "", without: str = " (unpaired)") -> str:
    """A paired figure with its 95% CI, ``1.08× (1.02–1.10)``; ``without`` where it has none (timed unpaired); ``–``
    for no figure."""
    if not value:
        return "–"
    return f"{value:{spec}}{unit}" + (f" ({ci[0]:{spec}}–{ci[1]:{spec}})" if ci else without)


def flops_ratio(row: dict) -> float | None:
    """Counted ÷ formula FLOPs of a row (``flops_counted_over_analytic``, or from ``gflops_per_batch`` and
    ``flops_analytic`` in rows stored before it); None where either is missing."""
    if row.get("flops_counted_over_analytic"):
        return row["flops_counted_over_analytic"]
    counted, analytic = row.get("gflops_per_batch"), row.get("flops_analytic")
    return counted * 1e9 / analytic if counted and analytic else None


def mfu_by_formula(row: dict) -> float | None:
    """A row's MFU by the formula's FLOPs (its ``mfu`` is by the counted ones): mfu ÷ (counted ÷ formula)."""
    ratio = flops_ratio(row)
    return row["mfu"] / ratio if ratio and row.get("mfu") is not None else None


def formula_cell(row: dict) -> str:
    """MFU by the formula's FLOPs and the ratio counted ÷ formula: ``37.3% (×1.0078)``; ``–`` where unknown."""
    mfu, ratio = mfu_by_formula(row), flops_ratio(row)
    return "–" if mfu is None else f"{mfu:.1%} (×{ratio:.4f})"


def ok(row) -> bool:
    """Whether a row (or None: no row) measured its case."""
    return bool(row) and row.get("status") == "ok"


def gpu_name(rows) -> str:
    """The GPU the ok rows ran on (the row's device name, else its environment's), for a report's sentences."""
    for r in rows:
        if ok(r) and (r.get("device_name") or (r.get("env") or {}).get("gpu_name")):
            return r.get("device_name") or r["env"]["gpu_name"]
    return "no GPU row stored"


def counts_text(rows) -> str:
    """How many rows of each status: ``3 error, 57 ok``; ``none`` for no rows."""
    return ", ".join(f"{n} {status}" for status, n in sorted(status_counts(rows).items())) or "none"


def span(values, spec: str = ".2f", suffix: str = "") -> str:
    """The range of some values as a sentence says it: ``1.2–3.4×``, or one value where both ends read the same."""
    lo, hi = format(min(values), spec), format(max(values), spec)
    return f"{lo}{suffix}" if lo == hi else f"{lo}–{hi}{suffix}"
