"""perflab's one step clock. On the bottom floor, so that everything that times a step (measure's harness, blocks,
ceilings and host probe, a decode family's tokens, ``perflab run``'s boundaries) imports it downward. And the one loop
that times a callable on the host clock alone, call by call (:func:`host_samples_ns`)."""

from __future__ import annotations

import time
from typing import Callable

import torch


class StepClock:
    """perflab's one step clock: ``stamp()`` at a step boundary, ``read(a, b)`` afterwards. On a GPU a stamp is a CUDA
    event recorded on the stream current at the boundary (the step's stream: no synchronisation while stamping, one
    when reading) together with the host clock; on the CPU the host clock alone. ``read`` gives (step ms, host ms):
    on the CPU both are the host's. Every CUDA event perflab times with is made here."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self._made: list = []  # events made ahead by reserve(), taken by the next stamps

    def reserve(self, stamps: int) -> None:
        """Make the events of the next ``stamps`` stamps now, before a timed stretch, so that a stamp inside it only
        records one (as a loop over events made beforehand does): a launch-bound GPU waits on the host between steps."""
        if self.cuda:
            self._made += [self._event() for _ in range(stamps)]

    def stamp(self, on_device: bool = True) -> tuple:
        """(the CUDA event recorded now on the current stream, or None; the host clock in ns, read after the event is
        recorded). ``on_device=False``: the host clock alone, for a boundary only the host passes (the end of issuing
        steps the GPU has not run yet), which records nothing on the stream."""
        event = None
        if self.cuda and on_device:
            event = self._made.pop() if self._made else self._event()
            event.record(torch.cuda.current_stream())
        return event, time.perf_counter_ns()

    @staticmethod
    def _event():
        return torch.cuda.Event(enable_timing=True)

    def read(self, a: tuple, b: tuple) -> tuple[float, float]:
        """(ms from ``a`` to ``b`` on the GPU, ms on the host); where either stamp has no event, the host's twice.
        Waits for ``b``'s event: the one synchronisation a timed stretch needs, after it."""
        host_ms = (b[1] - a[1]) / 1e6
        if a[0] is None or b[0] is None:
            return host_ms, host_ms
        b[0].synchronize()
        return float(a[0].elapsed_time(b[0])), host_ms

    @staticmethod
    def reached(stamp: tuple) -> bool:
        """Whether the GPU has run past this stamp's event, without waiting; a host-only stamp is passed when taken."""
        return stamp[0] is None or bool(stamp[0].query())

    def read_marks(self, marks: list) -> tuple[list[float], list[float]]:
        """Consecutive boundaries' stamps → each step's (step ms list, host ms list)."""
        return self.read_pairs(zip(marks, marks[1:]))

    def read_pairs(self, pairs) -> tuple[list[float], list[float]]:
        """(start, end) stamps of each step → (step ms list, host ms list)."""
        read = [self.read(a, b) for a, b in pairs]
        return [p[0] for p in read], [p[1] for p in read]


def host_samples_ns(fn: Callable[[], object], repeats: int, warmup: int = 0, after: Callable[[], object] | None = None) -> list[int]:
    """``repeats`` calls of ``fn``, each timed alone on the host clock (``time.perf_counter_ns``): their ns, in call
    order, after ``warmup`` calls untimed. ``after``, where given, runs after each timed call, outside its time (a
    synchronisation that lets the device drain between calls). The host's clock around the call, nothing else: on a
    GPU it is the time to issue the call's work (CUDA events time the work itself: :class:`StepClock`)."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - t0)
        if after is not None:
            after()
    return samples
