"""`perflab sweep experiments/smoke.yaml` killed with SIGKILL part-way, then resumed: every case once, all ok.

The killed sweep's store is polled (no fixed sleeps), so this holds on a slow 2-core machine too. The
resulting directory then feeds the report and break-even CLI checks on real measurements.
"""

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_util import ROOT, run_cli
from perflab.sweep.spec import load_experiment

SMOKE = ROOT / "experiments" / "smoke.yaml"
BENCH_KEYS = {  # what `perflab bench --format json` prints for every case (README, "Output fields")
    "case", "case_id", "status", "message", "model", "method", "keep_rate", "reduction_loc", "tokens", "input_size",
    "batch_size", "dtype", "mode", "device_name", "median_ms", "p10_ms", "p90_ms", "cv", "ci95_ms", "latency_ms_per_batch",
    "latency_ms_per_sample", "throughput_per_s", "gflops", "gmacs", "params_m", "peak_mem_alloc_mb", "peak_mem_reserved_mb",
    "energy_j", "power_w", "host_canary_us", "flags", "warnings", "env", "samples_ms",
}


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
            if "perflab.sweep.worker" in cmdline and str(out) in cmdline:
                pids.append(int(entry))
    return pids


def wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """Start the smoke sweep, SIGKILL it once at least one row is stored, resume it; return what happened."""
    out = tmp_path_factory.mktemp("smoke") / "run"
    total = len(load_experiment(SMOKE).cases)
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
        resumed = run_cli("sweep", SMOKE, "--out", out, "--resume", "--workers", "2", timeout=600)
    return {"out": out, "total": total, "stored_at_kill": stored_at_kill, "resumed": resumed}


def test_killed_sweep_resumes_to_every_case_exactly_once(smoke_run):
    out, total, at_kill, resumed = smoke_run["out"], smoke_run["total"], smoke_run["stored_at_kill"], smoke_run["resumed"]
    assert 1 <= at_kill < total
    assert resumed.returncode == 0, resumed.stderr
    assert f"{total} cases: {total - at_kill} run now ({total - at_kill} ok), {at_kill} already stored" in resumed.stdout
    r = run_cli("results", out, "--format", "json")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    ids = [row["case_id"] for row in rows]
    assert len(ids) == total and set(ids) == {c.id for c in load_experiment(SMOKE).cases}
    assert all(row["status"] == "ok" for row in rows), [(row["model"], row["status"], row["message"]) for row in rows]
    for row in rows:
        assert BENCH_KEYS <= set(row), BENCH_KEYS - set(row)
        assert row["throughput_per_s"] == pytest.approx(row["batch_size"] * 1000.0 / row["median_ms"])
        assert row["timed_iters"] == 30 and len(row["samples_ms"]) == 10  # the spec's harness policy
        assert row["host_canary_us"] > 0 and row["host_canary_ratio"] > 0  # killed or resumed, one environment, one median
    with sqlite3.connect(str(out / "results.sqlite")) as conn:
        sweeps = conn.execute("SELECT outcome, n_skipped, n_done FROM sweeps ORDER BY id").fetchall()
        stored = [json.loads(r[0]) for r in conn.execute("SELECT row_json FROM results")]
    assert not any("host_drift" in r["flags"] or "host_canary_ratio" in r for r in stored)  # derived when read, never stored
    assert sweeps == [(None, 0, 0), ("complete", at_kill, total - at_kill)]  # the killed sweep never finished


def test_report_from_the_resumed_sweep(smoke_run):
    out = smoke_run["out"]
    r = run_cli("report", out, "--bootstrap", "200")
    assert r.returncode == 0, r.stderr
    text = (out / "report.md").read_text()
    rows = {(row["model"], row["input_size"], row["batch_size"]): row for row in
            (json.loads(line) for line in run_cli("results", out, "--format", "json").stdout.splitlines())}
    for size in (64, 96, 128):
        assert f"#### Batch size sweep (input size {size})" in text
    base, tr = rows[("deit_tiny_patch16_224", 96, 2)], rows[("topk_deit_tiny_patch16_224", 96, 2)]
    speedup = tr["throughput_per_s"] / base["throughput_per_s"]
    assert f"| 2 | {base['throughput_per_s']:.2f} [" in text and f"| {speedup:.3f}× [" in text
    assert "## Break-even" in text and "### top-k vs baseline, bs 1" in text
    assert "did not finish (killed?)" in text and "--resume --workers 2" in text
    assert "| Host µs (Baseline / TR) | Flags |" in text and "\"Host µs\" is its median µs per run" in text
    for name in [line.split("](")[1].rstrip(")") for line in text.split() if "](" in line and line.endswith(".png)")]:
        assert (out / name).is_file()


def test_breakeven_cli_reuses_the_stored_cases(smoke_run, tmp_path):
    out = tmp_path / "breakeven"
    shutil.copytree(smoke_run["out"], out)
    r = run_cli("breakeven", "--model", "deit_tiny_patch16_224", "--variant", "topk_deit_tiny_patch16_224", "--keep-rate", "0.5",
                "--reduction-loc", "3", "6", "9", "--input-sizes", "64:160:32", "--batch-size", "1", "--device", "cpu",
                "--warmup", "2", "--iters", "30", "--repeats", "10", "--out", out, "--resume", "--bootstrap", "200")
    assert r.returncode == 0, r.stderr
    assert "8 cases: 0 run now (nothing run), 8 already stored" in r.stdout  # same cases, same environment: no rerun
    assert "topk_deit_tiny_patch16_224 vs deit_tiny_patch16_224" in r.stdout
    assert ("the variant is faster" in r.stdout) or ("no crossover in 17–101 tokens" in r.stdout)
    text = (out / "report.md").read_text()
    assert "## Break-even" in text and "| Input size | Tokens |" in text
    assert list(out.glob("breakeven_0_*.png"))
