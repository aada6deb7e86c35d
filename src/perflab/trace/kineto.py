"""Load a Kineto / Chrome trace (torch.profiler's ``export_chrome_trace``; .json or .json.gz) into a Trace.

What is read: GPU activities (``cat`` kernel, gpu_memcpy, gpu_memset), the CUDA API calls that launch
them (``cuda_runtime``: cudaLaunchKernel, cudaMemcpyAsync, cudaGraphLaunch, ...; ``cuda_driver``:
cuLaunchKernel(Ex), used by Triton and by cuBLAS's nvjet GEMMs on Hopper), and the CPU annotations
(``user_annotation``: record_function ranges, ProfilerStep#N). ``cuda_sync`` events are not GPU activity
and are skipped; so are python_function, flow and metadata events. torch's operators (``cpu_op``, with their
``Input Dims`` and ``Input type`` as recorded with ``record_shapes``) are read when asked (``ops=True``): a
trace with no GPU activity is then accounted over its CPU operators (``trace.build``), a user's program's
FLOPs are counted from its operators' shapes (and ``Concrete Inputs``: a convolution's stride, padding, ...), compiled regions are told from eager ones, and a CPU rank's
compute and gloo collectives are read (``trace.cpu_ranks``). Each operator's ``Input Dims``, ``Input
type`` and ``Concrete Inputs`` are decoded here, once per distinct text (``_Arguments``): the ``input_shapes``,
``input_types`` and ``concrete_inputs`` columns hold nested tuples, so nothing downstream parses JSON.

**One reader, any layout.** The JSON is parsed by msgspec (typed decoding into Structs that name only
the fields needed; every other key is skipped in C), so whitespace, key order, escapes, compact or
indented text and .gz make no difference. To keep memory flat the ``traceEvents`` array is decoded in
slices of about ``CHUNK_BYTES``: a slice ends at a ``}, {`` between two events, and msgspec decoding the
slice as an array is what proves the cut lies between two top-level events (a cut inside a string or a
nested value leaves the slice incomplete; the cut then moves to an earlier ``}, {``). The text before
``traceEvents`` is decoded as the document's head, and the last slice together with the document's
closing keys, so the whole file is checked as JSON (a truncated file is an error).

**Exact timestamps.** Kineto writes µs with three decimals ("ts": 4382075239980.014); float64 cannot
hold that exactly, so ``ts``/``dur`` are taken as raw JSON text (``msgspec.Raw``) and turned into integer
ns from their digits, vectorised (``us_texts_to_ns``), whatever their spelling: integers, any number of
decimals, exponents, signs, numeric strings (a tool's floats: "ts": 1000008.0665311092). ns = µs × 1000
rounded half to even, as ``decimal.Decimal`` gives. Only a mantissa of 10**18 or more (19+ significant
digits), a result outside int64 or a string outside that grammar goes through ``Decimal`` one value at a
time (counted in ``meta["times_parsed_one_by_one"]``). A negative duration is an error.

**Several processes.** A file of merged ranks holds several CPU processes and several devices. GPU
events carry the device (``args.device``, else ``pid``) but not the process that launched them, and each
process numbers its correlation ids from the same start. When ids collide across processes, each device
is assigned to the process whose launch calls precede its activities (see ``_assign_processes``) and
activities link only to that process's calls. Two ranks that each call their GPU device 0 (one visible
device per rank) cannot be told apart once merged into one file: keep one file per rank then, or give
the merged devices distinct ids.
"""

from __future__ import annotations

import collections
import io
import queue
import re
import threading
import zlib
from decimal import MAX_EMAX, MAX_PREC, MIN_EMIN, ROUND_HALF_EVEN, Context, Decimal, InvalidOperation
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import Any, BinaryIO

import msgspec
import numpy as np

from perflab.errors import PerflabError
from perflab.trace.build import RawEvents, build_trace
from perflab.trace.schema import Trace

GPU_CATEGORIES = {"kernel": 0, "gpu_memcpy": 1, "gpu_memset": 2}  # value: index into schema.KINDS
API_CATEGORIES = ("cuda_runtime", "cuda_driver")
RANGE_CATEGORY = "user_annotation"
OP_CATEGORY = "cpu_op"
API_EVENT, RANGE_EVENT, OP_EVENT = 3, 4, 5
_EVENT_KIND = collections.defaultdict(lambda: -1, {**GPU_CATEGORIES, **{c: API_EVENT for c in API_CATEGORIES}, RANGE_CATEGORY: RANGE_EVENT})
_EVENT_KIND_OPS = collections.defaultdict(lambda: -1, {**_EVENT_KIND, OP_CATEGORY: OP_EVENT})

CHUNK_BYTES = 512 << 10  # small slices: their event objects stay in the CPU cache between passes (measured: 16 MiB ~1.5x slower)
MAX_CUT_TRIES = 8  # earlier "}, {" tried when a cut falls inside a string or a nested value
TRACE_EVENTS = re.compile(rb'"traceEvents"\s*:\s*\[')
EVENT_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
BYTE_OFFSET = re.compile(r"\(byte (\d+)\)")

MISSING = msgspec.Raw(b"")  # a key absent from the event


