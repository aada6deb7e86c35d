"""Result rows as JSON lines and as CSV (the seed's columns first, then perflab's own).

The seed columns, and what they hold here (TokenReductionPT's speed_test.py printed the same names):

- run_name: model, input size, batch size, dtype, mode (and keep rates), joined by "_".
- tp: images per second, from the median batch latency.
- latency_ms: milliseconds per *batch* (the median). The seed labelled it ms/img; it was per batch there too.
- time_total: minutes spent in the timed loop (the seed printed minutes).
- flops: GMACs per image. The seed's column held MACs under the name "flops"; perflab's ``gflops``
  column holds real FLOPs (2 per multiply-add) and ``gmacs`` the MACs.
- max_memory: peak memory reserved by PyTorch's allocator during the timed loop, MiB (the seed read the
  same counter, but over its whole run, including model load and the FLOP count).
- no_params, no_params_trainable: parameters, millions.
- power: mean board power during the timed loop, W, from the energy counter (the seed sampled power
  during warm-up only). Empty when not measured.

Of perflab's own columns, ``host_canary_us`` is the host canary around the timed loop (the faster of the
readings before and after it, µs per run of a fixed CPU micro-workload, ``perflab.measure.canary``; lower
is a faster host), empty for rows without one.
"""

from __future__ import annotations

import csv
import functools
import io
import itertools
import json
import math
import re
import sys
from typing import Annotated, Iterable, Optional

import msgspec

SEED_COLUMNS = ["run_name", "tp", "latency_ms", "time_total", "flops", "max_memory", "no_params", "no_params_trainable", "power"]

PERFLAB_COLUMNS = [
    "case_id", "status", "model", "method", "keep_rate", "reduction_loc", "tokens", "input_size", "batch_size",
    "dtype", "mode", "attn", "device_name", "median_ms", "p10_ms", "p90_ms", "cv", "ci95_low_ms", "ci95_high_ms",
    "latency_ms_per_batch", "latency_ms_per_sample", "throughput_per_s", "gflops", "gmacs", "params_m",
    "peak_mem_alloc_mb", "peak_mem_reserved_mb", "energy_j", "power_w", "host_canary_us", "flags", "message",
    "ci_level", "processes", "process_medians_ms", "host_held_ms", "device_ms",
    "ci_coverage",  # what the CI may claim: 0.95 from 5 units or more (ci95_low_ms/ci95_high_ms are named for one more release)
    "version_name", "revision", "commit", "interpreter",  # ab and track: the row's version (A, B or the revision as given)
]
# Columns read back as text, and as whole numbers (read_rows); the others are numbers, or empty for none.
TEXT_COLUMNS = {"run_name", "case_id", "status", "model", "method", "dtype", "mode", "attn", "device_name", "message", "ci_level",
                "version_name", "revision", "commit", "interpreter"}
INT_COLUMNS = {"input_size", "batch_size", "processes"}
LIST_COLUMNS = {"keep_rate": float, "reduction_loc": int, "tokens": int, "flags": str, "process_medians_ms": float}


def run_name(row: dict) -> str:
    parts = [row["model"]]
    if row.get("keep_rate"):
        parts.append("kr" + "-".join(f"{r:g}" for r in row["keep_rate"]) + "@" + "-".join(map(str, row["reduction_loc"])))
    parts += [str(row["input_size"]), f"bs{row['batch_size']}", row["dtype"], row["mode"].replace(":", "-")]
    return "_".join(parts)


def seed_values(row: dict) -> dict:
    ok = row.get("status") == "ok"
    timed_s = row.get("timed_s")
    return {
        "run_name": run_name(row),
        "tp": _num(row.get("throughput_per_s")) if ok else None,
        "latency_ms": _num(row.get("latency_ms_per_batch")) if ok else None,
        "time_total": _num(timed_s / 60.0) if ok and timed_s is not None else None,
        "flops": _num(row.get("gmacs")),
        "max_memory": _num(row.get("peak_mem_reserved_mb")),
        "no_params": _num(row.get("params_m")),
        "no_params_trainable": _num(row.get("params_trainable_m")),
        "power": _num(row.get("power_w")),
    }


