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


def test_explain_case_per_pass_floors_and_fixes_with_a_real_trace(monkeypatch):
    """explain_case end to end on the CPU: the run, profile and trace are fakes around the real H100 profile of a
    2-layer GPT train_step (the case it was captured from); floors per pass, fixes predicted then 'measured'."""
    import io
    import json

    from rich.console import Console

    import perflab.explain as ex
    from perflab.analysis.fixes import predict_optimizer
    from perflab.report.explain_console import render_explanation

    case = validate_case(Case(model="gpt_small", layers=2, model_args={"d_model": 256, "d_ff": 1024, "n_heads": 4}, seq_len=128, batch_size=4,
                              dtype="bf16", workload="train_step", attn="explicit", mode="eager", device="cuda"))
    trace = load_trace(TRACES / "lm_train_step_explicit.json.gz")
    measured = {}

    def run_case(c):
        ms = {"eager": 10.0}.get(c.mode, 8.0) + (0.5 if c.optimizer == "foreach" else 0) + (1.0 if c.checkpoint_activations else 0)
        measured[c.label()] = ms
        return {"status": "ok", "median_ms": ms, "gflops_per_batch": 100.0, "params": 5_000_000, "first_step_s": 1.5 if c.mode == "eager" else 40.0,
                "peak_mem_alloc_mb": 900.0 if c.checkpoint_activations else 1000.0, "mfu": 0.3, "batch_size": c.batch_size}

    monkeypatch.setattr(ex, "measure_host_issue_ms", lambda c: 4.0)
    ceilings = {"graph_kernel_interval_us": 1.5, "graph_kernel_gap_us": 0.5, "matmul_tflops": {"bf16": 700.0}, "copy_gbps": 3000.0}
    fixes = ex.default_fixes(case)
    assert fixes == ["optimizer:foreach", "optimizer:in_backward", "optimizer:in_backward_stream", "checkpoint"]
    fixes.append("compile:reduce-overhead+optimizer:in_backward_stream")
    ce = ex.explain_case(case, Path("unused"), ceilings, 2, ["cudagraph"], lambda cs: [run_case(c) for c in cs], lambda *a, **k: None,
                         lambda p: trace, lambda s: None, fixes=fixes)

    sf = ce.step_floors
    assert [p.name for p in sf.passes] == ["forward", "backward", "optimizer"]
    assert sum(p.host_ms for p in sf.passes) == pytest.approx(4.0, abs=1e-12)  # the untraced host time, split exactly
    assert sf.floor_ms == pytest.approx(sum(p.floor_ms for p in sf.passes), abs=1e-12)
    costs = ex.pass_costs(case, ce.eager_row)
    assert sum(p.bytes for p in sf.passes) == sum(c["bytes"] for c in costs.values()) == ex.min_bytes(case, ce.eager_row)
    assert [p.gpu_ms for p in sf.passes] == [ce.timing[n]["gpu_ns"] / 1e6 for n in ("forward", "backward", "optimizer")]

    by = {fx.name: fx for fx in ce.fix_results}
    backward_memory = next(p.memory_ms for p in sf.passes if p.name == "backward")
    for variant in ("foreach", "in_backward", "in_backward_stream"):
        expected, _ = predict_optimizer(variant, "fused", 10.0, ce.timing, backward_memory)
        assert by[f"optimizer:{variant}"].predicted_ms == pytest.approx(expected)
    assert by["checkpoint"].predicted_ms == pytest.approx(10.0 + ce.timing["forward"]["gpu_ns"] / 1e6)
    assert by["checkpoint"].measured_ms == 11.0 and by["checkpoint"].error == pytest.approx(by["checkpoint"].predicted_ms / 11.0 - 1)
    combo = by["compile:reduce-overhead+optimizer:in_backward_stream"]
    assert combo.changes == {"mode": "compile:reduce-overhead", "optimizer": "in_backward_stream"} and combo.predicted_ms is None
    assert combo.measured_ms == 8.0 and combo.measured["first_step_s"] == 40.0

    d = ce.to_dict()
    json.dumps(d)  # --json
    assert d["pass_floors"]["floor_ms"] == pytest.approx(sf.floor_ms) and len(d["fix_predictions"]) == 5
    assert d["fixes"][0]["speedup"] == pytest.approx(10.0 / 8.0) and d["first_step_s"]["cudagraph"] == 40.0
    buf = io.StringIO()
    render_explanation(Console(file=buf, width=250), ex.Explanation([ce], None, ceilings))
    text = buf.getvalue()
    assert "Floors per pass" in text and "optimizer:in_backward_stream" in text and "the floors allow at best MFU" in text
    from perflab.report.explain_markdown import explanation_markdown

    md = explanation_markdown(ex.Explanation([ce], None, ceilings))
    assert "| optimizer |" in md and f"**{sf.floor_ms:.3f} ms**" in md and "`checkpoint`: step + the forward's GPU time" in md
    assert "| 4 | `checkpoint` | " + f"{by['checkpoint'].predicted_ms:.3f} | 11.000 | {by['checkpoint'].error:+.1%} |" in md


