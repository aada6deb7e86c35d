"""Per-pass floors and fix predictions (torch-free analysis): a synthetic trace with known passes, whose sums
must close exactly, and the real H100 train_step trace."""

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perflab.analysis.fixes import StepTimes, batch_delta, checkpoint_delta, optimizer_delta, predict_step_ms
from perflab.analysis.floors import pass_floors
from perflab.analysis.passes import pass_breakdown, pass_timing
from perflab.trace.schema import KERNEL_COLUMNS, Trace

TRACES = Path(__file__).parent / "data" / "traces"
STEP = 1_000_000  # ns between step starts

# Per step: (pass range name, start, end) and kernels (launch offset, launch duration, start offset, duration, stream)
PASS_RANGES = [("forward", 0, 100_000), ("backward", 100_000, 400_000), ("optimizer", 400_000, 450_000)]
KERNELS = [
    # forward: two kernels back to back, then one after a 20 µs gap
    (1_000, 2_000, 5_000, 30_000, 7), (4_000, 2_000, 35_000, 40_000, 7), (60_000, 2_000, 95_000, 10_000, 7),
    # backward: one on a second stream overlapping the first
    (110_000, 3_000, 120_000, 100_000, 7), (130_000, 3_000, 150_000, 80_000, 9), (300_000, 3_000, 310_000, 50_000, 7),
    # optimizer
    (410_000, 5_000, 420_000, 60_000, 7),
    # outside every pass (launched after the optimizer's range)
    (500_000, 1_000, 505_000, 5_000, 7),
]


def synthetic(steps: int = 2) -> Trace:
    rows, ranges = [], []
    for s in range(steps):
        base = s * STEP
        for name, start, end in PASS_RANGES:
            ranges.append(dict(name=name, tid=1, start_ns=base + start, end_ns=base + end, depth=1, parent=-1))
        for i, (launch, launch_dur, start, dur, stream) in enumerate(KERNELS):
            rows.append(dict(name=f"k{i}", category="gemm", kind="kernel", device=0, stream=stream, start_ns=base + start,
                             end_ns=base + start + dur, dur_ns=dur, correlation=len(rows), launch_api="cudaLaunchKernel",
                             launch_start_ns=base + launch, launch_end_ns=base + launch + launch_dur, launch_tid=1, range="", range_id=-1,
                             grid="", block=""))
    table = pd.DataFrame(rows, columns=list(KERNEL_COLUMNS))
    for col in ("name", "category", "kind", "launch_api", "range", "grid", "block"):
        table[col] = table[col].astype("category")
    steps_table = pd.DataFrame({"step": range(steps), "name": [f"ProfilerStep#{i}" for i in range(steps)],
                                "start_ns": np.arange(steps, dtype=np.int64) * STEP, "end_ns": (np.arange(steps, dtype=np.int64) + 1) * STEP,
                                "tid": 1})
    return Trace(kernels=table, launches=pd.DataFrame(), ranges=pd.DataFrame(ranges), steps=steps_table, meta={})


def test_pass_timing_of_known_passes():
    t = synthetic()
    timing = pass_timing(t.kernels, t.ranges, len(t.steps))
    assert list(timing) == ["forward", "backward", "optimizer"]
    f, b, o = timing["forward"], timing["backward"], timing["optimizer"]
    assert f == dict(kernels=3, gpu_ns=80_000, busy_ns=80_000, span_ns=100_000, idle_ns=20_000, issue_ns=62_000)
    # backward: 120–220 and 150–230 overlap into 120–230 (110 µs), then 310–360
    assert b == dict(kernels=3, gpu_ns=230_000, busy_ns=160_000, span_ns=240_000, idle_ns=80_000, issue_ns=203_000)
    assert o == dict(kernels=1, gpu_ns=60_000, busy_ns=60_000, span_ns=60_000, idle_ns=0, issue_ns=15_000)
    # the passes' GPU time is pass_breakdown's, and with the kernel outside every pass it is all of the steps' kernel time
    table = pass_breakdown(t.kernels, t.ranges, len(t.steps)).set_index("pass")
    for name, row in timing.items():
        assert row["gpu_ns"] == table.loc[name, "gpu_time_ns"] and row["kernels"] == table.loc[name, "kernels_per_step"]
    assert sum(r["gpu_ns"] for r in timing.values()) + 5_000 == t.kernels["dur_ns"].sum() // 2


CEIL = dict(matmul_tflops=500.0, copy_gbps=2500.0, kernel_interval_us=2.0)


