"""Load an Nsight Systems SQLite export (``nsys export --type sqlite``) into a Trace.

Written against the documented schema 3.28.1 (nsys 2026.4), and tolerant of what varies:

- Tables are created lazily: CUPTI_ACTIVITY_KIND_MEMCPY, _MEMSET and NVTX_EVENTS may be missing; so may
  CUPTI_ACTIVITY_KIND_RUNTIME (then nothing is linked). A separate CUPTI_ACTIVITY_KIND_DRIVER table
  (older exports) is read when present; in 3.28.1 driver calls (``cuLaunchKernel``, eventClass 1) sit
  in the RUNTIME table.
- Names are integer ids into StringIds: kernels use ``demangledName`` (as Kineto's kernel names are
  demangled), falling back to ``shortName``; API names drop their version suffix
  (``cudaLaunchKernel_v7000`` → ``cudaLaunchKernel``); NVTX text is ``COALESCE(text, StringIds.value
  via textId)``.
- A kernel links to the API call with its correlation id *in the same process*: correlation ids
  restart in every process (PID = globalTid / 0x1000000 % 0x1000000 = globalPid / 0x1000000 % 0x1000000).
  Kernels replayed from a CUDA graph (``--cuda-graph-trace=node``) carry their cudaGraphLaunch's id.
- Ranges: NVTX push/pop (eventType 59) and start/end (60) ranges that end on the thread they started on
  (a start/end range may end on another thread; those cannot enclose a launch on one thread and are
  counted in ``meta["cross_thread_ranges"]``).
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perflab.errors import PerflabError, first_line
from perflab.trace.build import RawEvents, build_trace
from perflab.trace.schema import Trace

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
DRIVER = "CUPTI_ACTIVITY_KIND_DRIVER"
NVTX = "NVTX_EVENTS"
NVTX_PUSH_POP, NVTX_START_END = 59, 60
PID = "/ 0x1000000 % 0x1000000"  # the PID bits of a globalTid / globalPid
TID = "% 0x1000000"
VERSION_SUFFIX = re.compile(r"_v\d+$")

# cudaMemcpyKind as nsys stores it (copyKind), and the memory kinds (srcKind, dstKind, memKind)
COPY_KINDS = {0: "Unknown", 1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD",
              9: "HtoH", 10: "PtoP", 11: "HtoD", 12: "DtoH", 13: "DtoD"}
MEMORY_KINDS = {0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed", 5: "Device Static", 6: "Managed Static", 7: "Unknown"}


def load_nsys(path: str | Path) -> Trace:
    path = Path(path)
    try:
        connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise PerflabError(f"{path}: cannot open the SQLite file ({exc})") from None
    try:
        with connection:
            raw, meta = _read(connection, path)
    except (sqlite3.DatabaseError, pd.errors.DatabaseError) as exc:
        raise PerflabError(f"{path}: not a readable SQLite database ({first_line(exc) or type(exc).__name__})") from None
    finally:
        connection.close()
    return build_trace(raw, meta)


def _read(connection: sqlite3.Connection, path: Path) -> tuple[RawEvents, dict[str, Any]]:
    tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
    if "StringIds" not in tables:
        raise PerflabError(f"{path}: a SQLite file, but not an nsys export (no StringIds table); export one with `nsys export --type sqlite`")
    names = _NameTable()
    gpu = _concat_frames([
        _kernels(connection, tables, names),
        _memcpys(connection, tables, names),
        _memsets(connection, tables, names),
    ])
    if len(gpu) == 0:
        raise PerflabError(f"{path}: this trace has no GPU activity (kernels, memcpy, memset): it was recorded without CUDA activities (nsys --trace=cuda)")
    api = _api_calls(connection, tables, names)
    ranges, cross_thread = _ranges(connection, tables, names)
    meta = {
        "format": "nsys",
        "path": str(path),
        "devices": _devices(connection, tables),
        "schema_version": _schema_version(connection, tables),
        "cross_thread_ranges": cross_thread,
    }
    raw = RawEvents(
        names=names.labels(),
        gpu={
            "name": gpu["name"].to_numpy(np.int64), "kind": gpu["kind"].to_numpy(np.int64), "process": gpu["process"].to_numpy(np.int64),
            "device": gpu["device"].to_numpy(np.int64), "stream": gpu["stream"].to_numpy(np.int64),
            "start_ns": gpu["start_ns"].to_numpy(np.int64), "dur_ns": (gpu["end_ns"] - gpu["start_ns"]).to_numpy(np.int64),
            "correlation": gpu["correlation"].to_numpy(np.int64),
            "dims": gpu[["grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z"]].to_numpy(np.int64),
        },
        api=_columns(api, with_correlation=True),
        ranges=_columns(ranges, with_correlation=False),
        correlation_per_process=True,
    )
    return raw, meta


class _NameTable:
    """One table of names for kernels, APIs and ranges; codes are dense and names unique."""

    def __init__(self):
        self.codes: dict[str, int] = {}

    def encode(self, values: pd.Series) -> np.ndarray:
        uniques, inverse = np.unique(values.fillna("").astype(str).to_numpy(), return_inverse=True)
        mapping = np.array([self.codes.setdefault(str(u), len(self.codes)) for u in uniques], dtype=np.int64)
        return mapping[inverse.reshape(-1)] if len(inverse) else np.zeros(0, dtype=np.int64)

    def labels(self) -> list[str]:
        return list(self.codes)


def _columns_of(connection: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in connection.execute(f"PRAGMA table_info({table})")}


def _optional(columns: set[str], name: str, alias: str, default: str = "-1", prefix: str = "") -> str:
    return f"{prefix}{name} AS {alias}" if name in columns else f"{default} AS {alias}"


def _kernels(connection, tables, names: _NameTable) -> pd.DataFrame:
    if KERNEL not in tables:
        return _empty_gpu()
    cols = _columns_of(connection, KERNEL)
    name = "COALESCE(d.value, s.value, '')" if "shortName" in cols else "COALESCE(d.value, '')"
    joins = "LEFT JOIN StringIds d ON d.id = k.demangledName" + (" LEFT JOIN StringIds s ON s.id = k.shortName" if "shortName" in cols else "")
    dims = ", ".join(_optional(cols, c, alias, prefix="k.") for c, alias in
                     (("gridX", "grid_x"), ("gridY", "grid_y"), ("gridZ", "grid_z"), ("blockX", "block_x"), ("blockY", "block_y"), ("blockZ", "block_z")))
    frame = pd.read_sql_query(
        f"SELECT k.start AS start_ns, k.end AS end_ns, k.deviceId AS device, k.streamId AS stream, k.correlationId AS correlation, "
        f"k.globalPid {PID} AS process, {name} AS name_text, {dims} FROM {KERNEL} k {joins}", connection)
    frame["kind"] = 0
    return _named(frame, names)


# The columns every GPU activity table (MEMCPY, MEMSET) shares, as the loader names them.
_ACTIVITY_SELECT = (f"start AS start_ns, end AS end_ns, deviceId AS device, streamId AS stream, correlationId AS correlation, "
                    f"globalPid {PID} AS process")


def _memcpys(connection, tables, names: _NameTable) -> pd.DataFrame:
    if MEMCPY not in tables:
        return _empty_gpu()
    cols = _columns_of(connection, MEMCPY)
    frame = pd.read_sql_query(
        f"SELECT {_ACTIVITY_SELECT}, {_optional(cols, 'copyKind', 'copy_kind', '0')}, {_optional(cols, 'srcKind', 'src_kind', '7')}, "
        f"{_optional(cols, 'dstKind', 'dst_kind', '7')} FROM {MEMCPY}", connection)
    # named as Kineto names them, so that both formats group alike
    frame["name_text"] = [f"Memcpy {COPY_KINDS.get(c, 'Unknown')} ({MEMORY_KINDS.get(s, 'Unknown')} -> {MEMORY_KINDS.get(d, 'Unknown')})"
                          for c, s, d in zip(frame["copy_kind"], frame["src_kind"], frame["dst_kind"])]
    frame["kind"] = 1
    return _named(_no_dims(frame), names)


def _memsets(connection, tables, names: _NameTable) -> pd.DataFrame:
    if MEMSET not in tables:
        return _empty_gpu()
    cols = _columns_of(connection, MEMSET)
    frame = pd.read_sql_query(
        f"SELECT {_ACTIVITY_SELECT}, {_optional(cols, 'memKind', 'mem_kind', '2')} FROM {MEMSET}", connection)
    frame["name_text"] = [f"Memset ({MEMORY_KINDS.get(k, 'Unknown')})" for k in frame["mem_kind"]]
    frame["kind"] = 2
    return _named(_no_dims(frame), names)


def _no_dims(frame: pd.DataFrame) -> pd.DataFrame:
    for column in ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z"):
        frame[column] = -1
    return frame


GPU_FRAME_COLUMNS = ("name", "kind", "process", "device", "stream", "start_ns", "end_ns", "correlation",
                     "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z")


def _empty_gpu() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series([], dtype="int64") for c in GPU_FRAME_COLUMNS})


def _named(frame: pd.DataFrame, names: _NameTable) -> pd.DataFrame:
    frame["name"] = names.encode(frame["name_text"])
    for column in GPU_FRAME_COLUMNS:
        frame[column] = frame[column].fillna(-1).astype(np.int64)
    return frame[list(GPU_FRAME_COLUMNS)]


def _concat_frames(frames: list[pd.DataFrame]) -> pd.DataFrame:
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else _empty_gpu()


def _api_calls(connection, tables, names: _NameTable) -> pd.DataFrame:
    parts = []
    for table in (RUNTIME, DRIVER):
        if table in tables:
            parts.append(pd.read_sql_query(
                f"SELECT r.start AS start_ns, r.end AS end_ns, r.globalTid {PID} AS process, r.globalTid {TID} AS tid, "
                f"r.correlationId AS correlation, COALESCE(s.value, '') AS name_text FROM {table} r LEFT JOIN StringIds s ON s.id = r.nameId",
                connection))
    frame = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["start_ns", "end_ns", "process", "tid", "correlation", "name_text"])
    frame["name_text"] = frame["name_text"].astype(str).str.replace(VERSION_SUFFIX, "", regex=True)
    frame["name"] = names.encode(frame["name_text"])
    return frame


def _ranges(connection, tables, names: _NameTable) -> tuple[pd.DataFrame, int]:
    columns = ["start_ns", "end_ns", "process", "tid", "name_text"]
    if NVTX not in tables:
        frame = pd.DataFrame(columns=columns)
        frame["name"] = names.encode(frame["name_text"])
        return frame, 0
    cols = _columns_of(connection, NVTX)
    text = "COALESCE(n.text, s.value, '')" if "textId" in cols else "COALESCE(n.text, '')"
    join = "LEFT JOIN StringIds s ON s.id = n.textId" if "textId" in cols else ""
    end_thread = "n.endGlobalTid" if "endGlobalTid" in cols else "NULL"
    frame = pd.read_sql_query(
        f"SELECT n.start AS start_ns, n.end AS end_ns, n.globalTid {PID} AS process, n.globalTid {TID} AS tid, {text} AS name_text, "
        f"n.eventType AS event_type, n.globalTid AS start_thread, {end_thread} AS end_thread "
        f"FROM {NVTX} n {join} WHERE n.eventType IN ({NVTX_PUSH_POP}, {NVTX_START_END}) AND n.end IS NOT NULL", connection)
    cross = frame["end_thread"].notna() & (frame["end_thread"] != frame["start_thread"])
    frame = frame[~cross].reset_index(drop=True)
    frame["name"] = names.encode(frame["name_text"])
    return frame, int(cross.sum())


def _columns(frame: pd.DataFrame, with_correlation: bool) -> dict[str, np.ndarray]:
    columns = {
        "name": np.asarray(frame["name"], dtype=np.int64),
        "process": frame["process"].to_numpy(np.int64),
        "tid": frame["tid"].to_numpy(np.int64),
        "start_ns": frame["start_ns"].to_numpy(np.int64),
        "dur_ns": (frame["end_ns"] - frame["start_ns"]).to_numpy(np.int64),
    }
    if with_correlation:
        columns["correlation"] = frame["correlation"].to_numpy(np.int64)
    return columns


def _devices(connection, tables) -> list[dict[str, Any]]:
    if "TARGET_INFO_GPU" not in tables:
        return []
    cols = _columns_of(connection, "TARGET_INFO_GPU")
    wanted = [c for c in ("id", "name", "smCount", "totalMemory", "computeMajor", "computeMinor", "clockRate", "memoryBandwidth") if c in cols]
    if not wanted:
        return []
    rows = connection.execute(f"SELECT {', '.join(wanted)} FROM TARGET_INFO_GPU").fetchall()
    devices = [dict(zip(wanted, row)) for row in rows]
    for device in devices:
        if "smCount" in device:
            device["numSms"] = device["smCount"]  # Kineto's key for the same thing
    return devices


def _schema_version(connection, tables) -> str | None:
    if "META_DATA_EXPORT" not in tables:
        return None
    row = connection.execute("SELECT value FROM META_DATA_EXPORT WHERE name = 'EXPORT_SCHEMA_VERSION'").fetchone()
    return row[0] if row else None
