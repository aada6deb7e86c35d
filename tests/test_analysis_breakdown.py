"""Kernel statistics, top kernels, categories, GEMM fraction, per-range breakdown, launch statistics."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest
from reference_trace import KINETO_TRACES, NSYS_FIXTURE, summarize

from perflab.analysis import analyze_trace
from perflab.analysis.accounting import Accounting
from perflab.analysis.breakdown import category_breakdown, gemm_fraction
from perflab.analysis.intervals import union_length, union_length_by_group
from perflab.analysis.kernels import top_memory_ops, kernel_stats, top_kernels
from perflab.analysis.launch import launch_delays, launch_verdict
from perflab.analysis.ranges import range_breakdown
from perflab.trace import load_trace

TRACE_IDS = [p.name.split(".")[0] for p in KINETO_TRACES]


@pytest.fixture(scope="module")
def nsys():
    return load_trace(NSYS_FIXTURE)


def test_analysis_and_trace_never_import_torch():
    code = textwrap.dedent("""
        import sys
        import perflab.analysis, perflab.trace
        from perflab.analysis import analyze_trace
        from perflab.trace import load_trace
        analyze_trace(load_trace(sys.argv[1]))
        import perflab.report.trace_console
        assert "torch" not in sys.modules, sorted(m for m in sys.modules if m.startswith("torch"))
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", code, str(KINETO_TRACES[0])], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_union_helpers():
    assert union_length(np.array([0, 5, 20]), np.array([10, 12, 21])) == 13
    assert union_length(np.array([0, 10]), np.array([10, 20])) == 20  # touching intervals
    assert union_length_by_group(np.array([0, 5, 0, 100]), np.array([10, 12, 3, 101]), np.array([0, 0, 1, 1]), 3).tolist() == [12, 4, 0]


def test_kernel_stats_match_the_reference():
    for path in KINETO_TRACES:
        stats = kernel_stats(load_trace(path).kernels)
        ref = summarize(path)
        assert stats.kernels == ref["kernels"] and stats.kernel_time_ns == ref["kernel_time_ns"]
        assert stats.gpu_activities == ref["gpu_activities"] and stats.gpu_activity_time_ns == ref["gpu_activity_time_ns"]
        assert stats.mean_ns == pytest.approx(ref["kernel_time_ns"] / ref["kernels"])


def test_kernel_stats_on_the_fixture(nsys):
    stats = kernel_stats(nsys.kernels)
    durations = [2000, 800, 1000, 500, 500, 900, 1000, 1000]
    assert (stats.kernels, stats.kernel_time_ns, stats.memcpy, stats.memset) == (8, sum(durations), 1, 1)
    assert stats.median_ns == np.median(durations)
    assert stats.short_share == 1.0  # all under 5 µs


def test_top_kernels(nsys):
    top = top_kernels(nsys.kernels, 3)
    assert top["full_name"].tolist()[0].startswith("void cutlass::Kernel2<")
    # (layer norm and add tie at 1000 ns: by full name, "void at::native::(anonymous..." comes first)
    assert top["name"].tolist() == ["cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8", "softmax_warp_forward",
                                    "vectorized_layer_norm_kernel"]
    assert top["total_ns"].tolist() == [2000, 1900, 1000] and top["count"].tolist() == [1, 2, 1]
    assert top["share"].iloc[0] == pytest.approx(2000 / 8200)  # of all GPU activity: 7700 kernel + 400 memcpy + 100 memset
    everything = top_kernels(nsys.kernels, None)
    assert everything["total_ns"].sum() == 7700  # kernels only
    assert everything["share"].sum() == pytest.approx(7700 / 8200)
    memory = top_memory_ops(nsys.kernels, None)
    assert memory["total_ns"].tolist() == [400, 100] and memory["category"].tolist() == ["memcpy", "memset"]
    assert memory["share"].sum() + everything["share"].sum() == pytest.approx(1.0)


def test_top_kernels_on_a_real_trace():
    top = top_kernels(load_trace(KINETO_TRACES[TRACE_IDS.index("two_streams")]).kernels, 5)
    assert top["name"].iloc[0] == "cutlass_80_simt_sgemm_256x128_8x4_nn_align1"
    assert top["count"].iloc[0] == 16 and top["category"].iloc[0] == "gemm"


def test_categories_and_gemm_fraction(nsys):
    categories = category_breakdown(nsys.kernels).set_index("category")
    assert categories["time_ns"].to_dict() == {"gemm": 2500, "softmax": 1900, "elementwise": 1000, "norm": 1000, "triton_fused": 800,
                                               "attention": 500, "memcpy": 400, "memset": 100}
    assert categories["time_ns"].sum() == nsys.kernels["dur_ns"].sum()
    # GEMM: [3000,5000] and [13500,14000]; all activity: 8100 ns of union
    assert gemm_fraction(nsys.kernels) == pytest.approx(2500 / 8100)


def test_gemm_fraction_counts_overlapping_gemms_once():
    trace = load_trace(KINETO_TRACES[TRACE_IDS.index("two_streams")])
    fraction = gemm_fraction(trace.kernels)
    assert 0.99 < fraction <= 1.0
    categories = category_breakdown(trace.kernels).set_index("category")
    assert categories.loc["gemm", "busy_ns"] < categories.loc["gemm", "time_ns"]  # the streams overlap


