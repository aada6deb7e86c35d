"""The phases of a program's run, step by step: skipped, timed, traced, then left alone.

- skipped (``--skip N``): warm-up and compilation run as the program runs them.
- timed (``--steps K``): nothing but a timestamp per boundary. On a GPU a CUDA event recorded on the stream current at
  the boundary (the step's stream; no synchronisation inside the phase); on the CPU the host clock. A "boundary"
  source's step is one boundary to the next; a "call" source's is one call (start to return; the time between calls
  is not the step's). The peak of the allocator's memory is reset when the phase begins and read when it ends.
- between (one step, where ``--trace`` is more than 0): the step after the timed ones, in which perflab does its own
  work: it reads the timed steps, writes them, and starts its profiler at the boundary that ends it. That work (a
  GPU's profiler start took 1.4 s in nanoGPT) lands in an iteration of the program's that is neither timed nor traced,
  so the program's own clock over the timed steps is theirs alone. The timed steps' watches (the loop's, the host's
  and the GPU's busy share, dynamo's counters and the allocator's peaks) end at the timed phase's last boundary.
- traced (``--trace M``): torch.profiler (``trace.capture.Tracer``), started at a boundary after one synchronisation,
  its ``--trace-warmup`` steps thrown away, then M steps recorded and stopped with another. On a GPU this accounted
  pass is CUDA only, each step boundary marked by a one-cycle kernel of perflab's (the trace's step windows), and a
  short second pass records the operators with their shapes (the FLOPs); on the CPU one pass records the operators
  with their shapes, each step in a ``ProfilerStep#n`` range. The traced steps are timed by the same clock and
  reported beside the untraced ones (``trace_inflated`` where the profiler slowed them).
- the boundary that ends a pass's last traced step only stops its profiler: its trace is written at the next boundary
  (with what follows it there: the pass with shapes, or the report), so that writing it lands in no traced iteration
  of the program's own clock; a program that ends first has it written at its end.
- then the program runs on untouched (the recorder's hooks detached; the source counts on where that is free), or
  stops (``--stop-after``).

The timed steps' stamps are read when their phase ends (the traced phase's synchronisation follows at once), or when the
record is handed over if the program ends first; the traced steps' when the record is handed over (``Recorder.finish``,
after the traced steps or when the program ends first). A read that fails there (a sticky CUDA error in the pass with
shapes fails every later event read) loses the traced steps' times only: the ``Recorded`` keeps the timed steps' summary.

dynamo's counters are taken at each phase's boundaries (``program.compiler``), so a frame compiled while timed is
seen, and a frame that hit the recompile limit is named with the step it happened in.
"""

from __future__ import annotations

import gc
import os
import shutil
import statistics
import tempfile
import time
import warnings
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from perflab.program import compiler
from perflab.program.boundaries import StepSource, programs_file
from perflab.program.guard import Guard, ProfilerWatch
from perflab.program.loop import LoopWatch, read_worker_batches


class StopProgram(SystemExit):
    """Raised inside the program at the end of the traced steps with ``--stop-after``: it unwinds the program (its
    ``finally`` blocks run) and ends it with exit code 0."""

    def __init__(self):
        super().__init__(0)


@dataclass
class RunOptions:
    skip: int = 5
    steps: int = 20
    trace: int = 3
    trace_warmup: int = 3  # steps under the profiler before the traced ones, thrown away (its start-up lands in them)
    record_shapes: bool = True  # a second, short pass with operator shapes after the traced steps (FLOPs are counted from it)
    # one step: its profiler's stop (CPU operators with their shapes, and CUDA) is the costliest of perflab's own work in a
    # step of the program (68 ms for two steps of a compiled GPT-2 on an H200, against its 24-40 ms steps)
    shapes_steps: int = 1
    inflation_limit: float = 1.10  # traced ÷ untraced step beyond which the traced accounting describes the profiler
    stop_after: bool = False
    out_dir: Path = Path("perflab-run")
    stall_factor: float = 1.5  # a timed step longer than this × the median is a stall (analysis.loop)
    inputs: tuple[str, ...] = ()  # functions whose calls are waits for input, beside DataLoaders' (--input)
    batch_size: int | None = None  # samples a step takes, where the batches do not say (--batch-size)
    seq_len: int | None = None  # tokens a sample has (--seq-len): tokens per step = batch_size × seq_len


@dataclass
class Rank:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls) -> "Rank":
        return cls(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0)))

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


TRACE_FILE = "trace.json.gz"  # the accounted pass, in the rank's folder
PROGRESS_S = 10.0  # a progress line this often while perflab works towards its report
SHAPES_FILE = "shapes.json.gz"  # the pass with operator shapes


