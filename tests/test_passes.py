"""Per-pass breakdowns (seed 003's tables b–e) on real H100 traces of perflab's own lm profile passes."""

from pathlib import Path

import numpy as np
import pytest

from perflab import api
from perflab.analysis.passes import PASSES, attention_breakdown, kernel_passes, pass_breakdown, softmax_flop_ratio
from perflab.trace import load_trace

TRACES = Path(__file__).parent / "data" / "traces"


@pytest.fixture(scope="module")
def explicit():
    return load_trace(TRACES / "lm_train_step_explicit.json.gz")


@pytest.fixture(scope="module")
def compiled():
    return load_trace(TRACES / "lm_train_step_compile.json.gz")


def _passes_by_loop(trace) -> list[str]:
    """Independently: each activity's pass, by looking for a pass range whose [start, end) holds its launch."""
    spans = [(str(r.name), r.start_ns, r.end_ns) for r in trace.ranges.itertuples() if str(r.name) in PASSES]
    out = []
    for launch in trace.kernels["launch_start_ns"].tolist():
        out.append(next((name for name, start, end in spans if launch >= 0 and start <= launch < end), ""))
    return out


@pytest.mark.parametrize("name", ["explicit", "compiled"])
def test_every_activity_gets_the_pass_whose_range_holds_its_launch(name, request):
    trace = request.getfixturevalue(name)
    assert kernel_passes(trace.kernels, trace.ranges).tolist() == _passes_by_loop(trace)


def test_backward_kernels_come_from_autograds_thread_and_still_count_as_backward(explicit):
    k = explicit.kernels
    passes = kernel_passes(k, explicit.ranges)
    main_tid = k.loc[passes == "forward", "launch_tid"].mode()[0]
    backward = k[passes == "backward"]
    assert len(backward) > 0 and (backward["launch_tid"] != main_tid).mean() > 0.9


def test_pass_times_add_up_to_the_kernel_time_of_the_steps(explicit):
    table = pass_breakdown(explicit.kernels, explicit.ranges, steps=len(explicit.steps))
    assert list(table["pass"]) == ["forward", "backward", "optimizer"]
    passes = kernel_passes(explicit.kernels, explicit.ranges)
    dur = explicit.kernels["dur_ns"].to_numpy()
    for row in table.itertuples():
        assert row.gpu_time_ns == int(dur[passes == row._1].sum()) // 2
        assert 0 < row.top_kernel_share <= 1 and 0 <= row.gemm_fraction <= 1
    assert "FusedAdamMathFunctor" in table.set_index("pass").loc["optimizer", "top_kernel"]
    fwd = table.set_index("pass").loc["forward"]
    assert fwd["top_non_gemm_share"] <= fwd["top_kernel_share"]


def test_gemm_fraction_is_gemm_time_over_pass_time(explicit):
    k = explicit.kernels
    passes = kernel_passes(k, explicit.ranges)
    table = pass_breakdown(k, explicit.ranges, steps=2).set_index("pass")
    for name in ("forward", "backward"):
        part = k[passes == name]
        expected = part.loc[part["category"] == "gemm", "dur_ns"].sum() / part["dur_ns"].sum()
        assert table.loc[name, "gemm_fraction"] == pytest.approx(expected, abs=1e-12)


def test_attention_softmax_against_matmul(explicit, compiled):
    k = explicit.kernels
    att = attention_breakdown(k, steps=2)
    rng = k["range"].astype(str)
    assert att["softmax_ns"] == int(k.loc[rng == "attn.softmax", "dur_ns"].sum()) // 2 > 0
    gemm = (k["category"] == "gemm") & rng.isin(["attn.scores", "attn.final_matmul"])
    assert att["matmul_ns"] == int(k.loc[gemm, "dur_ns"].sum()) // 2 > 0
    assert att["softmax_to_matmul"] == pytest.approx(att["softmax_ns"] / att["matmul_ns"])
    assert attention_breakdown(compiled.kernels, steps=2) is None  # SDPA under compile: no ranges
    assert softmax_flop_ratio(64) == pytest.approx(5 / 256)


def test_analyze_reports_passes_in_json():
    summary = api.analyze(TRACES / "lm_train_step_compile.json.gz").to_dict()
    assert [p["pass"] for p in summary["passes"]] == ["forward", "backward", "optimizer"]
    assert all(p["gpu_time_us"] > 0 for p in summary["passes"])
    assert summary["attention"] is None


def test_a_trace_without_passes_has_an_empty_table():
    trace = load_trace(TRACES / "eager_vit.json.gz")
    assert pass_breakdown(trace.kernels, trace.ranges, 3).empty
    assert np.all(kernel_passes(trace.kernels, trace.ranges) == "")
