"""``perflab run``'s report of the traced steps, made in a process of its own while the program runs on.

The report reads the trace back, analyses it, writes run.json and report.html and prints the console report: on a
CPU program 150 ms, on a GPU one a second or more, which made the program's step after the traced ones ×10 its
neighbours on the program's own clock (``docs/performance/run.md``). So the program's process does only what needs it
(the recorder's figures, and on a GPU its TF32 setting, its modules' bytes and the GPU's peaks: ``report.gpu_facts``),
writes them to ``OUT/.report-job.pickle`` and starts ``python -m perflab.program.report_job FILE``, at low priority,
one thread, stdin closed, stderr the program's; the run's end waits for it and reads its run.json.

Where the job cannot be made (a hook that cannot be pickled, a process that cannot be started) or fails, the report
is made in the program's process as before, and nothing is lost: the recorder's figures are still there. Ranks under
torchrun (their reports gather with collectives), followed children, ``--stop-after`` and an API caller's own
``render`` (whose effects the caller keeps: ``api.run`` passes ``report_process`` only for perflab's own console
report) keep the report in the program's process.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from perflab.program.recorder import Recorded
from perflab.program.report import RunContext

JOB_FILE = ".report-job.pickle"
UNLOADABLE, FAILED = 3, 4  # the job's exit codes where the program's process makes the report instead, having been told why
WAIT_S = 600.0  # the run's end waits this long for the job, then makes the report itself


@dataclass
class ReportJob:
    recorded: Recorded
    context: RunContext
    gpu: dict  # report.gpu_facts, taken in the program's process
    report_path: Path  # run.json
    render: Callable | None = None  # render(report dict): the console report (importable by name: pickled by reference)
    page: Callable | None = None  # page(out_dir, report dict): OUT/report.html


def job_env() -> dict:
    """The job's environment: the program's, less what would make the run's children follow it (``program.children``),
    with this perflab importable and one thread for numpy's and pandas' pools."""
    from perflab.program.children import CHILD_ENV, NPROCS_ENV, STARTUP_DIR

    env = {k: v for k, v in os.environ.items() if k not in (CHILD_ENV, NPROCS_ENV)}
    here = str(Path(__file__).resolve().parents[2])  # the folder holding the perflab package
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != STARTUP_DIR.resolve()]
    env["PYTHONPATH"] = os.pathsep.join([here, *paths])
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = "1"
    return env


def start(job: ReportJob) -> subprocess.Popen | None:
    """The job written beside run.json and its process started; None where either cannot be (the caller reports itself)."""
    try:
        data = pickle.dumps(job)
    except Exception:  # a render or page hook that is a closure or lambda: the report is made in the program's process
        return None
    path = job.report_path.parent / JOB_FILE
    try:
        path.write_bytes(data)
        return subprocess.Popen([sys.executable, "-m", "perflab.program.report_job", str(path)], env=job_env(), stdin=subprocess.DEVNULL,
                                close_fds=True)
    except OSError:
        path.unlink(missing_ok=True)
        return None


def main(argv: list[str]) -> int:
    from perflab.program.guard import say
    from perflab.program.report import build_run_report
    from perflab.records.run_report import save

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the program: the report of its traced steps is still made
    try:
        os.nice(10)  # the program's steps first
    except OSError:
        pass
    path = Path(argv[0])
    try:
        job: ReportJob = pickle.loads(path.read_bytes())
    except Exception:  # a hook this interpreter cannot import (the program's own module): the program's process reports
        return UNLOADABLE
    finally:
        path.unlink(missing_ok=True)
    try:
        report = build_run_report(job.recorded, job.context, partial=False, gpu=job.gpu)
        save(report, job.report_path)
        document = report.to_dict()
    except Exception as exc:
        say(f"perflab: the report of the traced steps failed in its own process ({type(exc).__name__}: {exc}); the program's "
            "process makes it")
        return FAILED
    if job.page is not None:
        try:
            job.page(job.context.options.out_dir, document)
        except Exception as exc:
            say(f"perflab: report.html could not be written to {job.context.options.out_dir} ({type(exc).__name__}: {exc})")
    if job.render is not None:
        try:
            job.render(document)
        except Exception as exc:  # the program closed stderr: the report is in run.json
            say(f"perflab: the report could not be printed ({type(exc).__name__}: {exc}); it is in {job.report_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
