"""The result row, declared once: what each field of a row holds, for the stages that build rows (measure) and the ones
that read them (analysis, sweep, report). A reader never imports the builder's room to read a field.

``ROW`` is the declaration, field by field (``Field``): the type and range a reader holds the field to, and in words what
a reader is told when it holds something else; the type the results store relies on; how a CSV cell of it is read back;
and whether every row has it (the harness's ``base_row``) with the empty value it starts from. The rest comes from it:

- ``BASE_FIELDS`` and ``new_row``: the keys every row has, whatever its status (``measure.harness.base_row`` builds
  its rows with ``new_row``, which refuses a key ``ROW`` does not declare as a base field);
- ``FIELDS``, ``ResultRow`` and ``check_row``: the checked fields, their types and ranges (``report.export.read_exported_rows``
  for a file of ``bench --out``, ``api.compare`` for a store's rows);
- ``StoredRow``: the store's lenient view of the same fields, their types without their ranges (``sweep.store.decode_row``:
  a stored row is read as it was stored);
- ``TEXT_FIELDS`` and ``WHOLE_FIELDS``: the CSV columns read back as text and as whole numbers (``report.export``).

Every row built since row format 1 carries ``"row_format": ROW_FORMAT``; a row without it (an older store or file) is
format 0, read as before (``row_format``). A row keeps the fields it had; a change that a reader must tell apart gives
the rows a new format number.

Torch-free, and below the store and the report, which import it; the harness, which imports torch, stays out of them.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Annotated, Callable, Optional

import msgspec

from perflab.errors import PerflabError, show

# The format of the rows built now; a row without FORMAT_KEY is format 0 (written before rows carried it).
ROW_FORMAT = 1
FORMAT_KEY = "row_format"

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
_CI_WORDS = f"[low, high] in ms, each {_TIME_RANGE}"


class _VersionShape(msgspec.Struct):
    key: Optional[_Line] = None
    session: Optional[_Line] = None


class _CaseShape(msgspec.Struct):
    model: Optional[_Line] = None


@dataclass(frozen=True)
class Field:
    """One field of a result row."""

    check: object = None  # the type and range a reader holds it to (check_row); None: not checked, the row's own business
    words: str = ""  # what a reader is told when it holds something else
    stored: object = None  # the type the store's reader relies on (StoredRow); None: not relied on
    required: bool = False  # the store's reader refuses a row without it
    csv: str | None = None  # a CSV cell of it read back as "text" or a "whole" number (else as a number)
    base: bool = False  # every row has it, whatever its status (new_row)
    empty: Callable[[], object] = lambda: None  # its value in a new row, until the builder sets it


def _line(**kw) -> Field:
    return Field(_Line, _LINE_WORDS, **kw)


def _time(**kw) -> Field:
    return Field(_Time, _TIME_WORDS, **kw)


def _amount(**kw) -> Field:
    return Field(_Amount, _AMOUNT_WORDS, **kw)


def _count(**kw) -> Field:
    return Field(_Count, "a whole number, 1 or more", csv="whole", **kw)


_BASE = dict(base=True)

# The declaration. The base fields come first, in the order a new row holds them.
ROW: dict[str, Field] = {
    "case_id": Field(Annotated[_Line, msgspec.Meta(min_length=1)], f"non-empty {_LINE_WORDS}", stored=str, required=True,
                     csv="text", **_BASE),
    FORMAT_KEY: Field(_Index, "a row format, a whole number 0 or more", stored=int, **_BASE),
    "case": Field(_CaseShape, f"a mapping whose model is {_LINE_WORDS}", stored=dict, **_BASE),
    "status": _line(stored=str, required=True, csv="text", **_BASE),
    # a failed case's own words, whatever a library printed; compare shows its status, not these
    "message": Field(str, "text", csv="text", **_BASE),
    "model": _line(stored=str, csv="text", **_BASE),
    "family": Field(**_BASE),
    "workload": Field(**_BASE),
    "label": _line(stored=str, **_BASE),
    "method": _line(csv="text", **_BASE),
    "keep_rate": Field(list[_Rate], "a list of keep rates, each above 0 and at most 1", **_BASE),
    "reduction_loc": Field(list[_Index], "a list of layer indices, whole numbers 0 or more", **_BASE),
    "tokens": Field(list[_Index], "a list of token counts, whole numbers 0 or more", **_BASE),
    "input_size": _count(stored=int, **_BASE),
    "seq_len": Field(**_BASE),
    "prompt_len": Field(**_BASE),
    "context_len": Field(**_BASE),
    "new_tokens": Field(**_BASE),
    "batch_size": _count(stored=int, **_BASE),
    "dtype": _line(stored=str, csv="text", **_BASE),
    "mode": _line(stored=str, csv="text", **_BASE),
    "attn": _line(csv="text", **_BASE),
    "device": Field(**_BASE),
    "device_name": _line(csv="text", **_BASE),
    "median_ms": _time(stored=float, **_BASE),
    "p10_ms": _time(**_BASE),
    "p90_ms": _time(**_BASE),
    "cv": _amount(**_BASE),
    # the row's CI, its level in ci_level (ci95_ms holds the same, for readers of that name)
    "ci_ms": Field(tuple[Optional[_Time], Optional[_Time]], _CI_WORDS, **_BASE),
    "ci95_ms": Field(tuple[Optional[_Time], Optional[_Time]], _CI_WORDS, stored=tuple[Optional[float], Optional[float]], **_BASE),
    "latency_ms_per_batch": _time(**_BASE),
    "latency_ms_per_sample": _time(**_BASE),
    "throughput_per_s": _amount(stored=float, **_BASE),
    "gflops": _amount(**_BASE),
    "gmacs": _amount(**_BASE),
    "params_m": _amount(**_BASE),
    "peak_mem_alloc_mb": _amount(stored=float, **_BASE),
    "peak_mem_reserved_mb": _amount(stored=float, **_BASE),
    "energy_j": _amount(**_BASE),
    "power_w": _amount(**_BASE),
    "host_canary_us": _amount(**_BASE),  # µs per host canary run (measure.canary.CANARY_KEY); None where none was taken
    "flags": Field(list[_Line], "a list of flag names", stored=list[str], base=True, empty=list),
    "warnings": Field(list[str], "a list of warnings (text)", stored=list[str], base=True, empty=list),
    "env": Field(dict, "a mapping (the environment the row was measured in)", stored=dict, **_BASE),
    # the fields of measured rows, of runs of several processes, and of ab and track runs
    "latency_ms": _time(),
    "host_held_ms": _time(),
    "device_ms": _time(),
    "items_per_s": _amount(stored=float),
    "mfu": _amount(stored=float),
    "mbu": _amount(stored=float),
    "processes": _count(),
    "ci_level": _line(csv="text"),
    "ci_coverage": Field(_Rate, "a coverage above 0 and at most 1"),
    "samples_ms": Field(list[_Time], f"a list of times in ms, each {_TIME_RANGE}", stored=list[Optional[float]]),
    "process_medians_ms": Field(list[Optional[_Time]], f"a list of process medians in ms, each {_TIME_RANGE} or null"),
    "sample_rounds": Field(list[_Index], "a list of round numbers, whole numbers 0 or more"),
    "sample_processes": Field(list[_Index], "a list of process numbers, whole numbers 0 or more"),
    "process_flags": Field(list[Optional[list[_Line]]], "a list of each process's flags (a list of flag names, or null)"),
    "process_sessions": Field(list[Optional[_Line]], "a list of each process's session (text, or null)"),
    "session": _line(),
    "env_key": _line(),
    "version": Field(_VersionShape, f"a mapping whose key and session are {_LINE_WORDS}"),
    # the columns of a CSV that are not fields of a row as built: the study's (report.export) and a version's
    "run_name": _line(csv="text"),
    **{key: _amount() for key in ("tp", "time_total", "flops", "max_memory", "no_params", "no_params_trainable", "power")},
    **{key: _line(csv="text") for key in ("version_name", "revision", "commit", "interpreter")},
}

BASE_FIELDS = tuple(key for key, field in ROW.items() if field.base)

# The fields that hold text, and whole numbers (a CSV's cells are read back by them: report.export)
TEXT_FIELDS = {key for key, field in ROW.items() if field.csv == "text"}
WHOLE_FIELDS = {key for key, field in ROW.items() if field.csv == "whole"}

# The checked fields: key → (type with its range, what a reader is told when it holds something else)
FIELDS: dict[str, tuple[object, str]] = {key: (field.check, field.words) for key, field in ROW.items() if field.check is not None}

# The fields of ``FIELDS`` with their types and ranges, each optional but ``case_id``. A row whose values have other
# types (a median that is text) or lie out of range (a negative or infinite time) is refused at once (``check_row``),
# not met later as a traceback or a false verdict in whatever reads it.
ResultRow = msgspec.defstruct("ResultRow", [("case_id", FIELDS["case_id"][0])]
                              + [(key, Optional[kind], None) for key, (kind, _) in FIELDS.items() if key != "case_id"],
                              module=__name__)

# The fields every reader of a stored row relies on, with their types and not their ranges (a time that is not finite is
# stored as null); the rest is the row's own business. ``sweep.store.decode_row`` holds each stored row to it. A row
# without ``row_format`` (format 0) is read as one with it.
StoredRow = msgspec.defstruct("StoredRow", [(key, field.stored) for key, field in ROW.items() if field.stored is not None and field.required]
                              + [(key, Optional[field.stored], None) for key, field in ROW.items()
                                 if field.stored is not None and not field.required],
                              module=__name__)


def new_row(**values) -> dict:
    """A new row: every base field (``BASE_FIELDS``, in their order) with its value in ``values`` or its empty one, and
    ``row_format`` this format. KeyError for a key of ``values`` that is not a base field: a key every row has is
    declared in ``ROW`` first."""
    unknown = [key for key in values if key not in ROW or not ROW[key].base or key == FORMAT_KEY]
    if unknown:
        raise KeyError(f"not a base field of a result row (records.row.ROW): {', '.join(unknown)}")
    row = {key: values[key] if key in values else ROW[key].empty() for key in BASE_FIELDS}
    row[FORMAT_KEY] = ROW_FORMAT
    return row


def row_format(row: dict) -> int:
    """A row's format: its ``row_format``, 0 for a row without one (written before rows carried it) or a damaged one that
    is no whole number 0 or more (``check_row`` names that damage)."""
    value = row.get(FORMAT_KEY)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def row_version(row: dict) -> dict:
    """A row's ``version`` (which revision of an ab or track run wrote it); {} for none, or for a damaged one that is no
    mapping (compare's ``check_row`` names that damage; the store's, the report's and the regressions' readers only need
    the mapping)."""
    version = row.get("version")
    return version if isinstance(version, dict) else {}


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
