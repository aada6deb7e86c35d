"""What torch.compile did in a user's program, from dynamo's own records, per phase of the run.

- ``counters()``: dynamo's process-wide counters (frames compiled, dynamo graphs, graphs handed to the backend, graph
  breaks with their reasons) and its guard failures per code object (``torch._dynamo.utils.guard_failures``: each
  recompile's reason: the guard that failed), taken at the boundaries of the phases (skipped, timed, traced).
- ``LimitWatch``: dynamo says a frame hit its recompile limit only in a warning of its log
  (``torch._dynamo.convert_frame``: "torch._dynamo hit config.recompile_limit (8) / function: 'f' (file:line) / last
  reason: ..."); from then on that frame runs eagerly, without another word. A handler on that logger keeps the
  records (the program's own logging is untouched: the handler only adds).

Nothing here changes what dynamo does (no limit is raised, no config set): the point is to see the program as it runs.
"""

from __future__ import annotations

import logging
import re
import sys

LIMIT = re.compile(r"hit config\.(?P<limit>\w+) \((?P<value>\d+)\)\s*\n\s*function: '(?P<function>[^']*)' \((?P<where>[^)]*)\)"
                   r"(?:\s*\n\s*last reason: (?P<reason>[^\n]*))?")
DYNAMO_LOGGER = "torch._dynamo.convert_frame"


def dynamo_loaded() -> bool:
    return "torch._dynamo" in sys.modules


def prepare() -> None:
    """Import what ``counters()`` reads once dynamo is loaded, before the program runs: a program that compiles would
    otherwise pay the import (about 0.1 s) inside the first step perflab times."""
    import perflab.runtime.modes  # noqa: F401


def counters() -> dict:
    """dynamo's counters now (``runtime.modes.compile_counters``: frames, graphs, backend graphs, graph breaks by
    reason), with the frames it compiled successfully and its guard failures per code object; {} when dynamo was never
    imported (nothing was compiled)."""
    if not dynamo_loaded():
        return {}
    from torch._dynamo.utils import counters as c

    from perflab.runtime.modes import compile_counters

    failures = {}
    try:
        from torch._dynamo.utils import guard_failures
    except ImportError:  # an older or newer torch without it: the recompiles are counted, their reasons not
        guard_failures = {}
    for code, reasons in list(guard_failures.items()):
        # dynamo appends, at each cache miss, the failed guard of every entry it tried: one reason per compiled entry
        # ("0/3: tag == 'tag3'"), repeated at every later miss; kept once each, in the order they first failed
        distinct = list(dict.fromkeys(_guard(r) for r in reasons))
        failures[f"{code.co_name} ({code.co_filename}:{code.co_firstlineno})"] = distinct
    return dict(compile_counters(), frames_ok=int(c["frames"]["ok"]), guard_failures=failures)


def _guard(reason) -> str:
    """A guard failure's first line without dynamo's source comment: "0/7: tag == 'tag7'"."""
    from perflab.errors import first_line

    return first_line(reason).split("  #")[0].strip()


NOTHING = {"frames": 0, "frames_ok": 0, "graphs": 0, "backend_graphs": 0, "breaks": {}, "guard_failures": {}}


def delta(before: dict, after: dict) -> dict:
    """What dynamo did between two ``counters()`` (``runtime.modes.compile_stats``: frames, graphs, backend graphs,
    graph breaks and their commonest reasons), with the frames compiled successfully and the guards that failed for
    the first time, per frame (each a recompile, until the frame's limit)."""
    from perflab.runtime.modes import compile_stats

    before, after = before or NOTHING, after or NOTHING
    recompiles = {}
    for frame, reasons in after["guard_failures"].items():
        seen = set(before["guard_failures"].get(frame, []))
        new = [r for r in reasons if r not in seen]
        if new:
            recompiles[frame] = new
    return dict(compile_stats(before, after), frames_ok=after["frames_ok"] - before["frames_ok"], recompiles=recompiles)


class LimitWatch(logging.Handler):
    """Keeps dynamo's "hit config.recompile_limit" warnings: (limit name, its value, the function, where, the last guard
    that failed), with the step the program was in when it happened."""

    def __init__(self, step_of: callable = lambda: None):
        super().__init__(level=logging.WARNING)
        self.hits: list[dict] = []
        self.step_of = step_of
        self._logger = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:  # a record that cannot format is not ours to fix
            return
        found = LIMIT.search(text)
        if found:
            self.hits.append({"limit": found["limit"], "value": int(found["value"]), "function": found["function"], "where": found["where"],
                              "last_reason": _guard(found["reason"] or ""), "step": self.step_of()})

    def install(self) -> None:
        self._logger = logging.getLogger(DYNAMO_LOGGER)
        self._logger.addHandler(self)

    def remove(self) -> None:
        if self._logger is not None:
            self._logger.removeHandler(self)
            self._logger = None
