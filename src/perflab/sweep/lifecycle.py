"""The lifecycle of every run into a store, whatever drives its cases: the local engine (``sweep.runner``), the Ray
engine (``sweep.ray_engine``) and the versions of ``ab``/``track`` (``sweep.versions``).

``SweepSession`` takes the store's lock (one writer per directory), opens the store, records the environments and the
run (``begin``), drives the cases with SIGTERM taken as Ctrl-C (``drive``), stores each row as it comes (``put``,
``case_done``), and at the end records how the run ended. What is stored stays stored however it ends: Ctrl-C or
SIGTERM is an interrupted run to resume; another error ends it as failed, a full disk in one line that names the store,
what it keeps and how to go on. An engine decides only what to run (reading ``session.store``) and how to run it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from perflab.errors import PerflabError
from perflab.paths import make_out_dir
from perflab.sweep.experiment import Experiment
from perflab.sweep.store import Store, disk_full, store_path

EventHandler = Callable[..., None]


def _ignore(kind: str, **info) -> None:
    pass


@dataclass
class SweepSummary:
    """What a sweep (local or Ray) did: its cases, those already stored, those run now by status, how it ended."""

    out_dir: Path
    env_key: str
    total: int  # cases in the experiment
    skipped: int  # already stored (resume)
    counts: dict = field(default_factory=dict)  # status → cases run and stored by this sweep
    interrupted: bool = False
    reruns: int = 0  # cases started again after their node was lost (Ray engine)

    @property
    def done(self) -> int:
        """Cases run and stored by this sweep."""
        return sum(self.counts.values())

    @property
    def store_path(self) -> Path:
        return store_path(self.out_dir)


class SweepSession:
    """One run into ``out_dir``'s store; see the module docstring. Use as a context manager::

        with SweepSession(out_dir, summary, on_event=emit) as session:
            todo = ...  # what session.store does not hold yet
            session.begin(environments, experiment=..., record=..., env_key=..., n_cases=..., n_skipped=..., command=...)
            session.drive(lambda: ...)  # runs the cases, calling session.put (or session.case_done) for each row

    ``summary`` is the engine's summary (a ``SweepSummary``, or versions' own): ``interrupted`` is set on it, and
    ``case_done`` counts each row into its ``counts`` (status → rows). ``on_event(kind, **info)`` hears "start"
    (``begin``'s ``start`` items), what the engine emits through ``session.emit``, and "finish" (summary) once the run
    has begun, however it ends. ``again``: how to go on after a
    full disk (a sweep's: ``--resume``); ``kept``: which of this run's rows a full disk leaves stored."""

    def __init__(self, out_dir, summary, *, on_event: EventHandler | None = None, again: str = "rerun with --resume to run the rest",
                 kept: str = "each committed when its case ended"):
        self.out_dir = Path(out_dir)
        self.summary = summary
        self.emit = on_event or _ignore
        self.again = again
        self.kept = kept
        self.store: Store | None = None
        self.sweep_id: int | None = None
        self.stored = 0  # rows this run stored
        self.outcome = "interrupted"  # until drive completes, or an error ends the run (failed); Ctrl-C anywhere leaves it
        self._exit = contextlib.ExitStack()

    def __enter__(self) -> "SweepSession":
        try:
            self._exit.enter_context(one_sweep_at_a_time(self.out_dir))
            make_work_dirs(self.out_dir)
            self.store = self._exit.enter_context(Store.create(self.out_dir))
        except BaseException as exc:
            self._exit.close()
            self._raise_if_full(exc)
            raise
        return self

    def begin(self, environments: Iterable[tuple[str, dict]], *, experiment: Experiment, record: dict, env_key: str, n_cases: int,
              n_skipped: int, command: str = "", start: dict | None = None) -> None:
        """Store the environments ((env key, environment) pairs; a key stored already keeps its first) the rows will be
        stored under, record the run (``record``: its experiment as stored), and emit "start" with ``start``'s items."""
        for key, env in environments:
            self.store.put_environment(key, env)
        self.sweep_id = self.store.begin_sweep(command=command, spec_source=experiment.source, spec_text=experiment.text,
                                               experiment=record, env_key=env_key, n_cases=n_cases, n_skipped=n_skipped)
        self.emit("start", **(start or {}))

    def drive(self, run_cases: Callable[[], None]) -> None:
        """``run_cases()`` with SIGTERM taken as Ctrl-C: either stops it, the engine's ``finally`` stopping its workers,
        and the run is interrupted (``summary.interrupted``); another error is raised, and ends the run as failed."""
        try:
            with sigterm_as_interrupt():
                run_cases()
            self.outcome = "complete"
        except KeyboardInterrupt:
            self.summary.interrupted = True

    def put(self, row: dict, env_key: str, *, worker: str, wall_s: float | None = None, replace: bool = False) -> None:
        """Commit one row of this run."""
        self.store.put(row, env_key, sweep_id=self.sweep_id, worker=worker, wall_s=wall_s, replace=replace)
        self.stored += 1

    def case_done(self, case, row: dict, env_key: str, *, slot: str, wall_s: float | None, replace: bool) -> None:
        """A sweep's case ended: its row committed (``slot`` its worker), counted in the summary and emitted."""
        self.put(row, env_key, worker=slot, wall_s=wall_s, replace=replace)
        self.summary.counts[row["status"]] = self.summary.counts.get(row["status"], 0) + 1
        self.emit("case_done", case=case, row=row, slot=slot)

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is not None and not isinstance(exc, KeyboardInterrupt) and self.outcome != "complete":
            self.outcome = "failed"
        try:
            try:
                self._end()
            finally:
                self._exit.close()
                if self.sweep_id is not None:
                    self.emit("finish", summary=self.summary)
        except BaseException as late:  # the end itself failed (a disk full since the last row)
            self._raise_if_full(late)
            raise
        if exc is not None:
            self._raise_if_full(exc)

    def _end(self) -> None:
        if self.sweep_id is not None:
            # a run that failed on a full disk may not record its end either: its own error is the one to tell
            with contextlib.suppress(sqlite3.OperationalError) if self.outcome == "failed" else contextlib.nullcontext():
                self.store.end_sweep(self.sweep_id, self.outcome, self.stored)
        for name in ("tmp", "flops"):  # the result files' (read and removed), and FLOP counts' where no case counted any
            with contextlib.suppress(OSError):  # not empty: kept
                (self.out_dir / name).rmdir()

    def _raise_if_full(self, exc: BaseException) -> None:
        if isinstance(exc, (sqlite3.OperationalError, OSError)) and disk_full(exc):
            raise PerflabError(f"{store_path(self.out_dir)}: the disk is full ({exc}); the store keeps the rows it held before and "
                               f"the {self.stored} row(s) of this run stored before it ({self.kept}; what was in flight is not "
                               f"stored). Free space, then {self.again}") from None


WORK_DIRS = {"logs": "logs", "tmp": "result files", "flops": "FLOP counts"}  # DIR's directories and what the workers write there


def make_work_dirs(out_dir: Path) -> None:
    """DIR's directories the workers write to, made before the store is opened or a case runs: a file where one goes is
    one line, not a traceback after the run has begun, nor an error row for every case."""
    for name, what in WORK_DIRS.items():
        try:
            (out_dir / name).mkdir(exist_ok=True)
        except OSError as exc:
            raise PerflabError(f"{out_dir / name}: cannot make the directory the workers write their {what} to "
                               f"({exc.strerror or exc}); move what is there, or give another --out") from None


@contextlib.contextmanager
def one_sweep_at_a_time(out_dir: Path):
    """An exclusive lock on DIR/sweep.lock: the store has one writer. The OS drops it when the process dies."""
    make_out_dir(out_dir)
    try:
        lock = open(out_dir / "sweep.lock", "a+")
    except OSError as exc:  # not writable, or a directory of that name: nothing stored here is touched
        raise PerflabError(f"{out_dir / 'sweep.lock'}: cannot open the store's lock ({exc.strerror or exc}); give another --out") from None
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            raise PerflabError(f"{out_dir}: another sweep ({holder}) is writing here; wait for it, or give another --out") from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"pid {os.getpid()} on {socket.gethostname()}")
        lock.flush()
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


class sigterm_as_interrupt:
    """Treat SIGTERM like Ctrl-C, so a terminated run stops its workers and records itself as interrupted."""

    def __enter__(self):
        self.previous = None
        try:
            self.previous = signal.signal(signal.SIGTERM, self._handle)
        except ValueError:  # not in the main thread: leave signals alone
            pass
        return self

    def _handle(self, signum, frame):
        raise KeyboardInterrupt

    def __exit__(self, *exc):
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)
        return False
