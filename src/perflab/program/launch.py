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
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "-m", "perflab", "run", *args, "--", *program]


def torchrun(nproc: int, program: list[str], options: RunOptions, step: str | None = None, step_range: str | None = None) -> int:
    """Run torchrun (``torch.distributed.run``, standalone: one host) and return its exit code (the ranks' output and
    rank 0's report pass through)."""
    if nproc < 1:
        raise PerflabError(f"--nproc must be at least 1, got {nproc}")
    return subprocess.call(torchrun_command(nproc, program, options, step, step_range))
