"""``perflab run --nproc N``: the program under torchrun, every rank running ``python -m perflab run`` on it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from perflab.errors import PerflabError
from perflab.program.guard import say
from perflab.program.recorder import RunOptions

CPU_RANKS_PER_CORE = 1  # on the CPU (gloo), ranks beyond this many a core only slow each other: refused


def rank_limit() -> tuple[int, str]:
    """How many ranks this host can run one per device: its GPUs (torch's count), or on the CPU its cores × the cap."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus:
        return gpus, f"{gpus} GPU(s) visible"
    cores = os.cpu_count() or 1
    return cores * CPU_RANKS_PER_CORE, f"no GPU, {cores} CPU core(s) (at most {CPU_RANKS_PER_CORE} gloo rank a core)"


def check_rank_counts(counts: list[int], several: bool = False) -> None:
    """--nproc's counts, before anything is created or started: each at least 1 and at most the ranks this host runs,
    distinct, in the order the scaling is to be read (the first is the base)."""
    text = ",".join(map(str, counts))
    if not counts or any(n < 1 for n in counts):
        raise PerflabError(f"--nproc: give rank counts of at least 1 (2, or 1,2), got {text}")
    if several and len(set(counts)) != len(counts):
        raise PerflabError(f"--nproc: give distinct rank counts, e.g. 1,2 (got {text})")
    limit, why = rank_limit()
    if max(counts) > limit:
        raise PerflabError(f"--nproc {text}: this host runs at most {limit} rank(s) ({why}); one rank per GPU")


def torchrun_command(nproc: int, program: list[str], options: RunOptions, step: str | None = None, step_range: str | None = None) -> list[str]:
    args = ["--skip", str(options.skip), "--steps", str(options.steps), "--trace", str(options.trace), "--trace-warmup", str(options.trace_warmup),
            "--inflation-limit", str(options.inflation_limit), "--out", str(options.out_dir)]
    if not options.record_shapes:
        args.append("--no-shapes")
    if step:
        args += ["--step", step]
    if step_range is not None:
        args += ["--step-range", step_range]
    if options.stop_after:
        args.append("--stop-after")
    args += ["--stall-factor", str(options.stall_factor)]
    for spec in options.inputs:
        args += ["--input", spec]
    if options.batch_size:
        args += ["--batch-size", str(options.batch_size)]
    if options.seq_len:
        args += ["--seq-len", str(options.seq_len)]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "-m", "perflab", "run", *args, "--", *program]


def torchrun(nproc: int, program: list[str], options: RunOptions, step: str | None = None, step_range: str | None = None) -> int:
    """Run torchrun (``torch.distributed.run``, standalone: one host) and return its exit code. The ranks' output and
    rank 0's report pass through; torchrun's own traceback of a rank that failed does not: one line names each failed
    rank, its exit code and its last words (from its rank.json), instead."""
    check_rank_counts([nproc])
    from perflab.program.run import RUN_ID_ENV, new_run_id

    env = dict(os.environ, **{RUN_ID_ENV: new_run_id()})  # one id for every rank's report: a stale one is never merged
    process = subprocess.Popen(torchrun_command(nproc, program, options, step, step_range), env=env, stderr=subprocess.PIPE, text=True,
                               errors="replace", bufsize=1)
    try:
        held = _pass_stderr(process.stderr)
        code = process.wait()
    except BaseException:  # Ctrl-C (or an error) in this process alone: torchrun and its ranks must not run on without it
        _stop(process)
        raise
    if code:
        failed = _failed_ranks(options.out_dir, nproc, env[RUN_ID_ENV])
        if failed:
            for line in failed:
                say(line)
        elif held:  # torchrun failed before any rank said why: its own words, as it wrote them
            sys.stderr.write("".join(held))
    return code


