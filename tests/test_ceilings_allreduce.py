"""The all-reduce sweep of `perflab ceilings --gpus` on two gloo ranks (one launch), and nccl-tests' definitions."""

import pytest


def test_all_reduce_sweep_on_two_cpu_ranks():
    from perflab.analysis.comm import busbw_at
    from perflab.measure.ceilings import all_reduce_sweep

    sweep = all_reduce_sweep(None, sizes=(4096, 65536), iters=3, warmup=1, device="cpu", world_size=2)
    assert sweep["world_size"] == 2 and [r["bytes"] for r in sweep["sizes"]] == [4096, 65536] and sweep["launches"] == 1
    for r in sweep["sizes"]:
        assert r["time_us"] > 0
        assert r["algbw_gbps"] == pytest.approx(r["bytes"] / (r["time_us"] / 1e6) / 1e9)
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"])  # 2(N-1)/N = 1 for two ranks
    assert sweep["busbw_gbps"] == max(r["busbw_gbps"] for r in sweep["sizes"])
    assert busbw_at(sweep, 5000) == sweep["sizes"][0]["busbw_gbps"] and busbw_at(sweep, 2**30) == sweep["sizes"][1]["busbw_gbps"]


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a GPU is here: ceilings would measure it")
def test_ceilings_without_a_gpu_is_one_line():
    from cli_util import assert_one_line_error, run_cli_here

    assert_one_line_error(run_cli_here("ceilings", "--gpus", "0,1"), "measures a GPU")