class _Args(msgspec.Struct, gc=False):
    correlation: Any = None
    device: Any = None
    stream: Any = None
    grid: msgspec.Raw = MISSING
    block: msgspec.Raw = MISSING
    input_dims: msgspec.Raw = msgspec.field(default=MISSING, name="Input Dims")  # a cpu_op's, with record_shapes
    input_type: msgspec.Raw = msgspec.field(default=MISSING, name="Input type")
    # the values of its non-tensor arguments, as text ("[2, 2]", "False", "1"; "" for a tensor): a convolution's stride,
    # padding, dilation, groups, whether transposed
    concrete_inputs: msgspec.Raw = msgspec.field(default=MISSING, name="Concrete Inputs")


NO_ARGS = _Args()


class _Event(msgspec.Struct, gc=False):
    # ids are decoded natively; times as their raw JSON text, so that they stay exact
    ph: str = ""
    cat: str = ""
    name: msgspec.Raw = MISSING  # (decoded once per distinct name: most events' names are never needed)
    pid: Any = None
    tid: Any = None
    ts: msgspec.Raw = MISSING
    dur: msgspec.Raw = MISSING
    args: _Args | None = None


class _Head(msgspec.Struct):
    """The document's top-level keys that perflab keeps (the rest is skipped)."""

    deviceProperties: Any = None
    baseTimeNanoseconds: Any = None
    cuda_runtime_version: Any = None
    cuda_driver_version: Any = None
    distributedInfo: Any = None
    perflab_step_markers: Any = None  # a CUDA-only trace of perflab's: its steps are marker kernels (trace.build)


class _Tail(_Head):
    traceEvents: list[_Event] = []


_EVENTS = msgspec.json.Decoder(list[_Event], float_hook=str)  # (a float id stays text: an error, not a rounding)
_HEAD = msgspec.json.Decoder(_Head)
_TAIL = msgspec.json.Decoder(_Tail, float_hook=str)
_GET_CAT, _GET_PH, _GET_NAME, _GET_ARGS = attrgetter("cat"), attrgetter("ph"), attrgetter("name"), attrgetter("args")
_GET_PID, _GET_TID, _GET_TS, _GET_DUR = attrgetter("pid"), attrgetter("tid"), attrgetter("ts"), attrgetter("dur")
_GET_CORRELATION, _GET_DEVICE, _GET_STREAM = attrgetter("correlation"), attrgetter("device"), attrgetter("stream")
_GET_GRID, _GET_BLOCK = attrgetter("grid"), attrgetter("block")
_GET_INPUT_DIMS, _GET_INPUT_TYPE, _GET_CONCRETE_INPUTS = attrgetter("input_dims"), attrgetter("input_type"), attrgetter("concrete_inputs")
_NOT_DIGITS = bytes(c if 48 <= c <= 57 else 32 for c in range(256))


def load_kineto(path: str | Path, ops: bool = False) -> Trace:
    """The Trace of a Kineto file. ``ops``: also torch's operators (``Trace.ops``); a trace with no GPU activity is read
    again with them, and accounted over them."""
    raw, meta = read_events(Path(path), ops=ops)
    if not ops and len(raw.gpu["start_ns"]) == 0:
        raw, meta = read_events(Path(path), ops=True)
    return build_trace(raw, meta)


def read_events(path: Path, ops: bool = False) -> tuple[RawEvents, dict[str, Any]]:
    """The columns of the events perflab needs (``ops``: torch's operators too), and the document's metadata."""
    reader = _Reader(path, ops=ops)
    with _open(path) as f:
        head, events_at, bare, reader.head = _find_events(f, path)
        rest = reader.decode_complete(_with_bracket(head[events_at:]), events_at)
        while (buf := _read_after(f, rest, path)) is not None:
            rest = reader.decode_complete(buf, reader.offset)
    tail = reader.decode_tail(rest, bare)
    meta = _meta(path, head_fields=reader.head, tail=tail)
    meta["times_parsed_one_by_one"] = reader.one_by_one  # (pathological spellings: over 18 digits, out of range)
    if not reader.saw_event:
        raise PerflabError(f"{path}: the trace has no events (empty traceEvents); profile at least one step with CUDA activities")
    return reader.raw_events(), meta


def _open(path: Path) -> BinaryIO:
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    return _Gunzip(path) if gz else open(path, "rb")


GUNZIP_IN_BYTES = 1 << 20  # compressed text read per step
# decompressed text per block handed to the parser: each block costs the thread a few GIL hand-overs
# (CPython grows zlib's output buffer in steps), so small blocks keep the parser waiting (measured on the
# 1 M-kernel trace: 1 MiB 0.5 s of waiting, 4 MiB 0.2-0.3 s, 8 MiB 0.02-0.05 s)
GUNZIP_OUT_BYTES = 8 << 20
GUNZIP_QUEUE_BLOCKS = 4  # blocks decompressed ahead of the parser (memory: a few times GUNZIP_OUT_BYTES)
GUNZIP_THREAD = "perflab-gunzip"
_END = object()


