"""Output paths: created or checked before any work, so a bad path costs one line, not a finished run."""

from __future__ import annotations

import json
import os
from pathlib import Path

from perflab.errors import PerflabError

SRC = str(Path(__file__).resolve().parents[1])  # the directory this perflab is imported from


def make_out_dir(out_dir, flag: str = "--out") -> Path:
    """Create the output directory (and parents), or say in one line why it cannot be (``flag``: the option that named it)."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise PerflabError(f"{out_dir}: exists and is not a directory; give {flag} a directory")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PerflabError(f"{out_dir}: cannot create the {'output' if flag == '--out' else flag} directory ({exc.strerror})") from None
    return out_dir


def check_writable_file(path) -> Path:
    """A file that can be written later: not a directory, its parent a directory, and writable.

    Writability is tried, not inferred: opening the file for appending (created, then removed, if it
    did not exist) is the only check that holds for root, read-only mounts and pseudo-filesystems such
    as /proc, where permission bits say yes and the write still fails."""
    path = Path(path)
    if path.is_dir():
        raise PerflabError(f"{path}: is a directory; give --out a file name")
    if not path.parent.exists():
        raise PerflabError(f"{path}: the directory {path.parent} does not exist")
    if not path.parent.is_dir():
        raise PerflabError(f"{path}: {path.parent} is a file, not a directory")
    existed = path.exists()
    try:
        with open(path, "a"):
            pass
    except OSError as exc:
        raise PerflabError(f"{path}: cannot write here ({exc.strerror})") from None
    if not existed:
        path.unlink(missing_ok=True)
    return path


def write_failed(path, exc: OSError) -> PerflabError:
    """The one-line error for an output that could not be written after the work was done."""
    return PerflabError(f"{path}: could not write the results ({exc.strerror or exc}); they are printed above")


def child_env(env: dict | None = None) -> dict:
    """``env`` (default: this process's environment), copied, with this perflab's source first on PYTHONPATH: a child
    started as ``python -m perflab...`` imports this perflab, even where it was found through a relative PYTHONPATH."""
    out = dict(os.environ if env is None else env)
    out["PYTHONPATH"] = os.pathsep.join([SRC] + [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p and p != SRC])
    return out


INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def use_inductor_cache(path) -> Path:
    """Point inductor's on-disk caches (the FX graph cache and its autotuning results) at ``path``, for this process and
    every process it starts (``--inductor-cache``): the first process to compile a max-autotune case tunes it, and every
    later one, on this host or another given the same directory, reads those choices back instead of tuning again.
    Without it, inductor's default (``/tmp/torchinductor_$USER``) is shared by the processes of one host only, and a
    fresh machine tunes afresh. Call before anything compiles."""
    path = make_out_dir(path, "--inductor-cache").resolve()
    probe = path / ".perflab-write-test"
    try:
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise PerflabError(f"{path}: cannot write inductor's cache here ({exc.strerror}); give --inductor-cache another directory") from None
    os.environ[INDUCTOR_CACHE_ENV] = str(path)
    return path


RESULT_FILE_SUFFIXES = (".csv", ".jsonl", ".ndjson")  # bench --out's files of result rows
RUN_REPORTS = ("run.json", "rank.json")  # perflab run's report, and each rank's under torchrun
RUN_TRACE = "trace.json.gz"  # perflab run's trace, in its directory


def json_first_line(path) -> str:
    """What a .json file's first line holds, read without parsing the rest: ``row`` (a result row: an object with a
    case_id), ``trace`` (a Kineto trace or bare event list on one line, with any metadata key, case_id too: the trace
    reader's to parse) or ``other``."""
    try:
        with open(path) as f:
            line = f.readline(1 << 20)
        if '"traceEvents"' in line or line.lstrip().startswith("["):
            return "trace"
        if not line.lstrip().startswith("{"):
            return "other"
        first = json.loads(line)
        return "row" if isinstance(first, dict) and "case_id" in first else "other"
    except (OSError, ValueError, UnicodeDecodeError):
        return "other"


def not_a_store(path, store_name: str) -> str:
    """Why ``path``, given where a sweep's directory goes (``results``, ``report``), holds no store, in one line that
    says what it is and which command reads it: perflab run's directory or report, a trace, a bench --out file, the
    store file itself; else that none is there and how to make one."""
    path = Path(path)
    if path.is_dir() and any((path / name).is_file() for name in RUN_REPORTS):
        return (f"{path}: the output of `perflab run` (run.json, the report it printed when the program ended), not a sweep's "
                f"directory; `perflab report {path}` writes its page, and `perflab analyze {path / RUN_TRACE}` reads its trace")
    if path.is_dir() or not path.exists():
        missing = "" if path.exists() else " (no such directory)"
        return (f"{path}: no results store ({store_name}) here, nor a `perflab run`'s run.json{missing}; run `perflab sweep SPEC --out {path}` "
                f"(or `perflab run --out {path} -- SCRIPT`) first")
    name, suffix = path.name, path.suffix
    if name == store_name:
        return f"{path}: a sweep's store file; give the directory that holds it, {path.parent}"
    if name in RUN_REPORTS:
        return (f"{path}: the report of `perflab run` (printed when the program ended), not a sweep's directory; "
                f"`perflab analyze {path.parent / RUN_TRACE}` reads its trace")
    first = json_first_line(path) if suffix == ".json" else None
    if suffix in RESULT_FILE_SUFFIXES or first == "row":
        return (f"{path}: a file of result rows (bench --out), not a sweep's directory; `perflab compare {path} OTHER` "
                "reads it beside other results")
    if name.endswith((".json.gz", ".pt.trace.json")) or first == "trace" or suffix in (".sqlite", ".db", ".nsys-rep"):
        return f"{path}: a file, not a sweep's directory; if it is a trace, `perflab analyze {path}` reads it"
    return f"{path}: a file, not a sweep's output directory; give the directory `perflab sweep --out` wrote"
