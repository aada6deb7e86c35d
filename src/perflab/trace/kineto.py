"""Load a Kineto trace (torch.profiler's ``export_chrome_trace``: .json or .json.gz) into a Trace.

What is read: GPU activities (``cat`` kernel, gpu_memcpy, gpu_memset), the CUDA API calls that launch
them (``cuda_runtime``: cudaLaunchKernel, cudaLaunchKernelExC, cudaMemcpyAsync, cudaGraphLaunch, ...;
``cuda_driver``: cuLaunchKernel(Ex), used by Triton and by cuBLAS's nvjet GEMMs on Hopper), and the CPU
annotations (``user_annotation``: record_function ranges, ProfilerStep#N). ``cuda_sync`` events are not
GPU activity and are skipped; so are cpu_op, python_function, flow and metadata events.

Timestamps are µs with three decimals ("ts": 4382075239980.014). float64 cannot hold that exactly, so
the decimal text is turned into integer ns (integer part × 1000 + the three fraction digits).

Two readers, one result:

- The fast reader goes through the file in chunks (memory-mapped for a plain file, whose pages it hands
  back as it goes, so that the resident set stays small; decompressed chunk by chunk for .gz) and
  extracts the fields with compiled regular expressions, relying on Kineto's fixed layout: every event
  starts with ``"ph"`` and its keys come in the order ``"ph", "cat", "name", "pid", "tid", "ts", "dur",
  "args"``. It checks itself: every event of a category it needs must have matched in full (else that
  chunk is re-read with an escape-aware pattern, and if that fails too, the whole file goes to the JSON
  reader); the header must parse as JSON; and the file must end as a complete JSON document (a
  truncated file is an error). It does not validate every byte between the events it reads.
- The JSON reader (``json.load``) handles any valid Chrome trace, in any layout; it is exact too
  (numbers are parsed from their text), but it needs several times the file's size in memory.
"""

from __future__ import annotations

import gzip
import json
import mmap
import operator
import re
import zlib
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from perflab.errors import PerflabError
from perflab.trace.build import RawEvents, build_trace
from perflab.trace.schema import Trace

GPU_CATEGORIES = {"kernel": 0, "gpu_memcpy": 1, "gpu_memset": 2}  # value: index into schema.KINDS
API_CATEGORIES = ("cuda_runtime", "cuda_driver")
RANGE_CATEGORY = "user_annotation"

CHUNK_BYTES = 32 << 20
HEAD_BYTES = 1 << 20