class _Gunzip(io.RawIOBase):
    """A .gz file decompressed in a background thread while the caller parses what came before.

    zlib releases the GIL while it inflates, so on a second core the decompression (~1.5 s for 1.6 GB)
    overlaps the parsing. Blocks go through a bounded queue (memory stays flat); an error of the
    decompression (truncated or corrupt file) is handed over in order, after the text before it, and
    raised by ``readinto``. ``close`` stops the thread and waits for it, also when reading stopped
    early. zlib directly, not gzip.GzipFile (a Python-level loop and a second CRC pass: ~25% of the
    decompression time here); concatenated members are read in turn."""

    def __init__(self, path: Path):
        self.file = open(path, "rb")
        self.blocks: queue.Queue = queue.Queue(GUNZIP_QUEUE_BLOCKS)
        self.stop = threading.Event()
        self.block, self.at, self.ended = memoryview(b""), 0, False
        self.thread = threading.Thread(target=self._produce, name=GUNZIP_THREAD, daemon=True)
        self.thread.start()

    def _produce(self) -> None:
        try:
            for block in _inflate(self.file):
                if self.stop.is_set():
                    return
                self.blocks.put(block)
            self.blocks.put(_END)
        except BaseException as exc:  # handed over: the reading thread raises it
            self.blocks.put(exc)

    def readable(self) -> bool:
        return True

    def readinto(self, target) -> int:
        size, n = len(target), 0
        while n < size:
            if self.at == len(self.block):
                if self.ended:
                    break
                item = self.blocks.get()
                if item is _END or isinstance(item, BaseException):
                    self.ended = True
                    if item is _END:
                        break
                    raise item
                self.block, self.at = memoryview(item), 0
            m = min(size - n, len(self.block) - self.at)
            target[n:n + m] = self.block[self.at:self.at + m]
            n += m
            self.at += m
        return n

    def close(self) -> None:
        self.stop.set()
        while self.thread.is_alive():  # unblock a put on a full queue, then wait for the thread to see stop
            try:
                while True:
                    self.blocks.get_nowait()
            except queue.Empty:
                pass
            self.thread.join(0.05)
        self.block = memoryview(b"")
        self.file.close()
        super().close()


def _inflate(file: BinaryIO):
    """The decompressed text of a gzip file (one member after another), in blocks of at most GUNZIP_OUT_BYTES."""
    inflate = zlib.decompressobj(31)
    data = b""
    while True:
        if not data:
            data = file.read(GUNZIP_IN_BYTES)
            if not data:
                if inflate.eof:
                    return
                raise EOFError("compressed file ended before the end-of-stream marker was reached")
        if inflate.eof:  # the next member
            inflate = zlib.decompressobj(31)
        block = inflate.decompress(data, GUNZIP_OUT_BYTES)
        data = inflate.unconsumed_tail or inflate.unused_data
        if block:
            yield block


def _read(f: BinaryIO, size: int, path: Path) -> bytes:
    try:
        return f.read(size)
    except (EOFError, OSError, zlib.error) as exc:
        raise PerflabError(f"{path}: truncated or corrupt gzip file ({exc})") from None


def _with_bracket(text: bytes) -> bytearray:
    buf = bytearray(b"[")
    buf += text
    return buf


def _read_after(f: BinaryIO, rest: bytes, path: Path) -> bytearray | None:
    """"[" + rest + the next block of the file (read in place), or None at the end of the file."""
    buf = bytearray(1 + len(rest) + CHUNK_BYTES)
    buf[0] = ord("[")
    buf[1:1 + len(rest)] = rest
    try:
        with memoryview(buf) as view:
            n = f.readinto(view[1 + len(rest):])
    except (EOFError, OSError, zlib.error) as exc:
        raise PerflabError(f"{path}: truncated or corrupt gzip file ({exc})") from None
    if not n:
        return None
    del buf[1 + len(rest) + n:]
    return buf


def _find_events(f: BinaryIO, path: Path) -> tuple[bytes, int, bool, _Head | None]:
    """Read until the start of the event list: (text read, offset just after its "[", bare list?, head keys)."""
    head = _read(f, CHUNK_BYTES, path)
    while True:
        text = head.lstrip(b"\xef\xbb\xbf").lstrip()
        skipped = len(head) - len(text)
        if text.startswith(b"["):  # the Chrome trace format also allows a bare list of events
            return head, skipped + 1, True, None
        if text and not text.startswith(b"{"):
            raise PerflabError(f"{path}: not a JSON object or list: not a Kineto/Chrome trace")
        for found in TRACE_EVENTS.finditer(head):
            fields = _head_fields(head[skipped:found.start()])
            if fields is not None:
                return head, found.end(), False, fields
        more = _read(f, len(head), path)
        if not more:
            break
        head += more
    try:  # the whole document is in hand: say what is wrong with it
        msgspec.json.decode(head)
    except msgspec.DecodeError as exc:
        raise PerflabError(f"{path}: invalid JSON: {exc} (truncated?)") from None
    raise PerflabError(f"{path}: not a Kineto/Chrome trace: no \"traceEvents\" list")


