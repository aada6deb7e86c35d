"""The results store: ``DIR/results.sqlite``, one row per (case id, environment key).

SQLite in WAL mode with synchronous=FULL: each result is committed in its own transaction as soon as
its case finishes, so a ``kill -9`` of the sweep loses at most the case in flight, and the primary key
(case_id, env_key) means a case is never stored twice for one environment. The sweep's parent process
is the only writer; readers (report, results) may open the store while a sweep runs.

The full result row is kept as JSON (``row_json``); a few columns are copied out for queries. The
``sweeps`` table records each invocation (command, spec text, the expanded experiment) so a report can
say what produced it. Reading needs no torch.

The readers (``read_rows``, ``load_stored``) add the ``host_drift`` flag to rows whose host canary is
off their environment's median (``measure.canary.mark_host_flags``); the flag is derived from the rows
present each time they are read, never stored, so ``Store.rows`` returns the rows exactly as stored.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import re
import sqlite3
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Callable, Iterable

import msgspec

from perflab.errors import PerflabError, show
from perflab.records.row import StoredRow, row_version
from perflab.paths import make_out_dir, not_a_store

STORE_NAME = "results.sqlite"
SCHEMA_VERSION = 1
FAILED_STATUSES = ("error", "timeout", "invalid")  # statuses that --retry-failed runs again (an OOM would recur)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    case_id     TEXT NOT NULL,
    env_key     TEXT NOT NULL,
    status      TEXT NOT NULL,
    model       TEXT,
    input_size  INTEGER,
    batch_size  INTEGER,
    dtype       TEXT,
    mode        TEXT,
    row_json    TEXT NOT NULL,
    sweep_id    INTEGER,
    worker      TEXT,
    wall_s      REAL,
    stored_at   REAL NOT NULL,
    PRIMARY KEY (case_id, env_key)
);
CREATE TABLE IF NOT EXISTS environments (
    env_key     TEXT PRIMARY KEY,
    env_json    TEXT NOT NULL,
    first_seen  REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS sweeps (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    started_at      REAL NOT NULL,
    finished_at     REAL,
    outcome         TEXT,
    command         TEXT,
    spec_source     TEXT,
    spec_text       TEXT,
    experiment_json TEXT,
    env_key         TEXT,
    n_cases         INTEGER,
    n_skipped       INTEGER,
    n_done          INTEGER
);
"""

# Each table of ``_SCHEMA`` and its columns: what a sweep writes to in a store that is there already
_TABLES = {table: re.findall(r"^\s+([a-z_]+)\s+[A-Z]", body, re.M)
           for table, body in re.findall(r"CREATE TABLE IF NOT EXISTS (\w+) \((.*?)\n\);", _SCHEMA, re.S)}

# A stored row's ``cost_s`` (the sweep worker's split of its case's wall time), its keys in the order of a case's life
COST_ORDER = ("start_and_imports", "build", "check_and_flops", "check", "flops", "compile", "warmup", "timed", "ranks", "profile", "ncu")


def cost_stage(name: str) -> str:
    """A worker's stage as the cost split names it: a data-parallel case's launched ranks (logged as "2 ranks", and so
    stored before this name) are one stage, ``ranks``: their processes, build, warm-up and timing together."""
    return "ranks" if name.endswith(" ranks") else name


def store_path(out_dir) -> Path:
    return Path(out_dir) / STORE_NAME


# A sweep whose expanded experiment an earlier sweep of the store holds points to it (``Store.begin_sweep``).
SAME_AS = "same_as_sweep"
# A sweep record with no outcome never recorded its end: its process was killed (SIGKILL, the OOM killer, a lost
# machine), or it is still running. A later run into the store, which holds the store's lock, records it as KILLED
# (``Store.begin_sweep``); a reader says NOT_FINISHED of the latest record (``Store.sweeps``), never null.
KILLED = "killed"
NOT_FINISHED = "did not finish (killed, or still running)"