def rank_dir(out_dir: Path, rank: Rank) -> Path:
    """Where a rank's record and traces go: ``OUT/rankR`` under torchrun, OUT itself for one process."""
    out = Path(out_dir)
    return out / f"rank{rank.rank}" if rank.distributed else out


@dataclass
class Recorded:
    """What a run measured, however far it got."""

    device: str | None = None  # "cuda" or "cpu", decided at the first timed boundary
    steps_seen: int = 0
    step_ms: list[float] = field(default_factory=list)  # the timed steps (CUDA events, or the host clock)
    host_step_ms: list[float] = field(default_factory=list)  # the same steps by the host clock
    traced_step_ms: list[float] = field(default_factory=list)  # the steps under the profiler, its warm-up first, same clock
    trace_warmup: int = 0  # how many of traced_step_ms are the profiler's warm-up (not in the trace)
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    peak_rss_bytes: int | None = None
    compile_phases: dict = field(default_factory=dict)  # skipped / timed / traced: compiler.delta of each
    limit_hits: list = field(default_factory=list)
    trace_path: str | None = None
    shapes_trace_path: str | None = None  # the pass with operator shapes, for the FLOPs (recording shapes slows a step)
    traced_steps: int = 0
    trace_note: str | None = None  # why there is no trace, or what happened to it
    profiler_seconds: float | None = None  # stopping and writing the trace
    optimizers: list = field(default_factory=list)
    phase: str = "skipped"
    wall_s: float | None = None
    timing: dict = field(default_factory=lambda: {"steps": 0})  # the timed steps' summary (``timing_summary``)
    # the whole loop of the timed steps, untraced (``program.loop``, ``measure.gpu_busy``; ``analysis.loop`` reads it):
    # each timed step's window on the host's clock (ns), the input waits and synchronising calls recorded in them, the
    # DataLoader workers' batches fetched meanwhile, and the GPU's busy share over them
    timed_windows_ns: list = field(default_factory=list)
    loop: dict | None = None
    busy: dict | None = None
    # perflab's own work at the program's step boundaries where it took over OWN_WORK_MS (it lands in the program's
    # step that holds the boundary): each {"step", "phase", "ms", "parts": {what: ms}}; the boundary that starts the
    # report is not in it (it is being measured as this record is taken)
    own_work: list = field(default_factory=list)


# perflab's own work at a boundary is kept in Recorded.own_work from this many ms
OWN_WORK_MS = 1.0


def timing_summary(step_ms: list[float], host_ms: list[float]) -> dict:
    """The timed steps' summary (``stats.TimingSummary``, as a bench row's): the median and its CI over stretches of
    the run (five stretches of consecutive steps; fewer than three give the order-statistics interval, labelled so),
    with the coverage that CI may claim."""
    from perflab.stats import summarize

    if not step_ms:
        return {"steps": 0}
    out = {"steps": len(step_ms), **summarize(step_ms).to_dict(), "host_median_ms": summarize(host_ms).median if host_ms else None}
    # steps in two modes: each stretch's median falls in one mode or the other, and the stretches' log-t interval reaches
    # far past every step (1.6-357 ms for steps of 1 and 46 ms); the median lies between the fastest and slowest step, and
    # so is its interval cut. With one mode a few stretches' interval may rightly reach past the steps seen (bench's too)
    low, high = min(step_ms), max(step_ms)
    for key in ("ci_ms", "ci95_ms") if out.get("modes") else ():
        ci = out.get(key)
        if ci and None not in ci and (ci[0] < low or ci[1] > high):
            out[key] = [max(ci[0], low), min(ci[1], high)]
            out["ci_clamped"] = True
    return out


BETWEEN_STEPS = 1  # the step between the timed and the traced ones, where perflab does its own work (the module's doc)


def steps_needed(options) -> int:
    """The program's steps a whole run needs: --skip, --steps and, where it traces, the step between, --trace-warmup
    and --trace."""
    return options.skip + options.steps + (BETWEEN_STEPS + options.trace_warmup + options.trace if options.trace else 0)


