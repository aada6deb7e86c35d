"""Floors and the binding verdict."""

import pytest

from perflab.analysis.floors import compute_floors
from perflab.workloads.classify import vit_min_bytes

CEIL = dict(matmul_tflops=800.0, copy_gbps=4000.0, kernel_interval_us=1.5)


def test_floor_arithmetic():
    f = compute_floors(measured_ms=2.0, flops_per_step=35.13e9, bytes_per_step=200e6, kernels_per_step=200, host_issue_ms=1.8, **CEIL)
    assert f.compute_ms == pytest.approx(35.13e9 / 800e12 * 1e3)
    assert f.memory_ms == pytest.approx(200e6 / 4000e9 * 1e3)
    assert f.launch_ms == pytest.approx(0.3)
    assert f.host_ms == 1.8
    assert f.binding == "host" and f.verdict == "launch-bound"
    assert f.ratios()["host"] == pytest.approx(2.0 / 1.8)
    u = f.utilisation()  # MFU = FLOPs ÷ time ÷ peak; the ceiling is the same at the binding (host) floor
    assert u["measured"]["mfu"] == pytest.approx(35.13e9 / 2.0e-3 / 800e12) and u["measured"]["mbu"] == pytest.approx(200e6 / 2.0e-3 / 4000e9)
    assert u["ceiling"]["mfu"] == pytest.approx(35.13e9 / 1.8e-3 / 800e12) and u["ceiling"]["mbu"] == pytest.approx(200e6 / 1.8e-3 / 4000e9)


@pytest.mark.parametrize(
    "kw,verdict",
    [
        (dict(flops_per_step=35e9, bytes_per_step=2e8, kernels_per_step=200, host_issue_ms=0.01), "latency-bound small kernels"),
        (dict(flops_per_step=2.25e12, bytes_per_step=3e8, kernels_per_step=200, host_issue_ms=2.0), "compute-bound"),
        (dict(flops_per_step=1e9, bytes_per_step=2e10, kernels_per_step=20, host_issue_ms=0.1), "memory-bound"),
    ],
)
def test_verdict_names_the_largest_floor(kw, verdict):
    assert compute_floors(measured_ms=1.0, **CEIL, **kw).verdict == verdict


def test_the_floor_table_lists_each_limit_with_measured_over_floor_and_marks_the_binding_one():
    from perflab.report.explain_rows import floor_rows

    f = compute_floors(measured_ms=2.0, flops_per_step=1e12, bytes_per_step=1e9, kernels_per_step=100, host_issue_ms=1.5,
                       matmul_tflops=100.0, copy_gbps=1000.0, kernel_interval_us=3.0)
    assert [row[1:] for row in floor_rows(f)] == [["10.0000", "0.20×"], ["1.0000", "2.00×"], ["0.3000", "6.67×"], ["1.5000", "1.33×"]]
    assert [row[0].split()[0] for row in floor_rows(f)] == ["compute", "memory", "launch", "host"]
    assert floor_rows(f)[0][0].endswith("◀ binding") and f.by_limit == {"compute": 10.0, "memory": 1.0, "launch": 0.3, "host": 1.5}


def test_vit_min_bytes_counts_weights_residual_stream_input_and_output():
    total = vit_min_bytes(params=10, weight_bytes=2, batch=2, tokens_per_block=[5, 3], dim=4, act_bytes=4, input_elems=100, output_elems=7)
    assert total == 10 * 2 + (2 * 2 * 5 * 4 * 4 + 2 * 2 * 3 * 4 * 4) + 4 * 107


def test_roofline_position_below_and_above_the_ridge():
    from perflab.analysis.floors import roofline

    # H100-like ceilings: 787 TFLOP/s bf16, 2971 GB/s → ridge at 264.9 FLOP/B
    decode = roofline(flops_per_step=16e9, bytes_per_step=16e9, achieved_tflops=2.2, matmul_tflops=787.0, copy_gbps=2971.0)
    assert decode["arithmetic_intensity"] == 1.0 and decode["ridge_intensity"] == pytest.approx(787e12 / 2971e9)
    assert decode["roofline_bound"] == "memory" and decode["roof_tflops"] == pytest.approx(2.971)
    assert decode["roofline_fraction"] == pytest.approx(2.2 / 2.971)
    prefill = roofline(flops_per_step=4e15, bytes_per_step=16e9, achieved_tflops=600.0, matmul_tflops=787.0, copy_gbps=2971.0)
    assert prefill["arithmetic_intensity"] == 250_000.0 and prefill["roofline_bound"] == "compute"
    assert prefill["roof_tflops"] == 787.0 and prefill["roofline_fraction"] == pytest.approx(600 / 787)


