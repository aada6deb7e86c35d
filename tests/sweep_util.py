"""The sweep tests' shared pieces: polling a store and the workers of a sweep, and the one smoke sweep (killed with
SIGKILL part-way, then resumed) whose store several test modules read (the ``smoke_run`` session fixture in conftest.py)."""

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_util import ROOT, run_cli_here
from perflab.sweep.spec import read_experiment

SMOKE = ROOT / "experiments" / "smoke.yaml"


def stored_count(out: Path) -> int:
    path = out / "results.sqlite"
    if not path.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5) as conn:
            return conn.execute("SELECT COUNT(*) FROM results").fetchone()[0]
    except sqlite3.OperationalError:  # created but no schema yet
        return 0


def live_workers(out: Path) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if ("perflab.sweep.worker" in cmdline or "perflab.sweep.launcher" in cmdline) and str(out) in cmdline:
                pids.append(int(entry))
    return pids


def wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def killed_and_resumed_smoke(tmp_path_factory):
    """Start the smoke sweep, SIGKILL it once at least one row is stored, resume it; return what happened."""
    out = tmp_path_factory.mktemp("smoke") / "run"
    total = len(read_experiment(SMOKE).cases)
    # One thread per worker: on a busy 2-core machine, torch's spinning thread pools would slow every case
    # many times over. The test is about the machinery, not the timings.
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    with open(tmp_path_factory.mktemp("logs") / "killed.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "perflab", "sweep", str(SMOKE), "--out", str(out)],
                                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        try:
            wait_for(lambda: stored_count(out) >= 1 or proc.poll() is not None, 300, "the first stored row")
            assert proc.poll() is None, "the sweep ended before it could be killed"
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            proc.kill()
            proc.wait()
    stored_at_kill = stored_count(out)
    wait_for(lambda: not live_workers(out), 30, "the killed sweep's worker to die with it")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")
        mp.setenv("PERFLAB_PROGRESS_S", "0.5")  # its progress lines, read by test_sweep_resume
        resumed = run_cli_here("sweep", SMOKE, "--out", out, "--resume", "--workers", "2")
    return {"out": out, "total": total, "stored_at_kill": stored_at_kill, "resumed": resumed}