# One event's fields, Kineto layout. Groups: category and name (one key), "pid..dur" (4 numbers),
# correlation, "grid...block" (6 numbers). Everything after the category is optional, so that an event of a wanted
# category whose fields are laid out differently still matches (with empty groups) and is detected.
_CATS = rb"(?:kernel|gpu_memcpy|gpu_memset|cuda_runtime|cuda_driver|user_annotation)"
_FIELDS = (
    rb'"pid": (\d+, "tid": \d+,\s+"ts": \d+\.\d{3}, "dur": \d+\.\d{3}),\s+"args": \{\s*'
    rb'(?:(?:"External id": \d+,\s*)?(?:"cbid": \d+, |(?:"queued": \d+, )?"device": \d+, "context": \d+,\s*"stream": \d+, )'
    rb'"correlation": (\d+)'
    # the first "[" after the correlation, within the args, opens the grid
    rb'(?:,[^\[}]*\[(\d+, \d+, \d+\],\s*"block": \[\d+, \d+, \d+)\])?)?'
)
# Kineto's own indentation, spelled out: literal text matches faster than \s+ (other whitespace still
# parses, through the careful pattern)
_KINETO_FIELDS = (
    _FIELDS.replace(rb',\s+"ts"', b',\n    "ts"')
    .replace(rb'),\s+"args": \{\s*', b'),\n    "args": {\n      ')
    .replace(rb'"External id": \d+,\s*', rb'"External id": \d+,      ')
    .replace(rb'"context": \d+,\s*"stream"', rb'"context": \d+,      "stream"')
    .replace(rb'(?:,[^\[}]*\[(\d+, \d+, \d+\],\s*"block"',
             rb'(?:,      "registers per thread": \d+,      "shared memory": \d+,      "blocks per SM": [\d.]+,      '
             rb'"warps per SM": [\d.]+,      "grid": \[(\d+, \d+, \d+\],      "block"')
)
# fast: a name is anything up to the next quote (an escaped quote makes the event incomplete, and the
# chunk is re-read with the careful pattern, which knows JSON escapes and any whitespace)
# (The patterns start at the "X" of "ph": "X": a rarer first byte than '"' makes the scan for it faster.)
FAST_EVENT = re.compile(rb'X", "cat": "(' + _CATS + rb'(?:", "name": "[^"]*)?)(?:", ' + _KINETO_FIELDS + rb")?")
CAREFUL_EVENT = re.compile(rb'X", "cat": "(' + _CATS + rb'(?:", "name": "(?:[^"\\]|\\.)*)?)(?:", ' + _FIELDS + rb")?")
TRACE_EVENTS = re.compile(rb'"traceEvents"\s*:\s*\[')
KINETO_FIRST_EVENT = re.compile(rb'\s*(?:\]|\{\s*"(?:ph|name)": ")')
# digits stay, everything else becomes a separator, and the decimal point goes: "12.345" → 12345 (ns)
_DIGITS_ONLY = bytes(c if 48 <= c <= 57 else 32 for c in range(256))
EVENT_START = b'"ph"'
PAGE = mmap.PAGESIZE
# The patterns above only see events written "ph": "X", "cat": "... on one line. Each chunk's first
# complete event ("X") must be written so, else the file is in another layout (newer torch writes one
# key per line) and would be read as empty: the JSON reader takes it instead.
ANY_COMPLETE_EVENT = re.compile(rb'"ph"\s*:\s*"X"')
KINETO_COMPLETE_EVENT = b'"ph": "X", "cat": "'


class LayoutMismatch(Exception):
    """The file is not in the layout the fast reader relies on; use the JSON reader."""


def load_kineto(path: str | Path) -> Trace:
    path = Path(path)
    try:
        raw, meta = read_fast(path)
    except LayoutMismatch as why:
        raw, meta = read_json(path)
        meta["fast_path"] = f"not used: {why}"
    return build_trace(raw, meta)


# --- the fast reader ------------------------------------------------------------------------------------

def read_fast(path: Path) -> tuple[RawEvents, dict[str, Any]]:
    gz = _is_gzip(path)
    with _open(path, gz) as f:
        head = _read(f, HEAD_BYTES, path)
    meta, events_at = _parse_header(head, path)
    if events_at is None:
        _no_events(path)
    acc = _Accumulator()
    tail = _scan_gzip(path, events_at, acc) if gz else _scan_mapped(path, events_at, acc)
    _check_tail(tail, path)
    if not acc.saw_event:
        _no_events(path)
    meta["fast_path"] = "used"
    return acc.raw_events(), meta


def _no_events(path: Path):
    raise PerflabError(f"{path}: the trace has no events (empty traceEvents); profile at least one step with CUDA activities")


