"""Output paths: created or checked before any work, so a bad path costs one line, not a finished run."""

from __future__ import annotations

from pathlib import Path

from perflab.errors import PerflabError


def make_out_dir(out_dir) -> Path:
    """Create the output directory (and parents), or say in one line why it cannot be."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise PerflabError(f"{out_dir}: exists and is not a directory; give --out a directory")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PerflabError(f"{out_dir}: cannot create the output directory ({exc.strerror})") from None
    return out_dir


def check_writable_file(path) -> Path:
    """A file that can be written later: not a directory, and its directory exists."""
    path = Path(path)
    if path.is_dir():
        raise PerflabError(f"{path}: is a directory; give --out a file name")
    if not path.parent.exists():
        raise PerflabError(f"{path}: the directory {path.parent} does not exist")
    return path