def _head_fields(prefix: bytes) -> _Head | None:
    """The keys before "traceEvents", or None if this "traceEvents" is not a top-level key."""
    prefix = prefix.rstrip()
    closed = prefix[:-1] + b"}" if prefix.endswith(b",") else prefix + b"}"
    try:
        return _HEAD.decode(closed)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def _meta(path: Path, head_fields: _Head | None, tail: _Head) -> dict[str, Any]:
    def first(key):
        value = getattr(head_fields, key, None) if head_fields is not None else None
        return value if value is not None else getattr(tail, key)

    return {
        "format": "kineto",
        "path": str(path),
        "devices": first("deviceProperties") or [],
        "base_time_ns": first("baseTimeNanoseconds"),
        "cuda_runtime_version": first("cuda_runtime_version"),
        "cuda_driver_version": first("cuda_driver_version"),
        "distributed": first("distributedInfo"),
        "step_markers": first("perflab_step_markers"),
    }


GPU_KEYS = ("name", "kind", "process", "device", "stream", "start_ns", "dur_ns", "correlation", "dims")
API_KEYS = ("name", "process", "tid", "start_ns", "dur_ns", "correlation")
RANGE_KEYS = ("name", "process", "tid", "start_ns", "dur_ns")
OP_KEYS = ("name", "process", "tid", "start_ns", "dur_ns", "input_shapes", "input_types", "concrete_inputs")


