"""Per-pass floors and fix predictions (torch-free analysis): a synthetic trace with known passes, whose sums
must close exactly, and the real H100 train_step trace."""

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perflab.analysis.fixes import predict_batch, predict_checkpoint, predict_optimizer
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


def test_optimizer_predictions():
    ms, model = predict_optimizer("foreach", "fused", 42.0, TIMING, backward_memory_floor_ms=2.0)
    assert ms == pytest.approx(42.0 - 9.0 + 9.0 * 84 / 28) and "84/28" in model
    ms, model = predict_optimizer("in_backward", "fused", 42.0, TIMING, 2.0)
    assert ms == pytest.approx(42.0 - 9.0 + (9.0 - 1.0)) and "idle" in model  # hides only in the backward's 1 ms of idle
    ms, _ = predict_optimizer("in_backward_stream", "fused", 42.0, TIMING, 2.0)
    assert ms == pytest.approx(42.0 - 9.0)  # 9 ms fits under the 18 ms of backward that needs no DRAM
    ms, _ = predict_optimizer("in_backward_stream", "foreach", 42.0, TIMING, 15.0)
    assert ms == pytest.approx(42.0 - 9.0 + max(0.0, 9.0 * 28 / 84 - 5.0))
    ms, _ = predict_optimizer("fused", "foreach", 42.0, TIMING, 2.0)
    assert ms == pytest.approx(42.0 - 9.0 + 3.0)
    assert predict_optimizer("fused", "in_backward", 42.0, {"forward": {}, "backward": {}}, 2.0)[0] is None


def test_checkpoint_and_batch_predictions():
    assert predict_checkpoint(42.0, TIMING)[0] == pytest.approx(52.0)
    assert predict_checkpoint(42.0, {})[0] is None
    ms, model = predict_batch(6.4, 16.1e9, 16.4e9, 1, 8)
    assert ms == pytest.approx(6.4 * 16.4 / 16.1) and "bs8" in model
