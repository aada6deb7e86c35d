"""Faults cost one cell, not the sweep: OOM, a crashed worker, a hang past the time limit, a failure."""

import os
import sqlite3

import pytest

from perflab import api
from perflab.errors import PerflabError
from perflab.sweep import runner
from perflab.sweep.lifecycle import one_sweep_at_a_time
from perflab.sweep.spec import parse_experiment
from perflab.sweep.store import Store

FAST = {"device": "cpu", "input_size": 32, "warmup": 1, "iters": 5, "repeats": 5}


def test_planted_faults_become_rows_and_the_other_cases_finish(tmp_path, monkeypatch):
    spec = {
        "defaults": FAST,
        "harness": {"timeout_s": 12},  # generous for a slow CI machine; only test:hangs reaches it
        "cases": [{"model": "test:hangs"}, {"model": "test:tiny"}, {"model": "test:oom"}, {"model": "test:tiny", "batch_size": 3},
                  {"model": "test:crashes"}, {"model": "test:fails"}, {"model": "test:tiny", "batch_size": 2}],
    }
    # Issue 39: a row SQLite refuses (here an integer past 64 bits, planted in the bs3 case's row as the parent reads
    # it) is stored as an error row saying why, and the cases after it still run.
    finished = runner._finished_row

    def planted(job, env, timeout_s):
        row = finished(job, env, timeout_s)
        if row is not None and job.case.batch_size == 3:
            row["batch_size"] = row["case"]["batch_size"] = 10 ** 26
        return row

    monkeypatch.setattr(runner, "_finished_row", planted)
    # Three workers side by side, as GPUs would be: the hang sleeps in one while the others share the cores.
    summary = api.sweep(spec, tmp_path, workers=3)
    assert summary.counts == {"ok": 2, "oom": 1, "error": 3, "timeout": 1}
    assert summary.done == 7 and not summary.interrupted
    rows = {(r["model"], r["batch_size"]): r for r in api.results(tmp_path)}
    assert len(rows) == 7
    unstorable = rows.pop(("test:tiny", None))
    assert unstorable["status"] == "error" and unstorable["case"]["batch_size"] is None and unstorable["median_ms"] > 0  # what was measured is kept
    assert unstorable["message"] == ("this row could not be stored as measured (OverflowError: Python int too large to convert to SQLite "
                                     "INTEGER); case.batch_size, batch_size stored as null; it was ok")
    with Store.open(tmp_path) as store:  # complete; --resume has nothing left to run, --retry-failed runs it again
        env_key = store.env_keys()[0]
        assert store.sweeps()[-1]["outcome"] == "complete"
        todo = runner._cases_to_run(parse_experiment(spec, "x.yaml"), store, env_key, tmp_path, True, True)
        assert [(c.model, c.batch_size) for c in todo] == [("test:hangs", 1), ("test:tiny", 3), ("test:crashes", 1), ("test:fails", 1)]
        assert runner._cases_to_run(parse_experiment(spec, "x.yaml"), store, env_key, tmp_path, True, False) == []
    assert rows[("test:oom", 1)]["status"] == "oom" and "out of memory" in rows[("test:oom", 1)]["message"]
    crashed = rows[("test:crashes", 1)]
    assert crashed["status"] == "error" and "worker exited with status 134 without a result" in crashed["message"]
    hung = rows[("test:hangs", 1)]
    assert hung["status"] == "timeout" and "no result within the 12 s limit" in hung["message"]
    assert rows[("test:fails", 1)]["status"] == "error" and "planted failure" in rows[("test:fails", 1)]["message"]
    for bs in (1, 2):
        ok = rows[("test:tiny", bs)]
        assert ok["status"] == "ok" and ok["batch_size"] == bs and ok["throughput_per_s"] > 0 and len(ok["samples_ms"]) == 5
    for row in rows.values():  # failed rows carry the same keys as measured ones
        assert {"case_id", "case", "status", "message", "median_ms", "flags", "env"} <= set(row)
    with sqlite3.connect(str(tmp_path / "results.sqlite")) as conn:
        workers = {w for (w,) in conn.execute("SELECT worker FROM results")}
    assert workers == {"w0", "w1", "w2"}
    assert not (tmp_path / "tmp").exists()  # no result files left behind
    assert "stage: timing" in (tmp_path / "logs" / f"{rows[('test:tiny', 1)]['case_id']}.log").read_text()  # the worker's log
    assert not _live_workers(tmp_path)
    # What a case costs (P9): the worker's wall time split by stage, adding up to its total
    cost = rows[("test:tiny", 1)]["cost_s"]
    assert {"start_and_imports", "build", "check", "flops", "warmup", "timed", "total"} <= set(cost)
    assert cost["total"] == pytest.approx(sum(v for k, v in cost.items() if k != "total"))
    assert all(v >= 0 for v in cost.values()) and cost["start_and_imports"] > 0  # a fork of the launcher (torch imported once per sweep)
    from perflab.report.markdown import cost_section

    section = "\n".join(cost_section(api.results(tmp_path)))
    assert section.startswith("## What a case costs") and "cases per minute" in section and "| timed |" in section


