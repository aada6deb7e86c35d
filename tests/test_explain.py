"""explain's pieces on real traces: the CUDA-graph prediction, the host issue time, the byte floor."""

from pathlib import Path

import numpy as np
import pytest

from perflab.explain import host_issue_ms, min_bytes, predict_modes
from perflab.spec import Case, validate_case
from perflab.trace import load_trace

TRACES = Path(__file__).parent / "data" / "traces"


@pytest.fixture(scope="module")
def eager():
    return load_trace(TRACES / "eager_vit.json.gz")


def steps_by_hand(trace):
    """Step windows and the activities launched in each, recomputed from the annotations."""
    steps = trace.steps.sort_values("start_ns")
    starts = list(steps["start_ns"])
    k = trace.kernels
    launched = np.where(k["launch_start_ns"] >= 0, k["launch_start_ns"], k["start_ns"])
    out = []
    for i, s in enumerate(starts):
        e = starts[i + 1] if i + 1 < len(starts) else np.inf
        out.append(k[(launched >= s) & (launched < e)])
    return starts, out


def test_graph_prediction_is_the_sum_of_max_duration_plus_gap_and_interval(eager):
    _, per_step = steps_by_hand(eager)
    interval, gap = 1.5, 0.4
    expected = np.mean([np.maximum(s["dur_ns"].to_numpy() + gap * 1e3, interval * 1e3).sum() for s in per_step]) / 1e6
    got = predict_modes(eager, interval, gap)
    assert got["cudagraph"] == pytest.approx(expected, rel=1e-12)
    # compile: GEMM, attention, selection and memcpy kernels as in the graph; the glue kernels' count and
    # time halved, each of the remaining ones costing at least the interval.
    glue = {"elementwise", "copy", "norm", "softmax", "reduction", "triton_fused", "memset"}
    kept, glue_time, glue_count = 0.0, 0.0, 0
    for s in per_step:
        is_glue = s["category"].astype(str).isin(glue).to_numpy()
        d = s["dur_ns"].to_numpy()
        kept += np.maximum(d[~is_glue] + gap * 1e3, interval * 1e3).sum()
        glue_time += d[is_glue].sum() / 2
        glue_count += is_glue.sum() / 2
    assert glue_count > 100  # the bf16 casts, norms and adds of the eager trace are there to fuse
    fused = (kept + max(glue_time + glue_count * gap * 1e3, glue_count * interval * 1e3)) / len(per_step) / 1e6
    assert got["compile:reduce-overhead"] == pytest.approx(fused, rel=1e-12)


def test_host_issue_time_is_step_start_to_last_launch_end(eager):
    starts, per_step = steps_by_hand(eager)
    expected = np.median([s.loc[s["launch_end_ns"] >= 0, "launch_end_ns"].max() - st for st, s in zip(starts, per_step)]) / 1e6
    assert host_issue_ms(eager) == pytest.approx(expected)
    assert 0 < host_issue_ms(eager) < 50


def test_min_bytes_for_topk_counts_weights_and_the_shrinking_residual_stream():
    case = validate_case(Case("topk_deit_base_patch16_224", keep_rate=(0.1,), reduction_loc=(3, 6, 9), dtype="bf16", batch_size=2, device="cpu"))
    row = {"params": 86_567_656, "tokens": [197, 21, 3, 2]}
    # Blocks 0-2 output 197 tokens, 3-5: 21, 6-8: 3, 9-11: 2 (a reducing block outputs the reduced set).
    tokens = [197] * 3 + [21] * 3 + [3] * 3 + [2] * 3
    expected = 86_567_656 * 2 + sum(2 * 2 * n * 768 * 4 for n in tokens) + 4 * (2 * 3 * 224 * 224 + 2 * 1000)
    assert min_bytes(case, row) == expected


def test_untraced_host_issue_time_of_a_50_ms_step():
    """On the CPU a step returns when its work is done, so the issue time is the step time (test:slow sleeps 50 ms)."""
    from perflab.measure.host import host_issue_ms as untraced

    ms = untraced(validate_case(Case("test:slow", device="cpu", warmup=1)), iters=5)
    assert 50 <= ms < 100  # the sleep, plus a loaded 2-core machine's scheduling delays