class _Reader:
    """Decodes the event list slice by slice and collects the columns of the events perflab needs."""

    def __init__(self, path: Path, ops: bool = False):
        self.path = path
        self.kinds = _EVENT_KIND_OPS if ops else _EVENT_KIND
        self.offset = 0  # file offset (of the decompressed text) of the text handed to decode_complete
        self.head: _Head | None = None
        self.names = _NameTable()
        self.text_ids: dict[str, int] = {}
        self.dims: dict[bytes, list[int]] = {}
        self.arguments = _Arguments()
        self.gpu: list[dict] = []
        self.api: list[dict] = []
        self.ranges: list[dict] = []
        self.ops: list[dict] = []
        self.saw_event = False
        self.one_by_one = 0  # ts/dur values the vectorised parser left to the per-value path

    def decode_complete(self, buf: bytearray, offset: int) -> bytes:
        """Decode the complete events at the start of ``buf`` ("[" + the text from ``offset`` on); return
        the text not decoded yet."""
        self.offset = offset
        if len(buf) < CHUNK_BYTES // 2:
            return bytes(buf[1:])
        for cut in _cuts(buf):
            comma = buf.index(b",", cut.start())
            buf[comma] = ord("]")
            try:
                events = _EVENTS.decode(memoryview(buf)[: comma + 1])
            except msgspec.DecodeError as exc:
                buf[comma] = ord(",")
                if _cut_was_not_between_events(exc):
                    continue
                if isinstance(exc, msgspec.ValidationError):  # valid JSON, an event of the wrong shape
                    raise self._malformed(exc) from None
                raise self._invalid(exc, offset - 1) from None
            self.add(events)
            self.offset = offset + cut.end() - 2
            return bytes(buf[cut.end() - 1:])
        return bytes(buf[1:])  # no usable cut yet: decode it with the next block

    def decode_tail(self, rest: bytes, bare: bool) -> _Head:
        """The last events and the document's closing keys."""
        try:
            if bare:
                events, tail = _EVENTS.decode(b"[" + rest), _Head()
            else:
                tail = _TAIL.decode(b'{"traceEvents": [' + rest)
                events = tail.traceEvents
        except msgspec.ValidationError as exc:  # a subclass of DecodeError: valid JSON, an event of the wrong shape
            raise self._malformed(exc) from None
        except msgspec.DecodeError as exc:
            raise self._invalid(exc, self.offset - len(b'{"traceEvents": [')) from None
        self.add(events)
        return tail

    def _invalid(self, exc: Exception, base: int) -> PerflabError:
        found = BYTE_OFFSET.search(str(exc))
        where = f" near byte {base + int(found.group(1)):,}" if found else ""
        why = str(exc).replace("JSON is malformed: ", "")
        return PerflabError(f"{self.path}: invalid JSON{where}: {why} (truncated?)")

    def _malformed(self, exc: Exception) -> PerflabError:
        return PerflabError(f"{self.path}: an event is malformed ({exc})")

    # --- columns ------------------------------------------------------------------------------------

    def add(self, events: list[_Event]) -> None:
        if not events:
            return
        self.saw_event = True
        kind = np.fromiter(map(self.kinds.__getitem__, map(_GET_CAT, events)), np.int64, len(events))
        wanted = np.flatnonzero(kind >= 0).tolist()
        if not wanted:
            return
        chosen = list(itemgetter(*wanted)(events)) if len(wanted) > 1 else [events[wanted[0]]]
        kind = kind[wanted]
        phases = list(map(_GET_PH, chosen))
        if phases.count("X") != len(phases):  # only complete events ("X") are read
            complete = np.array(phases, dtype=object) == "X"
            chosen = [e for e, keep in zip(chosen, complete.tolist()) if keep]
            kind = kind[complete]
        args = list(map(_GET_ARGS, chosen))
        if None in args:
            args = [a or NO_ARGS for a in args]
        correlation = self._ints(list(map(_GET_CORRELATION, args)), -1, "correlation")
        # an API call without a correlation id launched nothing that can be linked to it
        keep = (kind != API_EVENT) | (correlation >= 0)
        if not keep.all():
            rows = np.flatnonzero(keep).tolist()
            chosen, args = [chosen[i] for i in rows], [args[i] for i in rows]
            kind, correlation = kind[keep], correlation[keep]
        name = self._name_codes(chosen)
        pid = self._ints(list(map(_GET_PID, chosen)), -1)
        tid = self._ints(list(map(_GET_TID, chosen)), -1)
        start, dur = self._times(chosen)
        is_gpu = kind < API_EVENT
        if is_gpu.any():
            rows = np.flatnonzero(is_gpu)
            gpu_args = [args[i] for i in rows.tolist()]
            device = self._ints(list(map(_GET_DEVICE, gpu_args)), -1, "device")
            stream = self._ints(list(map(_GET_STREAM, gpu_args)), -1, "stream")
            self.gpu.append({
                "name": name[rows], "kind": kind[rows], "process": np.zeros(len(rows), dtype=np.int64),
                "device": np.where(device >= 0, device, pid[rows]), "stream": np.where(stream >= 0, stream, tid[rows]),
                "start_ns": start[rows], "dur_ns": dur[rows], "correlation": correlation[rows],
                "dims": self._dims(gpu_args, kind[rows]),
            })
        for group, code, keys in ((self.api, API_EVENT, API_KEYS), (self.ranges, RANGE_EVENT, RANGE_KEYS)):
            rows = np.flatnonzero(kind == code)
            if len(rows):
                columns = {"name": name, "process": pid, "tid": tid, "start_ns": start, "dur_ns": dur, "correlation": correlation}
                group.append({k: columns[k][rows] for k in keys})
        rows = np.flatnonzero(kind == OP_EVENT)
        if len(rows):
            op_args = [args[i] for i in rows.tolist()]
            decoded = self.arguments.__getitem__
            self.ops.append({"name": name[rows], "process": pid[rows], "tid": tid[rows], "start_ns": start[rows], "dur_ns": dur[rows],
                             "input_shapes": np.fromiter(map(decoded, map(bytes, map(_GET_INPUT_DIMS, op_args))), object, len(rows)),
                             "input_types": np.fromiter(map(decoded, map(bytes, map(_GET_INPUT_TYPE, op_args))), object, len(rows)),
                             "concrete_inputs": np.fromiter(map(decoded, map(bytes, map(_GET_CONCRETE_INPUTS, op_args))), object, len(rows))})

    def _name_codes(self, events: list[_Event]) -> np.ndarray:
        raws = list(map(bytes, map(_GET_NAME, events)))
        return np.fromiter(map(self.names.__getitem__, raws), np.int64, len(raws))

    def _ints(self, values: list, missing: int, strict: str = "") -> np.ndarray:
        """Integers from decoded JSON values (numbers or numeric strings). Other strings get an id of
        their own (a "pid" may be a label), except in the field named by ``strict``, where they are an error."""
        try:  # all JSON integers (or numeric strings): one C pass
            return np.array(values, dtype=np.int64)
        except (TypeError, ValueError, OverflowError):
            pass
        return np.fromiter((self._int(v, missing, strict) for v in values), np.int64, len(values))

    def _int(self, value: Any, missing: int, strict: str) -> int:
        if value is None:
            return missing
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        text = str(value).strip()
        if isinstance(value, str) and re.fullmatch(r"-?\d+", text):
            return int(text)
        if strict or not isinstance(value, str):
            raise PerflabError(f"{self.path}: an event is malformed: its {strict or 'pid/tid'} is {value!r}, not an integer")
        return self.text_ids.setdefault(text, -2 - len(self.text_ids))  # e.g. "pid": "Spans"

    def _times(self, events: list[_Event]) -> tuple[np.ndarray, np.ndarray]:
        """Exact start and duration ns of ``events`` (a missing "dur" is 0; a missing "ts" or a negative
        "dur" is an error), both parsed in one call."""
        n = len(events)
        ts, dur = list(map(_GET_TS, events)), list(map(_GET_DUR, events))
        if not all(ts):
            raise PerflabError(f"{self.path}: an event has no timestamp (\"ts\")")
        if not all(dur):
            dur = [d or b"0" for d in dur]
        ns = self._ns(ts + dur)
        start, dur_ns = ns[:n], ns[n:]
        if (dur_ns < 0).any():
            raise PerflabError(f"{self.path}: an event has a negative duration (\"dur\": "
                               f"{bytes(dur[int(np.argmax(dur_ns < 0))]).decode(errors='replace')})")
        return start, dur_ns

    def _ns(self, values: list) -> np.ndarray:
        """Exact ns from raw ts/dur texts: vectorised, the rare leftovers one by one (counted)."""
        parsed = us_texts_to_ns(values)
        if parsed is None:
            self.one_by_one += len(values)
            return np.fromiter(map(self._one_ns, values), np.int64, len(values))
        ns, rows = parsed
        if len(rows):
            self.one_by_one += len(rows)
            ns[rows] = [self._one_ns(values[i]) for i in rows.tolist()]
        return ns

    def _one_ns(self, raw: msgspec.Raw) -> int:
        try:
            value = msgspec.json.decode(raw, type=Decimal)
        except (msgspec.DecodeError, msgspec.ValidationError):
            raise PerflabError(f"{self.path}: a timestamp is not a number: {bytes(raw).decode(errors='replace')}") from None
        return us_text_to_ns(value, self.path)

    def _dims(self, args: list[_Args], kind: np.ndarray) -> np.ndarray:
        """(n, 6): grid and block (-1 where unknown: memcpy, memset), parsed in one pass when every kernel has both."""
        dims = np.full((len(args), 6), -1, dtype=np.int64)
        kernels = np.flatnonzero(kind == 0)
        if len(kernels) == len(args):
            dims[:] = self._kernel_dims(args)
        elif len(kernels):
            dims[kernels] = self._kernel_dims([args[i] for i in kernels.tolist()])
        return dims

    def _kernel_dims(self, args: list[_Args]) -> np.ndarray:
        n = len(args)
        grids, blocks = list(map(_GET_GRID, args)), list(map(_GET_BLOCK, args))
        values = _triples(grids + blocks, 2 * n)  # (one parse for both)
        if values is not None:
            return np.concatenate((values[:n], values[n:]), axis=1)
        return np.array([self._shape(bytes(g), bytes(b)) for g, b in zip(grids, blocks)], dtype=np.int64).reshape(-1, 6)

    def _shape(self, grid: bytes, block: bytes) -> list[int]:
        key = grid + b"|" + block
        if key not in self.dims:
            try:
                values = msgspec.json.decode(grid, type=list[int]) + msgspec.json.decode(block, type=list[int])
            except (msgspec.DecodeError, msgspec.ValidationError):
                values = []
            self.dims[key] = values if len(values) == 6 and min(values) >= 0 else [-1] * 6
        return self.dims[key]

    def raw_events(self) -> RawEvents:
        gpu = _concat(self.gpu, GPU_KEYS)
        api = _concat(self.api, API_KEYS)
        per_process = _assign_processes(gpu, api)
        return RawEvents(names=self.names.texts, gpu=gpu, api=api, ranges=_concat(self.ranges, RANGE_KEYS), ops=_concat(self.ops, OP_KEYS),
                         correlation_per_process=per_process)