class Store:
    """A connection to one results store. Use ``Store.create`` (sweeps) or ``Store.open`` (readers)."""

    def __init__(self, path: Path, conn: sqlite3.Connection):
        self.path = path
        self.conn = conn
        self.unreadable: list[Unreadable] = []  # what the readers below left out, and why

    @classmethod
    def create(cls, out_dir) -> "Store":
        """Open DIR/results.sqlite for writing, creating DIR and the schema if needed. A store that is there already is
        checked first (SQLite's quick_check, one pass over its pages, and the tables and columns a sweep writes): a
        damaged one is refused before a case runs, in one line that says how to recover it or what it lacks, and nothing
        is written to it."""
        out_dir = make_out_dir(out_dir)
        store = cls._connect(store_path(out_dir))
        try:
            with reading(store.path):
                if store.conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'results'").fetchone() is None:
                    with store.conn:  # only a new store is written to here, so a refused sweep leaves an old one as it was
                        store.conn.executescript(_SCHEMA)
                        store.conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                elif (problem := store.conn.execute("PRAGMA quick_check(1)").fetchone()[0]) != "ok":
                    raise damaged(store.path, sqlite3.DatabaseError(problem))
                for table, columns in _TABLES.items():
                    store.conn.execute(f"SELECT {', '.join(columns)} FROM {table} LIMIT 0")
        except BaseException:
            store.close()
            raise
        return store

    @classmethod
    def open(cls, out_dir) -> "Store":
        """Open an existing store (PerflabError if DIR holds none)."""
        path = store_path(out_dir)
        if not path.is_file():
            raise PerflabError(not_a_store(out_dir, STORE_NAME))
        if path.stat().st_size == 0:  # SQLite would make it a database at the first pragma: leave it as it is
            raise PerflabError(f"{path}: an empty file (0 bytes), not a perflab results store; a sweep into {out_dir} "
                               "makes one there")
        store = cls._connect(path, write=False)
        try:
            version = store.conn.execute("PRAGMA user_version").fetchone()[0]
            store.conn.execute("SELECT 1 FROM results LIMIT 1")
        except _STORE_ERRORS as exc:
            store.close()
            raise _unreadable_store(path, exc) from None
        if version > SCHEMA_VERSION:
            store.close()
            raise PerflabError(f"{path}: written by a newer perflab (store version {version}); upgrade perflab to read it")
        return store

    @classmethod
    def _connect(cls, path: Path, write: bool = True) -> "Store":
        """``write=False`` (readers): the journal mode is left as the file has it, since setting it writes the file's
        header (a store perflab wrote is in WAL mode already, and a reader of it reads in that mode)."""
        try:
            conn = sqlite3.connect(str(path), timeout=30.0, isolation_level="DEFERRED")
            if write:
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute("PRAGMA synchronous = FULL")
        except _STORE_ERRORS as exc:
            raise (damaged(path, exc) if _is_damage(exc) else PerflabError(f"{path}: cannot open the results store ({exc})")) from None
        conn.row_factory = sqlite3.Row
        # Text whose bytes are not UTF-8 (a damaged page) reads with U+FFFD in their place, not a UnicodeDecodeError
        # that ends the whole read; the JSON columns are read as bytes and decoded strictly (``_decode``), so a damaged
        # record is named and skipped.
        conn.text_factory = lambda data: data.decode("utf-8", "replace")
        return cls(path, conn)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- results

    def put(self, row: dict, env_key: str, *, sweep_id: int | None = None, worker: str | None = None,
            wall_s: float | None = None, replace: bool = False) -> bool:
        """Commit one result row. Returns False if (case_id, env_key) was stored already and not replaced.

        A row that cannot be stored as it is (an integer past SQLite's 64 bits, text that will not encode) is stored as
        an ``error`` row saying why, with what of it can be kept: never lost, and the sweep goes on. ``row`` is then
        that error row, in place, so that the caller counts and shows what was stored."""
        try:
            return self._insert(row, env_key, sweep_id, worker, wall_s, replace)
        except _UNSTORABLE as exc:
            stored = unstorable_row(row, exc)
            row.clear()
            row.update(stored)
            return self._insert(row, env_key, sweep_id, worker, wall_s, replace)

    def _insert(self, row: dict, env_key: str, sweep_id, worker, wall_s, replace: bool) -> bool:
        verb = "INSERT OR REPLACE" if replace else "INSERT OR IGNORE"
        with self.conn:
            cursor = self.conn.execute(
                f"{verb} INTO results (case_id, env_key, status, {', '.join(_COLUMNS)}, row_json, sweep_id, worker, wall_s, stored_at)"
                f" VALUES ({', '.join('?' * (len(_COLUMNS) + 8))})",
                (row["case_id"], env_key, row.get("status") or "error", *(row.get(k) for k in _COLUMNS), dumps(row), sweep_id, worker,
                 wall_s, time.time()),
            )
        return cursor.rowcount > 0

    def statuses(self, env_key: str) -> dict[str, str]:
        """case_id → status of the rows stored under this environment."""
        cur = self.conn.execute("SELECT case_id, status FROM results WHERE env_key = ?", (env_key,))
        return {r["case_id"]: r["status"] for r in cur}

    def statuses_by_env(self) -> dict[tuple[str, str], str]:
        """(case_id, env_key) → status of every stored row."""
        return {(r["case_id"], r["env_key"]): r["status"] for r in self.conn.execute("SELECT case_id, env_key, status FROM results")}

    def delete(self, case_id: str, env_key: str) -> None:
        with self.conn:
            self.conn.execute("DELETE FROM results WHERE case_id = ? AND env_key = ?", (case_id, env_key))

    def count(self, env_key: str | None = None) -> int:
        if env_key is None:
            return self.conn.execute("SELECT COUNT(*) FROM results").fetchone()[0]
        return self.conn.execute("SELECT COUNT(*) FROM results WHERE env_key = ?", (env_key,)).fetchone()[0]

    def rows(self, env_key: str | None = None) -> list[dict]:
        """Stored rows in the order they were stored, each with its ``env_key``. A row whose JSON cannot be read as a
        row is left out and named in ``self.unreadable``."""
        sql = "SELECT case_id, env_key, CAST(row_json AS BLOB) AS row_json FROM results"
        args: tuple = ()
        if env_key is not None:
            sql += " WHERE env_key = ?"
            args = (env_key,)
        out = []
        for r in self.conn.execute(sql + " ORDER BY rowid", args):
            try:
                row = decode_row(r["row_json"])
            except ValueError as exc:
                self.unreadable.append(Unreadable("row", r["case_id"], r["env_key"], str(exc)))
                continue
            row["env_key"] = r["env_key"]
            out.append(row)
        return out

    def env_keys(self) -> list[str]:
        """Environment keys with stored rows, most rows first."""
        cur = self.conn.execute("SELECT env_key, COUNT(*) AS n FROM results GROUP BY env_key ORDER BY n DESC, MAX(rowid) DESC")
        return [r["env_key"] for r in cur]

    # -- environments and sweep records

    def put_environment(self, env_key: str, env: dict) -> None:
        with self.conn:
            self.conn.execute(
                "INSERT OR IGNORE INTO environments (env_key, env_json, first_seen) VALUES (?, ?, ?)",
                (env_key, dumps(env), time.time()),
            )

    def environments(self) -> dict[str, dict]:
        out = {}
        for r in self.conn.execute("SELECT env_key, CAST(env_json AS BLOB) AS env_json FROM environments"):
            try:
                out[r["env_key"]] = _decode(r["env_json"], _EnvShape)
            except ValueError as exc:
                self.unreadable.append(Unreadable("environment", r["env_key"], r["env_key"], str(exc)))
        return out

    def begin_sweep(self, *, command: str, spec_source: str, spec_text: str, experiment: dict, env_key: str,
                    n_cases: int, n_skipped: int) -> int:
        """Record a sweep. Its expanded experiment is stored once per store: a sweep whose experiment an earlier one
        stored (every ``--resume`` of a grid) keeps ``{"same_as_sweep": N}`` instead, and so do older copies, so a store
        resumed many times does not grow by the whole grid each time (38 KB a sweep for lm_sizes' 240 cases)."""
        text = dumps(experiment)
        with self.conn:
            # the store's lock is held (``lifecycle.one_sweep_at_a_time``): an earlier run with no end recorded was killed;
            # its rows are counted (it stored each as its case ended, and its count only at the end)
            self.conn.execute("UPDATE sweeps SET outcome = ?, n_done = (SELECT COUNT(*) FROM results WHERE results.sweep_id = sweeps.id) "
                              "WHERE outcome IS NULL", (KILLED,))
            first = self.conn.execute("SELECT id FROM sweeps WHERE experiment_json = ? ORDER BY id LIMIT 1", (text,)).fetchone()
            stored = text
            if first is not None:
                stored = dumps({SAME_AS: int(first[0])})
                self.conn.execute("UPDATE sweeps SET experiment_json = ? WHERE experiment_json = ? AND id > ?", (stored, text, int(first[0])))
            cur = self.conn.execute(
                "INSERT INTO sweeps (started_at, command, spec_source, spec_text, experiment_json, env_key, n_cases, n_skipped, n_done)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0)",
                (time.time(), command, spec_source, spec_text, stored, env_key, n_cases, n_skipped),
            )
        return int(cur.lastrowid)

    def end_sweep(self, sweep_id: int, outcome: str, n_done: int) -> None:
        with self.conn:
            self.conn.execute(
                "UPDATE sweeps SET finished_at = ?, outcome = ?, n_done = ? WHERE id = ?", (time.time(), outcome, n_done, sweep_id)
            )

    def sweeps(self) -> list[dict]:
        """Sweep records, oldest first (``experiment`` decoded; ``{}`` where it cannot be, named in ``unreadable``). A
        record with no outcome (its run never recorded its end) reads as ``KILLED`` where a later one follows it, else
        ``NOT_FINISHED``, with the rows it stored as its ``n_done``; the store is not written."""
        out = []
        by_id: dict[int, dict] = {}
        for r in self.conn.execute("SELECT *, CAST(experiment_json AS BLOB) AS experiment_blob FROM sweeps ORDER BY id"):
            d = dict(r)
            problems = []  # one record, however many of its parts are wrong
            for name, kind in _SWEEP_COLUMNS.items():  # a column of the wrong type is named and read as unknown
                try:
                    msgspec.convert(d.get(name), kind)  # a column lost to a damaged schema reads as unknown
                except msgspec.ValidationError as exc:
                    problems.append(f"column {name} ({show(d[name])}): {_short(exc)}")
                    d[name] = None
            try:
                d.pop("experiment_json", None)
                experiment = _decode(d.pop("experiment_blob") or b"{}", _ExperimentShape)
                if set(experiment) == {SAME_AS}:
                    experiment = by_id.get(msgspec.convert(experiment[SAME_AS], int), {})
            except (ValueError, msgspec.ValidationError) as exc:
                problems.append(f"experiment_json: {_short(exc)}")
                experiment = {}
            if problems:
                self.unreadable.append(Unreadable("sweep", str(d["id"]), d.get("env_key") or "", "; ".join(problems)))
            d["experiment"] = by_id[d["id"]] = experiment
            out.append(d)
        for i, d in enumerate(out):
            if d["outcome"] is None:
                d["outcome"] = KILLED if i < len(out) - 1 else NOT_FINISHED
                d["n_done"] = self.conn.execute("SELECT COUNT(*) FROM results WHERE sweep_id = ?", (d["id"],)).fetchone()[0]
        return out


