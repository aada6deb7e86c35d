"""Progress on stderr for every command that runs long (bench, explain, explain --parallel, sweep, breakeven, ab, track).

One meter draws it: on a terminal a rich progress bar (what runs, the bar, done/total, the time elapsed and left); on
anything else (a pipe, a CI log) one line every ``PERFLAB_PROGRESS_S`` seconds (10 by default), from a thread of its
own, so a step that runs for minutes still says it is running, and one at the end where any was said (work shorter
than the interval says nothing: a command that fails at once keeps its one line)::

    perflab bench: 1/4 cases, 0:42 elapsed, about 2:06 left: gpt_small forward seq128 bs8 fp32 eager: warmup

The time left is the time elapsed per unit done so far, times the units left. The stages below measure, sweep and
diagnosis do not draw: they emit events (``measure.stages.Stage`` through ``on_case``/``on_stage``, the sweep
session's ``on_event``), and the drawers here turn them into the meter's units: ``BenchProgress`` (bench's cases,
each a unit: half its build and warm-up, half its timing), ``ExplainProgress`` (explain's parts: ceilings, timing
sessions, profile passes, rank launches), ``SweepProgress`` and ``ClusterProgress`` (a sweep's cases),
``VersionsProgress`` (the processes of ab and track).
"""

from __future__ import annotations

import collections
import math
import os
import threading
import time

INTERVAL_S = 10.0  # a line this often when stderr is not a terminal
INTERVAL_ENV = "PERFLAB_PROGRESS_S"


def interval_s(environ=None) -> float:
    """Seconds between progress lines: ``PERFLAB_PROGRESS_S`` where set (a number > 0), else ``INTERVAL_S``."""
    from perflab.errors import PerflabError

    text = (os.environ if environ is None else environ).get(INTERVAL_ENV, "").strip()
    if not text:
        return INTERVAL_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise PerflabError(f"{INTERVAL_ENV}={text!r}: expected the seconds between progress lines, a number above 0 (default {INTERVAL_S:g})")
    return value


def clock_text(seconds: float) -> str:
    """0:42, 12:05, 1:02:03."""
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def time_left_s(elapsed_s: float, done: float, total: float) -> float | None:
    """The time left at the pace so far (elapsed per unit done, times the units left); None before anything is done."""
    if total and done >= total:
        return 0.0
    if not done or done <= 0 or not total:
        return None
    return elapsed_s / done * (total - done)


def status_text(what: str, done: float, total: float, unit: str, elapsed_s: float, description: str) -> str:
    """One progress line: ``perflab WHAT: DONE/TOTAL UNIT, ELAPSED elapsed, about LEFT left: DESCRIPTION``."""
    left = time_left_s(elapsed_s, done, total)
    left_text = f", about {clock_text(left)} left" if left is not None and done < total else ""
    return f"perflab {what}: {int(done + 1e-9)}/{total} {unit}, {clock_text(elapsed_s)} elapsed{left_text}: {description}"


class Meter:
    """What runs, done of total units, since when: drawn by ``BarMeter`` or ``LineMeter`` (``meter`` picks)."""

    def __init__(self, console, what: str, unit: str, *, clock=time.monotonic):
        self.console, self.what, self.unit, self.clock = console, what, unit, clock
        self.total, self.done, self.description = 0, 0.0, "starting"
        self.started: float | None = None

    @property
    def elapsed_s(self) -> float:
        return self.clock() - self.started if self.started is not None else 0.0

    def line(self) -> str:
        return status_text(self.what, self.done, self.total, self.unit, self.elapsed_s, self.description)

    def start(self, total: int, description: str = "starting") -> None:
        self.total, self.done, self.description, self.started = total, 0.0, description, self.clock()

    def update(self, *, done: float | None = None, advance: float = 0.0, description: str | None = None, total: int | None = None) -> None:
        if total is not None:
            self.total = total
        if done is not None:
            self.done = done
        self.done = min(self.done + advance, self.total) if self.total else self.done + advance
        if description is not None:
            self.description = description

    def note(self, text: str) -> None:
        """A line of its own (a row that did not end ok, a resume), kept above the bar."""
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def finish(self, description: str = "done", complete: bool = False) -> None:
        """The end (``complete``: every unit done, where the units came in parts that need not add up)."""
        self.description = description
        if complete:
            self.done = self.total