class Recorder:
    def __init__(self, source: StepSource, options: RunOptions, rank: Rank | None = None, on_traced=None, guard: Guard | None = None,
                 on_timed=None, on_facts=None):
        self.source = source
        self.guard = guard or Guard()
        self.options = options
        self.rank = rank or Rank.from_env()
        self.data = Recorded()
        self.on_traced = on_traced  # called after the traced steps (the report); may raise StopProgram
        self.on_timed = on_timed  # called when the timed steps end, before the profiler starts (they are written then)
        # called at a boundary of its own after the last pass's trace is written, before the one that calls on_traced: what the
        # report needs from the program's process (program.report.gpu_facts), taken apart from the report's start so that
        # neither lands whole in one of the program's steps (issue 55). None: on_traced follows the write directly
        self.on_facts = on_facts
        self._closing: str | None = None  # after the last pass: "facts" (on_facts at the next boundary), then "report"
        self._warming = False  # perflab's own profiler session that pays CUPTI's start-up at the first boundary
        self.module_watch = ModuleWatch()  # the program's modules, for the report's bytes of weights (report.gpu_facts)
        self._clock = None  # perflab.clock.StepClock, chosen at the first timed step
        self._marks: dict[str, list] = {"timed": [], "traced": []}  # a boundary source's stamps, per phase
        self._pairs: dict[str, list] = {"timed": [], "traced": []}  # a call source's (start, end) stamps, per phase
        self._call_ends: dict[str, list] = {"timed": [], "traced": []}  # --step: each call's (start mark, return) stamps
        self._call_start = None
        self._timed_read = False  # the timed stamps are read once (``_read_timed``)
        self._tracer = None  # trace.capture.Tracer while tracing
        self._pass = "accounted"  # the traced phase's passes: accounted (no shapes), then shapes (for the FLOPs)
        self._counters: dict = {}
        self._script_profiler = False
        self._stop_s = 0.0  # the last pass's profiler stop, seconds (its write is added to it: profiler_seconds)
        self._t0 = time.perf_counter()
        self.watch = compiler.LimitWatch(step_of=lambda: self.data.steps_seen + 1)
        self._profiler_watch: ProfilerWatch | None = None
        self._worker_dir = Path(tempfile.mkdtemp(prefix="perflab-workers-"))
        self.loop = LoopWatch(clock=lambda: self._clock, own_file=programs_file, input_names=options.inputs, worker_dir=self._worker_dir)
        self._busy = None  # measure.gpu_busy.BusyMeter over the timed steps, on a GPU where NVML works
        self._busy_why: str | None = None
        self._loop_started = False
        self._host_before = None  # (thread id, measure.sched.HostSample) where the timed steps began: their host contention
        self._host_after = None  # the same where they ended
        self._said, self._said_n = self._t0, 0  # when the last progress line was said, at which step
        self._parts: dict[str, float] = {}  # what perflab did at the boundary now running, ms each (``_part``)

    # --- installation ------------------------------------------------------------------------------

    def install(self) -> None:
        self.source.on_start = self._on_start
        self.source.on_end = self._on_end
        self.source.on_call_end = self._on_call_end
        self.source.install()
        self.watch.install()
        self.loop.install()
        self.module_watch.install()
        compiler.prepare()
        import perflab.clock  # noqa: F401  (imported now, not inside the first timed step)
        _preload_report()
        self._counters["start"] = compiler.counters()
        self._watch_script_profiler()
        if self.options.skip == 0:  # the timed phase begins with the first step (checked: --step's or --step-range's)
            if self.source.starts_at_first_call:
                self.data.phase = "timed"  # its first boundary, the first call's start, begins it (_step_begins)
            else:
                self._enter_timed()

    def remove(self) -> None:
        self.source.detach()
        self.watch.remove()
        self.loop.remove()
        self.module_watch.remove()
        self._unwatch_script_profiler()
        if self.guard.owner:  # a forked child abandoning its parent's recorder leaves the parent's folder alone
            shutil.rmtree(self._worker_dir, ignore_errors=True)

    # --- the phases ----------------------------------------------------------------------------------

    @property
    def _timed_end(self) -> int:
        return self.options.skip + self.options.steps

    def _on_start(self) -> None:
        with self.loop.paused():
            self._step_begins()

    def _on_end(self) -> None:
        with self.loop.paused():
            self._step_ends()

    def _on_call_end(self) -> None:
        """--step: the call that began this step returned. Its own duration (start to return) is kept beside the step."""
        phase = self.data.phase
        if ((phase == "timed" or phase == "traced" and self._pass == "accounted") and self._clock is not None and self._marks[phase]
                and not self._writing):
            with self.loop.paused():
                self._call_ends[phase].append((self._marks[phase][-1], self._clock.stamp()))

    def _step_begins(self) -> None:
        phase = self.data.phase
        if phase == "timed" and self.source.kind == "boundary" and not self._marks["timed"] and self.source.starts_at_first_call:
            self._enter_timed()  # --skip 0 with --step: the first call's start begins the timed steps
            return
        if phase == "timed" and "timed" not in self._counters:  # a "call" source's first timed step begins
            self._counters["timed"] = compiler.counters()  # (a few µs: compiler.prepare ran at install)
            if self._clock is None:  # --skip 0: no step before this one to choose the clock in
                self._choose_clock()
                self._start_loop()
        if self.source.kind == "call" and phase in ("timed", "traced") and self._clock is not None and not self._writing:
            if phase == "traced" and self._tracer is not None:
                self._internal(self._tracer.begin_step)
            if phase == "timed" or self._pass == "accounted":
                self._call_start = self._clock.stamp()

    def _step_ends(self) -> None:
        self.data.steps_seen += 1
        n = self.data.steps_seen
        phase = self.data.phase
        self._progress(n, phase)
        if (phase == "timed" or phase == "traced" and self._pass == "accounted") and self._clock is not None and not self._writing:
            if self.source.kind == "call":
                if self._call_start is not None:
                    self._pairs[phase].append((self._call_start, self._clock.stamp()))
                self._call_start = None
            else:
                self._marks[phase].append(self._clock.stamp())
        t0 = time.perf_counter()
        self._parts = {}
        try:
            self._change_phase(n, phase)
        finally:
            ms = (time.perf_counter() - t0) * 1e3
            if ms >= OWN_WORK_MS:
                parts = {k: round(v, 3) for k, v in self._parts.items()}
                rest = ms - sum(self._parts.values())
                if rest >= OWN_WORK_MS / 2:
                    parts["other"] = round(rest, 3)
                self.data.own_work.append({"step": n, "phase": phase, "ms": round(ms, 3), "parts": parts})

    @contextmanager
    def _part(self, what: str):
        """A piece of perflab's own work at a boundary, timed into ``Recorded.own_work``'s parts."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._parts[what] = self._parts.get(what, 0.0) + (time.perf_counter() - t0) * 1e3

    def _change_phase(self, n: int, phase: str) -> None:
        """What the boundary that ended step ``n`` (in ``phase``) starts or ends."""
        if n == 1 and phase == "skipped" and self.options.trace:
            with self._part("warm the profiler"):
                self._warm_profiler()
        if phase == "skipped" and n == self.options.skip:
            with self._part("start timing"):
                self._enter_timed()
        elif phase == "timed" and n == self._timed_end:
            with self._part("end the timed steps' watches"):
                self._end_timed_watch()
            if self.options.trace:
                self.data.phase = "between"  # perflab's own work waits for the next boundary (the module's doc)
            else:
                self._begin_tracing()
        elif phase == "between":
            self._begin_tracing()
        elif phase == "traced":
            if self._tracer is not None:
                self._step_tracer()
            elif self._closing == "facts":
                self._closing = "report"
                with self._part("take the report's facts"):
                    self.on_facts(self)
            else:  # the report's boundary (or perflab's trace gave way to the program's own profiler)
                self._finish_tracing()

    def _warm_profiler(self) -> None:
        """CUPTI's and Kineto's one-time start-up paid at the end of the program's first step, which holds the program's
        own start (CUDA's, compiling): on an H200 a first CUDA profiler session took 38 ms to start, a later one 1.4 ms
        (benchmarks/profiler_costs_gpu.py), and the step between read 59 ms of perflab's work with it. Not where the
        program has not started CUDA by then, nor where a profiler of its own runs."""
        import torch

        if not (torch.cuda.is_available() and torch.cuda.is_initialized()) or self._script_profiler or _profiler_running():
            return
        from perflab.trace.capture import warm_cuda_profiler

        self._warming = True
        try:  # an optimisation only: its failure leaves the start-up to the traced pass's start, and is said after the program
            self.guard.call("perflab could not start its profiler ahead (its start-up then lands in the step between)", warm_cuda_profiler)
        finally:
            self._warming = False

    def _progress(self, n: int, phase: str) -> None:
        """One line on stderr every ``PROGRESS_S`` while perflab works towards its report (the program's own output is
        its own: no bar is drawn over it): the phase, the step, and the time left at the steps' pace so far."""
        now = time.perf_counter()
        if n == 1:
            self._said, self._said_n = now, 1  # the pace is counted from the first step's end: the program's start is not a step
            return
        if now - self._said < PROGRESS_S or self.rank.rank != 0 or not self.guard.owner:
            return
        per = (now - self._said) / (n - self._said_n)
        self._said, self._said_n = now, n
        o = self.options
        need = steps_needed(o) + (o.shapes_steps if o.record_shapes and o.trace and self._on_gpu else 0)  # shapes: a GPU's pass
        where = {"skipped": f"skipping step {n} of {o.skip}", "timed": f"timing step {n - o.skip} of {o.steps}",
                 "between": f"starting the profiler (step {n} of {need})", "traced": f"tracing (step {n} of {need})"}.get(phase, f"step {n}")
        from perflab.program.guard import say

        say(f"perflab: {where}; the report in about {max(need - n, 0) * per:.0f} s (at {per:.2f} s a step so far)")

    def _enter_timed(self) -> None:
        self.data.phase = "timed"
        if self.source.kind == "call":
            # the phase begins with its first step: what runs between calls (a warm-up loop before the first range,
            # compilation there) is not the timed steps', so dynamo's counters are taken when it begins. The clock is
            # chosen here, at the end of the last skipped call, out of the first timed one (with --skip 0, at the
            # first timed call's start: the program may not have started CUDA before it)
            if self.options.skip > 0:
                self._choose_clock()
                self._start_loop()
            return
        self._counters["timed"] = compiler.counters()
        self._choose_clock()
        self._start_loop()
        self._marks["timed"].append(self._clock.stamp())  # a boundary source's timed steps begin at this boundary

    def _start_loop(self) -> None:
        """The whole loop's watch over the timed steps: the ``--input`` functions wrapped (the program has defined them by
        its first step), and on a GPU the busy share's first sample (GPM's, just before the first stamp: it takes a
        while, and it is perflab's, not the step's)."""
        import sys

        if self._loop_started:
            return
        self._loop_started = True
        self.loop.find_inputs(sys.modules.get("__main__"))
        self._host_before = _host_sample()
        if self._on_gpu:
            from perflab.measure.gpu_busy import open_busy_meter

            import torch

            self._busy, self._busy_why = open_busy_meter("cuda", torch.cuda.current_device())
            if self._busy is not None:
                self._busy.start()
        self.loop.active = True

    def _choose_clock(self) -> None:
        """CUDA events where the program has started CUDA by its first timed step, else the host clock."""
        import torch

        from perflab.clock import StepClock

        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        self._clock = StepClock(cuda)
        self.data.device = "cuda" if cuda else "cpu"
        if cuda:
            torch.cuda.reset_peak_memory_stats()

    def _begin_tracing(self) -> None:
        """The timed steps read and handed to ``on_timed`` (written), then the traced phase entered."""
        with self._part("read the timed steps"):
            self._read_timed()
        if self.on_timed is not None:
            with self._part("write the timed steps"):
                self.on_timed(self)
        self._enter_traced()

    def _end_timed_watch(self) -> None:
        """At the timed phase's last boundary: what watched the timed steps stops (nothing here synchronises: the steps'
        events are read later, ``_read_timed``). Once."""
        if "traced" in self._counters:
            return
        self._counters["traced"] = compiler.counters()
        self.loop.active = False
        self._host_after = _host_sample()
        if self._busy is not None:
            self.data.busy = self._busy.stop()
            self._busy = None
        elif self._busy_why:
            self.data.busy = {"busy_share": None, "why": {"nvml": self._busy_why}}
        if self._clock is not None and self._clock.cuda:
            import torch

            self.data.peak_allocated_bytes = int(torch.cuda.max_memory_allocated())
            self.data.peak_reserved_bytes = int(torch.cuda.max_memory_reserved())

    def _read(self, phase: str) -> tuple[list[float], list[float]]:
        if self._clock is None:
            return [], []
        if self.source.kind == "boundary":
            return self._clock.read_marks(self._marks[phase])
        return self._clock.read_pairs(self._pairs[phase])

    def _read_timed(self) -> None:
        """The timed steps' times and summary, read once: when the timed phase ends, or at ``finish`` when the program
        ends first. A phase stamps nothing after it ends, so a run cut short reads the steps it got. On a GPU the read
        waits for the phase's last event; an event's time is the same whenever it is read."""
        if self._timed_read:
            return
        self._timed_read = True
        if self.data.phase in ("skipped", "timed"):  # the program ended before the timed phase did: its watches end now
            self._end_timed_watch()
        host = _host_contention(self._host_before, self._host_after)
        with self.loop.paused():
            step_ms, host_ms = self._read("timed")
            self.data.step_ms, self.data.host_step_ms = [float(x) for x in step_ms], [float(x) for x in host_ms]
            self.data.timing = timing_summary(self.data.step_ms, self.data.host_step_ms)
            if self.data.timing.get("steps"):
                self.data.timing.update(host)
            if self._call_ends["timed"]:  # --step: each call's own duration, beside the period that is the step
                call_ms = self._clock.read_pairs(self._call_ends["timed"])[0]
                self.data.timing.update(call_median_ms=float(statistics.median(call_ms)), calls=len(call_ms))
            self.data.timed_windows_ns = self._windows("timed")
            loop = self.loop.take()
        windows = self.data.timed_windows_ns
        if windows:
            loop["worker_batches"] = read_worker_batches(self._worker_dir, windows[0][0], windows[-1][1])
        self.data.loop = loop

    def _windows(self, phase: str) -> list[list[int]]:
        """Each step's window on the host's clock (ns): boundary to boundary, or a call's start to its return."""
        if self.source.kind == "boundary":
            marks = self._marks[phase]
            return [[a[1], b[1]] for a, b in zip(marks, marks[1:])]
        return [[a[1], b[1]] for a, b in self._pairs[phase]]

    def _read_traced(self) -> None:
        """The traced steps' times (the accounted pass's stamps). A failing read (a sticky CUDA error from the pass with
        shapes) leaves them out and says why; the timed steps were read when their phase ended."""
        try:
            self.data.traced_step_ms = [float(x) for x in self._read("traced")[0]]
        except Exception as exc:
            self.data.traced_step_ms = []
            note = f"the traced steps' times could not be read ({type(exc).__name__}: {exc})"
            self.data.trace_note = f"{self.data.trace_note}; {note}" if self.data.trace_note else note

    def _enter_traced(self) -> None:
        self.data.phase = "traced"
        if self.options.trace == 0:
            self._finish_tracing()
            return
        if self._script_profiler or _profiler_running():
            self.data.trace_note = ("the program runs torch.profiler itself, and only one profiler can record at a time: perflab timed "
                                    "its steps and left the tracing to it (analyse its trace with perflab analyze)")
            self._script_profiler = True
            self._finish_tracing()
            return
        from perflab.trace.capture import Tracer

        with self._part("synchronise"):
            self._sync()
        # on a GPU the accounted pass records no shapes, nor any of torch's operators (CUDA only: trace.capture.Tracer says
        # what they cost: nanoGPT's traced steps ×0.99–1.34 with them); the pass with shapes follows. On the CPU the
        # operators are the work: one pass records them, with their shapes
        self._tracer = Tracer(self.rank_dir() / TRACE_FILE, self.data.device or "cpu", steps=self.options.trace,
                              warmup=self.options.trace_warmup, record_shapes=self.options.record_shapes and not self._on_gpu,
                              own_step_ranges=self.source.kind == "call", cpu_ops=False, defer_write=True, compress_later=True)
        self.data.trace_warmup = self.options.trace_warmup
        with self._part("start the profiler"):
            self._tracer.start()
        if self.source.kind == "boundary":
            self._marks["traced"].append(self._clock.stamp())  # the traced steps begin at this boundary, as the timed did

    def _internal(self, call) -> None:
        """Run ``call`` with a range source told to ignore the ranges perflab opens itself."""
        internal = getattr(self.source, "internal", None)
        if internal is not None:
            self.source.internal = True
        try:
            call()
        finally:
            if internal is not None:
                self.source.internal = False

    @property
    def _writing(self) -> bool:
        """A pass's traced steps have ended: its trace waits to be written at this boundary (``Tracer.pending``), or the
        last pass's is written and the report's boundaries follow (``_closing``). No step is stamped then."""
        return self._closing is not None or self._tracer is not None and self._tracer.pending

    def _step_tracer(self) -> None:
        tracer = self._tracer
        t0 = time.perf_counter()
        if tracer.pending:  # the boundary after the pass's last step: its trace written now, then what follows the pass
            self._write_pass(tracer)
            return
        try:
            if self.source.kind == "call":
                self._internal(lambda: tracer.end_step(before_stop=self._sync))
            else:
                tracer.step(before_stop=self._sync)  # the last traced step's GPU work is inside the trace
            self._parts["step the profiler" if tracer.active else "stop the profiler"] = (time.perf_counter() - t0) * 1e3
        except Exception as exc:  # a trace that cannot be written (a full disk) must not end the user's program
            tracer.stop()
            self.data.trace_note = f"the trace could not be written ({type(exc).__name__}: {exc})"
        if tracer.active:
            return
        self._stop_s = time.perf_counter() - t0
        if not tracer.pending:  # stopped early (a failure said above): nothing to write
            self._after_pass(tracer)

    def _write_pass(self, tracer) -> None:
        """The pass's trace written, a step after its last traced step; then what follows the pass."""
        self._write_trace(tracer)
        self._after_pass(tracer)

    def write_pending(self) -> None:
        """At the program's end: a pass whose traced steps ended but whose trace waited for a next boundary that never
        came is written now, so that its steps are reported (the pass with shapes is not started)."""
        tracer = self._tracer
        if tracer is None or not tracer.pending:
            return
        self._write_trace(tracer)
        if self._pass == "accounted" and tracer.written and self.options.record_shapes and self._on_gpu:
            self.data.trace_note = "the program ended before perflab's pass with operator shapes: FLOPs left out"
        self._tracer = None
        self._counters["after"] = compiler.counters()
        self.data.phase = "done"

    def _write_trace(self, tracer) -> None:
        """``Tracer.write`` of a pass's held-back trace (its failure, a full disk, said in the trace's note, never raised
        into the program), the accounted pass's profiler seconds (its stop and this write), and the trace's path kept."""
        t0 = time.perf_counter()
        try:
            tracer.write()
        except Exception as exc:
            self.data.trace_note = f"the trace could not be written ({type(exc).__name__}: {exc})"
        self._parts["write the trace"] = (time.perf_counter() - t0) * 1e3
        if self._pass == "accounted":
            self.data.profiler_seconds = self._stop_s + (time.perf_counter() - t0)
        self._keep_path(tracer)

    def _keep_path(self, tracer) -> None:
        """A written pass's trace named in the record: the accounted one with its steps, or the one with shapes."""
        if not tracer.written:
            return
        if self._pass == "accounted":
            self.data.trace_path = str(tracer.trace_path)
            self.data.traced_steps = tracer.steps
        else:
            self.data.shapes_trace_path = str(tracer.trace_path)

    def _after_pass(self, tracer) -> None:
        """What follows a pass: after the accounted one, the pass with shapes (on a GPU) or the end of tracing."""
        self._keep_path(tracer)
        # on the CPU the operators are the accounted work and were recorded with their shapes already; a second session
        # there, beside gloo's threads, crashed a two-rank DDP run at its exit in 3 of 30 runs (0 of 16 with one pass)
        if self._pass == "accounted" and tracer.written and self.options.record_shapes and self._on_gpu:
            self._start_shapes_pass()
            return
        if self.on_facts is not None and tracer.written:  # the report's facts and its start, each at a boundary of its own
            self._tracer = None
            self._closing = "facts"
            return
        self._finish_tracing()

    def _start_shapes_pass(self) -> None:
        """A second, short pass with operator shapes, for the FLOPs only: its steps are not accounted or timed."""
        from perflab.trace.capture import Tracer

        self._pass = "shapes"
        with self._part("synchronise"):
            self._sync()
        # no warm-up: what the profiler's start costs these steps does not matter, only their operators' shapes do
        self._tracer = Tracer(self.rank_dir() / SHAPES_FILE, self.data.device or "cpu", steps=self.options.shapes_steps, warmup=0,
                              record_shapes=True, own_step_ranges=self.source.kind == "call", defer_write=True,
                              compress_later=True)
        with self._part("start the pass with shapes"):
            self._tracer.start()

    @property
    def _on_gpu(self) -> bool:
        return self._clock is not None and self._clock.cuda

    def _sync(self) -> None:
        if self._clock is not None and self._clock.cuda:
            import torch

            torch.cuda.synchronize()

    def _finish_tracing(self) -> None:
        self._counters["after"] = compiler.counters()
        self._tracer = None
        self.data.phase = "done"
        with self._part("remove perflab's hooks"):
            self.remove()  # the program runs on untouched
        if self.on_traced is not None:
            with self._part("start the report"):
                self.on_traced(self)  # may raise StopProgram (--stop-after)

    # --- the program's own profiler ------------------------------------------------------------------

    def _watch_script_profiler(self) -> None:
        """If the program starts torch.profiler itself while perflab's records, perflab's stops first (one profiler at a
        time) and says so; if it started one before, perflab does not trace (``guard.ProfilerWatch``: whichever way the
        program starts it)."""
        recorder = self

        def is_ours(autograd_profile) -> bool:
            # the tracer's torch profiler prepares its autograd profile at its start and at its schedule's warm-up,
            # before the tracer's start returns
            if recorder._warming:
                return True
            tracer = recorder._tracer
            prof = tracer.profiler if tracer is not None else None
            return prof is not None and getattr(prof, "profiler", None) is autograd_profile

        def give_way() -> None:
            recorder._script_profiler = True
            if recorder._tracer is None:
                return
            recorder._tracer.stop()
            recorder._tracer = None
            if recorder._pass == "shapes":
                recorder.data.trace_note = ("the program started torch.profiler itself during perflab's pass with operator shapes; that "
                                            "pass was dropped (one profiler at a time): FLOPs left out")
            else:
                recorder.data.trace_note = ("the program started torch.profiler itself while perflab traced; perflab's trace was "
                                            "dropped (one profiler at a time): analyse the program's own trace with perflab analyze")

        self._profiler_watch = ProfilerWatch(is_ours, give_way, self.guard)
        self._profiler_watch.install()

    def _unwatch_script_profiler(self) -> None:
        if self._profiler_watch is not None:
            self._profiler_watch.remove()
            self._profiler_watch = None

    # --- what was measured ---------------------------------------------------------------------------

    def rank_dir(self) -> Path:
        return rank_dir(self.options.out_dir, self.rank)

    def finish(self) -> Recorded:
        """What was measured up to now (at the end of the traced steps, or when the program ended first)."""
        data = self.data
        self.write_pending()
        self._read_timed()
        phases = [("start", "timed", "skipped"), ("timed", "traced", "timed"), ("traced", "after", "traced")]
        now = compiler.counters()
        for a, b, name in phases:
            if a in self._counters:
                data.compile_phases[name] = compiler.delta(self._counters[a], self._counters.get(b, now))
        data.limit_hits = list(self.watch.hits)
        data.optimizers = list(getattr(self.source, "optimizers", []))
        data.peak_rss_bytes = _peak_rss()
        data.wall_s = time.perf_counter() - self._t0
        if self._tracer is not None:  # cut short while tracing: the steps that were traced are not the ones asked for
            self._tracer.stop()
            self._tracer = None
            if self._pass == "accounted":
                data.trace_note = "the program ended while perflab traced; the partial trace was not written"
            else:
                data.trace_note = "the program ended during the pass with operator shapes: FLOPs left out"
        self._read_traced()
        return data


# what perflab's own work at the ends of its phases imports (the report's analysis, pandas under it, the trace's reader):
# imported at install, before the program's first step, not at the step between (a program's own clock read 288 ms for
# that step on the CPU, against 14 ms for its neighbours: 250 ms of it importing perflab.analysis and pandas)
REPORT_MODULES = ("perflab.analysis.loop", "perflab.analysis.program", "perflab.program.report", "perflab.records.run_report",
                  "perflab.trace.load", "perflab.trace.kineto", "perflab.trace.capture")


def _preload_report() -> None:
    import importlib

    for name in REPORT_MODULES:
        importlib.import_module(name)


def _profiler_running() -> bool:
    import torch

    try:
        return bool(torch.autograd.profiler._is_profiler_enabled)
    except AttributeError:
        return False


def _peak_rss() -> int | None:
    try:
        import resource
    except ImportError:
        return None
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB


def instances_alive(cls) -> list:
    """Every object of ``cls`` the garbage collector tracks (a dead weak proxy among them is skipped: isinstance on it
    raises ReferenceError)."""
    found = []
    for obj in gc.get_objects():
        try:
            if isinstance(obj, cls):
                found.append(obj)
        except ReferenceError:
            continue
    return found


class ModuleWatch:
    """Every ``nn.Module`` that registers a parameter or a buffer while installed (torch's global registration hooks),
    held weakly, for ``module_bytes``: with the garbage collector's scan instead, the report's facts took 155-220 ms of
    one of a compiled GPT-2's steps on an H200 (its 24-40 ms steps), with these 7 ms; the bytes were the same
    (497,759,232: GPT-2 small's 124,439,808 fp32 parameters)."""

    def __init__(self):
        self.modules = weakref.WeakSet()
        self._handles: list = []

    def install(self) -> None:
        from torch.nn.modules import module as nn_module

        def seen(module, name, value) -> None:  # returns nothing: the tensor registered is the program's, unchanged
            self.modules.add(module)

        self._handles = [nn_module.register_module_parameter_registration_hook(seen),
                         nn_module.register_module_buffer_registration_hook(seen)]

    def remove(self) -> None:
        """The hooks removed; the modules seen are kept (a report made after the program reads them)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []


def module_bytes(device_type: str, modules=None) -> dict:
    """The parameters and buffers of every ``nn.Module`` alive, each tensor once, on ``device_type``: what a step that
    reads every weight (and a KV cache held as a buffer) once moves at least. ``modules``: those a ``ModuleWatch`` saw;
    none (a model unpickled whole registers nothing), or not given: found through the garbage collector. The count
    returned is of the modules read (the watch's: those holding a tensor of their own; the scan's: every one alive)."""
    import torch

    seen, params, buffers, count = set(), 0, 0, 0
    found = list(modules) if modules is not None else []
    if not found:
        with warnings.catch_warnings():  # isinstance on a deprecated alias (torch.distributed.reduce_op) warns
            warnings.simplefilter("ignore")
            found = instances_alive(torch.nn.Module)
    for obj in found:
        count += 1
        for tensors, is_param in ((obj.parameters(recurse=False), True), (obj.buffers(recurse=False), False)):
            for t in tensors:
                if t is None or t.device.type != device_type or t.is_meta:
                    continue
                key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.numel())
                if key in seen:
                    continue
                seen.add(key)
                size = t.numel() * t.element_size()
                if is_param:
                    params += size
                else:
                    buffers += size
    return {"param_bytes": params, "buffer_bytes": buffers, "modules": count}


def _host_sample():
    """This thread's run-queue wait and the host's steal counters now (``measure.sched.sample``), with the thread's id."""
    import threading

    from perflab.measure import sched

    return threading.get_ident(), sched.sample()


def _host_contention(before, after) -> dict:
    """The program's thread's share of the timed steps spent waiting for a CPU, and the VM's steal over them
    (``measure.sched.contention``: ``host_wait_frac``, ``host_steal_frac``, each None where unknown), as bench's rows
    carry them: a host that other work shared is flagged ``host_contention`` where they are read (``perflab ab`` of a
    program). Both samples must come from one thread (a program that ends from another thread leaves them unknown)."""
    import os

    from perflab.measure import sched

    if before is None or before[0] != after[0]:
        return {sched.WAIT_KEY: None, sched.STEAL_KEY: None}
    getter = getattr(os, "sched_getaffinity", None)
    cpus = sorted(getter(0)) if getter else None
    return sched.contention(before[1], after[1], cpus)

