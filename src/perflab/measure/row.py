"""The result row's type: what each field of a row holds, as the readers of rows take it.

The harness builds a row (``measure.harness``: ``base_row`` the keys every row has, ``ok_row`` a measured case's,
``failed_row`` one that could not be measured); a row is a dict, as JSON lines, CSV and the results store keep it.
``FIELDS`` says, field by field, what a row read back holds: its type, its range and, in words, what a reader is told
when it holds something else; ``ResultRow`` is that type, a msgspec Struct. ``check_row`` holds a row to it
(``report.export.read_rows`` for a file of ``bench --out``, ``api.compare`` for a store's rows); ``StoredRow`` is the store's view of the same fields, their
types without their ranges (``sweep.store.decode_row``: a stored row is read as it was stored).

Torch-free, and below the store and the report, which import it; the harness, which imports torch, stays out of them.
"""

from __future__ import annotations

import re
import sys
from typing import Annotated, Optional

import msgspec

from perflab.errors import PerflabError, show

# A row is a measurement: its times are finite, positive and within what a timer can read, so a ratio of two of them is
# finite.
MIN_MS, MAX_MS = 1e-9, 1e10  # a picosecond; about 116 days
_Time = Annotated[float, msgspec.Meta(ge=MIN_MS, le=MAX_MS)]
_Amount = Annotated[float, msgspec.Meta(ge=0.0, le=sys.float_info.max)]
_Count = Annotated[int, msgspec.Meta(ge=1)]
_Index = Annotated[int, msgspec.Meta(ge=0)]
_Rate = Annotated[float, msgspec.Meta(gt=0.0, le=1.0)]
# Text is printed in tables and messages: one line, no terminal control sequence, nothing stdout cannot encode (a lone
# surrogate that JSON's \ud800 escape can give)
_Line = Annotated[str, msgspec.Meta(pattern="^[^\x00-\x1f\x7f-\x9f\ud800-\udfff]*\\Z")]
_LINE_WORDS = "text on one line, without control characters"
_TIME_RANGE = f"a number from {MIN_MS:g} to {MAX_MS:g}"
_TIME_WORDS = f"a time in ms, {_TIME_RANGE}"
_AMOUNT_WORDS = "a finite number, 0 or more"

# The fields that hold text, and whole numbers (a CSV's cells are read back by them: report.export)
TEXT_FIELDS = {"run_name", "case_id", "status", "model", "method", "dtype", "mode", "attn", "device_name", "message", "ci_level",
               "version_name", "revision", "commit", "interpreter"}
WHOLE_FIELDS = {"input_size", "batch_size", "processes"}


class _VersionShape(msgspec.Struct):
    key: Optional[_Line] = None
    session: Optional[_Line] = None


class _CaseShape(msgspec.Struct):
    model: Optional[_Line] = None


FIELDS: dict[str, tuple[object, str]] = {
    **{key: (_Line, _LINE_WORDS) for key in TEXT_FIELDS | {"label", "session", "env_key"}},
    "case_id": (Annotated[_Line, msgspec.Meta(min_length=1)], f"non-empty {_LINE_WORDS}"),
    "message": (str, "text"),  # a failed case's own words, whatever a library printed; compare shows its status, not these
    **{key: (_Time, _TIME_WORDS) for key in ("median_ms", "p10_ms", "p90_ms", "latency_ms", "latency_ms_per_batch",
                                              "latency_ms_per_sample", "host_held_ms", "device_ms")},
    **{key: (_Amount, _AMOUNT_WORDS) for key in ("cv", "throughput_per_s", "items_per_s", "gflops", "gmacs", "params_m",
                                                 "peak_mem_alloc_mb", "peak_mem_reserved_mb", "energy_j", "power_w",
                                                 "host_canary_us", "mfu", "mbu", "tp", "time_total", "flops", "max_memory",
                                                 "no_params", "no_params_trainable", "power")},
    **{key: (_Count, "a whole number, 1 or more") for key in WHOLE_FIELDS},
    "ci95_ms": (tuple[Optional[_Time], Optional[_Time]], f"[low, high] in ms, each {_TIME_RANGE}"),
    "ci_ms": (tuple[Optional[_Time], Optional[_Time]], f"[low, high] in ms, each {_TIME_RANGE}"),  # the row's CI, its level in ci_level (ci95_ms holds the same, for readers of that name)
    "ci_coverage": (_Rate, "a coverage above 0 and at most 1"),
    "samples_ms": (list[_Time], f"a list of times in ms, each {_TIME_RANGE}"),
    "process_medians_ms": (list[Optional[_Time]], f"a list of process medians in ms, each {_TIME_RANGE} or null"),
    "keep_rate": (list[_Rate], "a list of keep rates, each above 0 and at most 1"),
    "reduction_loc": (list[_Index], "a list of layer indices, whole numbers 0 or more"),
    "tokens": (list[_Index], "a list of token counts, whole numbers 0 or more"),
    "sample_rounds": (list[_Index], "a list of round numbers, whole numbers 0 or more"),
    "sample_processes": (list[_Index], "a list of process numbers, whole numbers 0 or more"),
    "flags": (list[_Line], "a list of flag names"),
    "warnings": (list[str], "a list of warnings (text)"),
    "process_flags": (list[Optional[list[_Line]]], "a list of each process's flags (a list of flag names, or null)"),
    "process_sessions": (list[Optional[_Line]], "a list of each process's session (text, or null)"),
    "version": (_VersionShape, f"a mapping whose key and session are {_LINE_WORDS}"),
    "case": (_CaseShape, f"a mapping whose model is {_LINE_WORDS}"),
    "env": (dict, "a mapping (the environment the row was measured in)"),
}


