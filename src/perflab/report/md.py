"""Markdown pieces every report module shares: tables, escaping, the cell of a failed case. A leaf: it imports no
other report module, so the family reports (lm, decode) and the report that gathers them (markdown) import it, not
each other."""

from __future__ import annotations

FAILED = {"oom": "OOM", "error": "ERROR", "timeout": "TIMEOUT", "invalid": "INVALID", "missing": "not run"}


def md_table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(escape(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def escape(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def num(value, spec: str) -> str:
    """A number in a table cell; ``–`` for none (None or NaN)."""
    return "–" if value is None or (isinstance(value, float) and value != value) else format(value, spec)


def pct(value) -> str:
    """A fraction as a percentage cell; ``–`` for none."""
    return "–" if value is None else f"{value:.1%}"
