"""Issue 27 on two GPUs: DDP and FSDP through NCCL, the all-reduce sweep, the merged per-rank traces.

Skips without two CUDA devices. Run on a two-GPU host: pytest -m gpu tests/gpu/test_parallel_gpu.py
"""

import os

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")]

SMALL = dict(model="gpt_small", workload="train_step", seq_len=128, batch_size=4, dtype="bf16", device="cuda", layers=2,
             warmup=3, min_time=0.2, repeats=5)


def _case(parallel):
    from perflab.spec import Case

    return Case(**SMALL, parallel=parallel, world_size=2)


def test_ddp_on_two_gpus(tmp_path):
    """A DDP row on two GPUs; with no cached all-reduce sweep (a scratch cache) its ranks measure one first and cache it,
    so the row has its communication floor."""
    import json

    from perflab.measure.parallel import run_parallel_case

    os.environ["PERFLAB_CACHE_DIR"] = str(tmp_path / "cache")
    try:
        row = run_parallel_case(_case("ddp"), gpus=[0, 1])
    finally:
        os.environ.pop("PERFLAB_CACHE_DIR")
    assert row["status"] == "ok", row.get("detail")
    assert row["all_reduce"]["source"].startswith("measured in this run") and row["busbw_gbps"] > 1.0
    assert row["comm_floor_ms"] == pytest.approx(row["comm_bus_bytes"] / (row["busbw_gbps"] * 1e9) * 1e3, rel=1e-9)
    (entry,) = json.loads((tmp_path / "cache" / "ceilings.json").read_text()).values()
    assert entry["all_reduce_2"]["sizes"] == row["all_reduce"]["sizes"]
    assert row["backend"] == "nccl" and row["ranks_agree"] is True and row["multicast_off"] is True
    assert row["median_ms"] == max(row["rank_median_ms"]) and 0 < row["scaling_efficiency"] < 1.5
    low, high = row["scaling_efficiency_ci95"]  # the one-GPU case interleaved with the ranks' step on rank 0's GPU
    assert row["single_gpu_timing"].startswith("interleaved") and low <= row["scaling_efficiency"] <= high
    for memory in row["rank_memory"]:
        assert memory["peak_alloc_mb"] > memory["params_mb"] + memory["grads_mb"] + memory["optimizer_mb"]
    assert os.environ.get("NCCL_NVLS_ENABLE") == "0"  # set in the launching process too


def test_fsdp_on_two_gpus_shards_the_parameters():
    from perflab.measure.parallel import run_parallel_case

    row = run_parallel_case(_case("fsdp"), gpus=[0, 1], single=False)
    assert row["status"] == "ok", row.get("detail")
    params = sum(m["params_mb"] for m in row["rank_memory"]) * 2**20
    assert params == pytest.approx(row["param_bytes"], rel=0.01)  # shards (dim 0 padded to a multiple of 2)


def test_all_reduce_sweep_on_two_gpus():
    from perflab.measure.ceilings import all_reduce_sweep

    sweep = all_reduce_sweep([0, 1], sizes=(2**20, 2**26), iters=10)
    big = sweep["sizes"][-1]
    assert big["busbw_gbps"] == pytest.approx(big["algbw_gbps"]) and big["busbw_gbps"] > 1.0


def test_profile_ddp_accounts_every_rank(tmp_path):
    from perflab import api

    result = api.profile_parallel(_case("ddp"), tmp_path, steps=3, gpus=[0, 1])
    assert result["row"]["status"] == "ok" and result["note"] is None, result["note"]
    assert len(result["accounts"]) == 2
    for a in result["accounts"]:
        assert a["compute_only_ns"] + a["comm_overlapped_ns"] + a["comm_exposed_ns"] + a["idle_ns"] == a["window_ns"]
        assert a["comm_ns"] > 0  # NCCL kernels found by name
        assert a["comm_exposed_waiting_ns"] + a["comm_exposed_transfer_ns"] == a["comm_exposed_ns"] and a["comm_exposed_waiting_ns"] >= 0
    assert len(result["waits_per_step"]) == 3


def test_explain_ddp_communication_floor_and_a_bucket_fix(tmp_path):
    """explain --parallel on two GPUs: the floor from ceilings' sweep (measured and cached in a scratch cache), NCCL time
    per rank against it, DDP's rebuilt buckets as ddp_buckets groups them, a bucket fix predicted then measured."""
    from perflab import api
    from perflab.analysis.comm import MIB, ddp_buckets

    os.environ["PERFLAB_CACHE_DIR"] = str(tmp_path / "cache")
    try:
        e = api.explain(_case("ddp:bucket_cap_mb=5"), out_dir=tmp_path / "traces", steps=3, gpus=[0, 1], fixes=["ddp:bucket_cap_mb=50"])
    finally:
        os.environ.pop("PERFLAB_CACHE_DIR")
    c, row = e.communication, e.row
    assert "perflab ceilings' all-reduce sweep of GPUs 0,1" in c["busbw_source"] and c["busbw_gbps"] > 1.0
    assert c["bus_bytes"] == row["grad_bytes"] and c["floor_ms"] > 0 and c["latency_us"] >= 0
    assert row["ddp_buckets"] == ddp_buckets(row["ready_grad_bytes"], 5 * MIB) and len(row["ddp_buckets"]) > 1
    for r in c["ranks"]:
        assert r["comm_ms"] > 0 and r["exposed_ms"] <= r["comm_ms"] and r["measured_over_floor"] > 0
    (fix,) = e.fix_results
    assert fix.measured_ms and fix.prediction.ms and fix.measured_exposed_ms is not None and fix.base_row["median_ms"] > 0
    assert e.step.glue_ms > 0 and e.step.optimizer_ms > 0  # the GPU traces' categories and passes


def test_a_compiled_ddp_step_says_what_compiling_did():
    """compile of the DDP-wrapped model: DDPOptimizer splits its graph at the buckets (gpt_small's 2 layers and its
    embeddings hold about 150 MB of fp32 gradients: several 25 MB buckets), and nothing compiles while timed."""
    from dataclasses import replace

    from perflab.measure.parallel import run_parallel_case

    row = run_parallel_case(replace(_case("ddp"), mode="compile"), gpus=[0, 1], single=False)
    assert row["status"] == "ok", row.get("detail")
    c = row["compile"]
    assert c["graphs"] >= 1 and c["backend_graphs"] >= 2 and c["frames_compiled_while_timed"] == 0
    assert sum(r["count"] for r in c["break_reasons"]) <= c["graph_breaks"]  # the commonest reasons (at most 3)


def test_your_own_lm_file_under_ddp_on_two_gpus_counts_its_flops():
    """A course LM file (no FLOP formula) under DDP through NCCL: the ranks agree and the row counts rank 0's step."""
    from pathlib import Path

    from perflab.measure.parallel import run_parallel_case
    from perflab.spec import Case

    course = Path(__file__).resolve().parents[1] / "data" / "models" / "course_lm.py"
    case = Case(model=f"{course}:small", model_args={"d_model": 256, "num_layers": 2, "num_heads": 4, "d_ff": 1024}, workload="train_step",
                seq_len=128, batch_size=4, dtype="bf16", device="cuda", warmup=3, min_time=0.2, repeats=5, parallel="ddp", world_size=2)
    row = run_parallel_case(case, gpus=[0, 1], single=False)
    assert row["status"] == "ok", row.get("detail")
    assert row["ranks_agree"] is True and row["flops_source"] == "counted" and row["gflops_per_batch"] > 0
    assert row["model_source"]["path"].endswith("course_lm.py")
