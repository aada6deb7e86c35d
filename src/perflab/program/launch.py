"""``perflab run --nproc N``: the program under torchrun, every rank running ``python -m perflab run`` on it."""

from __future__ import annotations

import subprocess
import sys

from perflab.errors import PerflabError
from perflab.program.recorder import RunOptions


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
    """Run torchrun (``torch.distributed.run``, standalone: one host) and return its exit code (the ranks' output and
    rank 0's report pass through)."""
    if nproc < 1:
        raise PerflabError(f"--nproc must be at least 1, got {nproc}")
    return subprocess.call(torchrun_command(nproc, program, options, step, step_range))


def torchrun_counts(counts: list[int], program: list[str], options: RunOptions, step: str | None = None, step_range: str | None = None,
                    render=None) -> int:
    """The program under torchrun at each rank count in turn (``OUT/nprocN/``), then the scaling over the first count
    (``analysis.program.scaling_section``), written to ``OUT/scaling.json`` and rendered. Returns the first non-zero exit
    code of the runs (0 when all ended well)."""
    import json
    from dataclasses import replace
    from pathlib import Path

    from perflab.analysis.program import scaling_section
    from perflab.program.guard import say
    from perflab.program.report import write_json

    if not counts or any(n < 1 for n in counts) or len(set(counts)) != len(counts):
        raise PerflabError(f"--nproc: give distinct rank counts of at least 1, e.g. 1,2 (got {','.join(map(str, counts))})")
    out = Path(options.out_dir)
    codes, reports = [], {}
    for n in counts:
        say(f"perflab: running the program on {n} rank(s) (torchrun), into {out / f'nproc{n}'}")
        code = torchrun(n, program, replace(options, out_dir=out / f"nproc{n}"), step, step_range)
        codes.append(code)
        path = out / f"nproc{n}" / "run.json"
        if path.exists():
            try:
                reports[n] = json.loads(path.read_text())
            except ValueError:
                say(f"perflab: {path} could not be read; {n} rank(s) left out of the scaling")
    section = scaling_section(reports)
    write_json(out / "scaling.json", section)
    if render is not None:
        render(section)
    return next((c for c in codes if c), 0)
