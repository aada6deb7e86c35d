"""``perflab run``: run a program with a recorder installed, then report and write what was measured.

The report is made at the end of the traced steps, while the program is still running (it runs on afterwards, or stops
with ``--stop-after``), so a long training job gives its answer minutes in, not at its end. The timed steps are written
(``partial``) as soon as they end, before the profiler starts: a program that dies during its traced steps
(``os._exit``, a crash in the profiler) keeps them. Whatever ends the program first (its end, an exception, sys.exit,
Ctrl-C, SIGTERM), what was measured up to then is written to ``OUT/run.json`` and one line says how far it got.
``OUT`` is resolved when the run begins (a program that changes directory does not move it); only the process perflab
started writes or reports (``program.guard``); perflab's own failures (a disk that is full, a stderr the program
closed) are said after the program, never raised inside it.

The processes the program starts are followed (``program.children``): a child that steps is recorded as this process
is (a ``Run`` of its own, ``start`` and ``finish`` around its bootstrap), the report lists the processes seen, and
where the program stepped only in its children, theirs is the run's report. Every report and record carries the
run's id (``run_id``): a run reads only its own, never one an earlier run left in the same ``OUT``.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from perflab.errors import PerflabError
from perflab.program.boundaries import StepSource, make_source
from perflab.program.children import resolve_hook
from perflab.program.guard import Guard, say
from perflab.program.recorder import Rank, Recorded, Recorder, RunOptions, StopProgram, steps_needed
from perflab.program.report import RunContext, build_run_report
from perflab.program.script import Outcome, Program, print_program_traceback, run_program
from perflab.program.report_job import FAILED, UNLOADABLE, WAIT_S
from perflab.records.run_report import RunReport, save
from perflab.records.run_report import load as load_report

ACTIVE: "Run | None" = None  # the run recording in this process (a forked child finds its parent's here, and abandons it)
RUN_ID_ENV = "PERFLAB_RUN_ID"  # set by perflab run --nproc for its ranks: one id for the whole run


def new_run_id() -> str:
    """The id of this run: the launcher's (``PERFLAB_RUN_ID``, or torchrun's own ``TORCHELASTIC_RUN_ID`` for ranks
    started by a plain torchrun), else a new one."""
    for name in (RUN_ID_ENV, "TORCHELASTIC_RUN_ID"):
        value = os.environ.get(name)
        if value and value != "none":
            return value
    return uuid.uuid4().hex[:12]


PEAKS_AFTER = ("perflab: this GPU's peaks (for MFU and the floors) are measured once, after the program, when they touch none "
               "of its steps; the report follows them (later runs read them from the cache)")


@dataclass
class RunResult:
    exit_code: int
    report: RunReport | None  # None: no report was made (a forked child, or perflab failed before it)
    out_dir: Path


class Run:
    def __init__(self, program: Program | None, options: RunOptions, step: str | None = None, step_range: str | None = None, render=None,
                 rank: Rank | None = None, label: str | None = None, run_id: str | None = None, follow: bool = False, page=None,
                 report_process: bool = False):
        """``program``: the program to run (None for a child's run, whose bootstrap runs it: ``start`` and ``finish``
        around it); ``label``: what the report calls the program; ``follow``: follow the processes it starts
        (``program.children``; the process perflab started); ``render(report)`` and ``page(out_dir, report)``: the
        console report and the run's page, from the stage above (the API: program/ imports no report);
        ``report_process``: the traced steps' report may be made in a process of its own (``program.report_job``): the
        caller's ``render`` and ``page`` are hooks that process can make again, with no effect the caller keeps."""
        self.program = program
        self.options = replace(options, out_dir=Path(os.path.abspath(options.out_dir)))  # where the run began, whatever the program's cwd
        self.guard = Guard()
        self.step, self.step_range = step, step_range
        self.source: StepSource = make_source(step, step_range)
        self.rank = rank or Rank.from_env()
        self.render = render  # render(report) -> None: the console report (rank 0)
        self.page = page  # page(out_dir, report) -> None: OUT/report.html beside run.json
        self.label = label or (program.label if program is not None else "?")
        self.run_id = run_id or new_run_id()
        self.follow = follow
        self.report_process = report_process
        self.follower = None
        self.report: RunReport | None = None
        self.written = False
        self.write_failed = False
        self._t0 = None
        self._recorder: Recorder | None = None
        self._processes: list[dict] | None = None  # the processes the program started, once its end gathered them
        self._job = None  # the report's own process (program.report_job), until the run's end awaits it
        self._job_recorded: Recorded | None = None  # what it reports, kept to report here should it fail
        # the report's facts from the program's process (report.gpu_facts), taken a boundary before the report starts
        # (Recorder.on_facts); where this GPU's peaks were never measured, the report is made after the program (_deferred)
        self._facts: dict | None = None
        self._deferred = False

    @property
    def report_path(self) -> Path:
        """Where this process's report goes: run.json, or under torchrun (and a spawned rank) its rank.json."""
        from perflab.program.recorder import rank_dir

        return rank_dir(self.options.out_dir, self.rank) / "rank.json" if self.rank.distributed else Path(self.options.out_dir) / "run.json"

    def __call__(self) -> RunResult:
        recorder = self.start()
        try:
            outcome = run_program(self.program, stop=StopProgram)
        except BaseException:
            self.close(recorder)
            raise
        return self.finish(recorder, outcome)

    def start(self) -> Recorder:
        """The recorder installed, SIGTERM taken (in the process perflab started), the children followed."""
        global ACTIVE

        self._clear_stale()
        if self.rank.distributed:  # rank 0 waits for this rank's report only while this process runs
            from perflab.program.ranks import write_rank_pid
            from perflab.program.recorder import rank_dir

            self.guard.call("perflab could not write this rank's pid", lambda: write_rank_pid(rank_dir(self.options.out_dir, self.rank), self.run_id))
        recorder = Recorder(self.source, self.options, self.rank, on_traced=self._on_traced, on_timed=self._on_timed, guard=self.guard,
                            on_facts=self._on_facts if self._job_possible else None)
        self._recorder = recorder
        recorder.install()
        if self.follow:
            from perflab.program.children import Follower

            self.follower = Follower({"out_dir": str(self.options.out_dir), "options": _json_options(self.options), "step": self.step,
                                      "step_range": self.step_range, "run_id": self.run_id, "program": self.label,
                                      "render": self.render is not None, "hooks": CHILD_HOOKS})
            self.guard.call("perflab could not prepare to follow the program's children", self.follower.install)
        if self.program is not None:  # the process perflab started (a child's SIGTERM ends it as it would alone)
            self.guard.catch_sigterm()
        ACTIVE = self
        self._t0 = time.perf_counter()
        return recorder

    def _clear_stale(self) -> None:
        """The traces, rank report and page an earlier run left where this one writes its own: gone before the program runs,
        so that nothing of that run is read as this one's (every report of this run also carries its id)."""
        from perflab.program.recorder import SHAPES_FILE, TRACE_FILE, rank_dir

        from perflab.program.ranks import PID_FILE
        from perflab.program.report_job import JOB_FILE
        from perflab.records.run_report import RANK_FILE
        from perflab.trace.load import plain_trace_path

        folder = rank_dir(self.options.out_dir, self.rank)
        for name in (TRACE_FILE, SHAPES_FILE, plain_trace_path(TRACE_FILE).name, plain_trace_path(SHAPES_FILE).name, RANK_FILE,
                     PID_FILE, "report.html", JOB_FILE):
            try:
                (folder / name).unlink(missing_ok=True)
            except OSError:
                pass

    def close(self, recorder: Recorder) -> None:
        global ACTIVE

        self.guard.release_sigterm()
        recorder.remove()
        self.source.close()
        if self.follower is not None:
            self.follower.remove()
        if ACTIVE is self:
            ACTIVE = None

    def abandon(self) -> None:
        """In a forked child: this (its parent's) recorder stops here, writing nothing (``program.children``)."""
        global ACTIVE

        if self._recorder is not None:
            try:
                self._recorder.remove()
                self.source.close()
            except Exception:
                pass
        ACTIVE = None

    def finish(self, recorder: Recorder, outcome: Outcome) -> RunResult:
        """After the program (or a child's bootstrap): what was measured written, one line on how far it got."""
        self.close(recorder)
        if not self.guard.owner:  # a forked child that ran on through perflab: its end is its own, it reports nothing
            if self.program is not None:
                print_program_traceback(outcome, self.program)
            return RunResult(outcome.code, None, Path(self.options.out_dir))
        self._join_report_job()
        children = self._children(outcome)
        if children is not None and children.get("report") is not None:
            return self._children_result(outcome, children)
        self._processes = children["processes"] if children else None
        if not self.written:  # a trace whose steps ended with the program's last step, written a step later: now
            self.guard.call(f"the trace could not be written to {self.options.out_dir}", recorder.write_pending)
        if not self.written and not self.write_failed:  # the program ended before the traced steps did (or during the pass with shapes)
            self._write_kept(recorder, ended_early=recorder.data.trace_path is None, outcome=outcome)
        elif self._processes and self.written and self.rank.rank == 0 and self.report is not None:
            self.report.processes = self._processes
            self.guard.call(f"run.json could not be written to {self.options.out_dir}", lambda: self._write_file(self.report))
        if self.program is not None:
            print_program_traceback(outcome, self.program)
        if self.report is None or self.report.partial:
            say(self._early_line(recorder, outcome, time.perf_counter() - self._t0))
        elif outcome.exception is not None and self.rank.rank == 0:
            where = f"was written to {self.report_path}" if self.written else "was made (it could not be written: below)"
            say(f"perflab: the program {self._how(outcome)} {self._at_step()}, after perflab's report of its steps {where}")
        for note in self._notes():
            say(f"perflab: {note}")
        return RunResult(outcome.code, self.report, Path(self.options.out_dir))

    def _children(self, outcome: Outcome) -> dict | None:
        """The program's children at its end: those still running ended where it ended badly; their records; and where
        this process stepped nothing, the report they wrote."""
        if self.follower is None:
            return None
        if outcome.exception is not None or outcome.interrupted:
            ended = self.follower.end_children()
            if ended:
                say(f"perflab: the program {self._how(outcome)}; its processes still running were ended: {', '.join(map(str, ended))}")
        records = self.follower.records()
        if not records:
            return None
        from perflab.program.children import processes_section

        top = {"pid": os.getpid(), "kind": "the program (perflab started it)", "target": self.label, "followed": True,
               "steps_seen": self.source.seen, "timed_steps": len(self._recorder.data.step_ms) if self._recorder else 0}
        report = self.follower.children_report(records) if self.source.seen == 0 else None
        return {"processes": processes_section(records, top), "report": report}

    def _children_result(self, outcome: Outcome, children: dict) -> RunResult:
        """The program stepped in its children only: their report is the run's, with the processes seen."""
        report = children["report"]
        report.processes, report.steps_in = children["processes"], "the program's children"
        self.report = report
        if self.program is not None:
            print_program_traceback(outcome, self.program)
        if self.guard.call(f"run.json could not be written to {self.options.out_dir}", lambda: self._write_file(self.report)):
            self.written = True
        stepped = [p for p in children["processes"][1:] if p.get("followed") and p.get("steps_seen")]
        who = ", ".join(f"{p['kind']} {p['rank'] if p.get('rank') is not None else p['pid']} (pid {p['pid']}, {p['steps_seen']} steps)"
                        for p in stepped)
        say(f"perflab: the program stepped in its children, not in the process perflab started: {who}; their report "
            f"({report.report_of}) is the run's: {Path(self.options.out_dir) / 'run.json'}")
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

    def _on_timed(self, recorder: Recorder) -> None:
        """The timed steps are complete: written now (partial), before the profiler starts, so that a program that
        dies during its traced steps keeps them."""
        self._write_kept(recorder, ended_early=True, quiet=True)
        self.written = False  # the whole report is still to come

    def _on_traced(self, recorder: Recorder) -> None:
        # deferred (_on_facts): made after the program (finish), where measuring this GPU's peaks touches none of its steps
        if not self._deferred and not self._job_possible and self._peaks_to_measure(recorder):
            self._deferred = True  # a followed child makes its report here: the same wait for the program's end
            say(PEAKS_AFTER)
        if not self._deferred and not self._start_report_job(recorder):
            self._write_kept(recorder, ended_early=False)
        if self.options.stop_after:
            raise StopProgram()

    def _peaks_to_measure(self, recorder: Recorder) -> bool:
        """The report made in the program's process would measure this GPU's peaks in a step of the program: on a GPU
        whose peaks were never measured, in a process that is no torchrun rank (the all-reduce sweep and the ranks' merge
        must run while every rank still steps), without --stop-after. A spawned ResNet-50's own clock on a fresh H200 read
        1325.8 ms for that step, against a 62.4 ms median."""
        from perflab.program.report import _cached_ceilings

        return recorder.data.device == "cuda" and self._waits_for_peaks(recorder.data.device, _cached_ceilings())

    def _waits_for_peaks(self, device: str | None, ceilings: dict | None) -> bool:
        """The one rule for both reports (made in a job, ``_on_facts``; made here, ``_on_traced``): on a GPU with no
        peaks cached, outside torchrun and --stop-after, the report waits for the program's end."""
        return device == "cuda" and ceilings is None and not self.rank.distributed and not self.options.stop_after

    @property
    def _job_possible(self) -> bool:
        """The traced steps' report can be made in a process of its own (not under torchrun, in a followed child, with
        --stop-after, or where the caller asked for it here)."""
        return (self.report_process and not self.rank.distributed and self.program is not None and not self.options.stop_after
                and self.rank.rank == 0)

    def _on_facts(self, recorder: Recorder) -> None:
        """What the report needs from the program's process, a boundary before the report's start: on a GPU its TF32
        setting, its modules' bytes and the peaks cached for it. Where the peaks were never measured here (on an H200 the
        step that measured them read 1202 ms, against 310 ms with them cached), the report waits for the program's end."""
        from perflab.program.report import gpu_facts

        def take() -> None:
            self._facts = gpu_facts(recorder.data, self._context(), measure=False, modules=recorder.module_watch.modules)

        if not self.guard.call("perflab could not read its GPU's facts; the report is made after the program", take):
            self._deferred = True
        elif self._waits_for_peaks(recorder.data.device, self._facts["ceilings"]):
            self._deferred = True
            say(PEAKS_AFTER)

    def _context(self) -> RunContext:
        return RunContext(self.label, self.source.description, self.options, self.rank, self.run_id)

    def _start_report_job(self, recorder: Recorder) -> bool:
        """The report of the traced steps made in a process of its own (``program.report_job``) while the program runs
        on; False where it is made here (``_job_possible``, or where the job could not start)."""
        if not self._job_possible:
            return False
        from perflab.program import report_job
        from perflab.program.report import gpu_facts

        def start() -> bool:
            recorded = recorder.finish()
            context = self._context()
            facts = self._facts if self._facts is not None else gpu_facts(recorded, context)
            job = report_job.ReportJob(recorded, context, facts, self.report_path, render=self.render, page=self.page)
            self._job = report_job.start(job)
            self._job_recorded = recorded
            return self._job is not None

        return self.guard.call("perflab could not start its report's process; the report is made in the program's", start) and self._job is not None

    def _join_report_job(self) -> None:
        """The report's process awaited and its run.json read as this run's report; where it failed, the report is made
        here from the same figures (nothing measured is lost)."""
        job, self._job = self._job, None
        if job is None:
            return
        import subprocess

        try:
            code = job.wait(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            job.kill()
            code = f"killed after {WAIT_S:.0f} s"
        if code == 0:
            try:
                self.report = load_report(self.report_path)
                self.written = True
                return
            except Exception as exc:
                code = f"its run.json unreadable: {type(exc).__name__}: {exc}"
        if code not in (UNLOADABLE, FAILED):  # those said why themselves, or had nothing to say
            say(f"perflab: the report's own process failed (exit {code}); the report is made in the program's process")
        recorded = self._job_recorded
        if not self.guard.call(f"run.json could not be written to {self.options.out_dir}", lambda: self._write(recorded, False)):
            self.write_failed = True

    def _write_kept(self, recorder: Recorder, ended_early: bool, outcome=None, quiet: bool = False) -> None:
        """``_write`` of what the recorder measured; its failure (a full disk) is said after the program, which runs on."""
        if not self.guard.call(f"run.json could not be written to {self.options.out_dir}",
                               lambda: self._write(recorder.finish(), ended_early, outcome, quiet)):
            self.write_failed = True

    def _write(self, recorded: Recorded, ended_early: bool, outcome=None, quiet: bool = False) -> None:
        """The report of what was measured, written to run.json (under torchrun each rank's to its rank.json, and rank
        0's merged with the others' to run.json)."""
        from perflab.program import ranks

        context = self._context()
        # under torchrun, after the traced steps, every rank takes its DDP (or FSDP) layout and the all-reduce sweep here (the same
        # boundary on every rank: the sweep's collectives line up)
        # (the sweep's device is the recorder's, by the same rule: ranks._device)
        extra = ranks.rank_fields(self.rank.world_size) if self.rank.distributed and not ended_early else None
        # the facts taken a step earlier (_on_facts), the GPU's peaks measured now where they were missing
        report = build_run_report(recorded, context, partial=ended_early, outcome=outcome,
                                  notes=self._notes() if outcome is not None else None, rank_fields=extra, gpu=self._facts,
                                  measure_missing=True)
        if self._processes:
            report.processes = self._processes
        if self.rank.distributed:
            if quiet:  # the timed steps, kept in this rank's report until the whole one replaces it
                save(report, self.report_path)
            else:
                ranks.gather(report, self.options, self.rank, ended_early)
        self.report = report
        if self.rank.rank == 0 and not (quiet and self.rank.distributed):
            self._write_file(report, page=not quiet)
            if not ended_early and self.render is not None:
                try:
                    self.render(report.to_dict())
                except Exception as exc:  # the program closed stderr: the report is in run.json
                    self.guard.failed(f"the report could not be printed; it is in {Path(self.options.out_dir) / 'run.json'}", exc)
        self.written = True

    def _write_file(self, report: RunReport, page: bool = True) -> None:
        save(report, Path(self.options.out_dir) / "run.json")
        if page and self.page is not None:  # the run's page beside it; a failure to write it is one line after the program
            self.guard.call(f"report.html could not be written to {self.options.out_dir}", lambda: self.page(self.options.out_dir, report.to_dict()))

    @staticmethod
    def _how(outcome) -> str:
        if outcome.terminated:
            return "was terminated (SIGTERM)"
        return "was interrupted" if outcome.interrupted else ("raised an exception" if outcome.exception else f"exited with code {outcome.code}")

    def _early_line(self, recorder: Recorder, outcome, seconds: float) -> str:
        data = recorder.data
        seen = self.source.seen
        where = self.report_path if self.written else "nothing (run.json could not be written)"
        how = self._how(outcome)
        if not self.source.matched and data.phase != "done":
            return f"perflab: {self.source.never_matched()}; the program {how} after {seconds:.1f} s"
        o = self.options
        need = steps_needed(o)
        how = f"{how} after {seen} step(s)"
        timed = len(data.step_ms)
        measured = f"{timed} timed step(s)" + (", traced" if data.trace_path else "")
        traced = f" + 1 (perflab's own work) + --trace-warmup {o.trace_warmup} + --trace {o.trace}" if o.trace else " + --trace 0"
        return (f"perflab: the program {how} ({self.source.description}); --skip {o.skip} + --steps {o.steps}{traced} needs {need}: "
                f"{measured} written to {where}")


# a followed child's console report and page, named for it to import (it runs in another interpreter; program/ imports
# no report itself): the API's, which hands the process perflab started the same two
CHILD_HOOKS = {"render": "perflab.api:render_run_stderr", "page": "perflab.api:write_run_page_quietly"}


def start_child_session(config: dict, kind: str, rank: int | None, world: int | None, record: dict):
    """A followed child's own run (``program.children``): a recorder of its steps as ``perflab run`` gives the process it
    started; a spawned rank as torchrun's ranks are (``OUT/spawn/rankR``), any other process on its own (``OUT/procPID``)."""
    from perflab.program.children import SPAWN

    options = RunOptions(**{k: (tuple(v) if k == "inputs" else v) for k, v in config["options"].items() if k in RunOptions.__dataclass_fields__})
    out = Path(config["out_dir"])
    if kind == "spawned rank" and rank is not None:
        world = world or 1
        options = replace(options, out_dir=out / SPAWN)
        this = Rank(rank, world, rank)
        label = f"{config['program']} [rank {rank} of {world}, torch.multiprocessing.spawn]"
    else:
        options = replace(options, out_dir=out / f"proc{os.getpid()}")
        this = Rank(0, 1, 0)
        label = f"{config['program']} [process {os.getpid()}: {record['target']}]"
    hooks = config.get("hooks") or {}
    render = resolve_hook(hooks.get("render")) if config.get("render") and this.rank == 0 else None
    session = Run(None, options, step=config.get("step"), step_range=config.get("step_range"), render=render, rank=this,
                  label=label, run_id=config.get("run_id"), page=resolve_hook(hooks.get("page")))
    return session, session.start()


def abandon_inherited() -> None:
    """In a forked child: the recorder of the process it was forked from, copied with its memory, stops here (its hooks
    off, nothing written): this process records its own steps, if any."""
    if ACTIVE is not None and ACTIVE.guard.pid != os.getpid():
        ACTIVE.abandon()


def _json_options(options: RunOptions) -> dict:
    return {k: (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v) for k, v in asdict(options).items()}


def check_options(skip: int, steps: int, trace: int, step: str | None = None, step_range: str | None = None, trace_warmup: int = 3,
                  inflation_limit: float = 1.10, stall_factor: float = 1.5, inputs=(), batch_size: int | None = None,
                  seq_len: int | None = None) -> None:
    for name, value, least in (("--skip", skip, 0), ("--steps", steps, 1), ("--trace", trace, 0), ("--trace-warmup", trace_warmup, 0)):
        if value < least:
            raise PerflabError(f"{name} must be at least {least}, got {value}")
    if not (inflation_limit > 1.0 and inflation_limit < 100):
        raise PerflabError(f"--inflation-limit must be a ratio above 1 and below 100 (1.10: traced steps 10% longer), got {inflation_limit}")
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