def _scan_mapped(path: Path, start: int, acc: "_Accumulator") -> bytes:
    """Parse a plain file through a read-only mapping, chunk by chunk; returns the text from the last event on."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        size = len(mapped)
        acc.saw_event = mapped.find(EVENT_START, start) >= 0
        pos = start
        while pos < size:
            end = _chunk_end(mapped, pos, size)
            acc.parse(mapped, pos, end)
            # the parsed pages are not needed again: drop them from this process (they stay in the page cache)
            first_page, last_page = pos // PAGE * PAGE, end // PAGE * PAGE
            if last_page > first_page and hasattr(mapped, "madvise"):
                mapped.madvise(mmap.MADV_DONTNEED, first_page, last_page - first_page)
            pos = end
        last = mapped.rfind(EVENT_START, start)
        return mapped[last:] if last >= 0 else mapped[start:]


def _chunk_end(mapped: mmap.mmap, pos: int, size: int) -> int:
    """The start of the last event that begins in [pos, pos + CHUNK_BYTES), or the end of the file."""
    end = pos + CHUNK_BYTES
    while end < size:
        cut = mapped.rfind(EVENT_START, pos + 1, end)
        if cut > pos:
            return cut
        end += CHUNK_BYTES  # one event longer than a chunk: widen
    return size


def _scan_gzip(path: Path, start: int, acc: "_Accumulator") -> bytes:
    """Parse a .gz file chunk by chunk as it decompresses; returns the text from the last event on."""
    carry = b""
    with _open(path, True) as f:
        f.seek(start)
        while True:
            data = _read(f, CHUNK_BYTES, path)
            if not data:
                break
            first = data.find(EVENT_START)
            if first < 0:
                carry += data
                continue
            acc.saw_event = True
            if carry:
                acc.parse(carry + data[:first])
            last = data.rfind(EVENT_START)
            acc.parse(data, first, last)
            carry = data[last:]
    acc.parse(carry)  # the last event, and the closing brackets
    return carry


def _is_gzip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def _open(path: Path, gz: bool) -> BinaryIO:
    return gzip.open(path, "rb") if gz else open(path, "rb")


def _read(f: BinaryIO, size: int, path: Path) -> bytes:
    try:
        return f.read(size)
    except (EOFError, OSError, zlib.error) as exc:
        raise PerflabError(f"{path}: truncated or corrupt gzip file ({exc})") from None


def _parse_header(head: bytes, path: Path) -> tuple[dict[str, Any], int | None]:
    """The top-level keys before "traceEvents" (device properties, base time) and where the events start."""
    found = TRACE_EVENTS.search(head)
    if found is None:
        raise LayoutMismatch("no \"traceEvents\" in the first MiB")
    if not KINETO_FIRST_EVENT.match(head, found.end()):
        raise LayoutMismatch("the first event is not in Kineto's layout")
    try:
        header = json.loads(head[: found.start()].rstrip().rstrip(b",") + b"}")
    except ValueError as exc:
        raise LayoutMismatch(f"the header is not Kineto's ({exc})") from None
    if not isinstance(header, dict):
        raise LayoutMismatch("the header is not a JSON object")
    meta = _meta_from_header(header, path)
    rest = head[found.end():].lstrip()
    if rest.startswith(b"]"):
        return meta, None
    return meta, found.end()


def _meta_from_header(header: dict[str, Any], path: Path) -> dict[str, Any]:
    return {
        "format": "kineto",
        "path": str(path),
        "devices": header.get("deviceProperties") or [],
        "base_time_ns": header.get("baseTimeNanoseconds"),
        "cuda_runtime_version": header.get("cuda_runtime_version"),
        "cuda_driver_version": header.get("cuda_driver_version"),
        "distributed": header.get("distributedInfo"),
    }


# what each event kind becomes: KINDS index for GPU activities, then these
API_EVENT, RANGE_EVENT = 3, 4
_EVENT_KIND = {b"kernel": 0, b"gpu_memcpy": 1, b"gpu_memset": 2, b"cuda_runtime": API_EVENT, b"cuda_driver": API_EVENT,
               b"user_annotation": RANGE_EVENT}
_NAME_SEPARATOR = b'", "name": "'


class _Accumulator:
    """Collects the columns of the parsed events, chunk by chunk.

    The regex captures category and name as one key (``kernel", "name": "...``): one object per event
    instead of two, and each distinct key is split and decoded once.
    """

    def __init__(self):
        self.keys: dict[bytes, int] = {}
        self.key_kind: list[int] = []
        self.key_name: list[int] = []
        self.names: dict[bytes, int] = {}
        self.dims: dict[bytes, int] = {}
        self.dims_values: list[list[int]] = []
        self.gpu: list[dict] = []
        self.api: list[dict] = []
        self.ranges: list[dict] = []
        self.saw_event = False

    def parse(self, buf: bytes, start: int = 0, end: int | None = None) -> None:
        end = len(buf) if end is None else end
        first = ANY_COMPLETE_EVENT.search(buf, start, end)
        if first is not None and buf[first.start(): first.start() + len(KINETO_COMPLETE_EVENT)] != KINETO_COMPLETE_EVENT:
            raise LayoutMismatch("events are not written in Kineto's one-line layout")
        rows = FAST_EVENT.findall(buf, start, end)
        if not rows:
            return
        parsed = self._parse_columns(_transpose(rows))
        if parsed is None or not parsed[-1]:
            # an event that did not match in full, or a kernel whose grid was not found where Kineto puts it
            careful = self._parse_columns(_transpose(CAREFUL_EVENT.findall(buf, start, end)))
            if careful is None:
                raise LayoutMismatch("some kernel, API or annotation events are not in Kineto's layout")
            parsed = careful  # (kernels still without a grid there have none in the file: grid unknown)
        self._add(*parsed[:-1])

    def _parse_columns(self, columns):
        """(kind, name, values, correlation, dims) arrays and whether every kernel had its grid, or None
        if an event did not match in full."""
        keys, numbers, correlations, dims = columns
        if b"" in numbers:
            return None
        table = self.keys
        for key in set(keys).difference(table):
            table[key] = len(table)
        if len(table) > len(self.key_kind):
            self._new_keys()
        codes = np.fromiter(map(table.__getitem__, keys), np.int64, len(keys))
        kind = np.asarray(self.key_kind, dtype=np.int64)[codes]
        is_range = kind == RANGE_EVENT
        n_ranges = int(is_range.sum())
        if correlations.count(b"") != n_ranges:
            return None
        n = len(keys)
        values = _ints(numbers, 4 * n).reshape(n, 4)  # pid, tid, ts, dur (ns)
        correlation = np.full(n, -1, dtype=np.int64)
        correlation[~is_range] = _ints(correlations, n - n_ranges)
        name = np.asarray(self.key_name, dtype=np.int64)[codes]
        # only kernels have a grid, so every kernel has one when the counts agree
        dims_complete = len(dims) - dims.count(b"") == int((kind == 0).sum())
        return kind, name, values, correlation, self._dims(dims), dims_complete

    def _dims(self, dims: list[bytes]) -> np.ndarray:
        """(n, 6) grid and block; a kernel's few distinct launch shapes are parsed once each."""
        table = self.dims
        for text in set(dims).difference(table):
            table[text] = len(table)
            self.dims_values.append(_ints([text], 6).tolist() if text else [-1] * 6)
        codes = np.fromiter(map(table.__getitem__, dims), np.int64, len(dims))
        return np.asarray(self.dims_values, dtype=np.int64).reshape(-1, 6)[codes]

    def _new_keys(self) -> None:
        for key in list(self.keys)[len(self.key_kind):]:
            category, _, name = key.partition(_NAME_SEPARATOR)
            self.key_kind.append(_EVENT_KIND[category])
            self.key_name.append(self.names.setdefault(name, len(self.names)))

    def _add(self, kind, name, values, correlation, dims) -> None:
        for gpu_kind in range(3):
            mask = kind == gpu_kind
            if mask.any():
                self.gpu.append(self._gpu_rows(mask, gpu_kind, values, name, correlation, dims))
        is_api = kind == API_EVENT
        if is_api.any():
            self.api.append(_columns(is_api, values, name, correlation))
        is_range = kind == RANGE_EVENT
        if is_range.any():
            self.ranges.append(_columns(is_range, values, name, None))

    @staticmethod
    def _gpu_rows(mask, kind, values, name, correlation, grid_block) -> dict:
        rows = _columns(mask, values, name, correlation)
        n = len(rows["name"])
        rows.update(kind=np.full(n, kind, dtype=np.int64), device=rows["process"], stream=rows["tid"], dims=grid_block[mask])
        rows["process"] = np.zeros(n, dtype=np.int64)  # one process per Kineto trace
        return rows

    def raw_events(self) -> RawEvents:
        return RawEvents(
            names=[_decode_name(name) for name in self.names],
            gpu=_concat(self.gpu, GPU_KEYS),
            api=_concat(self.api, API_KEYS),
            ranges=_concat(self.ranges, RANGE_KEYS),
            correlation_per_process=False,
        )


