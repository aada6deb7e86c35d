"""The Ray engine on this machine: a two-node Ray cluster (ray.cluster_utils.Cluster), started once.

The head and a second node each have one CPU of their own, so CPU cases spread over both. Nodes are
added and killed (``remove_node(allow_graceful=False)``: the raylet and its workers are SIGKILLed) while
a sweep runs, from the sweep's own progress events, so nothing waits on fixed sleeps.
"""

import json
import os
import signal
import sqlite3
import subprocess
import sys

import pytest

ray = pytest.importorskip("ray")

from cli_util import ROOT, assert_one_line_error, run_cli_here  # noqa: E402
from perflab import api  # noqa: E402
from perflab.errors import PerflabError  # noqa: E402
from perflab.sweep import ray_engine, runner  # noqa: E402
from perflab.sweep.spec import read_experiment, parse_experiment  # noqa: E402
from perflab.sweep.store import Store  # noqa: E402
from sweep_util import SMOKE, live_workers, stored_count, wait_for  # noqa: E402

FAST = {"device": "cpu", "input_size": 32, "warmup": 1, "iters": 5, "repeats": 5}
SLOW = dict(FAST, model="test:slow", iters=10)  # about 0.5 s of 50 ms steps, after the worker's start
TIMING_KEYS = {"median_ms", "p10_ms", "p90_ms", "cv", "ci_ms", "ci95_ms", "latency_ms_per_batch", "latency_ms_per_sample",
               "throughput_per_s", "samples_ms", "timed_s", "flags", "warnings", "energy_j", "power_w", "mean_ms", "std_ms",
               "min_ms", "max_ms", "peak_mem_alloc_mb", "peak_mem_reserved_mb", "node_id", "node_host", "gpu_name", "reruns",
               "items_per_s", "tokens_per_s", "mfu", "mfu_datasheet", "mbu", "mbu_datasheet", "memory_breakdown_mb",
               "host_canary_us", "host_canary_ratio", "host_canary_before_us", "host_canary_after_us", "host_canary_min_us",
               "host_canary_cpu_frac", "host_cpu", "host_cpu_after", "host_wait_frac", "host_steal_frac", "host_issue_ms",
               "host_bound_frac", "host_exempt", "pinned_cpu", "first_step_s", "ci95_within_ms", "ci_level", "ci_units",
               "device_ms", "host_held_ms", "gpu_busy_frac", "host_bound_source", "cost_s", "memory_baseline_mb"}


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    os.environ.setdefault("OMP_NUM_THREADS", "1")  # one thread per worker on this 2-core machine
    # A killed node is declared dead after its health checks fail: every 0.5 s, 3 in a row (Ray's defaults, 3 s and 5,
    # kept the node-loss tests waiting about 15 s for each kill)
    health = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 500, "health_check_failure_threshold": 3}
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": health})
    c.add_node(num_cpus=1)
    ray.init(address=c.address, logging_level="ERROR", log_to_driver=False)
    yield c
    ray.shutdown()
    c.shutdown()


def _untimed(row):
    return {k: v for k, v in row.items() if k not in TIMING_KEYS and not k.startswith("achieved_")}


def node_ids():
    return {n["NodeID"] for n in ray.nodes() if n["Alive"]}


def _small_smoke(tmp_path):
    """The smoke spec at one input size and without its break-even cases: 4 cases, two per node (the full 14 took 76 s
    twice over; 8 took 21 s)."""
    import yaml

    spec = yaml.safe_load(SMOKE.read_text())
    spec["grid"]["input_size"] = [64]
    spec.pop("breakeven")
    path = tmp_path / "smoke8.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_smoke_sweep_on_ray_stores_each_case_once_with_the_local_rows(cluster, tmp_path, smoke_run):
    smoke = _small_smoke(tmp_path)
    total = len(read_experiment(smoke).cases)
    assert total == 4
    summary = api.sweep(smoke, tmp_path / "ray", engine="ray")
    assert (summary.total, summary.done, summary.skipped, summary.counts, summary.reruns) == (total, total, 0, {"ok": total}, 0)
    # The local engine's rows of the same cases: the session's smoke sweep (all 14 cases, resumed with --workers 2).
    ids = {c.id for c in read_experiment(smoke).cases}
    here = [r for r in api.results(smoke_run["out"]) if r["case_id"] in ids]
    assert len(here) == total and {r["status"] for r in here} == {"ok"}
    on_ray = api.results(tmp_path / "ray")
    assert len(on_ray) == len({r["case_id"] for r in on_ray}) == total
    assert {r["node_id"] for r in on_ray} == node_ids()  # both nodes ran cases
    assert {summary.env_key} == {r["env_key"] for r in here}  # one host: the same environment key as the local engine
    local_rows = {r["case_id"]: r for r in here}
    for row in on_ray:
        other = local_rows[row["case_id"]]
        assert _untimed(row) == _untimed(other)
        assert row["timed_iters"] == 30 and len(row["samples_ms"]) == 10 and row["reruns"] == 0
    with sqlite3.connect(str(tmp_path / "ray" / "results.sqlite")) as conn:
        workers = {w for (w,) in conn.execute("SELECT worker FROM results")}
        (record,) = conn.execute("SELECT outcome, n_done, env_key FROM sweeps").fetchall()
    assert len(workers) == 2 and record == ("complete", total, summary.env_key)
    assert sorted(p.name for p in (tmp_path / "ray" / "logs").iterdir()) == sorted(f"{r['case_id']}.log" for r in on_ray)