class _NameTable(dict):
    """Code of each distinct raw name (JSON text, quotes and escapes included); ``texts``: the decoded names."""

    def __init__(self):
        super().__init__()
        self.texts: list[str] = []

    def __missing__(self, raw: bytes) -> int:
        code = self[raw] = len(self.texts)
        try:
            value = msgspec.json.decode(raw) if raw else ""
        except msgspec.DecodeError:
            value = raw.decode(errors="replace")
        self.texts.append(value if isinstance(value, str) else str(value))
        return code


class _Arguments(dict):
    """An operator's ``Input Dims``, ``Input type`` or ``Concrete Inputs`` (raw JSON text) decoded once per distinct text: a JSON array as
    nested tuples (``[[8, 64], [64, 64], []]`` → ``((8, 64), (64, 64), ())``; immutable, so rows share them), None
    where the event has no such key (shapes not recorded), () where its value is not an array."""

    def __missing__(self, raw: bytes) -> tuple | None:
        value = None
        if raw:
            try:
                value = _as_tuples(msgspec.json.decode(raw))
            except msgspec.DecodeError:  # (not reached: the raw text was decoded as part of the document)
                pass
            value = value if isinstance(value, tuple) else ()
        self[raw] = value
        return value


def _as_tuples(value: Any) -> Any:
    return tuple(map(_as_tuples, value)) if isinstance(value, list) else value


def _cuts(buf: bytearray):
    """Candidate cuts ("}, {" between two events), the last first."""
    window = 1 << 16
    while True:
        start = max(1, len(buf) - window)
        found = list(EVENT_BOUNDARY.finditer(buf, start))
        if found or start == 1:
            return reversed(found[-MAX_CUT_TRIES:])
        window *= 8


def _cut_was_not_between_events(exc: msgspec.DecodeError) -> bool:
    # a cut inside a string or a nested value leaves the slice unfinished ("truncated"); one after the end
    # of the event list leaves text after it ("trailing characters"). Any other error is the file's.
    text = str(exc)
    return "truncated" in text or "trailing characters" in text


def _concat(blocks: list[dict], keys: tuple[str, ...]) -> dict[str, np.ndarray]:
    if not blocks:
        empty = {"dims": np.zeros((0, 6), dtype=np.int64), **{k: np.zeros(0, dtype=object) for k in ("input_shapes", "input_types", "concrete_inputs")}}
        return {k: empty.get(k, np.zeros(0, dtype=np.int64)) for k in keys}
    return {k: np.concatenate([b[k] for b in blocks]) for k in keys}