def _transpose(rows: list[tuple[bytes, ...]]) -> tuple[list[bytes], ...]:
    """Columns of findall's rows (itemgetter per column: several times faster than zip(*rows) here)."""
    if not rows:
        return ([], [], [], [])
    return tuple(list(map(operator.itemgetter(i), rows)) for i in range(len(rows[0])))


GPU_KEYS = ("name", "kind", "process", "device", "stream", "start_ns", "dur_ns", "correlation", "dims")
API_KEYS = ("name", "process", "tid", "start_ns", "dur_ns", "correlation")
RANGE_KEYS = ("name", "process", "tid", "start_ns", "dur_ns")


def _ints(texts, expected: int) -> np.ndarray:
    if expected == 0:  # (numpy parses a blank string as one number)
        return np.zeros(0, dtype=np.int64)
    values = np.fromstring(b" ".join(texts).translate(_DIGITS_ONLY, b"."), dtype=np.int64, sep=" ")
    if len(values) != expected:
        raise LayoutMismatch("a number field did not parse")
    return values


def _columns(mask: np.ndarray, values: np.ndarray, name_codes: np.ndarray, correlation: np.ndarray | None) -> dict:
    rows = {
        "name": name_codes[mask],
        "process": values[mask, 0],
        "tid": values[mask, 1],
        "start_ns": values[mask, 2],
        "dur_ns": values[mask, 3],
    }
    if correlation is not None:
        rows["correlation"] = correlation[mask]
    return rows


