"""What every reader of a stored result row needs of it, below the stages that build rows (measure) and read them
(analysis, sweep, report): a reader never imports the builder's room to read a field."""

from __future__ import annotations


def row_version(row: dict) -> dict:
    """A row's ``version`` (which revision of an ab or track run wrote it); {} for none, or for a damaged one that is no
    mapping (compare's ``check_row`` names that damage; the store's, the report's and the regressions' readers only need
    the mapping)."""
    version = row.get("version")
    return version if isinstance(version, dict) else {}