def test_a_worker_that_kills_itself_is_an_error_row_and_the_sweep_goes_on(cluster, tmp_path):
    spec = {"defaults": FAST, "harness": {"timeout_s": 30},
            "cases": [{"model": "test:crashes"}, {"model": "test:tiny"}, {"model": "test:hangs"}, {"model": "test:tiny", "batch_size": 2}]}
    summary = api.sweep(spec, tmp_path, engine="ray")
    assert summary.counts == {"error": 1, "ok": 2, "timeout": 1} and summary.done == 4
    rows = {(r["model"], r["batch_size"]): r for r in api.results(tmp_path)}
    assert len(rows) == 4
    crashed = rows[("test:crashes", 1)]
    assert "worker exited with status 134 without a result" in crashed["message"] and crashed["node_id"] in node_ids()
    assert "no result within the 30 s limit" in rows[("test:hangs", 1)]["message"]  # its process group killed on its node
    assert rows[("test:tiny", 2)]["status"] == "ok" and rows[("test:tiny", 2)]["throughput_per_s"] > 0
    wait_for(lambda: not _perflab_workers(), 20, "the killed hang's worker to be gone")


def test_a_node_lost_mid_case_reruns_it_elsewhere_then_gives_up_naming_the_node(cluster, tmp_path):
    doomed = cluster.add_node(num_cpus=1)
    doomed_id = doomed.node_id
    spec = {"defaults": SLOW, "grid": {"batch_size": [1, 2, 3, 4]}}

    def kill_on_first_start(kind, **info):
        if kind == "case_start" and info["slot"].endswith(doomed_id[:6]) and doomed_id in node_ids():
            cluster.remove_node(doomed, allow_graceful=False)

    summary = api.sweep(spec, tmp_path / "a", engine="ray", on_event=kill_on_first_start)
    # the GCS marks the killed node dead after its health checks fail, which can outlast the sweep
    wait_for(lambda: doomed_id not in node_ids(), 60, "the GCS to mark the killed node dead")
    rows = api.results(tmp_path / "a")
    assert len(rows) == len({r["case_id"] for r in rows}) == 4 and summary.counts == {"ok": 4}
    assert summary.reruns == 1  # the one case in flight on the lost node (it had one CPU)
    (rerun,) = [r for r in rows if r["reruns"]]
    assert rerun["reruns"] == 1 and rerun["node_id"] != doomed_id and {r["node_id"] for r in rows} <= node_ids()

    # With no reruns allowed, the lost node's case is an error row that names the node.
    doomed = cluster.add_node(num_cpus=1)
    doomed_id = doomed.node_id
    experiment = parse_experiment({"defaults": SLOW, "grid": {"batch_size": [1, 2, 3]}}, "x.yaml")
    summary = ray_engine.run_sweep_ray(experiment, tmp_path / "b", on_event=kill_on_first_start, node_retries=0)
    rows = api.results(tmp_path / "b")
    assert len(rows) == 3 and summary.counts == {"ok": 2, "error": 1} and summary.reruns == 0
    (lost,) = [r for r in rows if r["status"] == "error"]
    assert f"node {doomed_id[:12]} " in lost["message"] and "was lost while running the case; gave up after 0 rerun(s)" in lost["message"]
    assert lost["node_id"] == doomed_id