def _concat(blocks: list[dict], keys: tuple[str, ...]) -> dict[str, np.ndarray]:
    if not blocks:
        return {k: (np.zeros((0, 6), dtype=np.int64) if k == "dims" else np.zeros(0, dtype=np.int64)) for k in keys}
    return {k: np.concatenate([b[k] for b in blocks]) for k in keys}


def _decode_name(name: bytes) -> str:
    if b"\\" in name:
        return json.loads(b'"' + name + b'"')
    return name.decode("utf-8", errors="replace")


def _check_tail(tail: bytes, path: Path) -> None:
    """The text from the last event's "ph" key on must close the event list and the document."""
    try:
        json.loads(b'{"traceEvents": [{' + tail)
    except ValueError:
        raise PerflabError(f"{path}: invalid JSON: the file ends before the trace is complete (truncated?)") from None


# --- the JSON reader ----------------------------------------------------------------------------------

def read_json(path: Path) -> tuple[RawEvents, dict[str, Any]]:
    document = _load_json(path)
    if isinstance(document, list):  # the Chrome trace format also allows a bare list of events
        document = {"traceEvents": document}
    if not isinstance(document, dict) or not isinstance(document.get("traceEvents"), list):
        raise PerflabError(f"{path}: not a Kineto/Chrome trace: no \"traceEvents\" list")
    events = document["traceEvents"]
    meta = _meta_from_header(document, path)
    if not events:
        _no_events(path)
    names: dict[str, int] = {}
    gpu = {k: [] for k in GPU_KEYS}
    api = {k: [] for k in API_KEYS}
    ranges = {k: [] for k in RANGE_KEYS}
    for index, event in enumerate(events):
        try:
            _json_event(event, names, gpu, api, ranges, path)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise PerflabError(f"{path}: event {index} is malformed ({type(exc).__name__}: {exc})") from None
    raw = RawEvents(
        names=list(names),
        gpu={k: (np.asarray(v, dtype=np.int64).reshape(-1, 6) if k == "dims" else np.asarray(v, dtype=np.int64)) for k, v in gpu.items()},
        api={k: np.asarray(v, dtype=np.int64) for k, v in api.items()},
        ranges={k: np.asarray(v, dtype=np.int64) for k, v in ranges.items()},
        correlation_per_process=False,
    )
    return raw, meta


