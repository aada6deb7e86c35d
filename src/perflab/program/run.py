"""``perflab run``: run a program with a recorder installed, then report and write what was measured.

The report is made at the end of the traced steps, while the program is still running (it runs on afterwards, or stops
with ``--stop-after``), so a long training job gives its answer minutes in, not at its end. Whatever ends the program
first (its end, an exception, sys.exit, Ctrl-C, SIGTERM), what was measured up to then is written to ``OUT/run.json``
and one line says how far it got. ``OUT`` is resolved when the run begins (a program that changes directory does not
move it); only the process perflab started writes or reports (``program.guard``); perflab's own failures (a disk that
is full, a stderr the program closed) are said after the program, never raised inside it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

from perflab.errors import PerflabError
from perflab.program.boundaries import StepSource, make_source
from perflab.program.guard import Guard, say
from perflab.program.recorder import Rank, Recorded, Recorder, RunOptions, StopProgram
from perflab.program.report import RunContext, RunReport, build_run_report, write_json
from perflab.program.script import Program, print_program_traceback, run_program


@dataclass
class RunResult:
    exit_code: int
    report: RunReport | None  # None: no report was made (a forked child, or perflab failed before it)
    out_dir: Path


class Run:
    def __init__(self, program: Program, options: RunOptions, step: str | None = None, step_range: str | None = None, render=None):
        self.program = program
        self.options = replace(options, out_dir=Path(os.path.abspath(options.out_dir)))  # where the run began, whatever the program's cwd
        self.guard = Guard()
        self.source: StepSource = make_source(step, step_range)
        self.rank = Rank.from_env()
        self.render = render  # render(report) -> None: the console report (rank 0)
        self.report: RunReport | None = None
        self.written = False
        self.write_failed = False

    def __call__(self) -> RunResult:
        guard = self.guard
        recorder = Recorder(self.source, self.options, self.rank, on_traced=self._on_traced, guard=guard)
        recorder.install()
        guard.catch_sigterm()
        t0 = time.perf_counter()
        try:
            outcome = run_program(self.program, stop=StopProgram)
        finally:
            guard.release_sigterm()
            recorder.remove()
            self.source.close()
        if not guard.owner:  # a forked child that ran on through perflab: its end is its own, it reports nothing
            print_program_traceback(outcome, self.program)
            return RunResult(outcome.code, None, Path(self.options.out_dir))
        if not self.written and not self.write_failed:  # the program ended before the traced steps did (or during the pass with shapes: reported in full)
            self._write_kept(recorder, ended_early=recorder.data.trace_path is None, outcome=outcome)
        print_program_traceback(outcome, self.program)
        if self.report is None or self.report.partial:
            say(self._early_line(recorder, outcome, time.perf_counter() - t0))
        elif outcome.exception is not None and self.rank.rank == 0:
            where = f"was written to {Path(self.options.out_dir) / 'run.json'}" if self.written else "was made (it could not be written: below)"
            say(f"perflab: the program {self._how(outcome)} {self._at_step()}, after perflab's report of its steps {where}")
        for note in self._notes():
            say(f"perflab: {note}")
        return RunResult(outcome.code, self.report, Path(self.options.out_dir))

    def _at_step(self) -> str:
        """The step the program was in, by its own count (the source counts on after the report where that is free)."""
        if self.source.counting_after:
            return f"at step {self.source.seen + 1}"
        return f"after step {self.source.seen}"

    def _notes(self) -> list[str]:
        """perflab's own failures and where it gave way, said after the program."""
        notes = list(self.guard.failures)
        if self.source.failure:
            notes.append(f"perflab stopped recording after step {self.source.seen}: its own step hook failed ({self.source.failure}); "
                         "the program ran on")
        if self.source.gave_way:
            notes.append(self.source.gave_way)
        return notes

    def _on_traced(self, recorder: Recorder) -> None:
        self._write_kept(recorder, ended_early=False)
        if self.options.stop_after:
            raise StopProgram()

    def _write_kept(self, recorder: Recorder, ended_early: bool, outcome=None) -> None:
        """``_write`` of what the recorder measured; its failure (a full disk) is said after the program, which runs on."""
        if not self.guard.call(f"run.json could not be written to {self.options.out_dir}",
                               lambda: self._write(recorder.finish(), ended_early, outcome)):
            self.write_failed = True

    def _write(self, recorded: Recorded, ended_early: bool, outcome=None) -> None:
        """The report of what was measured, written to run.json (under torchrun each rank's to its rank.json, and rank
        0's merged with the others' to run.json)."""
        from perflab.program import ranks

        context = RunContext(self.program.label, self.source.description, self.options, self.rank)
        report = build_run_report(recorded, context, partial=ended_early, outcome=outcome,
                                  notes=self._notes() if outcome is not None else None)
        if self.rank.distributed:
            ranks.gather(report, self.options, self.rank, ended_early)
        self.report = report
        if self.rank.rank == 0:
            written = report.to_dict()
            write_json(Path(self.options.out_dir) / "run.json", written)
            if not ended_early and self.render is not None:
                try:
                    self.render(written)
                except Exception as exc:  # the program closed stderr: the report is in run.json
                    self.guard.failed(f"the report could not be printed; it is in {Path(self.options.out_dir) / 'run.json'}", exc)
        self.written = True

    @staticmethod
    def _how(outcome) -> str:
        if outcome.terminated:
            return "was terminated (SIGTERM)"
        return "was interrupted" if outcome.interrupted else ("raised an exception" if outcome.exception else f"exited with code {outcome.code}")

    def _early_line(self, recorder: Recorder, outcome, seconds: float) -> str:
        data = recorder.data
        seen = self.source.seen
        where = Path(self.options.out_dir) / "run.json" if self.written else "nothing (run.json could not be written)"
        how = self._how(outcome)
        if seen == 0 and data.phase != "done":
            return f"perflab: {self.source.never_matched()}; the program {how} after {seconds:.1f} s"
        o = self.options
        need = o.skip + o.steps + (o.trace_warmup + o.trace if o.trace else 0)
        how = f"{how} after {seen} step(s)"
        timed = len(data.step_ms)
        measured = f"{timed} timed step(s)" + (", traced" if data.trace_path else "")
        traced = f" + --trace-warmup {o.trace_warmup} + --trace {o.trace}" if o.trace else " + --trace 0"
        return (f"perflab: the program {how} ({self.source.description}); --skip {o.skip} + --steps {o.steps}{traced} needs {need}: "
                f"{measured} written to {where}")


