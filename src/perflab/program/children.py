"""The processes a program starts: followed where they step, listed either way, ended with the program.

A program that starts its training processes itself (``torch.multiprocessing.spawn``, a ``multiprocessing`` Process or
Pool, by spawn or by fork) steps in them, not in the process perflab started. As coverage.py and VizTracer follow
children, perflab does two things while the program runs:

- **every new interpreter** started with perflab's environment (``CHILD_ENV``: the run's options, as JSON) imports
  ``program/startup/sitecustomize.py`` first (its folder is put at the front of ``PYTHONPATH``), which wraps
  ``multiprocessing``'s process bootstrap there and then hands on to the interpreter's own ``sitecustomize``;
- **a forked child** inherits the same wrapper from the process perflab started, which wraps it at the run's start.

In the child, the wrapper (``child_bootstrap``) looks at what the process runs:

- a DataLoader worker (``torch.utils.data``'s worker loop) is not followed: its batches are timed as the input's
  (``program.loop``); a spawned worker has the dataset fetchers wrapped there;
- a rank of ``torch.multiprocessing.spawn`` (its ``_wrap``, rank i of the nprocs it was called with) is recorded as a
  torchrun rank is, in ``OUT/spawn/``: every rank its ``rankR/rank.json``, rank 0 the merge (``OUT/spawn/run.json``);
- any other process (a Process's target, a Pool's worker) is recorded on its own, in ``OUT/procPID/``;

each under a recorder of its own (``run.Run``), which reports nothing into the program and ends with the process. Each
writes what it is to ``OUT/processes/PID.json`` when it starts and again when it ends (steps seen, exit code, where its
report is). A Python process started otherwise (``subprocess``, a compiler's worker) writes one line there saying it
was not followed, and why. The process perflab started gathers these records at its end (``Follower``): the report
lists the processes seen, which stepped, and which were not followed; where the program stepped only in its children,
their report is the run's. A followed child asks the kernel to end it when its parent dies (``PR_SET_PDEATHSIG``), and
when the program ends by an exception or a signal, its processes still running are ended.

Nothing here imports torch at import time: the startup hook runs in every child interpreter.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

CHILD_ENV = "PERFLAB_RUN_CHILD"  # the run's configuration for its children (JSON)
NPROCS_ENV = "PERFLAB_SPAWN_NPROCS"  # how many ranks torch.multiprocessing.spawn starts, while it starts them
STARTUP_DIR = Path(__file__).resolve().parent / "startup"
PROCESSES = "processes"  # OUT/processes/PID.json: what each process the program started is
SPAWN = "spawn"  # OUT/spawn: the ranks of torch.multiprocessing.spawn, as torchrun's are in OUT
END_WAIT_S = 5.0  # a child still running when the program ends badly gets SIGTERM, then this long before SIGKILL


def _config() -> dict | None:
    text = os.environ.get(CHILD_ENV)
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def _write_record(config: dict, record: dict) -> None:
    folder = Path(config["out_dir"]) / PROCESSES
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{record['pid']}.tmp"
        tmp.write_text(json.dumps(dict(record, run_id=config.get("run_id"))))
        tmp.replace(folder / f"{record['pid']}.json")
    except OSError:
        pass  # a record that cannot be written must not harm the child


def _target_name(process) -> str:
    target = getattr(process, "_target", None)
    if target is None:
        return f"{type(process).__name__}.run"
    return f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', getattr(target, '__name__', '?'))}"


def classify(process) -> tuple[str, int | None, int | None]:
    """(kind, rank, world size) of a multiprocessing child: ``DataLoader worker``, ``spawned rank`` (of
    ``torch.multiprocessing.spawn``) or ``process``."""
    target = _target_name(process)
    if target == "torch.utils.data._utils.worker._worker_loop":
        return "DataLoader worker", None, None
    if target == "torch.multiprocessing.spawn._wrap":
        args = getattr(process, "_args", ()) or ()
        rank = args[1] if len(args) > 1 and isinstance(args[1], int) else None
        world = os.environ.get(NPROCS_ENV)
        return "spawned rank", rank, int(world) if world and world.isdigit() else None
    return "process", None, None


def _set_parent_death_signal() -> None:
    """Ask Linux to send this process SIGTERM when its parent dies: a child perflab follows never outlives the program."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def child_bootstrap(original):
    """``multiprocessing.process.BaseProcess._bootstrap`` wrapped: see the module's docstring."""

    def _bootstrap(process, *args, **kwargs):
        config = _config()
        if config is None or os.getpid() == config.get("top_pid"):
            return original(process, *args, **kwargs)
        kind, rank, world = classify(process)
        record = {"pid": os.getpid(), "ppid": os.getppid(), "kind": kind, "target": _target_name(process), "rank": rank,
                  "followed": kind != "DataLoader worker", "started": time.time()}
        if kind == "DataLoader worker":
            record["why"] = "a DataLoader worker: its batches are the input's (timed in it), not steps"
            _time_worker_batches()
            _write_record(config, record)
            return original(process, *args, **kwargs)
        resolve_hook(ABANDON_INHERITED)()
        _set_parent_death_signal()
        try:
            session, recorder = resolve_hook(START_SESSION)(config, kind, rank, world, record)
        except Exception as exc:  # perflab's own failure: the child runs as it would alone
            _write_record(config, dict(record, followed=False, why=f"perflab could not follow it ({type(exc).__name__}: {exc})"))
            return original(process, *args, **kwargs)
        _write_record(config, record)
        code = 1
        try:
            code = original(process, *args, **kwargs)
            return code
        finally:
            from perflab.program.script import Outcome

            try:
                result = session.finish(recorder, Outcome(code if isinstance(code, int) else 1))
                report = result.report
                record.update(steps_seen=session.source.seen, exit_code=code, timed_steps=(report.timing or {}).get("steps") if report else 0,
                              report=str(session.report_path) if session.written else None, out_dir=str(session.options.out_dir))
            except Exception as exc:
                record.update(exit_code=code, why=f"perflab's report of it failed ({type(exc).__name__}: {exc})")
            _write_record(config, dict(record, ended=time.time()))

    _bootstrap.__wrapped__ = original
    _bootstrap._perflab = True
    return _bootstrap