def _assign_processes(gpu: dict[str, np.ndarray], api: dict[str, np.ndarray]) -> bool:
    """Whether GPU activities must link per process; if so, fills gpu["process"] (one process per device).

    One process (or correlation ids that never collide across processes): link by correlation alone, as
    Kineto intends. Otherwise each device goes to the process with the most *causal* matches (a launch
    call with the activity's correlation id that started before it). Ranks running in lockstep can make
    that a tie; within 1% of the best, the i-th device (by index) goes to the i-th process (by pid), as
    when rank i drives device i.
    """
    processes = np.unique(api["process"])
    if len(processes) <= 1:
        return False
    pairs = np.unique(np.stack([api["process"], api["correlation"]]), axis=1).shape[1]
    if len(np.unique(api["correlation"])) == pairs:
        return False
    devices = np.unique(gpu["device"]).tolist()
    for index, device in enumerate(devices):
        rows = gpu["device"] == device
        scores = [_causal_matches(gpu["correlation"][rows], gpu["start_ns"][rows], api, process) for process in processes.tolist()]
        best = int(np.argmax(scores))
        if len(devices) == len(processes) and scores[index] >= 0.99 * scores[best]:
            best = index
        gpu["process"][rows] = processes[best]
    return True


def _causal_matches(correlation: np.ndarray, start: np.ndarray, api: dict[str, np.ndarray], process: int) -> int:
    mine = api["process"] == process
    calls, call_start = api["correlation"][mine], api["start_ns"][mine]
    if len(calls) == 0:
        return 0
    order = np.argsort(calls, kind="stable")
    calls, call_start = calls[order], call_start[order]
    pos = np.minimum(np.searchsorted(calls, correlation), len(calls) - 1)
    return int(((calls[pos] == correlation) & (call_start[pos] <= start)).sum())


def _triples(raws: list[msgspec.Raw], n: int) -> np.ndarray | None:
    """(n, 3) from raw JSON arrays of three non-negative integers, or None if any is not one."""
    joined = b";".join(raws)
    if joined.count(b"[") != n or joined.translate(None, b"0123456789[], ;\n\t\r") != b"":
        return None
    values = np.fromstring(joined.translate(_NOT_DIGITS), dtype=np.int64, sep=" ") if n else np.zeros(0, dtype=np.int64)
    return values.reshape(n, 3) if len(values) == 3 * n else None


_POW10 = 10 ** np.arange(19, dtype=np.int64)
_HALF = np.append(np.int64(1), _POW10[1:] // 2)  # (index 0: above any remainder, so nothing rounds)
_LIMIT = np.iinfo(np.int64).max // _POW10  # the largest magnitude that 10**k times fits in int64
_SPACE, _DOT, _MINUS, _PLUS, _LOWER_E, _UPPER_E = map(ord, " .-+eE")
_E_TO_SPACE = bytes.maketrans(b"eE", b"  ")


def _digits(t: np.ndarray) -> np.ndarray:
    return (t - np.uint8(ord("0"))) < 10  # (uint8 wraps: one comparison)


def us_texts_to_ns(raws: list) -> tuple[np.ndarray, np.ndarray] | None:
    """Exact integer ns from µs written as JSON numbers or numeric strings (their raw text), vectorised.

    Every spelling ``-?D+(.D+)?([eE][+-]?D+)?`` (D: digits), quoted or not: integers, any number of
    decimals, exponents. ns = µs × 1000 rounded half to even at the ns, as ``decimal.Decimal`` gives.
    Returns (ns, rows): ``rows`` are the values to take one by one (ns is 0 there): a mantissa of 10**18
    or more once its dot is removed, or a result outside int64. None when some value is spelled otherwise
    (empty, a quoted value with spaces or escapes, a sign or a dot misplaced, ...): the caller then takes
    every value one by one."""
    n = len(raws)
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.intp)
    joined = b" ".join(raws)
    quoted = b'"' in joined  # raw JSON numbers are valid numbers (msgspec checked them); strings are checked here
    if quoted:
        joined = joined.translate(None, b'"')
    plain = joined.translate(None, b"0123456789. ") == b""  # no sign, no exponent: the common case
    if not plain and joined.translate(None, b"0123456789. eE+-") != b"":
        return None
    t = np.frombuffer(joined, dtype=np.uint8)
    size = len(t)
    seps = np.flatnonzero(t == _SPACE)
    if len(seps) != n - 1:  # a quoted value held a space
        return None
    ends = np.append(seps, size)
    dots = np.flatnonzero(t == _DOT)
    if len(dots) == n and (n == 1 or ((dots[:-1] < seps).all() and (dots[1:] > seps).all())):
        dot_rows = slice(None)  # one dot in every value (floats, Kineto's three decimals)
    else:
        dot_rows = np.searchsorted(seps, dots)
        if (np.diff(dot_rows) == 0).any():  # two dots in one value
            return None
    if quoted and len(dots) and (dots[0] == 0 or dots[-1] == size - 1
                                 or not (_digits(t[dots - 1]).all() and _digits(t[dots + 1]).all())):
        return None  # ".5", "5.", "-.5"
    if plain:
        mantissa_ends = ends
        text = joined.translate(None, b".") if len(dots) else joined
        es = ()
    else:
        es = np.flatnonzero((t == _LOWER_E) | (t == _UPPER_E))
        e_rows = np.searchsorted(seps, es)
        if quoted and not _valid_signs_and_exponents(t, es, e_rows):
            return None
        mantissa_ends = ends.copy()
        mantissa_ends[e_rows] = es
        if len(dots) and (dots > mantissa_ends[dot_rows]).any():  # "1e5.5"
            return None
        text = joined.translate(_E_TO_SPACE, b".")
    try:
        tokens = np.fromstring(text, dtype=np.int64, sep=" ")
    except ValueError:
        return None
    if len(tokens) != n + len(es):  # (an empty value gives no token)
        return None
    if plain and (not len(dots) or (isinstance(dot_rows, slice) and (ends - dots == 4).all())):
        # Kineto's own spellings: all integers, or all with exactly three decimals
        if len(dots):
            return tokens, np.flatnonzero(tokens >= _POW10[18])
        rows = np.flatnonzero(tokens > _LIMIT[3])
        tokens *= 1000
        tokens[rows] = 0
        return tokens, rows
    scale = np.full(n, 3, dtype=np.int64)  # ns = mantissa × 10**scale
    if len(dots):
        scale[dot_rows] -= mantissa_ends[dot_rows] - dots - 1
    if len(es):
        at = np.arange(n)
        at[1:] += np.cumsum(np.bincount(e_rows, minlength=n))[:-1]
        mantissa = tokens[at]
        scale[e_rows] += np.maximum(np.minimum(tokens[at[e_rows] + 1], 1 << 20), -(1 << 20))
    else:
        mantissa = tokens
    negative = mantissa < 0
    any_negative = negative.any()
    magnitude = np.abs(mantissa) if any_negative else mantissa
    up = np.minimum(np.maximum(scale, 0), 18)
    ns = magnitude * _POW10[up]
    # numpy's parser saturates at the int64 maximum on overflow (tests/test_trace_numbers.py checks it): a
    # magnitude of 10**18 or more may be cut (more than 18 digits), so it is taken one by one, as is any
    # result that would leave int64
    slow = (magnitude >= _POW10[18]) | (magnitude > _LIMIT[up]) | ((scale > 18) & (magnitude != 0))
    if any_negative:
        slow |= magnitude < 0  # (-2**63 has no int64 magnitude)
    if scale.min() < 0:
        down = np.minimum(np.maximum(-scale, 0), 18)
        quotient, rest = np.divmod(magnitude, _POW10[down])
        half = _HALF[down]
        quotient += (rest > half) | ((rest == half) & ((quotient & 1) == 1))  # half to even
        quotient[scale < -18] = 0  # (a magnitude under 10**18 times 10**-19 or less rounds to 0)
        ns = np.where(scale < 0, quotient, ns)
    if any_negative:
        ns = np.where(negative, -ns, ns)
    rows = np.flatnonzero(slow)
    if len(rows):
        ns[rows] = 0
    return ns, rows