def test_a_killed_driver_resumes_to_every_case_exactly_once(cluster, tmp_path):
    spec = tmp_path / "slow.yaml"
    spec.write_text(json.dumps({"defaults": SLOW, "grid": {"batch_size": [1, 2, 3, 4]}}))
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), PYTHONWARNINGS="ignore")
    with open(tmp_path / "killed.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "perflab", "sweep", str(spec), "--out", str(out), "--engine", "ray",
                                 "--address", cluster.address], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        try:
            wait_for(lambda: stored_count(out) >= 1 or proc.poll() is not None, 120, "the first stored row")
            assert proc.poll() is None, (tmp_path / "killed.log").read_text()
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            proc.kill()
            proc.wait()
    at_kill = stored_count(out)
    assert 1 <= at_kill < 4
    wait_for(lambda: not _perflab_workers(), 30, "the killed driver's workers to die with it")  # Ray ends the job's tasks
    # Resumed in this process, already connected to the cluster (as a notebook would be): the engine joins it as it is.
    resumed = run_cli_here("sweep", spec, "--out", out, "--engine", "ray", "--address", cluster.address, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert f"4 cases: {4 - at_kill} run now ({4 - at_kill} ok), {at_kill} already stored" in resumed.stdout
    rows = api.results(out)
    assert sorted(r["batch_size"] for r in rows) == [1, 2, 3, 4] and all(r["status"] == "ok" for r in rows)
    with Store.open(out) as store:
        assert [(s["outcome"], s["n_skipped"], s["n_done"]) for s in store.sweeps()] == [("killed", 0, at_kill), ("complete", at_kill, 4 - at_kill)]
    again = run_cli_here("sweep", spec, "--out", out, "--engine", "ray", "--address", cluster.address)
    assert_one_line_error(again, "already holds 4 stored result(s); pass --resume")


def _perflab_workers() -> list[int]:
    return live_workers("perflab-case-")  # the Ray task's working directory is in the worker's --result path


# ---------------------------------------------------------------------------------------------------
# Placement on GPU types, and bad input (no cluster needed)


def _node(node_id, host, types, gpu_names):
    envs = [dict(host=host, cpu="x86_64", gpus=[g], driver="570", torch="2.13", cuda="12.8", perflab="0.1.0", gpu_name=g)
            for g in gpu_names]
    return ray_engine.Node(node_id, host, types, envs)


NODES = [_node("a" * 56, "h100-1", ["H100"], ["NVIDIA H100 80GB HBM3"]), _node("b" * 56, "h100-2", ["H100"], ["NVIDIA H100 80GB HBM3"]),
         _node("c" * 56, "h200-1", ["H200"], ["NVIDIA H200"])]


def test_units_pin_cases_to_gpu_types_or_run_them_on_every_type_with_the_same_case_id():
    cuda = {"device": "cuda", "model": "test:tiny"}
    pinned = parse_experiment({"defaults": cuda, "grid": {"batch_size": [1, 2], "gpu": ["H100", "H200"]}, "cases": [{"batch_size": 4}]}, "x.yaml")
    units = ray_engine.plan_units(pinned, NODES)
    assert [(u.case.batch_size, u.gpu, u.accelerator_type) for u in units] == [
        (1, "H100", "H100"), (1, "H200", "H200"), (2, "H100", "H100"), (2, "H200", "H200"), (4, None, None)]
    assert units[0].case.id == units[1].case.id and units[0].log_name != units[1].log_name
    across = parse_experiment({"defaults": cuda, "grid": {"batch_size": [1, 2]}, "across_gpus": True}, "x.yaml")
    assert [(u.case.batch_size, u.gpu) for u in ray_engine.plan_units(across, NODES)] == [(1, "H100"), (1, "H200"), (2, "H100"), (2, "H200")]
    assert [c.id for c in across.cases] == [c.id for c in parse_experiment({"defaults": cuda, "grid": {"batch_size": [1, 2]}}, "x.yaml").cases]
    # Done per GPU type: a row under either H100 host's key covers the H100 unit, not the H200 one.
    key = {n.host: runner.environment_key(n.envs[0]) for n in NODES}
    stored = {(units[0].case.id, key["h100-2"]): "ok"}
    assert ray_engine._done(units[0], NODES, stored, False) and not ray_engine._done(units[1], NODES, stored, False)
    assert ray_engine._done(units[4], NODES, {(units[4].case.id, key["h200-1"]): "ok"}, False)
    assert not ray_engine._done(units[0], NODES, {(units[0].case.id, key["h100-1"]): "error"}, True)  # --retry-failed
    with pytest.raises(PerflabError, match=r"gpu: A100: no node of this Ray cluster has that GPU type \(present: H100, H200\)"):
        ray_engine.plan_units(parse_experiment({"defaults": dict(cuda, gpu="A100"), "cases": [{}]}, "x.yaml"), NODES)
    assert ray_engine.gpu_matches("NVIDIA GeForce RTX 4090", "RTX 4090") and not ray_engine.gpu_matches("NVIDIA H100 80GB HBM3", "H10")


def test_bad_engine_options_and_missing_ray_are_one_line_errors(tmp_path, monkeypatch):
    spec = tmp_path / "s.yaml"
    spec.write_text(json.dumps({"defaults": FAST, "cases": [{"model": "test:tiny"}]}))
    assert_one_line_error(run_cli_here("sweep", spec, "--out", tmp_path / "a", "--engine", "slurm"), "--engine: expected local or ray, got 'slurm'")
    assert_one_line_error(run_cli_here("sweep", spec, "--out", tmp_path / "a", "--address", "auto"), "--address joins a Ray cluster; give --engine ray")
    assert_one_line_error(run_cli_here("sweep", spec, "--out", tmp_path / "a", "--engine", "ray", "--workers", "2"), "--workers is for --engine local")
    pinned = tmp_path / "p.yaml"
    pinned.write_text(json.dumps({"defaults": dict(FAST, device="cuda", model="test:tiny", gpu="H100"), "cases": [{}]}))
    assert_one_line_error(run_cli_here("sweep", pinned, "--out", tmp_path / "a"), "place cases on a cluster's GPU types; run it with --engine ray")
    # Ray not installed: hidden from the import system (an import of a module mapped to None raises ImportError).
    monkeypatch.setitem(sys.modules, "ray", None)
    r = run_cli_here("sweep", spec, "--out", tmp_path / "b", "--engine", "ray")
    assert_one_line_error(r, "perflab: error: --engine ray needs Ray: pip install 'perflab[ray]'")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_report_has_a_cross_gpu_table_and_results_name_node_and_gpu(tmp_path):
    from perflab.sweep.store import load_stored

    experiment = parse_experiment({"defaults": {"device": "cuda", "model": "test:tiny"}, "grid": {"batch_size": [1, 2]},
                                   "across_gpus": True}, "x.yaml")
    envs = {n.host: n.envs[0] for n in NODES}
    keys = {h: runner.environment_key(e) for h, e in envs.items()}
    with Store.create(tmp_path) as store:
        for host, env in envs.items():
            store.put_environment(keys[host], env)
        store.begin_sweep(command="perflab sweep x.yaml --engine ray", spec_source="x.yaml", spec_text="", experiment=experiment.to_json(),
                          env_key=",".join(keys.values()), n_cases=4, n_skipped=0)
        for case, tps in zip(experiment.cases, ({"h100-1": 100.0, "h200-1": 150.0}, {"h100-2": 180.0, "h200-1": 198.0})):
            for host, tp in tps.items():
                row = {"case_id": case.id, "case": case.to_dict(), "status": "ok", "model": case.model, "input_size": 224,
                       "batch_size": case.batch_size, "dtype": "fp32", "mode": "eager", "throughput_per_s": tp, "median_ms": 1.0, "ci95_ms": [0.9, 1.1],
                       "node_id": host * 8, "node_host": host, "gpu_name": envs[host]["gpu_name"], "env": envs[host]}
                store.put(row, keys[host])
    stored = load_stored(tmp_path)
    # The main tables show one GPU type (that of the key with most rows); the cross-GPU table shows every row.
    assert [r["node_host"] for r in stored.rows] == ["h200-1", "h200-1"] and sorted(stored.other_env_keys) == sorted([keys["h100-1"], keys["h100-2"]])
    assert len(stored.all_rows) == 4
    text = api.report(tmp_path, n_boot=100).read_text()
    assert "## Across GPU types" in text
    assert "| test:tiny 224px bs1 fp32 eager | 100.00 | 150.00 | 1.500× |" in text
    assert "| test:tiny 224px bs2 fp32 eager | 180.00 | 198.00 | 1.100× |" in text
    table = run_cli_here("results", tmp_path, "--wide")  # whole: at 100 columns one node's column is said once, under the table
    assert table.returncode == 0, table.stderr
    assert "node" in table.stdout and "GPU" in table.stdout and table.stdout.count("h200-1:h200-1") == 2


def test_a_spec_naming_its_own_model_file_runs_on_ray_workers_from_the_spec_directory(cluster, tmp_path, monkeypatch):
    from test_own_model import _spec_dir

    spec = _spec_dir(tmp_path)
    monkeypatch.chdir(tmp_path)  # not the spec's directory: the reference is the spec's, shipped as Ray's working_dir
    summary = api.sweep(spec / "own.yaml", tmp_path / "out", engine="ray")
    rows = api.results(tmp_path / "out")
    assert summary.counts == {"ok": 2, "error": 1}, [r.get("message") for r in rows]
    ok = [r for r in rows if r["status"] == "ok"]
    assert {r["model"] for r in ok} == {"models/mylm.py:small"} and {r["family"] for r in ok} == {"lm"}
    (failed,) = [r for r in rows if r["status"] == "error"]
    assert "ZeroDivisionError" in failed["message"] and failed["model"] == "models/flaky.py:Net"