# The fields of ``FIELDS`` with their types and ranges, each optional but ``case_id``. A row whose values have other
# types (a median that is text) or lie out of range (a negative or infinite time) is refused at once (``check_row``),
# not met later as a traceback or a false verdict in whatever reads it.
ResultRow = msgspec.defstruct("ResultRow", [("case_id", FIELDS["case_id"][0])]
                              + [(key, Optional[kind], None) for key, (kind, _) in FIELDS.items() if key != "case_id"],
                              module=__name__)


def check_row(row: dict, where: str) -> dict:
    """``row`` where each of its fields holds what ``FIELDS`` says; PerflabError naming ``where`` (the file and line, or
    the store and case), the field and its value otherwise."""
    try:
        msgspec.convert(row, ResultRow)
    except (msgspec.ValidationError, UnicodeEncodeError) as exc:
        if isinstance(exc, UnicodeEncodeError):  # msgspec encodes text to match its pattern, and cannot encode a lone surrogate
            path = next(filter(None, (_unencodable(row[key], key) for key in FIELDS if key in row)), "")
        else:
            path = str(exc).partition(" - at `$")[2].rstrip("`").lstrip(".")
        key = re.match(r"[^.\[]*", path).group(0)
        if key not in FIELDS:
            raise PerflabError(f"{where}: not a perflab result row ({exc})") from None
        raise PerflabError(f"{where}: {path}: {show(_at(row, path))}: expected {FIELDS[key][1]}") from None
    ci = row.get("ci95_ms")
    if ci and ci[0] is not None and ci[1] is not None and ci[0] > ci[1]:
        raise PerflabError(f"{where}: ci95_ms: {show(ci)}: expected [low, high], low at most high")
    return row


class StoredRow(msgspec.Struct):
    """The fields of ``FIELDS`` that every reader of a stored row relies on, with their types and not their ranges (a
    time that is not finite is stored as null); the rest is the row's own business. ``sweep.store.decode_row`` holds
    each stored row to it."""

    case_id: str
    status: str
    model: str | None = None
    batch_size: int | None = None
    dtype: str | None = None
    mode: str | None = None
    median_ms: float | None = None
    input_size: int | None = None
    label: str | None = None
    env: dict | None = None
    throughput_per_s: float | None = None
    items_per_s: float | None = None
    mfu: float | None = None
    mbu: float | None = None
    peak_mem_alloc_mb: float | None = None
    peak_mem_reserved_mb: float | None = None
    case: dict | None = None
    flags: list[str] | None = None
    warnings: list[str] | None = None
    ci95_ms: tuple[float | None, float | None] | None = None
    samples_ms: list[float | None] | None = None


def _unencodable(value, path: str, levels: int = 3) -> str | None:
    """The path of the first text within ``levels`` of ``value`` that UTF-8 cannot encode (of its mapping, for a key)."""
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            return path
    elif levels and isinstance(value, dict):
        for key, item in value.items():
            found = _unencodable(key, path) or _unencodable(item, f"{path}.{key}", levels - 1)
            if found:
                return found
    elif levels and isinstance(value, list):
        for index, item in enumerate(value):
            found = _unencodable(item, f"{path}[{index}]", levels - 1)
            if found:
                return found
    return None


def _at(row: dict, path: str):
    """The value at a msgspec error path (``process_flags[0][1]``, ``version.key``) in ``row``."""
    value = row
    for name, index in re.findall(r"([^.\[\]]+)|\[(\d+)\]", path):
        value = value[name] if name else value[int(index)]
    return value