@pytest.mark.parametrize("spec,changes", [
    ("optimizer:foreach", {"optimizer": "foreach"}),
    ("checkpoint", {"checkpoint_activations": True}),
    ("batch:8", {"batch_size": 8}),
    ("compile:max-autotune", {"mode": "compile:max-autotune"}),
    ("cudagraph+optimizer:in_backward", {"mode": "cudagraph", "optimizer": "in_backward"}),
])
def test_fix_specs(spec, changes):
    from perflab.explain import parse_fix

    assert parse_fix(spec) == changes


@pytest.mark.parametrize("spec", ["speedup", "batch:0", "batch:x", "optimizer:", "compile:fast"])
def test_bad_fix_specs_are_one_line_errors(spec):
    from perflab.errors import PerflabError
    from perflab.explain import parse_fix

    with pytest.raises(PerflabError, match="unknown fix"):
        parse_fix(spec)


def test_default_fixes_per_family():
    from perflab.explain import case_fixes, default_fixes

    decode = validate_case(Case("llama3_8b", workload="decode", batch_size=2, dtype="bf16", device="cuda"))
    assert default_fixes(decode) == ["batch:4", "batch:8", "batch:16", "batch:32"]
    assert default_fixes(validate_case(Case("gpt_small", workload="forward_backward", device="cuda"))) == ["checkpoint"]
    assert default_fixes(validate_case(Case("gpt_small", workload="forward", device="cuda"))) == []
    assert case_fixes(decode, ["none"]) == [] and case_fixes(decode, ["batch:3"]) == ["batch:3"]


def test_explain_by_module_records_module_ranges_and_keeps_the_tree(monkeypatch):
    """--by-module: the eager profile is asked for module ranges, and the tree of that trace (here the real H100
    by-module profile of gpt_small's forward) is the explanation's, in its JSON and on the console."""
    import io

    from rich.console import Console

    import perflab.explain as ex
    from perflab.report.explain_console import render_explanation

    case = validate_case(Case(model="gpt_small", seq_len=1024, batch_size=4, attn="explicit", mode="eager", device="cuda"))
    trace = load_trace(TRACES / "by_module_lm_forward.json.gz")
    asked = {}
    monkeypatch.setattr(ex, "measure_host_issue_ms", lambda c: 30.0)
    ceilings = {"graph_kernel_interval_us": 1.5, "graph_kernel_gap_us": 0.5, "matmul_tflops": {"fp32": 50.0}, "copy_gbps": 3000.0}
    run = lambda c: {"status": "ok", "median_ms": 37.7, "gflops_per_batch": 1000.0, "params": 120_000_000, "mfu": 0.5, "batch_size": 4}
    ce = ex.explain_case(case, Path("unused"), ceilings, 3, [], lambda cs: [run(c) for c in cs], lambda *a, **k: asked.update(k),
                         lambda p: trace, lambda s: None,
                         fixes=[], by_module=True)
    assert asked == {"steps": 3, "by_module": True}
    root = ce.modules[(ce.modules["pass"] == "forward") & (ce.modules["module"] == ".")].iloc[0]
    assert root["class"] == "GPT" and root["inclusive_ns"] == int(trace.kernels["dur_ns"].sum()) - int(
        ce.modules[ce.modules["module"] == "(unattributed)"]["exclusive_ns"].sum())
    records = ce.to_dict()["modules"]
    assert records[0]["module"] == "." and records[0]["inclusive_us_per_step"] == pytest.approx(root["inclusive_ns"] / 3 / 1000, abs=1e-3)
    buffer = io.StringIO()
    render_explanation(Console(file=buffer, width=200), ex.Explanation(cases=[ce], comparison=None, ceilings=ceilings))
    assert "GPU time by module" in buffer.getvalue() and "feed_forward" in buffer.getvalue()


def test_an_eager_fixs_prediction_has_a_host_term():
    # A synthetic step: its host needs 10 ms to issue it, its GPU 4 ms; measured 10.5 ms. A fix that adds 1 ms of GPU
    # work cannot lengthen it (the GPU still waits for the host); one that adds 8 ms does, by what rises above the host.
    from perflab.analysis.fixes import with_host_term

    launch_bound = {"median_ms": 10.5, "host_held_ms": 10.0, "device_ms": 4.0}
    predicted, model = with_host_term(11.5, "step + F", launch_bound)
    assert predicted == pytest.approx(10.5) and "host-bound" in model
    predicted, _ = with_host_term(18.5, "step + F", launch_bound)
    assert predicted == pytest.approx(10.5 * 12.0 / 10.0)
    # GPU-bound: host 2 ms, GPU 8 ms, measured 8.2 ms: the GPU's change carries through, anchored at the measurement
    predicted, model = with_host_term(9.2, "step + F", {"median_ms": 8.2, "host_held_ms": 2.0, "device_ms": 8.0})
    assert predicted == pytest.approx(8.2 * 9.0 / 8.0) and "with the host term" in model
    # without the held timing (older rows, the CPU) the GPU model stands
    assert with_host_term(9.2, "m", {"median_ms": 8.2}) == (9.2, "m")