def _json_event(event: Any, names: dict[str, int], gpu: dict, api: dict, ranges: dict, path: Path) -> None:
    if not isinstance(event, dict) or event.get("ph") != "X":
        return
    cat = event.get("cat")
    if cat in GPU_CATEGORIES:
        _json_gpu_event(event, GPU_CATEGORIES[cat], names, gpu, path)
    elif cat in API_CATEGORIES:
        args = event.get("args") or {}
        if "correlation" in args:
            correlation = int(args["correlation"])
            _json_common(event, names, api, path)
            api["correlation"].append(correlation)
    elif cat == RANGE_CATEGORY:
        _json_common(event, names, ranges, path)


def _load_json(path: Path) -> Any:
    gz = _is_gzip(path)
    try:
        with _open(path, gz) as f:
            # floats stay text, so that timestamps become exact integer ns
            return json.load(f, parse_float=str)
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise PerflabError(f"{path}: truncated or corrupt gzip file ({exc})") from None
    except UnicodeDecodeError as exc:
        raise PerflabError(f"{path}: not a JSON text file ({exc.reason})") from None
    except json.JSONDecodeError as exc:
        raise PerflabError(f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg} (truncated?)") from None


def _json_common(event: dict, names: dict[str, int], columns: dict[str, list], path: Path) -> None:
    columns["name"].append(names.setdefault(str(event.get("name", "")), len(names)))
    columns["process"].append(_int_id(event.get("pid")))
    columns["tid"].append(_int_id(event.get("tid")))
    columns["start_ns"].append(us_text_to_ns(event.get("ts"), path))
    columns["dur_ns"].append(us_text_to_ns(event.get("dur", 0), path))


def _json_gpu_event(event: dict, kind: int, names: dict[str, int], gpu: dict[str, list], path: Path) -> None:
    args = event.get("args") or {}
    gpu["name"].append(names.setdefault(str(event.get("name", "")), len(names)))
    gpu["kind"].append(kind)
    gpu["process"].append(0)
    gpu["device"].append(int(args.get("device", _int_id(event.get("pid")))))
    gpu["stream"].append(int(args.get("stream", _int_id(event.get("tid")))))
    gpu["start_ns"].append(us_text_to_ns(event.get("ts"), path))
    gpu["dur_ns"].append(us_text_to_ns(event.get("dur", 0), path))
    gpu["correlation"].append(int(args.get("correlation", -1)))
    grid, block = args.get("grid"), args.get("block")
    known = isinstance(grid, list) and isinstance(block, list) and len(grid) == 3 and len(block) == 3
    gpu["dims"].extend([int(v) for v in grid] + [int(v) for v in block] if known else [-1] * 6)


def _int_id(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return -1


def us_text_to_ns(value: Any, path: Path | str = "the trace") -> int:
    """Exact integer ns from a µs value given as an int or as decimal text ("5983925445894.137")."""
    if isinstance(value, int):
        return value * 1000
    try:
        return int((Decimal(str(value)) * 1000).to_integral_value())
    except (InvalidOperation, ValueError):
        raise PerflabError(f"{path}: a timestamp is not a number: {value!r}") from None