@dataclass(frozen=True)
class Unreadable:
    """A stored record a reader left out: a row (``key``: its case id), a sweep record (its id) or an environment."""

    what: str  # "row", "sweep" or "environment"
    key: str
    env_key: str
    problem: str

    def line(self) -> str:
        where = f" ({self.env_key})" if self.env_key and self.env_key != self.key else ""
        return f"{self.what} {self.key}{where}: {self.problem}; skipped"


class _EnvShape(msgspec.Struct):
    """The keys of a stored environment its readers rely on (the GPU names choose the rows a report shows)."""

    gpus: list[str] | None = None


class _RunVersion(msgspec.Struct):
    key: str


class _ExperimentShape(msgspec.Struct):
    """The keys of a stored run's experiment its readers rely on: an ab or track run's versions (two or more: ab and
    track refuse fewer), each with its key (the report groups the rows by it)."""

    versions: Annotated[list[_RunVersion], msgspec.Meta(min_length=2)] | None = None


# The sweep records' columns and their types, as ``Store.sweeps``'s readers take them (SQLite stores what it is given).
_SWEEP_COLUMNS = {"started_at": float | None, "finished_at": float | None, "outcome": str | None, "command": str | None,
                  "spec_source": str | None, "spec_text": str | None, "env_key": str | None, "n_cases": int | None,
                  "n_skipped": int | None, "n_done": int | None}