def test_per_pass_floors_close_exactly():
    t = synthetic()
    timing = pass_timing(t.kernels, t.ranges, len(t.steps))
    costs = {"forward": {"flops": 10e9, "bytes": 50e6}, "backward": {"flops": 20e9, "bytes": 120e6}, "optimizer": {"flops": 0, "bytes": 280e6}}
    sf = pass_floors(costs=costs, timing=timing, measured_ms=0.5, host_issue_ms=0.28, **CEIL)
    by = {p.name: p for p in sf.passes}
    assert list(by) == ["forward", "backward", "optimizer"]
    # each floor from the pass's own numbers
    assert by["forward"].compute_ms == pytest.approx(10e9 / 500e12 * 1e3) == pytest.approx(0.02)
    assert by["backward"].memory_ms == pytest.approx(120e6 / 2500e9 * 1e3) == pytest.approx(0.048)
    assert by["optimizer"].memory_ms == pytest.approx(0.112) and by["optimizer"].compute_ms == 0
    assert [by[n].launch_ms for n in by] == [pytest.approx(0.006), pytest.approx(0.006), pytest.approx(0.002)]
    # the untraced host time split by the traced issue times 62 : 203 : 15 µs, adding up to it exactly
    assert [by[n].host_ms for n in by] == [pytest.approx(0.28 * 62 / 280), pytest.approx(0.28 * 203 / 280), pytest.approx(0.28 * 15 / 280)]
    assert math.fsum(p.host_ms for p in sf.passes) == pytest.approx(0.28, abs=1e-15)
    # binding per pass: forward host 0.062 > compute 0.02; backward host 0.203; optimizer memory 0.112 > host 0.015
    assert [by[n].binding for n in by] == ["host", "host", "memory"]
    assert sf.floor_ms == pytest.approx(0.062 + 0.203 + 0.112, abs=1e-15)
    assert sf.by_limit == {"compute": 0.0, "memory": pytest.approx(0.112), "launch": 0.0, "host": pytest.approx(0.265)}
    assert math.fsum(sf.by_limit.values()) == pytest.approx(sf.floor_ms, abs=1e-15)
    assert sf.binding == "host" and sf.verdict == "launch-bound"
    # profiled GPU time against each pass's floor
    assert by["optimizer"].gpu_ms == 0.06 and by["optimizer"].gpu_over_floor == pytest.approx(0.06 / 0.112)
    # MFU and MBU of the step, and the best the floors allow: Σ compute floors ÷ the step floor
    d = sf.to_dict()
    assert d["flops"] == 30e9 and d["bytes"] == 450e6
    assert d["mfu"] == pytest.approx(30e9 / 0.5e-3 / 500e12) and d["mbu"] == pytest.approx(450e6 / 0.5e-3 / 2500e9)
    assert d["ceiling_mfu"] == pytest.approx(math.fsum(p.compute_ms for p in sf.passes) / sf.floor_ms)
    assert d["ceiling_mbu"] == pytest.approx(math.fsum(p.memory_ms for p in sf.passes) / sf.floor_ms)
    assert d["measured_over_floor"] == pytest.approx(0.5 / sf.floor_ms)


def test_a_pass_without_costs_or_without_kernels_still_counts():
    t = synthetic()
    timing = pass_timing(t.kernels, t.ranges, len(t.steps))
    # costs name a pass the trace lacks (no kernels), and omit the optimizer the trace has
    costs = {"forward": {"flops": 1e9, "bytes": 1e6}, "backward": {"flops": 2e9, "bytes": 2e6}, "prefetch": {"flops": 0, "bytes": 25e6}}
    sf = pass_floors(costs=costs, timing=timing, measured_ms=1.0, host_issue_ms=0.0, **CEIL)
    by = {p.name: p for p in sf.passes}
    assert list(by) == ["forward", "backward", "prefetch", "optimizer"]
    assert by["prefetch"].kernels == 0 and by["prefetch"].gpu_ms is None and by["prefetch"].binding == "memory"
    assert by["optimizer"].flops == 0 and by["optimizer"].bytes == 0 and by["optimizer"].binding == "launch"
    assert sf.floor_ms == pytest.approx(math.fsum(p.floor_ms for p in sf.passes), abs=1e-15)


def test_real_train_step_pass_timing():
    from perflab.trace import load_trace

    t = load_trace(TRACES / "lm_train_step_explicit.json.gz")
    timing = pass_timing(t.kernels, t.ranges, len(t.steps))
    table = pass_breakdown(t.kernels, t.ranges, len(t.steps)).set_index("pass")
    assert list(timing) == ["forward", "backward", "optimizer"]
    for name, row in timing.items():
        assert row["gpu_ns"] == table.loc[name, "gpu_time_ns"]
        assert row["busy_ns"] <= row["gpu_ns"] and row["idle_ns"] == row["span_ns"] - row["busy_ns"] >= 0
        assert 0 < row["issue_ns"]