def _stop(process: subprocess.Popen) -> None:
    """torchrun ended with this process: given a moment to end by itself (a Ctrl-C at a terminal reached it and its ranks
    too), then told as a Ctrl-C would tell it (it ends its ranks), then terminated, then killed."""
    for send, wait in ((None, 5.0), (signal.SIGINT, 20.0), (signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        if process.poll() is not None:
            return
        if send is not None:
            try:
                process.send_signal(send)
            except ProcessLookupError:
                return
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _pass_stderr(stream) -> list[str]:
    """Copy torchrun's stderr (the ranks' and its own) through, line by line, holding each traceback back until its
    exception line shows whose it is: a rank's (the program's: passed on whole) or torchrun's elastic agent's
    ``ChildFailedError``, which with the failure table after it ends torchrun's output and is returned, not printed."""
    held: list[str] = []
    block: list[str] | None = None
    for line in stream:
        if held:
            held.append(line)  # torchrun's failure table: the rest of its output
        elif block is not None:
            block.append(line)
            if not line.startswith((" ", "\t")):  # the exception line ends the frames
                if "ChildFailedError" in line:
                    held, block = block, None
                else:
                    sys.stderr.write("".join(block))
                    block = None
        elif line.startswith("Traceback (most recent call last):"):
            block = [line]
        else:
            sys.stderr.write(line)
    if block:
        sys.stderr.write("".join(block))
    return held


def _failed_ranks(out_dir, nproc: int, run_id: str) -> list[str]:
    """One line per rank of this run that ended with a non-zero exit code, from its own report (rankR/rank.json)."""
    from pathlib import Path

    from perflab.program.recorder import Rank, rank_dir
    from perflab.records.run_report import RANK_FILE, read

    lines = []
    for r in range(nproc):
        path = rank_dir(Path(out_dir), Rank(r, nproc)) / RANK_FILE
        try:
            report = read(path)
        except PerflabError as exc:  # a report of a format this perflab does not read
            lines.append(f"perflab: rank {r}: {exc}")
            continue
        if report is None:
            lines.append(f"perflab: rank {r} wrote no report for this run ({path}): it failed before perflab's end of it")
            continue
        if report.run_id != run_id:
            lines.append(f"perflab: rank {r} wrote no report for this run (the one in {path} is an earlier run's)")
            continue
        code = report.exit_code
        if code:
            last = report.last_words
            lines.append(f"perflab: rank {r} exited with code {code}" + (f": {last}" if last else "") + f" (its report: {path})")
    return lines


def torchrun_counts(counts: list[int], program: list[str], options: RunOptions, step: str | None = None, step_range: str | None = None,
                    render=None) -> int:
    """The program under torchrun at each rank count in turn (``OUT/nprocN/``), then the scaling over the first count
    (``analysis.program.scaling_section``), written to ``OUT/scaling.json`` and rendered. Returns the first non-zero exit
    code of the runs (0 when all ended well)."""
    from dataclasses import replace
    from pathlib import Path

    from perflab.analysis.program import scaling_section
    from perflab.program.guard import say
    from perflab.records.run_report import RUN_FILE, NewerFormat, UnreadableReport, load, write_json

    check_rank_counts(counts, several=True)
    out = Path(options.out_dir)
    codes, reports = [], {}
    for n in counts:
        say(f"perflab: running the program on {n} rank(s) (torchrun), into {out / f'nproc{n}'}")
        code = torchrun(n, program, replace(options, out_dir=out / f"nproc{n}"), step, step_range)
        codes.append(code)
        path = out / f"nproc{n}" / RUN_FILE
        if path.exists():
            try:
                reports[n] = load(path)
            except UnreadableReport:
                say(f"perflab: {path} could not be read; {n} rank(s) left out of the scaling")
            except NewerFormat as exc:
                say(f"perflab: {exc}; {n} rank(s) left out of the scaling")
    section = scaling_section(reports)
    write_json(out / "scaling.json", section)
    if render is not None:
        render(section)
    return next((c for c in codes if c), 0)