def decode_row(text) -> dict:
    """A stored row's JSON → the row; ValueError saying what is wrong with it (cut short, not an object, a key of the
    wrong type)."""
    return _decode(text, StoredRow, "not a result row")


def _decode(text, shape: type = dict, wrong: str = "not as stored"):
    """JSON text → a JSON object (a dict) with the keys of ``shape`` (a msgspec Struct) of their types; ValueError (one
    line) where it is not JSON, not an object, or a key is missing or of the wrong type (``wrong``, and msgspec's why)."""
    try:
        if isinstance(text, bytes):  # as the readers select it: not UTF-8 is damage too
            text = text.decode("utf-8")
        value = json.loads(text)
    except (TypeError, ValueError, RecursionError) as exc:  # RecursionError: arrays or objects nested past Python's limit
        size = f" of {len(text)} characters" if isinstance(text, str) else ""
        raise ValueError(f"malformed JSON{size}, cut short or damaged ({_short(exc)})") from None
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {type(value).__name__}")
    if shape is not dict:
        try:
            msgspec.convert(value, shape)
        except msgspec.ValidationError as exc:
            raise ValueError(f"{wrong} ({_short(exc)})") from None
    return value


def _short(exc: Exception) -> str:
    return " ".join(str(exc).split())[:160]