def perflab_values(row: dict) -> dict:
    values = {k: row.get(k) for k in PERFLAB_COLUMNS}
    ci = row.get("ci95_ms") or [None, None]
    values["ci95_low_ms"], values["ci95_high_ms"] = ci
    for key in LIST_COLUMNS:
        v = row.get(key)
        values[key] = " ".join(map(str, v)) if v else ""
    version = row.get("version") if isinstance(row.get("version"), dict) else None
    if version is not None:  # a stored row of ab or track (a CSV read back holds these columns themselves)
        values.update(version_name=version.get("name"), revision=version.get("revision"), commit=version.get("commit"),
                      interpreter=version.get("python"))
    return values


def to_csv(rows: Iterable[dict]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(SEED_COLUMNS + PERFLAB_COLUMNS)
    for row in rows:
        seed, own = seed_values(row), perflab_values(row)
        writer.writerow([_cell(seed[c]) for c in SEED_COLUMNS] + [_cell(own[c]) for c in PERFLAB_COLUMNS])
    return buf.getvalue()


def to_json_lines(rows: Iterable[dict]) -> str:
    return "".join(json.dumps(_jsonable(row), sort_keys=False) + "\n" for row in rows)


def write_rows(rows: list[dict], path) -> None:
    text = to_csv(rows) if str(path).endswith(".csv") else to_json_lines(rows)
    with open(path, "w") as f:
        f.write(text)


def read_rows(path) -> list[dict]:
    """The rows of a file ``write_rows`` wrote (``bench --out``): CSV (by its ``.csv`` name) or JSON lines. PerflabError,
    one line naming the file, the line and the field, for a file that is missing or not such rows: a value of another
    type or out of its range (``check_row``), a CSV cell past csv's limit, JSON nested past ``MAX_JSON_DEPTH``, NaN or
    Infinity. CSV rows hold the CSV's columns only (``ci95_ms`` rebuilt from its two columns); JSON lines hold the
    whole rows."""
    from perflab.errors import PerflabError

    try:
        text = open(path).read()
    except FileNotFoundError:
        raise PerflabError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PerflabError(f"{path}: cannot read it ({getattr(exc, 'strerror', None) or exc})") from None
    rows = _csv_rows(text, path) if str(path).endswith(".csv") else _json_rows(text, path)
    if not rows:
        raise PerflabError(f"{path}: holds no result rows")
    return rows


MAX_JSON_DEPTH = 32  # a result row nests 3 deep (version, process_flags); a line past this is refused before it is decoded


def _json_rows(text: str, path) -> list[dict]:
    from perflab.errors import PerflabError

    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}, line {number}"
        depth = json_depth(line)
        if depth > MAX_JSON_DEPTH:
            raise PerflabError(f"{where}: JSON nested {depth} deep; a result row nests at most {MAX_JSON_DEPTH} deep")
        constants: list[str] = []  # NaN, Infinity, -Infinity: Python's json reads them, JSON has none
        try:
            row = json.loads(line, parse_constant=lambda name: constants.append(name) or float(name))
        except ValueError:
            raise PerflabError(f"{where}: not JSON (expected one result row per line, as bench --out writes)") from None
        if not isinstance(row, dict) or "case_id" not in row:
            raise PerflabError(f"{where}: not a perflab result row (no case_id)")
        rows.append(check_row(row, where))  # names the field of a NaN or Infinity among those compare reads
        if constants:
            raise PerflabError(f"{where}: holds {constants[0]}, which JSON does not allow (a result row's numbers are finite)")
    return rows


def json_depth(text: str) -> int:
    """How deep the arrays and objects of JSON ``text`` nest (brackets inside strings not counted), read without
    decoding it: a line nested 100,000 deep costs its length, not Python's recursion limit."""
    brackets = re.sub(r'"(?:[^"\\]|\\.)*"|[^][{}]+', "", text)
    return max(itertools.accumulate(1 if c in "[{" else -1 for c in brackets), default=0)


# What each field of a result row holds, as the readers of rows (compare, the regressions' ratios) take it. A row is a
# measurement: its times are finite, positive and within what a timer can read, so a ratio of two of them is finite.
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


class _VersionShape(msgspec.Struct):
    key: Optional[_Line] = None
    session: Optional[_Line] = None


class _CaseShape(msgspec.Struct):
    model: Optional[_Line] = None


