"""`perflab sweep experiments/smoke.yaml` killed with SIGKILL part-way, then resumed: every case once, all ok.

The killed sweep's store is polled (no fixed sleeps), so this holds on a slow 2-core machine too. The sweep runs once
per session (``smoke_run``, conftest.py); its directory then feeds the report and break-even CLI checks on real
measurements, and the Ray engine's tests compare their rows with it.
"""

import json
import shutil
import sqlite3

import pytest

from cli_util import assert_progress_lines, run_cli_here
from perflab.sweep.spec import read_experiment
from sweep_util import SMOKE

BENCH_KEYS = {  # what `perflab bench --format json` prints for every case (docs/reference.md, "Output fields")
    "case", "case_id", "status", "message", "model", "method", "keep_rate", "reduction_loc", "tokens", "input_size",
    "batch_size", "dtype", "mode", "device_name", "median_ms", "p10_ms", "p90_ms", "cv", "ci95_ms", "latency_ms_per_batch",
    "latency_ms_per_sample", "throughput_per_s", "gflops", "gmacs", "params_m", "peak_mem_alloc_mb", "peak_mem_reserved_mb",
    "energy_j", "power_w", "host_canary_us", "flags", "warnings", "env", "samples_ms",
}


def test_killed_sweep_resumes_to_every_case_exactly_once(smoke_run):
    out, total, at_kill, resumed = smoke_run["out"], smoke_run["total"], smoke_run["stored_at_kill"], smoke_run["resumed"]
    assert 1 <= at_kill < total
    assert resumed.returncode == 0, resumed.stderr
    assert f"{total} cases: {total - at_kill} run now ({total - at_kill} ok), {at_kill} already stored" in resumed.stdout
    # stderr a pipe: what resumes, then a line every PERFLAB_PROGRESS_S (sweep_util's 0.5 s) with the cases each worker runs
    assert f"resuming: {at_kill} of {total} cases already stored" in resumed.stderr
    lines = assert_progress_lines(resumed.stderr, "sweep", total - at_kill, "cases")
    assert any(" left: w0: " in line or " left: w1: " in line for line in lines), lines
    r = run_cli_here("results", out, "--format", "json")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    ids = [row["case_id"] for row in rows]
    assert len(ids) == total and set(ids) == {c.id for c in read_experiment(SMOKE).cases}
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
    # the killed sweep never recorded its end; the resumed one, holding the store's lock, recorded it as killed with its rows
    assert sweeps == [("killed", 0, at_kill), ("complete", at_kill, total - at_kill)]


def test_report_from_the_resumed_sweep(smoke_run):
    out = smoke_run["out"]
    r = run_cli_here("report", out, "--bootstrap", "200")
    assert r.returncode == 0, r.stderr
    text = (out / "report.md").read_text()
    rows = {(row["model"], row["input_size"], row["batch_size"]): row for row in
            (json.loads(line) for line in run_cli_here("results", out, "--format", "json").stdout.splitlines())}
    for size in (64, 96, 128):
        assert f"#### Batch size sweep (input size {size})" in text
    base, tr = rows[("deit_tiny_patch16_224", 96, 2)], rows[("topk_deit_tiny_patch16_224", 96, 2)]
    speedup = tr["throughput_per_s"] / base["throughput_per_s"]
    # a sweep times each case in its own process: the speedup is not paired, and says so instead of giving a CI
    assert f"| 2 | {base['throughput_per_s']:.2f} [" in text and f"| {speedup:.3f}× (unpaired) |" in text
    assert "## Break-even" in text and "### top-k vs baseline, bs 1" in text
    assert f"killed; {smoke_run['stored_at_kill']} case(s) run, 0 already stored" in text and "--resume --workers 2" in text
    assert "| Host µs (Baseline / TR) | Flags |" in text and "\"Host µs\" is its median µs per run" in text
    for name in [line.split("](")[1].rstrip(")") for line in text.split() if "](" in line and line.endswith(".png)")]:
        assert (out / name).is_file()


def test_breakeven_cli_reuses_the_stored_cases(smoke_run, tmp_path):
    out = tmp_path / "breakeven"
    shutil.copytree(smoke_run["out"], out)
    r = run_cli_here("breakeven", "--model", "deit_tiny_patch16_224", "--variant", "topk_deit_tiny_patch16_224", "--keep-rate", "0.5",
                "--reduction-loc", "3", "6", "9", "--input-sizes", "64:160:32", "--batch-size", "1", "--device", "cpu",
                "--warmup", "2", "--iters", "30", "--repeats", "10", "--out", out, "--resume", "--bootstrap", "200")
    assert r.returncode == 0, r.stderr
    assert "8 cases: 0 run now (nothing run), 8 already stored" in r.stdout  # same cases, same environment: no rerun
    assert "topk_deit_tiny_patch16_224 vs deit_tiny_patch16_224" in r.stdout
    assert ("the variant is faster" in r.stdout) or ("no crossover in 17–101 tokens" in r.stdout)
    text = (out / "report.md").read_text()
    assert "## Break-even" in text and "| Input size | Tokens |" in text
    assert list(out.glob("breakeven_0_*.png"))