# What reading a store can raise: SQLite's errors, and a UnicodeDecodeError where SQLite's message quotes the bytes of a
# damaged schema
_STORE_ERRORS = (sqlite3.DatabaseError, UnicodeDecodeError)


def _is_damage(exc: Exception) -> bool:
    """A store whose pages are damaged (SQLITE_CORRUPT), not one that is locked or not a database at all."""
    if isinstance(exc, UnicodeDecodeError):
        return True
    name = getattr(exc, "sqlite_errorname", "")  # Python 3.11+
    return name.startswith("SQLITE_CORRUPT") if name else "malformed" in str(exc)


def damaged(path, exc: Exception) -> PerflabError:
    path = Path(path)
    copy = path.parent.with_name(path.parent.name + "_recovered")
    return PerflabError(f"{path}: the store is damaged ({_short(exc)}); recover what it holds with `mkdir {copy} && "
                        f"sqlite3 {path} .recover | sqlite3 {copy / STORE_NAME}` and read {copy} instead")


@contextlib.contextmanager
def reading(path):
    """Reads of a store whose pages are damaged end in one line naming the file (``damaged``), and so do reads of one
    that lacks a table or column perflab's stores have."""
    try:
        yield
    except _STORE_ERRORS as exc:
        raise _unreadable_store(path, exc) from None


def _unreadable_store(path, exc: Exception) -> PerflabError:
    return damaged(path, exc) if _is_damage(exc) else PerflabError(f"{path}: not a perflab results store ({exc})")


