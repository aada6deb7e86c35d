"""Recording traces with torch.profiler: perflab's own cases, and a user's loop.

Profiling is a separate pass from timing: the timed numbers come from the harness with no profiler, and
the profiled pass reports how much the profiler inflated the step (traced step time ÷ untraced median).

In a profiled pass each step runs inside a ``step`` annotation and ends with a device synchronisation, so
that each step window holds its own GPU work (the windows tile the timeline). In eager mode the model's
stages are annotated too (``block3.attn``, ``block3.reduce``, ``block3.mlp``, ...; a GPT's ``attn.scores``,
``attn.softmax``, ``attn.final_matmul``); compiled and graph modes run without them (annotations would break
the graph). A training step marks its passes ``forward``, ``backward`` and ``optimizer`` in eager and compiled
modes (outside the compiled model); in a CUDA graph every kernel falls in ``step``.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch.profiler import ProfilerActivity, record_function, schedule

from perflab.errors import PerflabError


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


def record_steps(step: Callable[[], object], trace_path: Path, device: str, steps: int = 5, warmup: int = 1) -> CaptureResult:
    """Run ``warmup`` + ``steps`` calls of ``step`` under torch.profiler and write the active window."""
    trace_path = Path(trace_path)
    trace_path.parent.mkdir(parents=True, exist_ok=True)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    # repeat=1: after the active window the profiler stops; a repeating schedule would start a new cycle
    # and export only that cycle's few events.
    sched = schedule(wait=0, warmup=warmup, active=steps, repeat=1)
    with quiet_profiler(), torch.profiler.profile(
        activities=_activities(device),
        record_shapes=True,
        schedule=sched,
        on_trace_ready=lambda prof: prof.export_chrome_trace(str(trace_path)),
    ) as prof:
        for _ in range(warmup + steps):
            with record_function("step"):
                step()
                sync()
            prof.step()
    if not trace_path.exists():
        raise PerflabError(f"the profiler wrote no trace to {trace_path}")
    return CaptureResult(trace_path, steps, device)


def profile_case(case, trace_path: Path, steps: int = 5, by_module: bool = False) -> CaptureResult:
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
        self._count = 0
        self._prof = None
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> "StepProfiler":
        device = "cuda" if self.cuda else "cpu"
        sched = schedule(wait=0, warmup=self.warmup, active=self.steps, repeat=1)
        self._prof = torch.profiler.profile(
            activities=_activities(device), record_shapes=True, schedule=sched,
            on_trace_ready=lambda prof: prof.export_chrome_trace(str(self.trace_path)),
        )
        with quiet_profiler():  # around the profiler's own calls only: the user's loop keeps its stderr
            self._stack.enter_context(self._prof)
        self._open_step()
        return self

    def _open_step(self) -> None:
        self._range = record_function("step")
        self._range.__enter__()

    def step(self) -> None:
        if self._count >= self.warmup + self.steps:
            return
        if self.sync and self.cuda:
            torch.cuda.synchronize()
        self._range.__exit__(None, None, None)
        self._count += 1
        with quiet_profiler():
            self._prof.step()
        if self._count < self.warmup + self.steps:
            self._open_step()

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self._count < self.warmup + self.steps:
            self._range.__exit__(None, None, None)
        with quiet_profiler():
            self._stack.close()
        if exc_type is None:
            if self._count < self.warmup + self.steps:
                raise PerflabError(
                    f"the loop ran {self._count} steps, but {self.warmup} warm-up + {self.steps} profiled steps were asked for; "
                    "call p.step() once per step, or lower steps/warmup"
                )
        return False