def resolve_hook(name: str | None):
    """``module:function`` → the function (None for none): how a child, in an interpreter of its own, finds what it
    calls above this module (a run's session, the console report, the page) without this module importing it."""
    if not name:
        return None
    import importlib

    module, _, function = name.partition(":")
    return getattr(importlib.import_module(module), function)


# what a followed child calls, in the module above this one that runs sessions (named: program.run imports this module)
START_SESSION = "perflab.program.run:start_child_session"
ABANDON_INHERITED = "perflab.program.run:abandon_inherited"


def _time_worker_batches() -> None:
    """A spawned DataLoader worker times its batches as a forked one does (a forked one inherited the wrapped fetchers)."""
    try:
        from torch.utils.data._utils import fetch

        from perflab.program.loop import wrap_fetcher

        for cls in (fetch._MapDatasetFetcher, fetch._IterableDatasetFetcher):
            if not getattr(cls.fetch, "_perflab", False):
                wrap_fetcher(cls, lambda owner, name, wrapper: setattr(owner, name, wrapper))
    except Exception:
        pass


def install_in_child() -> None:
    """The startup hook's work in a new interpreter that carries the run's configuration: wrap multiprocessing's
    bootstrap (a multiprocessing child then runs it), or, in a Python process started otherwise, say it was seen and
    not followed."""
    config = _config()
    if config is None:
        return
    import multiprocessing.process as mp_process

    if not getattr(mp_process.BaseProcess._bootstrap, "_perflab", False):
        mp_process.BaseProcess._bootstrap = child_bootstrap(mp_process.BaseProcess._bootstrap)
    argv = list(getattr(sys, "argv", []) or [])
    if "--multiprocessing-fork" in argv or any("forkserver" in a for a in argv):
        return  # a multiprocessing child: the bootstrap says what it is
    line = " ".join(getattr(sys, "orig_argv", argv)[1:])  # with -c, the code itself (argv holds only "-c")
    what = " ".join(line.split())[:100] or "python"
    if "resource_tracker" in line:
        why = "multiprocessing's resource tracker"
    elif "compile_worker" in line:
        why = "torch.compile's compile worker"
    else:
        why = "started by subprocess, not by multiprocessing: perflab follows multiprocessing's children"
    _write_record(config, {"pid": os.getpid(), "ppid": os.getppid(), "kind": "python subprocess", "target": what, "rank": None,
                           "followed": False, "why": why, "started": time.time()})


