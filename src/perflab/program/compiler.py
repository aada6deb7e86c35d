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


def counters() -> dict:
    """dynamo's counters now ({} when dynamo was never imported: nothing was compiled)."""
    if not dynamo_loaded():
        return {}
    from torch._dynamo.utils import counters as c

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
    return {"frames": int(c["frames"]["total"]), "frames_ok": int(c["frames"]["ok"]), "graphs": int(c["stats"]["unique_graphs"]),
            "backend_graphs": int(c["aot_autograd"]["total"]), "breaks": {_first_line(k): int(v) for k, v in c["graph_break"].items()},
            "guard_failures": failures}


def _guard(reason) -> str:
    """A guard failure's first line without dynamo's source comment: "0/7: tag == 'tag7'"."""
    return _first_line(reason).split("  #")[0].strip()


def _first_line(text) -> str:
    text = str(text).strip()
    return text.splitlines()[0] if text else ""


def delta(before: dict, after: dict) -> dict:
    """What dynamo did between two ``counters()``: frames compiled, graphs, backend graphs, graph breaks by reason, and
    the recompiles per frame with the guard that failed each time (the reasons added since ``before``)."""
    if not after:
        return {"frames": 0, "frames_ok": 0, "graphs": 0, "backend_graphs": 0, "graph_breaks": 0, "break_reasons": {}, "recompiles": {}}
    before = before or {"frames": 0, "frames_ok": 0, "graphs": 0, "backend_graphs": 0, "breaks": {}, "guard_failures": {}}
    breaks = {k: v - before["breaks"].get(k, 0) for k, v in after["breaks"].items()}
    breaks = {k: v for k, v in breaks.items() if v > 0}
    recompiles = {}  # frame -> the guards that failed for the first time in this phase (one per recompile)
    for frame, reasons in after["guard_failures"].items():
        seen = set(before["guard_failures"].get(frame, []))
        new = [r for r in reasons if r not in seen]
        if new:
            recompiles[frame] = new
    return {"frames": after["frames"] - before["frames"], "frames_ok": after["frames_ok"] - before["frames_ok"],
            "graphs": after["graphs"] - before["graphs"], "backend_graphs": after["backend_graphs"] - before["backend_graphs"],
            "graph_breaks": sum(breaks.values()), "break_reasons": breaks, "recompiles": recompiles}


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
