"""Result rows as JSON lines and as CSV: perflab's CSV (the study's columns first, named for what they hold, then
perflab's own), and the study-shaped CSV (the study's columns alone, under its names).

The study's columns, and what they hold here (TokenReductionPT's speed_test.py printed the same names):

- run_name: model, input size, batch size, dtype, mode (and keep rates), joined by "_".
- tp: images per second, from the median batch latency.
- latency_ms: milliseconds per *batch* (the median). The seed labelled it ms/img; it was per batch there too.
- time_total: minutes spent in the timed loop (the seed printed minutes).
- flops: GMACs per image. The study's column held MACs under the name "flops", so only the study-shaped CSV
  (``--format study-csv``) keeps that name, for the study's own scripts; perflab's CSV names the column ``gmacs``
  (a reader who took "flops" for FLOPs would read half the work: perflab's ``gflops`` column holds real FLOPs, 2 per
  multiply-add).
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
import io
import itertools
import json
import math
import re
from typing import Iterable

from perflab.errors import PerflabError, show
from perflab.records.row import TEXT_FIELDS, WHOLE_FIELDS, check_row

SEED_COLUMNS = ["run_name", "tp", "latency_ms", "time_total", "flops", "max_memory", "no_params", "no_params_trainable", "power"]
# perflab's CSV: the study's columns, each named for what it holds (its "flops" held GMACs)
STUDY_NAMED = {"flops": "gmacs"}

PERFLAB_COLUMNS = [
    "case_id", "status", "model", "method", "keep_rate", "reduction_loc", "tokens", "input_size", "batch_size",
    "dtype", "mode", "attn", "device_name", "median_ms", "p10_ms", "p90_ms", "cv", "ci95_low_ms", "ci95_high_ms",
    "latency_ms_per_batch", "latency_ms_per_sample", "throughput_per_s", "gflops", "params_m",  # gmacs: among the study's
    "peak_mem_alloc_mb", "peak_mem_reserved_mb", "energy_j", "power_w", "host_canary_us", "flags", "message",
    "ci_level", "processes", "process_medians_ms", "host_held_ms", "device_ms",
    "ci_coverage",  # what the CI may claim: 0.95 from 5 units or more (ci95_low_ms/ci95_high_ms are named for one more release)
    "version_name", "revision", "commit", "interpreter",  # ab and track: the row's version (A, B or the revision as given)
]
# Columns read back as lists of these (read_exported_rows); the others as text or whole numbers where the row's field is
# (records.row.TEXT_FIELDS, WHOLE_FIELDS), else as numbers, or empty for none.
LIST_COLUMNS = {"keep_rate": float, "reduction_loc": int, "tokens": int, "flags": str, "process_medians_ms": float}


def run_name(row: dict) -> str:
    if row.get("kind") == "program":  # a side of a program's ab or track (sweep.programs): named by its program
        return str(row.get("label") or row.get("model"))
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


def to_csv(rows: Iterable[dict], study: bool = False) -> str:
    """perflab's CSV: the study's columns named for what they hold (``STUDY_NAMED``), then perflab's own. ``study``: the
    study-shaped CSV, its columns alone under its own names (``flops`` holding GMACs, as its column did)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(SEED_COLUMNS if study else [STUDY_NAMED.get(c, c) for c in SEED_COLUMNS] + PERFLAB_COLUMNS)
    for row in rows:
        seed, own = seed_values(row), perflab_values(row)
        cells = [_cell(seed[c]) for c in SEED_COLUMNS]
        writer.writerow(cells if study else cells + [_cell(own[c]) for c in PERFLAB_COLUMNS])
    return buf.getvalue()


def to_json_lines(rows: Iterable[dict]) -> str:
    return "".join(json.dumps(_jsonable(row), sort_keys=False) + "\n" for row in rows)


def write_rows(rows: list[dict], path) -> None:
    text = to_csv(rows) if str(path).endswith(".csv") else to_json_lines(rows)
    with open(path, "w") as f:
        f.write(text)


def read_exported_rows(path) -> list[dict]:
    """The rows of a file ``write_rows`` wrote (``bench --out``): CSV (by its ``.csv`` name) or JSON lines. PerflabError,
    one line naming the file, the line and the field, for a file that is missing or not such rows: a value of another
    type or out of its range (``check_row``), a CSV cell past csv's limit, JSON nested past ``MAX_JSON_DEPTH``, NaN or
    Infinity. CSV rows hold the CSV's columns only (``ci95_ms`` rebuilt from its two columns); JSON lines hold the
    whole rows."""
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


def _csv_rows(text: str, path) -> list[dict]:
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
    if key in TEXT_FIELDS:
        return cell or None
    if cell == "":
        return None
    return int(cell) if key in WHOLE_FIELDS else float(cell)


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
