"""The harness on a real GPU: modes agree, energy and memory are read, weights are cast once."""

import pytest
import torch

from perflab.measure.harness import run_case
from perflab.models.registry import build_model
from perflab.workloads.base import image_batch
from perflab.runtime.modes import make_step
from perflab.runtime.workload import build
from perflab.runtime.workload import precision
from perflab.spec import Case, validate_case

TOPK = dict(keep_rate=(0.1,), reduction_loc=(3, 6, 9))


@pytest.mark.parametrize(
    "model,kw,mode",
    [
        ("deit_base_patch16_224", {}, "cudagraph"),
        ("topk_deit_base_patch16_224", TOPK, "cudagraph"),
        ("evit_deit_small_patch16_224", TOPK, "cudagraph"),
        ("topk_deit_small_patch16_224", TOPK, "compile"),
    ],
)
def test_modes_compute_what_eager_computes(model, kw, mode):
    case = validate_case(Case(model, batch_size=4, dtype="fp32", device="cuda", **kw))
    built = build(case)
    net, x = built.model, built.extra["inputs"]
    with torch.no_grad(), precision("fp32", "cuda"):
        expected = net(x).clone()
        step = make_step(built, mode)
        for _ in range(3):
            got = step()
        torch.cuda.synchronize()
    rel = (got - expected).norm() / expected.norm()
    assert rel < 1e-3, f"{mode}: relative difference {rel:.2e}"


def test_gpu_row_has_energy_memory_clocks_and_tokens():
    row = run_case(Case("topk_deit_base_patch16_224", batch_size=64, dtype="bf16", mode="cudagraph", device="cuda", min_time=2.0, **TOPK))
    assert row["status"] == "ok", row["message"]
    assert row["tokens"] == [197, 21, 3, 2]
    assert row["energy_j"] is not None and row["energy_j"] > 0
    assert 30 < row["power_w"] < 1500
    assert row["peak_mem_alloc_mb"] > 86e6 * 4 / 2**20  # at least the fp32 weights
    assert row["peak_mem_reserved_mb"] >= row["peak_mem_alloc_mb"]
    assert row["env"]["gpu_name"] and row["env"]["driver"] and row["env"]["sm_clock_mhz"]
    assert "no_power" not in row["flags"] and "batch_mismatch" not in row["flags"]


def test_autocast_casts_weights_once_on_the_gpu():
    from torch.profiler import ProfilerActivity, profile

    case = validate_case(Case("deit_base_patch16_224", dtype="bf16", device="cuda"))
    net, _ = build_model(case)
    net = net.cuda()
    x = image_batch(1, 224, "cuda", 0)
    with torch.no_grad(), precision("bf16", "cuda"):
        net(x)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            net(x)
            torch.cuda.synchronize()
    casts = sum(e.count for e in prof.key_averages() if "bfloat16_copy" in e.key)
    linears = 12 * 4 + 1
    assert casts <= linears + 2, f"{casts} cast kernels for {linears} Linear layers: weights are re-cast every step"


def test_interleaved_cases_on_the_gpu_pair_hold_their_graphs_and_measure_host_and_gpu_apart():
    """Two bf16 cases (a CUDA graph captured under autocast, and eager) timed together: the graph replays the
    weight casts autocast cached during capture, so the cache must outlive each case's contexts (freeing it made
    the replay read freed memory: a segfault, seen on an H100); the held timing gives each step's GPU time."""
    from perflab import api
    from perflab.stats import paired_ratio

    cases = api.make_cases(model=["deit_small_patch16_224", "topk_deit_small_patch16_224"], keep_rate=[0.1], reduction_loc=[3, 6, 9],
                           batch_size=[8], dtype=["bf16"], mode=["cudagraph", "eager"], device="cuda", min_time=0.3, repeats=10)
    rows = api.bench(cases)
    assert [r["status"] for r in rows] == ["ok"] * 4
    assert len({r["session"] for r in rows}) == 1
    graph = [r for r in rows if r["mode"] == "cudagraph"]
    for row in graph:
        # a graph replay is all GPU: its GPU time is its step time, its host time a replay call
        assert row["device_ms"] == pytest.approx(row["median_ms"], rel=0.05)
        assert row["host_held_ms"] < 0.2 * row["device_ms"] and row["host_bound_frac"] < 0.5
        assert row["power_w"] and row["power_w"] > 50
    pair = paired_ratio(graph[1], graph[0])  # graph[0]'s time ÷ graph[1]'s
    assert pair["pairs"] == 10
    alone = api.bench([c for c in cases if c.mode == "cudagraph"], interleave=False)
    assert pair["ratio"] == pytest.approx(alone[0]["median_ms"] / alone[1]["median_ms"], rel=0.03)
