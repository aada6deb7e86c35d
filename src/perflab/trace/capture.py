"""Recording traces with torch.profiler: perflab's own cases, and a user's loop.

Profiling is a separate pass from timing: the timed numbers come from the harness with no profiler, and
the profiled pass reports how much the profiler inflated the step (traced step time ÷ untraced median).

Every trace is recorded by one :class:`Tracer`: warm-up steps thrown away, then each recorded step in torch's
``ProfilerStep#n`` range. In a profiled pass each step ends with a device synchronisation, so
that each step window holds its own GPU work (the windows tile the timeline). In eager mode the model's
stages are annotated too (``block3.attn``, ``block3.reduce``, ``block3.mlp``, ...; a GPT's ``attn.scores``,
``attn.softmax``, ``attn.final_matmul``); compiled and graph modes run without them (annotations would break
the graph). A training step marks its passes ``forward``, ``backward`` and ``optimizer`` in eager and compiled
modes (outside the compiled model); in a CUDA graph every kernel falls in the step's range.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch.profiler import ProfilerActivity, record_function, schedule

from perflab.errors import PerflabError
from perflab.trace.load import plain_trace_path


@dataclass
class CaptureResult:
    trace_path: Path
    steps: int
    device: str
    module_note: str | None = None  # by-module capture: why backward ranges were left off, if they were


# libkineto's stage lines ("USDT:2026-01-01 12:00:00 123:123 SyncActivityProfilerHandler.cpp:52] profiler_start",
# "STAGE:... Completed Stage: Warm Up"): written to fd 2 at every KINETO_LOG_LEVEL, so they are caught instead.
KINETO_LINE = re.compile(r"^(USDT|STAGE):\d{4}-\d\d-\d\d ")


@contextlib.contextmanager
def quiet_profiler():
    """Catch fd 2 while the profiler starts, steps and stops, and pass on all it caught but libkineto's stage lines."""
    try:
        sys.stderr.flush()
    except (AttributeError, ValueError):
        pass
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            kept = [line for line in caught.read().decode(errors="replace").splitlines(True) if not KINETO_LINE.match(line)]
            if kept:
                os.write(2, "".join(kept).encode())


def _activities(device: str) -> list:
    acts = [ProfilerActivity.CPU]
    if device == "cuda":
        acts.append(ProfilerActivity.CUDA)
    return acts


def warm_cuda_profiler() -> None:
    """A CUDA profiler session started and stopped at once, recording nothing: CUPTI's and Kineto's start-up, paid once
    a process (38 ms on an H200; a later session's start took 1.4 ms), paid here rather than by the next session."""
    with warnings.catch_warnings(), quiet_profiler():
        warnings.simplefilter("ignore")
        prof = torch.profiler.profile(activities=[ProfilerActivity.CUDA])
        prof.start()
        prof.stop()
    prof.profiler = None  # its (empty) events freed now, while no session records (Tracer.stop says why)