def _valid_signs_and_exponents(t: np.ndarray, es: np.ndarray, e_rows: np.ndarray) -> bool:
    """Quoted values with a sign or an exponent: "-" only first or after the e, "+" only after the e, one
    e per value, after a digit and before a digit or a sign, a digit after every sign."""
    size = len(t)
    if len(es) and (es[0] == 0 or es[-1] == size - 1 or (np.diff(e_rows) == 0).any() or not _digits(t[es - 1]).all()):
        return False
    after_e = t[np.minimum(es + 1, size - 1)]
    if len(es) and not (_digits(after_e) | (after_e == _MINUS) | (after_e == _PLUS)).all():
        return False
    signs = np.flatnonzero((t == _MINUS) | (t == _PLUS))
    if not len(signs):
        return True
    if signs[-1] == size - 1 or not _digits(t[signs + 1]).all():
        return False
    before = t[np.maximum(signs - 1, 0)]
    exponent_sign = (signs > 0) & ((before == _LOWER_E) | (before == _UPPER_E))
    leading_minus = (t[signs] == _MINUS) & ((signs == 0) | (before == _SPACE))
    return bool((exponent_sign | leading_minus).all())


_EXACT = Context(prec=MAX_PREC, Emax=MAX_EMAX, Emin=MIN_EMIN, rounding=ROUND_HALF_EVEN)  # × 1000 without rounding
_NS_LIMIT = Decimal(2**63 - 1)


def us_text_to_ns(value: Any, path: Path | str = "the trace") -> int:
    """Exact integer ns from one µs value given as an int, a Decimal or decimal text ("5983925445894.137"):
    µs × 1000 rounded half to even at the ns (the per-value path, for what us_texts_to_ns leaves)."""
    if isinstance(value, int) and not isinstance(value, bool):
        ns = value * 1000
    else:
        try:
            us = value if isinstance(value, Decimal) else Decimal(str(value).strip())
        except (InvalidOperation, ValueError):
            raise PerflabError(f"{path}: a timestamp is not a number: {value!r}") from None
        if not us.is_finite():
            raise PerflabError(f"{path}: a timestamp is not a number: {value!r}")
        if abs(us) > _NS_LIMIT:  # (before anything is built from a huge exponent)
            raise PerflabError(f"{path}: a timestamp is out of range: {value!r} µs")
        ns = int(_EXACT.multiply(us, 1000).to_integral_value(ROUND_HALF_EVEN))
    if not -2**63 <= ns < 2**63:
        raise PerflabError(f"{path}: a timestamp is out of range: {value!r} µs")
    return ns
