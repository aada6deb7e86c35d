"""Progress drawing for every run into a store: a rich progress bar on stderr, and one line for each row that did not
end ``ok``. The engines emit events (``sweep.lifecycle.SweepSession``: "start", their own per case or process,
"finish"); a drawer is the ``on_event`` that draws them, for a sweep (``RichProgress``), a sweep over a Ray cluster
(``ClusterProgress``) or the versions of ``ab``/``track`` (``VersionsProgress``)."""

from __future__ import annotations

import collections


class _Bar:
    """The bar, its description, the line for a row not ok, and its end; ``eta`` adds the time remaining."""

    eta = False
    width = 120  # characters of the description

    def __init__(self, console):
        self.console = console
        self.progress = None
        self.task = None

    def __call__(self, kind: str, **info) -> None:
        getattr(self, "_" + kind)(**info)

    def _open(self, total: int) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
        if self.eta:
            columns += [TextColumn("ETA"), TimeRemainingColumn()]
        self.progress = Progress(*columns, console=self.console, transient=True)
        self.progress.start()
        self.task = self.progress.add_task("starting", total=total)

    def _describe_as(self, text: str) -> None:
        from rich.markup import escape

        self.progress.update(self.task, description=escape(text[:self.width]) or "…")

    def _not_ok(self, row: dict, what: str) -> None:
        """``status: what: message`` for a row that did not end ok."""
        from rich.markup import escape

        if row.get("status") != "ok":
            self.progress.console.print(f"[red]{row.get('status')}[/red]: {escape(what)}: {escape(str(row.get('message')))}", soft_wrap=True)

    def _finish(self, summary) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None

    def _note(self, text: str) -> None:
        """A line of what the run does after its bar (track profiling its change points)."""
        self.console.print(text, markup=False, soft_wrap=True)


class RichProgress(_Bar):
    """A sweep's bar (with ETA) over its cases, described by what each worker slot runs."""

    eta = True

    def __init__(self, console):
        super().__init__(console)
        self.active: dict[str, str] = {}

    def _start(self, total, skipped, to_run, env_key, slots):
        if skipped:
            self.console.print(f"resuming: {skipped} of {total} cases already stored (environment {env_key}); running {to_run}", markup=False)
        self._open(to_run)

    def _case_start(self, case, slot):
        self.active[slot] = f"{slot}: {case.label()}"
        self._describe()

    def _case_done(self, case, row, slot):
        self.active.pop(slot, None)
        self.progress.advance(self.task)
        self._describe()
        self._not_ok(row, case.label())

    def _describe(self):
        self._describe_as(" | ".join(self.active.values()))


class ClusterProgress(RichProgress):
    """RichProgress with the cases per node: running now and done, e.g. ``gpu-a:3f2a1c 2 running, 5 done``."""

    width = 160

    def __init__(self, console):
        super().__init__(console)
        self.running: collections.Counter = collections.Counter()
        self.finished: collections.Counter = collections.Counter()

    def _case_start(self, case, slot):
        self.running[slot] += 1
        self._describe()

    def _case_done(self, case, row, slot):
        self.running[slot] = max(0, self.running[slot] - 1)
        self.finished[slot] += 1
        super()._case_done(case, row, slot)

    def _describe(self):
        nodes = sorted(set(self.running) | set(self.finished))
        self._describe_as(" | ".join(f"{n} {self.running[n]} running, {self.finished[n]} done" for n in nodes))


class VersionsProgress(_Bar):
    """A versions run's bar over its processes (blocks: its rounds), described by the round and what runs in it."""

    def _start(self, total, reused, versions, rounds):
        if reused:
            self.console.print(f"reusing {reused} stored row(s) (a case at a version)", markup=False)
        self._open(total)

    def _process_start(self, case, version, round):
        what = f"{version.name}: {case.label()}" if version is not None else "every version's cases, interleaved"
        self._describe_as(f"round {round + 1}, {what}")

    def _process_done(self, case, version, round, row, rows=None, row_versions=None):
        self.progress.advance(self.task)
        rows = [row] if rows is None else rows
        for row, of in zip(rows, row_versions or [version] * len(rows)):
            who = f"{of.name} " if of is not None else ""
            self._not_ok(row, f"{who}round {round + 1}: {row.get('label') or case.label()}")