_FIELDS: dict[str, tuple[object, str]] = {
    **{key: (_Line, _LINE_WORDS) for key in TEXT_COLUMNS | {"label", "session", "env_key"}},
    "case_id": (Annotated[_Line, msgspec.Meta(min_length=1)], f"non-empty {_LINE_WORDS}"),
    "message": (str, "text"),  # a failed case's own words, whatever a library printed; compare shows its status, not these
    **{key: (_Time, _TIME_WORDS) for key in ("median_ms", "p10_ms", "p90_ms", "latency_ms", "latency_ms_per_batch",
                                              "latency_ms_per_sample", "host_held_ms", "device_ms")},
    **{key: (_Amount, _AMOUNT_WORDS) for key in ("cv", "throughput_per_s", "gflops", "gmacs", "params_m", "peak_mem_alloc_mb",
                                                 "peak_mem_reserved_mb", "energy_j", "power_w", "host_canary_us", "tp",
                                                 "time_total", "flops", "max_memory", "no_params", "no_params_trainable", "power")},
    **{key: (_Count, "a whole number, 1 or more") for key in INT_COLUMNS},
    "ci95_ms": (tuple[Optional[_Time], Optional[_Time]], f"[low, high] in ms, each {_TIME_RANGE}"),
    "ci_ms": (tuple[Optional[_Time], Optional[_Time]], f"[low, high] in ms, each {_TIME_RANGE}"),  # ci95_ms's new name
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
}


@functools.cache
def _typed_row():
    """The fields of ``_FIELDS`` with their types and ranges, each optional but ``case_id``: a row whose values have
    other types (a median that is text) or lie out of range (a negative or infinite time) is refused at once, not met
    later as a traceback or a false verdict in whatever reads it."""
    fields = [(key, Optional[kind], None) for key, (kind, _) in _FIELDS.items() if key != "case_id"]
    return msgspec.defstruct("ResultRow", [("case_id", _FIELDS["case_id"][0])] + fields)


def check_row(row: dict, where: str) -> dict:
    """``row`` where each of its fields holds what ``_FIELDS`` says; PerflabError naming ``where`` (the file and line, or
    the store and case), the field and its value otherwise."""
    from perflab.errors import PerflabError, show

    try:
        msgspec.convert(row, _typed_row())
    except (msgspec.ValidationError, UnicodeEncodeError) as exc:
        if isinstance(exc, UnicodeEncodeError):  # msgspec encodes text to match its pattern, and cannot encode a lone surrogate
            path = next(filter(None, (_unencodable(row[key], key) for key in _FIELDS if key in row)), "")
        else:
            path = str(exc).partition(" - at `$")[2].rstrip("`").lstrip(".")
        key = re.match(r"[^.\[]*", path).group(0)
        if key not in _FIELDS:
            raise PerflabError(f"{where}: not a perflab result row ({exc})") from None
        raise PerflabError(f"{where}: {path}: {show(_at(row, path))}: expected {_FIELDS[key][1]}") from None
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


def _csv_rows(text: str, path) -> list[dict]:
    from perflab.errors import PerflabError

    reader = csv.DictReader(io.StringIO(text))
    rows: list[dict] = []
    line = 0  # the last line read: the header's, then each record's
    try:
        if "case_id" not in (reader.fieldnames or []):
            raise PerflabError(f"{path}: not a perflab results CSV (no case_id column)")
        line = 1
        for line, record in enumerate(reader, 2):
            rows.append(_csv_row(record, f"{path}, line {line}"))
    except csv.Error as exc:  # raised reading the line after ``line``
        too_long = "field larger than field limit" in str(exc)
        why = f"a cell longer than {csv.field_size_limit() // 1024} KiB" if too_long else f"not CSV ({exc})"
        raise PerflabError(f"{path}, line {line + 1}: {why}; expected the rows bench --out writes") from None
    return rows


def _csv_row(record: dict, where: str) -> dict:
    from perflab.errors import PerflabError, show

    row = {}
    for key, cell in record.items():
        if key is None:
            raise PerflabError(f"{where}: more cells than columns")
        try:
            row[key] = _read_cell(key, cell or "")
        except ValueError:
            raise PerflabError(f"{where}: column {key}: {show(cell)} is not a number") from None
    low, high = row.pop("ci95_low_ms", None), row.pop("ci95_high_ms", None)
    row["ci95_ms"] = [low, high] if low is not None and high is not None else None
    return check_row(row, where)


def _read_cell(key: str, cell: str):
    if key in LIST_COLUMNS:
        return [LIST_COLUMNS[key](v) for v in cell.split()]
    if key in TEXT_COLUMNS:
        return cell or None
    if cell == "":
        return None
    return int(cell) if key in INT_COLUMNS else float(cell)


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _num(value):
    return None if value is None else float(value)


def _cell(value):
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return value