def _columns():
    """rich's columns for done/total and the time left (by ``time_left_s``, the estimate the lines give)."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    class Done(ProgressColumn):
        def render(self, task):
            return Text(f"{int(task.completed + 1e-9)}/{int(task.total or 0)} {task.fields.get('unit', '')}", style="progress.download")

    class Left(ProgressColumn):
        def render(self, task):
            left = time_left_s(task.elapsed or 0.0, task.completed, task.total or 0)
            shown = left is not None and task.completed < (task.total or 0)
            return Text(f"about {clock_text(left)} left" if shown else "", style="progress.remaining")

    return Done(), Left()


class BarMeter(Meter):
    """A rich progress bar on the console (a terminal), gone when it finishes (the tables follow it)."""

    width = 120  # characters of the description

    def __init__(self, console, what: str, unit: str, *, clock=time.monotonic, auto_refresh: bool = True, **_line_options):
        super().__init__(console, what, unit, clock=clock)
        self.auto_refresh = auto_refresh
        self.progress = None
        self.task = None

    def start(self, total: int, description: str = "starting") -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        super().start(total, description)
        done, left = _columns()
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), done, TimeElapsedColumn(), left, console=self.console,
                                 transient=True, get_time=self.clock, auto_refresh=self.auto_refresh)
        self.progress.start()
        self.task = self.progress.add_task(self._escaped(), total=total, unit=self.unit)

    def _escaped(self) -> str:
        from rich.markup import escape

        return escape(self.description[:self.width]) or "…"  # a label may hold a path's brackets

    def update(self, **changes) -> None:
        super().update(**changes)
        if self.progress is not None:
            self.progress.update(self.task, completed=self.done, total=self.total, description=self._escaped(), refresh=not self.auto_refresh)

    def note(self, text: str) -> None:
        (self.progress.console if self.progress is not None else self.console).print(text, markup=False, highlight=False, soft_wrap=True)

    def finish(self, description: str = "done", complete: bool = False) -> None:
        super().finish(description, complete)
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


class LineMeter(Meter):
    """A line every ``interval`` seconds (from a thread that wakes when one is due, so a long stage without events still
    says it runs; ``ticker=False``: only as events come), and one at the end where any was said: work shorter than the
    interval says nothing, so a command that fails at once (bad input found while building) keeps its one line."""

    def __init__(self, console, what: str, unit: str, *, clock=time.monotonic, interval: float | None = None, ticker: bool = True,
                 **_bar_options):
        super().__init__(console, what, unit, clock=clock)
        self.interval = interval_s() if interval is None else interval
        self.ticker = ticker
        self._said = -math.inf
        self._spoke = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, total: int, description: str = "starting") -> None:
        super().start(total, description)
        self._said, self._spoke = self.clock(), False
        if self.ticker:
            self._stop.clear()
            self._thread = threading.Thread(target=self._tick, name="perflab-progress", daemon=True)
            self._thread.start()

    def update(self, **changes) -> None:
        with self._lock:
            super().update(**changes)
        self._say()

    def finish(self, description: str = "done", complete: bool = False) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        if self.started is None:
            return
        with self._lock:
            super().finish(description, complete)
        if self._spoke:
            self._say(force=True)
        self.started = None  # said once

    def _tick(self) -> None:
        while not self._stop.wait(max(0.01, self._said + self.interval - self.clock())):
            self._say()

    def _say(self, force: bool = False) -> None:
        with self._lock:
            now = self.clock()
            if self.started is None or not force and now - self._said < self.interval:
                return
            self._said, self._spoke = now, True
            line = self.line()
        self.console.print(line, markup=False, highlight=False, soft_wrap=True)


def meter(console, what: str, unit: str, **options) -> Meter:
    """A bar where ``console`` is a terminal (rich's ``is_terminal``: stderr's isatty, or FORCE_TERMINAL), lines otherwise.
    ``options``: ``clock`` (both), ``auto_refresh`` (the bar's), ``interval`` and ``ticker`` (the lines')."""
    return (BarMeter if console.is_terminal else LineMeter)(console, what, unit, **options)


# ---------------------------------------------------------------------------------------------------
# The commands' drawers: events in, the meter's units out


class CaseProgress:
    """How many of a run's cases are done (a fraction), from the stages ``on_case(index, case, stage)`` hears
    (``measure.harness``): each case is half done when its build and warm-up end (its timing begins, or the next
    case's build: cases timed together are all built first), and whole when its timing ends (the next case's build,
    or the end); cases timed together move from half to whole with their rounds. With ``processes``, each process runs
    every case again (``measure.stages`` "process"): the total is cases × processes."""

    def __init__(self, cases: int, processes: int = 1):
        self.cases, self.processes = cases, processes
        self.total = cases * processes
        self._before = 0  # the units of the processes that ended
        self._units: dict[int, float] = {}
        self._state: dict[int, str] = {}  # "building" → "built" (waits to be timed with others) | "timing" → "done"

    @property
    def done(self) -> float:
        return min(self._before + sum(self._units.values()), self.total)

    def hear(self, index: int, stage) -> None:
        kind = getattr(stage, "kind", None)
        if kind == "process":
            self._before, self._units, self._state = stage.done * self.cases, {}, {}
            return
        if kind == "round":
            self._finish_timed()
            for i in stage.cases:
                self._units[i] = 0.5 + 0.5 * stage.done / max(stage.total, 1)
                self._state[i] = "timing"
            return
        if index not in self._state:  # a case begins: those timed before it are done, those built wait to be timed
            self._finish_timed()
            for i, state in self._state.items():
                if state == "building":
                    self._units[i], self._state[i] = 0.5, "built"
            self._units[index], self._state[index] = 0.0, "building"
        if kind == "timing":
            self._units[index], self._state[index] = 0.5, "timing"

    def _finish_timed(self) -> None:
        for i, state in self._state.items():
            if state == "timing":
                self._units[i], self._state[i] = 1.0, "done"


class BenchProgress:
    """bench's progress: ``on_case`` for ``api.bench``, over ``cases`` (× ``processes``). Use as a context manager
    around the run: the meter starts with the first case (bad input refused before it leaves its one line alone), and
    finishes however the run ends."""

    def __init__(self, console, cases, processes: int = 1, what: str = "bench", **options):
        self.cases = CaseProgress(len(cases), processes)
        self.meter = meter(console, what, "cases" if processes == 1 else "case runs", **options)

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        self.meter.finish("done" if kind is None else "stopped", complete=kind is None)

    def __call__(self, index: int, case, stage) -> None:
        self.cases.hear(index, stage)
        words = str(stage) if getattr(stage, "kind", None) in ("round", "process") else f"{case.label()}: {stage}"
        if self.meter.started is None:
            self.meter.start(self.cases.total, words)
        self.meter.update(done=self.cases.done, description=words)


class ExplainProgress:
    """explain's progress (and explain --parallel's): ``on_stage`` and ``on_case`` for ``api.explain``. Its units are the
    parts ``diagnosis`` names (``Stage`` of kind "part": the ceilings, each timing session, each profile pass, each rank
    launch); within a timing session, its cases' stages move the part from begun to done (``CaseProgress``). The meter
    starts with the first part (bad input, refused before it, keeps its one line)."""

    def __init__(self, console, what: str = "explain", **options):
        self.meter = meter(console, what, "parts", **options)
        self._part = 0
        self._session: CaseProgress | None = None

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        self.meter.finish("done" if kind is None else "stopped", complete=kind is None)

    def on_stage(self, stage) -> None:
        if getattr(stage, "kind", None) == "part":
            if self.meter.started is None:
                self.meter.start(stage.total, str(stage))
            self._part = stage.done
            self._session = CaseProgress(len(stage.cases)) if stage.cases else None
            self.meter.update(done=stage.done, total=stage.total, description=str(stage))
        elif self.meter.started is not None:
            self.meter.update(description=str(stage))

    def on_case(self, index: int, case, stage) -> None:
        if self._session is None:
            return
        self._session.hear(index, stage)
        words = str(stage) if getattr(stage, "kind", None) in ("round", "process") else f"{case.label()}: {stage}"
        self.meter.update(done=self._part + self._session.done / max(self._session.total, 1), description=words)


class _Events:
    """A drawer of the sweep session's events (``sweep.lifecycle.SweepSession``): ``drawer(kind, **info)``."""

    unit = "cases"

    def __init__(self, console, what: str, **options):
        self.console = console
        self.meter = meter(console, what, self.unit, **options)

    def __call__(self, kind: str, **info) -> None:
        getattr(self, "_" + kind)(**info)

    def _not_ok(self, row: dict, what: str) -> None:
        """``status: what: message`` for a row that did not end ok."""
        if row.get("status") != "ok":
            self.meter.note(f"{row.get('status')}: {what}: {row.get('message')}")

    def _finish(self, summary) -> None:
        interrupted = getattr(summary, "interrupted", False)
        self.meter.finish("interrupted" if interrupted else "done")

    def _note(self, text: str) -> None:
        """A line of what the run does after its progress (track profiling its change points)."""
        self.meter.note(text)


