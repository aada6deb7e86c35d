"""The stages a measurement reports as it goes (``on_case(index, case, stage)``, ``on_stage(stage)``), for progress.

A stage is the words its callback has always heard (``"build"``, ``"warmup"``, ``"timing 3 cases together, round
2/5"``); those that say how far the work is are a :class:`Stage`, a ``str`` that also carries its ``kind`` and how
much of its part is ``done`` of ``total``. A callback that prints a stage prints the same words as before; a progress
drawer (``report.progress``) reads the numbers instead of the words.
"""

from __future__ import annotations


class Stage(str):
    """A stage's words with how far the work is. ``kind``:

    - ``"timing"``: a case's timing begins, alone (after its build and warm-up; or on its ranks);
    - ``"round"``: round ``done`` of ``total`` (0-based, the rounds ended) of cases timed together, ``cases`` their indices;
    - ``"process"``: process ``done`` of ``total`` (0-based, the processes ended) of a run spread over processes begins;
    - ``"part"``: a command's part ``done`` of ``total`` begins (explain's timing sessions and passes, explain
      --parallel's rank launches); the stages heard from its timing sessions until the next part are within it."""

    kind: str
    done: int
    total: int
    cases: tuple[int, ...]

    def __new__(cls, text: str, kind: str, done: int = 0, total: int = 1, cases=()):
        self = super().__new__(cls, text)
        self.kind, self.done, self.total, self.cases = kind, done, total, tuple(cases)
        return self

    def __reduce__(self):  # a plain str across processes and pickles: the words are what a log keeps
        return (str, (str(self),))


TIMING = Stage("timing", "timing")  # a case alone: its build and warm-up ended, its timed loop begins


class Parts:
    """A command's parts, numbered as they begin: ``begin(text, cases)`` tells ``on_stage`` part ``done`` of ``total``
    (with ``cases``, the number of cases a timing session of that part times together)."""

    def __init__(self, on_stage, total: int):
        self.on_stage, self.total, self.done = on_stage, total, 0

    def begin(self, text: str, cases: int = 0) -> None:
        self.on_stage(Stage(text, "part", self.done, self.total, range(cases)))
        self.done = min(self.done + 1, self.total)