def check_options(skip: int, steps: int, trace: int, step: str | None = None, step_range: str | None = None, trace_warmup: int = 3,
                  inflation_limit: float = 1.10, stall_factor: float = 1.5, inputs=(), batch_size: int | None = None,
                  seq_len: int | None = None) -> None:
    for name, value, least in (("--skip", skip, 0), ("--steps", steps, 1), ("--trace", trace, 0), ("--trace-warmup", trace_warmup, 0)):
        if value < least:
            raise PerflabError(f"{name} must be at least {least}, got {value}")
    if not (inflation_limit > 1.0 and inflation_limit < 100):
        raise PerflabError(f"--inflation-limit must be a ratio above 1 (1.10: traced steps 10% longer), got {inflation_limit}")
    if not (stall_factor > 1.0 and stall_factor < 1000):
        raise PerflabError(f"--stall-factor must be a ratio above 1 (1.5: a step 50% longer than the median), got {stall_factor}")
    for name, value in (("--batch-size", batch_size), ("--seq-len", seq_len)):
        if value is not None and value < 1:
            raise PerflabError(f"{name} must be at least 1, got {value}")
    if seq_len is not None and batch_size is None:
        raise PerflabError("--seq-len needs --batch-size: tokens a step = --batch-size × --seq-len")
    for spec in inputs:
        from perflab.program.boundaries import parse_step_function

        try:
            parse_step_function(spec)
        except PerflabError:
            raise PerflabError(f"--input {spec!r}: give a function's qualified name (get_batch, MyLoader.__next__) or FILE:QUALNAME") from None
    if skip == 0 and not step and step_range is None:
        raise PerflabError("--skip 0 needs --step or --step-range: an optimizer step's first step begins with the program itself "
                           "(imports, building the model)")