def test_a_step_whose_kernels_outlast_the_hosts_issue_is_set_by_its_kernels_not_its_launches():
    # One llama3_8b layer decoding at batch 64 over a cache of 4097 positions on an H100 (explain's numbers): the host
    # floor (1.1547 ms) binds, so the floors say launch-bound, but the GPU was busy 1.9801 ms of a traced step in
    # cuBLAS fallback kernels, 3.8x the memory floor: no CUDA graph can take the step below that.
    from perflab.report.explain_rows import floor_verdict

    kw = dict(measured_ms=2.0577, flops_per_step=0.032e12, bytes_per_step=0.5170e-3 * 4000e9, kernels_per_step=60,
              host_issue_ms=1.1547, **CEIL)
    slow = compute_floors(**kw, gpu_busy_ms=1.9801)
    assert slow.binding == "host" and slow.verdict == "launch-bound" and slow.kernels_set_the_step
    assert slow.to_dict()["kernels_set_the_step"] is True
    line = floor_verdict(slow)
    assert line.startswith("Whole step: **launch-bound** (binding floor: host)")
    assert ("But the kernels set this step, not the launches: the GPU is busy 1.9801 ms a traced step, longer than the 1.1547 ms "
            f"the host takes to issue it, and {1.9801 / slow.memory_ms:.1f}× the memory floor") in line and "3.8×" in line
    launch_bound = compute_floors(**kw, gpu_busy_ms=0.9)  # the GPU waits for the CPU: the floors' verdict stands
    unprofiled = compute_floors(**kw)
    assert not launch_bound.kernels_set_the_step and not unprofiled.kernels_set_the_step
    assert "But the kernels" not in floor_verdict(launch_bound) + floor_verdict(unprofiled)
    memory_bound = compute_floors(**dict(kw, host_issue_ms=0.1), gpu_busy_ms=1.98)  # a GPU floor binds: nothing to add
    assert memory_bound.binding == "memory" and not memory_bound.kernels_set_the_step


def test_where_the_launch_floor_binds_the_verdict_already_names_the_kernels_and_nothing_is_added():
    from perflab.report.explain_rows import floor_verdict

    f = compute_floors(measured_ms=2.0, flops_per_step=1e9, bytes_per_step=1e6, kernels_per_step=2000, host_issue_ms=0.5,
                       gpu_busy_ms=1.9, **CEIL)  # 2000 kernels × 1.5 µs = 3 ms: the launch floor binds
    assert f.binding == "launch" and f.verdict == "latency-bound small kernels" and not f.kernels_set_the_step
    assert "But the kernels" not in floor_verdict(f)


# a ResNet-50 trained in fp32 under `perflab run` on an H200 (torch.multiprocessing.spawn, batch 128): its counted FLOPs
# a step, its untraced median step and the GPU's measured matmul peaks; the 1.57 GFLOP of its linear head
RESNET50_FLOPS, RESNET50_MS, HEAD_FLOPS = 3_110_281_936_896, 62.4578, 3 * 2 * 128 * 2048 * 1000
H200_PEAKS = {"bf16": 769.68, "fp16": 741.04, "tf32": 368.67, "fp32": 50.61}


def resnet50_floors(tf32: bool, tf32_conv: bool) -> dict:
    from perflab.analysis.op_flops import OpFlops
    from perflab.analysis.program import _floors

    flops = OpFlops(RESNET50_FLOPS, 1, 161, by_dtype={"fp32": RESNET50_FLOPS}, conv_by_dtype={"fp32": RESNET50_FLOPS - HEAD_FLOPS})
    ceilings = {"matmul_tflops": H200_PEAKS, "copy_gbps": 4204.0, "graph_kernel_interval_us": 1.5, "measured_at": "2026-11-29"}
    return _floors(ceilings, flops, None, RESNET50_MS, {"host_ms": None, "busy_ms": 59.3}, {"kernels_per_step": 700}, tf32, tf32_conv)


def test_fp32_convolutions_on_cudnns_default_tf32_are_held_against_the_tf32_peak():
    """torch runs fp32 convolutions on TF32 tensor cores by default (cudnn.allow_tf32) and fp32 matmuls not: against the
    fp32 peak a ResNet-50's step read MFU 98.4%, above what its fp32 (non-tensor-core) arithmetic could reach."""
    util = resnet50_floors(tf32=False, tf32_conv=True)["utilisation"]
    assert util["dtype"] == "tf32" and util["peak_tflops"] == H200_PEAKS["tf32"]
    assert util["flops_by_precision"] == {"tf32": RESNET50_FLOPS - HEAD_FLOPS, "fp32": HEAD_FLOPS}
    assert util["mfu"] == pytest.approx(RESNET50_FLOPS / (RESNET50_MS / 1e3) / (H200_PEAKS["tf32"] * 1e12)) == pytest.approx(0.1351, abs=1e-4)
    strict = resnet50_floors(tf32=False, tf32_conv=False)["utilisation"]  # the program turned cuDNN's TF32 off: fp32's peak
    assert strict["dtype"] == "fp32" and strict["mfu"] == pytest.approx(0.984, abs=1e-3)


def test_tf32_matmuls_move_only_the_matmuls_fp32_flops():
    from perflab.analysis.op_flops import OpFlops
    from perflab.analysis.program import precision_flops

    flops = OpFlops(10, 1, 3, by_dtype={"fp32": 7, "bf16": 3}, conv_by_dtype={"fp32": 2})
    assert precision_flops(flops, tf32=True, tf32_conv=False) == {"bf16": 3, "fp32": 2, "tf32": 5}
    assert precision_flops(flops, tf32=False, tf32_conv=False) == {"bf16": 3, "fp32": 7}
    assert precision_flops(flops, tf32=True, tf32_conv=True) == {"bf16": 3, "tf32": 7}
