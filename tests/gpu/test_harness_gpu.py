"""The harness on a real GPU: modes agree, energy and memory are read, weights are cast once."""

import pytest
import torch

from perflab.measure.harness import run_case
from perflab.models.registry import build_model
from perflab.runtime.inputs import image_batch
from perflab.runtime.modes import make_step
from perflab.runtime.workload import build
from perflab.runtime.precision import precision
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