class Tracer:
    """perflab's one torch.profiler session: ``warmup`` steps recorded and thrown away, then ``steps`` steps recorded,
    each in torch's own ``ProfilerStep#n`` range (the trace's step windows), then stopped and written to ``trace_path``.

    The warm-up exists because a profiler's start-up (CUPTI's, Kineto's) is not the program's: it runs at the boundary
    where ``start`` is called and in the steps after it, which ``torch.profiler.schedule`` prepares but does not record
    (on an H200, nanoGPT's own clock read 1472 ms for the iteration holding the start, ~103 ms for the warm-up steps).
    Call :meth:`start` at a step boundary, :meth:`step` at every following boundary (it returns True once the
    recorded steps are written), and :meth:`stop` to end early or after.
    libkineto's stage lines are kept off the program's stderr around each of the profiler's own calls.

    ``on_ready(prof)``: called with torch's profiler once the recorded steps are in, before they are written and
    freed, for a caller that reads torch's own summary (``prof.key_averages()``); with ``trace_path`` None nothing
    is written and the steps count as written once ``on_ready`` has them.

    ``defer_write``: the boundary that ends the recorded steps only stops the profiler; the trace is written (and
    ``on_ready`` called) by :meth:`write`, which the caller runs a step later, so that writing it (seconds for a large
    trace) lands in no recorded step of the program's own clock. :attr:`pending` says a trace waits for it."""

    def __init__(self, trace_path, device: str, steps: int, warmup: int = 1, record_shapes: bool = True,
                 own_step_ranges: bool = False, cpu_ops: bool = True, on_ready: Callable[[object], None] | None = None,
                 defer_write: bool = False, compress_later: bool = False):
        if steps < 1:
            raise PerflabError(f"steps to trace must be at least 1, got {steps}")
        if warmup < 0:
            raise PerflabError(f"profiler warm-up steps must be at least 0, got {warmup}")
        self.trace_path = Path(trace_path) if trace_path is not None else None
        self.on_ready = on_ready
        self.device, self.steps, self.warmup = device, steps, warmup
        self.record_shapes = record_shapes
        # own_step_ranges: a step is one call (``begin_step`` .. ``end_step``), not boundary to boundary, so the tracer
        # opens each recorded step's ProfilerStep#n range itself instead of torch opening one at every boundary
        self.own_step_ranges = own_step_ranges
        # cpu_ops False (a GPU only): kernels, memory operations and CUDA's API calls, without torch's operators or
        # any CPU range: recording operators slows the host of a program whose host keeps just ahead of its GPU
        # (nanoGPT's traced steps ×0.99–1.34 with them, on an H200; CUDA only: ×1.006–1.017). Each step boundary is then marked by a one-cycle
        # kernel of perflab's own, which trace.build cuts the steps at and drops
        self.cpu_ops = cpu_ops or device != "cuda"
        self.markers = None if self.cpu_ops else ("call" if own_step_ranges else "boundary")
        self.boundaries = 0  # steps ended since start()
        self.written = False
        self._discard = False  # stopped before the recorded steps ended: what torch hands over is not written
        self.defer_write = defer_write
        # compress_later: a .gz trace is exported as plain JSON beside its name (torch gzips in Python at level 9: 35 ms
        # of a 37 ms write for a CPU program's 20 KB trace), and trace.load.compress_trace makes the .gz, off the
        # program's thread (program.report_job)
        self.compress_later = compress_later
        self._pending = None  # with defer_write: torch's profiler, stopped, its recorded steps not yet written
        self._prof = None
        self._range = None

    @property
    def profiler(self):
        return self._prof

    @property
    def active(self) -> bool:
        """Between start() and the end of the recorded steps (or stop())."""
        return self._prof is not None

    @property
    def pending(self) -> bool:
        """The recorded steps are in and the profiler stopped, but the trace is not written yet (``defer_write``)."""
        return self._pending is not None

    @property
    def recording(self) -> bool:
        """The step now running is one of the recorded ones (not the warm-up)."""
        return self.active and self.warmup <= self.boundaries < self.warmup + self.steps

    def start(self) -> None:
        if self.trace_path is not None:
            self.trace_path.parent.mkdir(parents=True, exist_ok=True)
        # repeat=1: after the recorded steps the profiler stops; a repeating schedule would start a new cycle and
        # export only that cycle's few events
        with warnings.catch_warnings():  # torch warns of a schedule without warm-up: the shapes pass wants none
            warnings.simplefilter("ignore")
            sched = schedule(wait=0, warmup=self.warmup, active=self.steps, repeat=1)
        activities = _activities(self.device) if self.cpu_ops else [ProfilerActivity.CUDA]
        with warnings.catch_warnings():  # torch's "Profiler clears events at the end of each cycle": perflab's, not the program's
            warnings.simplefilter("ignore")
            self._prof = torch.profiler.profile(activities=activities, record_shapes=self.record_shapes and self.cpu_ops,
                                                schedule=sched, on_trace_ready=self._export)
        if self.own_step_ranges or self.markers:
            self._prof.record_steps = False  # the schedule without torch's boundary-to-boundary step ranges
        with quiet_profiler():
            self._prof.start()
        if self.markers:
            self._prof.add_metadata("perflab_step_markers", self.markers)
            if self.recording and self.markers == "boundary":  # no warm-up: the first step begins now
                self._mark()

    def _mark(self) -> None:
        torch.cuda._sleep(1)

    def begin_step(self) -> None:
        """A call source's step begins: a recorded step opens its ``ProfilerStep#n`` range (or its start is marked)."""
        if self._prof is None or not self.recording:
            return
        if self.markers:
            self._mark()
        elif self._range is None:
            self._range = record_function(f"ProfilerStep#{self.boundaries}")
            self._range.__enter__()

    def end_step(self, before_stop=None) -> bool:
        """A call source's step ends: its range closed (or its end marked), then as :meth:`step`."""
        if self._range is not None:
            self._range.__exit__(None, None, None)
            self._range = None
        elif self.markers and self.recording:
            self._mark()
        return self.step(before_stop, mark=False)

    def _export(self, prof) -> None:
        if self._discard:
            return
        if self.defer_write:
            self._pending = prof
            return
        self._write(prof)

    def write(self) -> bool:
        """Write the recorded steps held back by ``defer_write`` (once; the profiler's events are freed after, written or
        not). True where they were written."""
        prof, self._pending = self._pending, None
        if prof is None:
            return self.written
        try:
            self._write(prof)
        finally:
            prof.profiler = None
        return self.written

    def _write(self, prof) -> None:
        if self.on_ready is not None:
            self.on_ready(prof)
        if self.trace_path is not None:
            plain = plain_trace_path(self.trace_path) if self.compress_later else None
            prof.export_chrome_trace(str(plain or self.trace_path))
        self.written = True

    def step(self, before_stop=None, mark: bool = True) -> bool:
        """A step boundary: the step that ran is closed and the next opened; True once the recorded steps are written
        (the profiler is then stopped). ``before_stop``: called (a device synchronisation) before the boundary that
        ends the recording, after its marker, so that the last step's GPU work is in the trace."""
        if self._prof is None:
            return self.written
        mark = mark and self.markers == "boundary"
        was_recording = self.recording
        if mark and was_recording:
            self._mark()
        self.boundaries += 1
        if before_stop is not None and self.boundaries >= self.warmup + self.steps:
            before_stop()
        with warnings.catch_warnings(), quiet_profiler():  # torch's "Profiler clears events at the end of each cycle": not ours
            warnings.simplefilter("ignore")
            self._prof.step()
        if mark and self.recording and not was_recording:  # the first recorded step begins here
            self._mark()
        if self.boundaries >= self.warmup + self.steps:
            self.stop()
        return self.written

    def stop(self) -> None:
        """Stop now (idempotent). Steps recorded but not yet written are dropped: a partial trace is not a trace."""
        prof, self._prof = self._prof, None
        if prof is None:
            return
        if self._range is not None:
            self._range.__exit__(None, None, None)
            self._range = None
        self._discard = self.boundaries < self.warmup + self.steps
        with warnings.catch_warnings(), quiet_profiler():
            warnings.simplefilter("ignore")
            prof.stop()
        # the recorded events freed now, while no profiler records: freed later by the garbage collector, during the
        # next session (perflab's pass with shapes, or the program's own), torch's KinetoEvent vector crashed (SIGSEGV).
        # A trace held back for write() is freed there, before perflab's next session starts
        if self._pending is not prof:
            prof.profiler = None