TIMING = {"forward": {"gpu_ns": 10_000_000}, "backward": {"gpu_ns": 20_000_000, "idle_ns": 1_000_000},
          "optimizer": {"gpu_ns": 9_000_000}}


GPU_BOUND = StepTimes({"forward": 1.0, "backward": 2.0, "optimizer": 0.5}, {"forward": 10.0, "backward": 20.0, "optimizer": 9.0})


def test_optimizer_predictions_on_a_gpu_bound_step():
    # every pass GPU-bound (host 1, 2, 0.5 ms against GPU 10, 20, 9 ms), measured 42 ms against T = 39 ms
    def at(variant, current="fused", floor=2.0):
        delta, _ = optimizer_delta(variant, current, TIMING, floor, GPU_BOUND)
        return predict_step_ms(42.0, GPU_BOUND, delta)

    p = at("foreach")
    assert p.ms == pytest.approx(42.0 * (39.0 + 9.0 * 84 / 28 - 9.0) / 39.0) and "84/28" in p.model
    p = at("in_backward")  # hides only in the backward's 1 ms of idle; the update's 0.5 ms of host moves into the backward
    assert p.ms == pytest.approx(42.0 * (10.0 + 20.0 + 8.0) / 39.0) and "idle" in p.model
    assert at("in_backward_stream").ms == pytest.approx(42.0 * 30.0 / 39.0)  # 9 ms fits under the 18 ms that needs no DRAM
    assert at("in_backward_stream", "foreach", 15.0).ms == pytest.approx(42.0 * (30.0 + max(0.0, 3.0 - 5.0)) / 39.0)
    assert at("fused", "foreach").ms == pytest.approx(42.0 * (30.0 + 3.0) / 39.0)
    assert optimizer_delta("fused", "in_backward", {"forward": {}, "backward": {}}, 2.0, GPU_BOUND)[0] is None


def test_the_host_term_on_the_h100s_launch_bound_training_step():
    """gpt_large bf16 train_step on the H100 (docs/performance/lm.md, 2026-11-23): host 42.908, 79.480, 1.528 ms (the
    untraced issue time split by pass), GPU 18.218, 36.870, 10.270 ms, eager 101.8 ms; foreach measured 131.3 ms.
    Σ max(host, GPU) per pass: 132.658 ms before, 153.198 after (the optimizer's GPU time ×3): 117.56 ms, −10.5%. The
    whole-step max(Σhost, ΣGPU) would keep 101.8 (host 123.9 > GPU 85.9), −22%."""
    times = StepTimes({"forward": 42.908, "backward": 79.480, "optimizer": 1.528}, {"forward": 18.218, "backward": 36.870, "optimizer": 10.270})
    timing = {"forward": {"gpu_ns": 18_218_000}, "backward": {"gpu_ns": 36_870_000, "idle_ns": 0}, "optimizer": {"gpu_ns": 10_270_000}}
    assert times.ms == pytest.approx(42.908 + 79.480 + 10.270)
    p = predict_step_ms(101.8, times, optimizer_delta("foreach", "fused", timing, 2.6, times)[0])
    assert p.ms == pytest.approx(101.8 * 153.198 / 132.658) == pytest.approx(117.56, abs=0.01)
    assert abs(p.ms / 131.3 - 1) < 0.15
    # checkpoint: + the forward's GPU (18.218) and host (42.908) in the backward: 42.908 + 122.388 + 10.270 = 175.566 ms
    p = predict_step_ms(101.8, times, checkpoint_delta(timing, times)[0])
    assert p.ms == pytest.approx(101.8 * 175.566 / 132.658) and p.host_ms == pytest.approx(123.916 + 42.908)


def test_checkpoint_and_batch_predictions():
    delta, _ = checkpoint_delta(TIMING, GPU_BOUND)
    assert predict_step_ms(42.0, GPU_BOUND, delta).ms == pytest.approx(42.0 * (10.0 + 30.0 + 9.0) / 39.0)
    assert predict_step_ms(42.0, None, delta).ms == pytest.approx(52.0)  # GPU only
    delta, _ = checkpoint_delta(TIMING, GPU_BOUND, compiled_forward_ms=4.0)  # on a compiled base: the fused forward, no launches
    assert delta.gpu == {"backward": 4.0} and delta.host == {}
    assert checkpoint_delta({}, GPU_BOUND)[0] is None
    one = StepTimes({"step": 0.3}, {"step": 6.3})
    p = predict_step_ms(6.4, one, batch_delta(6.3, 16.1e9, 16.4e9, 1, 8))
    assert p.ms == pytest.approx(6.4 * 6.3 * 16.4 / 16.1 / 6.3) and "bs8" in p.model