def report_unreadable(unreadable: list[Unreadable], on_unreadable: Callable[[Unreadable], None] | None, path) -> None:
    """Each left-out record to ``on_unreadable``, or as a warning where there is none."""
    for item in unreadable:
        if on_unreadable is not None:
            on_unreadable(item)
        else:
            warnings.warn(f"{path}: {item.line()}", stacklevel=3)


def read_rows(out_dir, env_key: str | None = None, on_unreadable: Callable[[Unreadable], None] | None = None) -> list[dict]:
    """The stored rows (of one environment, or all), each judged for ``host_drift`` against its own environment's rows.
    Rows that cannot be decoded are left out, each passed to ``on_unreadable`` (a warning without it)."""
    from perflab.measure.canary import mark_host_flags

    with Store.open(out_dir) as store, reading(store.path):
        rows = store.rows(env_key)
    report_unreadable(store.unreadable, on_unreadable, store.path)
    return mark_host_flags(rows)


def dumps(value) -> str:
    """JSON with NaN/inf as null and numpy scalars as plain numbers."""
    return json.dumps(_plain(value), allow_nan=False)


def _plain(value):
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, bool)):
        return value
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return _plain(value.tolist())
    return str(value)


# What a row's values can do to an INSERT: an int past 64 bits (OverflowError), a str() refused (ValueError: over 4300
# digits), a lone surrogate (UnicodeEncodeError), a type sqlite3 cannot bind in a column (ProgrammingError since Python
# 3.11, InterfaceError before). A full disk or a lock is not the row's fault.
_UNSTORABLE = (OverflowError, ValueError, TypeError, sqlite3.InterfaceError, sqlite3.ProgrammingError, sqlite3.DataError)
_COLUMNS = ("model", "input_size", "batch_size", "dtype", "mode")  # the row's keys that ``_insert`` binds as columns