def record_steps(step: Callable[[], object], trace_path: Path, device: str, steps: int = 5, warmup: int = 1) -> CaptureResult:
    """Run ``warmup`` + ``steps`` calls of ``step`` under the tracer and write the recorded ones; each step ends with
    a device synchronisation, so that each step window holds its own GPU work (the windows tile the timeline)."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    tracer = Tracer(trace_path, device, steps=steps, warmup=warmup)
    tracer.start()
    try:
        for _ in range(warmup + steps):
            step()
            sync()
            tracer.step()
    finally:
        tracer.stop()
    if not tracer.written or not tracer.trace_path.exists():
        raise PerflabError(f"the profiler wrote no trace to {trace_path}")
    return CaptureResult(tracer.trace_path, steps, device)


def capture_case(case, trace_path: Path, steps: int = 5, by_module: bool = False) -> CaptureResult:
    """Build the case's workload exactly as the harness does, warm it up, and record ``steps`` steps.

    ``by_module``: also a range around each module's forward and backward (``trace.modules``), for the
    per-module attribution of ``analysis.modules``; eager mode only (a compiled graph has no modules left)."""
    from perflab.runtime.workload import warm_workload

    with warm_workload(case) as work:  # by_module with a compiled mode is refused by api.profile_case, before any timing
        work.built.set_annotate(model_ranges=case.mode == "eager", passes=case.mode != "cudagraph")
        step = work.step
        if by_module:
            from perflab.trace.modules import with_module_ranges

            step = with_module_ranges(work.step, work.built.model, backward=work.built.has_backward)
        try:
            result = record_steps(step, trace_path, case.device, steps=steps)
            if by_module:
                result.module_note = step.state["hooks"].skipped
            return result
        finally:
            if by_module:
                step.remove()
            work.built.set_annotate(model_ranges=False, passes=False)


class StepProfiler:
    """``with perflab.profile(steps=5) as p: ... p.step()`` — profiles a user's own loop.

    The first ``warmup`` steps are not recorded, the next ``steps`` are, and later ``p.step()`` calls do
    nothing. ``p.step()`` synchronises the GPU (``sync=True``) so that each step window holds its own GPU
    work. After the block, ``p.trace_path`` is the Kineto trace. Capture stops there: analysing the
    trace is the API's part (``perflab.profile`` wraps this and sets ``p.analysis``), so that capture
    never reaches back up the flow.
    """

    def __init__(self, steps: int = 5, warmup: int = 1, out: str | os.PathLike | None = None, sync: bool = True, cuda: bool | None = None):
        if steps < 1:
            raise PerflabError(f"steps must be at least 1, got {steps}")
        self.steps, self.warmup, self.sync = steps, warmup, sync
        self.cuda = torch.cuda.is_available() if cuda is None else cuda
        self.trace_path = Path(out) if out else Path("perflab-profile.json.gz")
        self._tracer = Tracer(self.trace_path, "cuda" if self.cuda else "cpu", steps=steps, warmup=warmup)

    def __enter__(self) -> "StepProfiler":
        self._tracer.start()
        return self

    @property
    def _count(self) -> int:
        """The loop's steps so far (the tracer counts them; it stops counting once the recorded steps are written)."""
        return self._tracer.boundaries

    def step(self) -> None:
        if self._count >= self.warmup + self.steps:
            return
        if self.sync and self.cuda:
            torch.cuda.synchronize()
        self._tracer.step()

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._tracer.stop()
        if exc_type is None:
            if self._count < self.warmup + self.steps:
                raise PerflabError(
                    f"the loop ran {self._count} steps, but {self.warmup} warm-up + {self.steps} profiled steps were asked for; "
                    "call p.step() once per step, or lower steps/warmup"
                )
        return False