class Follower:
    """In the process perflab started: its children made to follow themselves, their records read at the end, and the
    ones still running ended when the program ends badly."""

    def __init__(self, config: dict):
        self.config = dict(config, top_pid=os.getpid())
        self._env: dict[str, str | None] = {}
        self._saved: list[tuple] = []

    def install(self) -> None:
        import multiprocessing.process as mp_process

        for name, value in ((CHILD_ENV, json.dumps(self.config, default=str)),
                            ("PYTHONPATH", os.pathsep.join([str(STARTUP_DIR), *filter(None, [os.environ.get("PYTHONPATH")])]))):
            self._env[name] = os.environ.get(name)
            os.environ[name] = value
        original = mp_process.BaseProcess._bootstrap
        if not getattr(original, "_perflab", False):
            self._saved.append((mp_process.BaseProcess, "_bootstrap", original))
            mp_process.BaseProcess._bootstrap = child_bootstrap(original)
        self._wrap_spawn()

    def _wrap_spawn(self) -> None:
        """``torch.multiprocessing.start_processes`` tells its children how many ranks it starts (``NPROCS_ENV``)."""
        try:
            import torch.multiprocessing as tmp
            import torch.multiprocessing.spawn  # noqa: F401  (the module: torch.multiprocessing.spawn is also its function)
        except Exception:
            return
        tspawn = sys.modules["torch.multiprocessing.spawn"]
        original = tspawn.start_processes

        def start_processes(fn, args=(), nprocs=1, *rest, **kwargs):
            before = os.environ.get(NPROCS_ENV)
            os.environ[NPROCS_ENV] = str(nprocs)
            try:
                return original(fn, args, nprocs, *rest, **kwargs)
            finally:
                if before is None:
                    os.environ.pop(NPROCS_ENV, None)
                else:
                    os.environ[NPROCS_ENV] = before

        for module in (tspawn, tmp):
            if getattr(module, "start_processes", None) is original:
                self._saved.append((module, "start_processes", original))
                setattr(module, "start_processes", start_processes)

    def remove(self) -> None:
        for name, value in self._env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._env = {}
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved = []

    def records(self) -> list[dict]:
        """Every record a process of this run wrote (``OUT/processes/PID.json``), in the order they started."""
        folder = Path(self.config["out_dir"]) / PROCESSES
        out = []
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if record.get("run_id") == self.config.get("run_id"):
                out.append(record)
        return sorted(out, key=lambda r: r.get("started") or 0)

    def children_report(self, records: list[dict]):
        """The report the program's children wrote, where they stepped (a ``records.run_report.RunReport``, its
        ``report_of`` the file's path), or None: the spawned ranks' merge (``OUT/spawn/run.json``), else the first
        followed process's that timed steps."""
        from perflab.errors import PerflabError
        from perflab.records.run_report import RunView, load

        out = Path(self.config["out_dir"])
        candidates = [out / SPAWN / "run.json"] + [Path(r["report"]) for r in records if r.get("report") and r.get("timed_steps")]
        for path in candidates:
            try:
                report = load(path)
            except PerflabError:  # none there, or not one this perflab reads
                continue
            if report.run_id == self.config.get("run_id") and RunView.of(report).timing.steps:
                report.report_of = str(path)
                return report
        return None

    @staticmethod
    def end_children() -> list[int]:
        """SIGTERM to the program's multiprocessing children still running, then SIGKILL to those still there after
        ``END_WAIT_S``; the pids ended."""
        import multiprocessing

        alive = [p for p in multiprocessing.active_children() if p.is_alive()]
        for process in alive:
            try:
                process.terminate()
            except Exception:
                pass
        deadline = time.monotonic() + END_WAIT_S
        for process in alive:
            process.join(max(deadline - time.monotonic(), 0.0))
            if process.is_alive():
                try:
                    process.kill()
                    process.join(1.0)
                except Exception:
                    pass
        return [p.pid for p in alive]


def processes_section(records: list[dict], top: dict) -> list[dict]:
    """The processes seen, the one perflab started first: per process its kind, what it ran, whether it was followed
    (and why not), the steps it saw and how it ended. DataLoader workers and processes not followed of one kind are one
    row each, with their count."""
    rows = [top]
    grouped: dict[tuple, dict] = {}
    for r in records:
        if r.get("followed"):
            rows.append({k: r.get(k) for k in ("pid", "ppid", "kind", "target", "rank", "followed", "steps_seen", "timed_steps", "exit_code", "out_dir", "why")})
            continue
        key = (r.get("kind"), r.get("why"))
        row = grouped.setdefault(key, {"pid": r.get("pid"), "kind": r.get("kind"), "target": r.get("target"), "followed": False,
                                       "why": r.get("why"), "count": 0, "pids": []})
        row["count"] += 1
        row["pids"].append(r.get("pid"))
    return rows + list(grouped.values())