class SweepProgress(_Events):
    """A sweep's progress over its cases, described by what each worker slot runs."""

    def __init__(self, console, what: str = "sweep", **options):
        super().__init__(console, what, **options)
        self.active: dict[str, str] = {}

    def _start(self, total, skipped, to_run, env_key, slots):
        if skipped:
            self.meter.note(f"resuming: {skipped} of {total} cases already stored (environment {env_key}); running {to_run}")
        self.meter.start(to_run)

    def _case_start(self, case, slot):
        self.active[slot] = f"{slot}: {case.label()}"
        self._describe()

    def _case_done(self, case, row, slot):
        self.active.pop(slot, None)
        self._describe(advance=1)
        self._not_ok(row, case.label())

    def _describe(self, advance: int = 0):
        self.meter.update(advance=advance, description=" | ".join(self.active.values()) or "…")


class ClusterProgress(SweepProgress):
    """SweepProgress with the cases per node: running now and done, e.g. ``gpu-a:3f2a1c 2 running, 5 done``."""

    def __init__(self, console, what: str = "sweep", **options):
        super().__init__(console, what, **options)
        self.running: collections.Counter = collections.Counter()
        self.finished: collections.Counter = collections.Counter()

    def _case_start(self, case, slot):
        self.running[slot] += 1
        self._describe()

    def _case_done(self, case, row, slot):
        self.running[slot] = max(0, self.running[slot] - 1)
        self.finished[slot] += 1
        super()._case_done(case, row, slot)

    def _describe(self, advance: int = 0):
        nodes = sorted(set(self.running) | set(self.finished))
        self.meter.update(advance=advance, description=" | ".join(f"{n} {self.running[n]} running, {self.finished[n]} done" for n in nodes) or "…")


class VersionsProgress(_Events):
    """The progress of ab and track over their processes (blocks: their rounds), described by the round and what runs."""

    unit = "processes"

    def _start(self, total, reused, versions, rounds):
        if reused:
            self.meter.note(f"reusing {reused} stored row(s) (a case at a version)")
        self.meter.start(total)

    def _process_start(self, case, version, round):
        what = f"{version.name}: {case.label()}" if version is not None else "every version's cases, interleaved"
        self.meter.update(description=f"round {round + 1}, {what}")

    def _process_done(self, case, version, round, row, rows=None, row_versions=None):
        self.meter.update(advance=1)
        rows = [row] if rows is None else rows
        for row, of in zip(rows, row_versions or [version] * len(rows)):
            who = f"{of.name} " if of is not None else ""
            self._not_ok(row, f"{who}round {round + 1}: {row.get('label') or case.label()}")