def unstorable_row(row: dict, exc: Exception) -> dict:
    """A row that could not be stored (``exc``) as an ``error`` row that can: the values that cannot (integers past 64
    bits, text that will not encode, what JSON cannot hold) become null, and its message names them and its status."""
    from perflab.spec import INT64_MAX, INT64_MIN

    dropped: list[str] = []

    def keep(value, path: str):
        if isinstance(value, bool) or value is None or isinstance(value, float):
            return value
        if isinstance(value, int):
            if INT64_MIN <= value <= INT64_MAX:
                return value
        elif isinstance(value, str):
            try:
                value.encode("utf-8")
                return value
            except UnicodeEncodeError:
                pass
        elif isinstance(value, dict):
            return {str(k): keep(v, f"{path}.{k}" if path else str(k)) for k, v in value.items()}
        elif isinstance(value, (list, tuple)):
            return [keep(v, f"{path}[{i}]") for i, v in enumerate(value)]
        elif hasattr(value, "tolist"):
            return keep(value.tolist(), path)
        else:
            return str(value)
        dropped.append(path)
        return None

    kept = keep(dict(row), "")
    for key in _COLUMNS:  # a column takes one value, not a list or mapping
        if isinstance(kept.get(key), (list, dict)):
            dropped.append(key)
            kept[key] = None
    was = f"{kept.get('status') or 'unknown'}" + (f": {str(kept['message'])[:200]}" if kept.get("message") else "")
    reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
    nulled = f"; {', '.join(dropped[:5])}{' and more' if len(dropped) > 5 else ''} stored as null" if dropped else ""
    kept.update(case_id=str(row.get("case_id")), status="error",
                message=f"this row could not be stored as measured ({reason}){nulled}; it was {was}")
    return kept


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` says the disk (or the store's quota) is full: SQLite's SQLITE_FULL ("database or disk is full"),
    or an OSError ENOSPC or EDQUOT from a file written beside the store."""
    if isinstance(exc, sqlite3.OperationalError):
        name = getattr(exc, "sqlite_errorname", "")  # Python 3.11+
        return name == "SQLITE_FULL" or (not name and "database or disk is full" in str(exc))
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


RUN_KINDS = ("sweep", "ab", "track")


def run_kinds(store: Store) -> set[str]:
    """The kinds of run that wrote ``store``: "sweep", "ab" or "track", by its sweep records; by its rows where no
    record says (a row without ``version`` is a sweep's). A record or row that names no kind perflab knows (one that
    cannot be read, a versions run from before the kind was recorded) says nothing."""
    def known(kinds) -> set[str]:  # a damaged record's kind may be any JSON value
        return {k for k in kinds if isinstance(k, str) and k in RUN_KINDS}

    experiments = [record["experiment"] for record in store.sweeps() if record.get("experiment")]
    recorded = known(e.get("kind") if e.get("versions") else "sweep" for e in experiments)
    return recorded or known(row_version(row).get("kind_of_run") if row.get("version") else "sweep" for row in store.rows())


def status_counts(rows: Iterable[dict]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.get("status") or "?"] = counts.get(row.get("status") or "?", 0) + 1
    return counts


class StoredSweep:
    """What a sweep directory holds, read back: the rows of one environment and the experiment behind them."""

    def __init__(self, out_dir, rows, experiment, sweeps, environments, env_key, other_env_keys, all_rows=None, unreadable=()):
        self.out_dir = Path(out_dir)
        self.rows = rows  # of env_key, in stored order
        self.experiment = experiment  # the latest sweep's Experiment, or None (rows stored by other means)
        self.sweeps = sweeps  # sweep records, oldest first
        self.environments = environments  # env_key → the parent's environment probe
        self.env_key = env_key
        self.other_env_keys = other_env_keys  # environments with rows not shown (resumed elsewhere, other GPU types)
        self.all_rows = rows if all_rows is None else all_rows  # of every environment (the cross-GPU table)
        self.unreadable = list(unreadable)  # records left out (Unreadable), which the report names


def load_stored(out_dir, env_key: str | None = None) -> StoredSweep:
    """Rows of one environment (default: the latest sweep's, else the one with most rows) and the experiment.

    A Ray sweep records the keys of all its nodes (comma-separated); then the rows shown are those of its
    keys with the same GPUs as the key with most rows (one GPU type, any host), the others go to the
    cross-GPU table.
    """
    from perflab.measure.canary import mark_host_flags
    from perflab.sweep.spec import Experiment

    with Store.open(out_dir) as store, reading(store.path):
        sweeps = store.sweeps()
        keys = store.env_keys()
        environments = store.environments()
        shown = [env_key]
        if env_key is None:
            latest = (sweeps[-1]["env_key"] or "").split(",") if sweeps else []
            env_key = next((k for k in keys if k in latest), keys[0] if keys else (latest[0] if latest else None))
            gpus = _gpu_names(environments.get(env_key))
            shown = [k for k in keys if k == env_key or (k in latest and _gpu_names(environments.get(k)) == gpus)]
        all_rows = mark_host_flags(store.rows())  # each row against the median canary of its own environment
        rows = [r for r in all_rows if r["env_key"] in shown] if env_key is not None else []
    experiment = None
    if sweeps and sweeps[-1]["experiment"]:
        try:
            experiment = Experiment.from_json(sweeps[-1]["experiment"], text=sweeps[-1].get("spec_text") or "")
        except (TypeError, ValueError, KeyError, AttributeError, PerflabError) as exc:  # a record of the wrong shape: the rows alone
            store.unreadable.append(Unreadable("sweep", str(sweeps[-1]["id"]), sweeps[-1].get("env_key") or "",
                                               f"experiment_json is not an experiment ({type(exc).__name__}: {_short(exc)}); "
                                               "the cases it did not run are not counted"))
    return StoredSweep(out_dir, rows, experiment, sweeps, environments, env_key, [k for k in keys if k not in shown], all_rows,
                       unreadable=store.unreadable)


def _gpu_names(env: dict | None) -> list:
    return sorted(set((env or {}).get("gpus") or []))