def test_resume_skips_stored_cases_per_environment_and_retry_failed_reruns_errors(tmp_path):
    experiment = parse_experiment({"defaults": dict(FAST, model="test:tiny"), "grid": {"batch_size": [1, 2]}}, "x.yaml")
    one, two = experiment.cases
    env_key = runner.environment_key(runner.probe_environment(experiment))
    with Store.create(tmp_path) as store:
        store.put({"case_id": one.id, "status": "error", "model": "test:tiny", "message": "earlier crash"}, env_key)
        store.put({"case_id": two.id, "status": "ok", "model": "test:tiny"}, "another-machine")
    with pytest.raises(PerflabError, match="already holds 2 stored result"):
        api.sweep(experiment, tmp_path)  # without --resume nothing stored is touched
    summary = api.sweep(experiment, tmp_path, resume=True)
    assert (summary.skipped, summary.done) == (1, 1)  # case two ran: its row was from another environment
    summary = api.sweep(experiment, tmp_path, resume=True, retry_failed=True)
    assert (summary.skipped, summary.done, summary.counts) == (1, 1, {"ok": 1})
    rows = api.results(tmp_path, env_key)
    assert sorted((r["case_id"], r["status"]) for r in rows) == sorted([(one.id, "ok"), (two.id, "ok")])
    assert len(api.results(tmp_path)) == 3


def test_worker_environment_pins_one_gpu_per_worker():
    env = runner.slot_env("gpu3", 2)
    assert env["CUDA_VISIBLE_DEVICES"] == "3" and env["CUDA_DEVICE_ORDER"] in ("PCI_BUS_ID", os.environ.get("CUDA_DEVICE_ORDER"))
    assert env["PYTHONPATH"].split(os.pathsep)[0].endswith("src")
    cpu = runner.slot_env("w1", 2)
    assert "CUDA_VISIBLE_DEVICES" not in cpu or cpu["CUDA_VISIBLE_DEVICES"] == os.environ.get("CUDA_VISIBLE_DEVICES")
    assert cpu["OMP_NUM_THREADS"] == os.environ.get("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // 2)))


def test_gpus_are_refused_for_cpu_cases_and_bad_worker_counts(tmp_path):
    experiment = parse_experiment({"defaults": FAST, "cases": [{"model": "test:tiny"}]}, "x.yaml")
    with pytest.raises(PerflabError, match="--gpus: the spec's cases run on the CPU"):
        api.sweep(experiment, tmp_path / "a", gpus=[0, 1])
    with pytest.raises(PerflabError, match="--workers must be at least 1"):
        api.sweep(experiment, tmp_path / "b", workers=0)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def _live_workers(out_dir) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = open(f"/proc/{entry}/cmdline", "rb").read().decode(errors="replace")
            except OSError:
                continue
            if ("perflab.sweep.worker" in cmdline or "perflab.sweep.launcher" in cmdline) and str(out_dir) in cmdline:
                pids.append(int(entry))
    return pids


def test_gpu_slots_follow_the_parents_visible_devices(monkeypatch):
    experiment = parse_experiment({"defaults": {"device": "cuda", "model": "test:tiny"}, "grid": {"batch_size": [1, 2]}}, "x.yaml")
    monkeypatch.setattr(runner, "_require_cuda", lambda e: None)  # this machine has no GPU: pretend two H200s
    monkeypatch.setattr(runner, "gpu_inventory", lambda: (["NVIDIA H200", "NVIDIA H200"], "570.86"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert runner.worker_slots(experiment, [0, 1], 1) == ["gpu0", "gpu1"]
    with pytest.raises(PerflabError, match=r"--gpus: GPU 2 does not exist here \(2 visible: 0..1\)"):
        runner.worker_slots(experiment, [0, 2], 1)
    with pytest.raises(PerflabError, match="for CUDA cases give --gpus"):
        runner.worker_slots(experiment, None, 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert runner.worker_slots(experiment, [0], 1) == ["gpu1"]  # --gpus counts within the parent's visible GPUs
    env = runner.probe_environment(experiment, ["0", "1"])
    assert env["gpus"] == ["NVIDIA H200", "NVIDIA H200"] and env["driver"] == "570.86" and env["gpu_name"] == "NVIDIA H200"
    cpu_env = runner.probe_environment(parse_experiment({"defaults": FAST, "cases": [{"model": "test:tiny"}]}, "x.yaml"))
    assert runner.environment_key(env) != runner.environment_key(cpu_env)
    assert runner.environment_key(env) == runner.environment_key(runner.probe_environment(experiment, ["1"]))  # same GPU model


def test_a_second_sweep_into_the_same_directory_is_refused_while_one_runs(tmp_path):
    experiment = parse_experiment({"defaults": FAST, "cases": [{"model": "test:tiny"}]}, "x.yaml")
    with one_sweep_at_a_time(tmp_path):
        with pytest.raises(PerflabError, match=rf"another sweep \(pid {os.getpid()} on .*\) is writing here"):
            api.sweep(experiment, tmp_path, resume=True)
    assert not (tmp_path / "results.sqlite").exists()

