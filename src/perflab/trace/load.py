"""``load_trace(path)``: open a Kineto JSON (.json, .json.gz) or nsys SQLite export, chosen by content."""

from __future__ import annotations

import os
from pathlib import Path

from perflab.errors import PerflabError
from perflab.trace.schema import Trace

SQLITE_MAGIC = b"SQLite format 3\x00"
GZIP_MAGIC = b"\x1f\x8b"


def plain_trace_path(path: Path) -> Path | None:
    """Where a ``.json.gz`` trace is first written plain (``Tracer(compress_later=True)``): its name less ``.gz``."""
    path = Path(path)
    return path.with_name(path.name[:-3]) if path.name.endswith(".gz") else None


def compress_trace(path: str | Path) -> None:
    """``path`` (a .json.gz) made from the plain JSON written beside it (``plain_trace_path``), which is then removed;
    nothing where there is none. Level 6, in blocks: a GPU trace of hundreds of MB never sits in memory."""
    import gzip
    import shutil

    plain = plain_trace_path(Path(path))
    if plain is None or not plain.exists():
        return
    partial = Path(path).with_name(Path(path).name + ".partial")
    with open(plain, "rb") as src, gzip.open(partial, "wb", compresslevel=6) as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    os.replace(partial, path)
    plain.unlink()


def load_trace(path: str | Path) -> Trace:
    """Load a trace file into a :class:`Trace` (PerflabError, with one line saying why, on bad input)."""
    path = Path(path)
    if not path.exists():
        raise PerflabError(f"{path}: no such file")
    if path.is_dir():
        raise PerflabError(f"{path}: is a directory, not a trace file")
    kind = sniff(path)
    if kind == "sqlite":
        from perflab.trace.nsys import load_nsys

        return load_nsys(path)
    if kind in ("json", "gzip"):
        from perflab.trace.kineto import load_kineto

        return load_kineto(path)
    if kind == "empty":
        raise PerflabError(f"{path}: the file is empty")
    raise PerflabError(f"{path}: neither a Kineto JSON trace (.json, .json.gz) nor an nsys SQLite export")


def sniff(path: Path) -> str:
    """"sqlite", "gzip", "json", "empty" or "unknown", from the first bytes of the file."""
    with open(path, "rb") as f:
        head = f.read(4096)
    if not head:
        return "empty"
    if head.startswith(SQLITE_MAGIC):
        return "sqlite"
    if head.startswith(GZIP_MAGIC):
        return "gzip"
    text = head.lstrip(b"\xef\xbb\xbf").lstrip()
    if text.startswith((b"{", b"[")):
        return "json"
    return "unknown"