def test_range_breakdown_on_the_fixture(nsys):
    ranges = range_breakdown(nsys.kernels, nsys.ranges).set_index("range")
    assert ranges.loc["attn", ["kernels", "gpu_time_ns", "gpu_busy_ns", "gemm_ns"]].tolist() == [2, 2800, 2800, 2000]
    assert ranges.loc["attn", "gemm_fraction"] == pytest.approx(2000 / 2800)
    assert ranges.loc["mlp", ["kernels", "gpu_time_ns", "gpu_busy_ns"]].tolist() == [3, 1500, 1400]  # memcpy ∥ memset
    assert ranges.loc["prefetch", ["kernels", "gpu_time_ns", "gpu_busy_ns", "gpu_projected_ns"]].tolist() == [3, 1900, 1900, 2000]
    assert ranges.loc["attn", ["instances", "cpu_wall_ns"]].tolist() == [1, 4000]
    # "forward" launches nothing itself, but its children's work spans [3000, 9000]
    assert ranges.loc["forward", ["kernels", "gpu_projected_ns"]].tolist() == [0, 6000]
    assert ranges.loc["step", "gpu_projected_ns"] == 15500 - 3000
    assert ranges["gpu_time_ns"].sum() == nsys.kernels["dur_ns"].sum()


def test_range_breakdown_on_the_eager_trace():
    trace = load_trace(KINETO_TRACES[TRACE_IDS.index("eager_vit")])
    ranges = range_breakdown(trace.kernels, trace.ranges).set_index("range")
    assert ranges["gpu_time_ns"].sum() == trace.kernels["dur_ns"].sum()
    assert ranges.loc["block3.attn", "instances"] == 3
    assert (ranges.loc[[f"block{i}.mlp" for i in range(12)], "gemm_fraction"] > 0.25).all()
    assert ranges.loc["ProfilerStep#1", "gpu_projected_ns"] > 0  # everything is inside the step


def test_launch_delays(nsys):
    delays = launch_delays(nsys.kernels).sort_values("first_start_ns")
    # one row per launch call that launched work (the stream synchronize launched nothing); the graph
    # launch counts once, from the end of the call to its first kernel
    assert delays["delay_ns"].tolist() == [3_000 - 2_600, 5_000 - 3_100, 7_200 - 7_000, 7_400 - 7_300, 8_000 - 7_900,
                                           13_500 - 13_000, 20_000 - 900, 21_000 - 1_400]
    assert delays["api"].astype(str).tolist()[5] == "cudaGraphLaunch"


def test_launch_api_table(nsys):
    report = analyze_trace(nsys)
    apis = report.launch_apis.set_index("api")
    # cudaLaunchKernel: corr 1 and 5 in process 1001 (500 ns each), corr 1 and 2 in process 2002 (400 ns each)
    assert apis.loc["cudaLaunchKernel", ["calls", "total_ns", "activities"]].tolist() == [4, 1_800, 4]
    assert apis.loc["cudaLaunchKernel", "delay_median_ns"] == np.median([400, 100, 19_100, 19_600])
    assert apis.loc["cudaGraphLaunch", ["calls", "activities", "delay_median_ns"]].tolist() == [1, 3, 500]
    assert apis.loc["cudaStreamSynchronize", "activities"] == 0
    assert report.launch_delay == {"launches": 8, "median_ns": 450.0, "p90_ns": pytest.approx(np.percentile([400, 1900, 200, 100, 100, 500, 19100, 19600], 90))}


def _accounting(host, busy, wall, steps=True):
    frame = pd.DataFrame({"host_bound_ns": [host], "busy_ns": [busy], "wall_ns": [wall]})
    return Accounting(trace=frame.iloc[0], steps=frame, kernel_gap_threshold_ns=5000, has_step_annotations=steps)


def test_launch_verdict_rule():
    bound = launch_verdict(_accounting(1_900_000, 1_200_000, 3_100_000))
    assert bound.launch_bound and bound.verdict == "launch-bound"
    assert bound.message == "launch-bound: the GPU is idle 61% of each step waiting for launches (host-bound idle 1.90 ms vs 1.20 ms busy per step)"
    partly = launch_verdict(_accounting(300, 600, 1000))
    assert partly.verdict == "partly launch-bound" and not partly.launch_bound
    fine = launch_verdict(_accounting(50, 900, 1000, steps=False))
    assert fine.verdict == "not launch-bound" and "busy 90% of the trace" in fine.message


def test_report_bundles_everything(nsys):
    report = analyze_trace(nsys, top=2)
    summary = report.to_dict()
    assert summary["kernels"] == 8 and summary["kernel_time_us"] == 7.7 and summary["gpu_activity_time_us"] == 8.2
    assert summary["gpu_busy_us"] == 8.1 and summary["wall_us"] == 21.0
    assert summary["idle_by_cause_us"] == {"host_bound": 7.9, "kernel_gap": 5.0, "other": 0.0}
    assert summary["wall_us"] == pytest.approx(summary["gpu_busy_us"] + sum(summary["idle_by_cause_us"].values()))
    assert len(summary["top_kernels"]) == 2 and summary["top_kernels"][0]["count"] == 1
    assert summary["categories_us"]["gemm"] == 2.5
    assert summary["gemm_fraction"] == pytest.approx(2500 / 8100)
    # the report's views read the trace and its accounting themselves
    assert report.kernels is nsys.kernels and report.steps is report.accounting.steps and report.devices is report.accounting.devices
    assert report.trace_accounting["wall_ns"] == 21_000 and report.trace_accounting["busy_ns"] == 8_100
    assert summary["steps"] == 1 and summary["kernels_per_step"] == 7
    assert summary["launch"]["verdict"] in ("launch-bound", "partly launch-bound", "not launch-bound")
    assert isinstance(report.to_json(), str)
