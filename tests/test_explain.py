"""explain's pieces on real traces: the CUDA-graph prediction, the host issue time, the byte floor."""

from pathlib import Path

import numpy as np
import pytest

from perflab.analysis.launch import traced_host_issue_ms
from perflab.diagnosis.explanation import min_bytes, predict_modes
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
    assert traced_host_issue_ms(eager) == pytest.approx(expected)
    assert 0 < traced_host_issue_ms(eager) < 50


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


LM_CASE = dict(model="gpt_small", layers=2, model_args={"d_model": 256, "d_ff": 1024, "n_heads": 4}, seq_len=128, batch_size=4,
               dtype="bf16", workload="train_step", attn="explicit", mode="eager", device="cuda")
CEILINGS = {"graph_kernel_interval_us": 1.5, "graph_kernel_gap_us": 0.5, "matmul_tflops": {"bf16": 700.0}, "copy_gbps": 3000.0}


def fake_row(c):
    """A measured row by the case's settings: eager 10 ms (host 9, GPU 6: launch-bound), cudagraph 8 ms (host 0.5, GPU 7.8);
    foreach +0.5 ms, checkpoint +1 ms."""
    ms = {"eager": 10.0}.get(c.mode, 8.0) + (0.5 if c.optimizer == "foreach" else 0) + (1.0 if c.checkpoint_activations else 0)
    host, gpu = (9.0, 6.0) if c.mode == "eager" else (0.5, ms - 0.2)
    return {"status": "ok", "median_ms": ms, "gflops_per_batch": 100.0, "params": 5_000_000, "first_step_s": 1.5 if c.mode == "eager" else 40.0,
            "peak_mem_alloc_mb": 900.0 if c.checkpoint_activations else 1000.0, "mfu": 0.3, "batch_size": c.batch_size,
            "host_held_ms": host, "device_ms": gpu, "flops_analytic": 90e9}


def run_explain(monkeypatch, fixes, fixes_on="best", modes=("cudagraph",), on_stage=lambda s: None):
    import perflab.diagnosis.explanation as ex

    case = validate_case(Case(**LM_CASE))
    trace = load_trace(TRACES / "lm_train_step_explicit.json.gz")
    sessions = []

    def run_cases(cases):
        sessions.append([c.label() for c in cases])
        return [fake_row(c) for c in cases]

    monkeypatch.setattr(ex, "measure_host_issue_ms", lambda c: 4.0)
    ce = ex.explain_case(case, Path("unused"), CEILINGS, 2, list(modes), run_cases, lambda *a, **k: None, lambda p: trace, on_stage,
                         fixes=fixes, fixes_on=fixes_on)
    return ce, sessions, trace


def test_explain_counts_its_parts_as_they_begin_and_its_progress_says_them_in_a_pipe(monkeypatch):
    """Each part of explain_case begins with a Stage that counts it (the two timing sessions with their cases, the
    profile pass, the host's issue), as many as case_parts said beforehand; report.progress draws them as lines."""
    import io

    from rich.console import Console

    import perflab.diagnosis.explanation as ex
    from perflab.report.progress import ExplainProgress

    fixes = ex.default_fixes(validate_case(Case(**LM_CASE)))
    stages = []
    run_explain(monkeypatch, fixes, on_stage=stages.append)
    parts = [(s.done, s.total, len(s.cases)) for s in stages]
    assert parts == [(0, 4, 2), (1, 4, 5), (2, 4, 0), (3, 4, 0)]  # eager and cudagraph; cudagraph again and the 4 fixes on it
    assert ex.case_parts(validate_case(Case(**LM_CASE)), ["cudagraph"], fixes) == 4
    assert ex.case_parts(validate_case(Case(**LM_CASE)), ["cudagraph"], fixes, fixes_on="eager") == 3  # one session
    buffer = io.StringIO()
    now = [0.0]
    with ExplainProgress(Console(file=buffer, width=300), clock=lambda: now[0], interval=10.0, ticker=False) as drawer:
        for stage in stages:
            now[0] += 10.0
            drawer.on_stage(stage)
    lines = buffer.getvalue().splitlines()
    # the first part starts the clock and says nothing (work shorter than the interval keeps quiet); each later one
    # comes an interval on, so each is a line; the end is said because a line was
    assert lines == [f"perflab explain: {s.done}/4 parts, 0:{10 * k:02d} elapsed{left}: {s}"
                     for k, (s, left) in enumerate(zip(stages, ["", ", about 0:30 left", ", about 0:20 left", ", about 0:10 left"]))
                     if k > 0] + ["perflab explain: 4/4 parts, 0:30 elapsed: done"]


def test_explain_case_per_pass_floors_and_fixes_on_the_best_mode_with_a_real_trace(monkeypatch):
    """explain_case end to end on the CPU: the run, profile and trace are fakes around the real H100 profile of a
    2-layer GPT train_step (the case it was captured from); floors per pass; eager and the modes timed first, then the
    fixes on the fastest (cudagraph), timed together with it, each predicted from the base's host and GPU times."""
    import io
    import json

    from rich.console import Console

    import perflab.diagnosis.explanation as ex
    from perflab.analysis.fixes import ADAMW_BYTES_PER_PARAM
    from perflab.report.explain_console import render_explanation

    fixes = ex.default_fixes(validate_case(Case(**LM_CASE)))
    assert fixes == ["optimizer:foreach", "optimizer:in_backward", "optimizer:in_backward_stream", "checkpoint"]
    fixes.append("compile:reduce-overhead+optimizer:in_backward_stream")
    ce, sessions, trace = run_explain(monkeypatch, fixes)
    # session 1: eager, the mode, and the fix that names its own mode; session 2: the best mode again and the four fixes on it
    assert len(sessions) == 2 and len(sessions[0]) == 3 and len(sessions[1]) == 5
    assert all("cudagraph" in label for label in sessions[1])

    sf = ce.step_floors
    assert [p.name for p in sf.passes] == ["forward", "backward", "optimizer"]
    assert sum(p.host_ms for p in sf.passes) == pytest.approx(4.0, abs=1e-12)  # the untraced host time, split exactly
    assert sf.floor_ms == pytest.approx(sum(p.floor_ms for p in sf.passes), abs=1e-12)
    costs = ex.pass_costs(ce.case, ce.eager_row)
    assert sum(p.bytes for p in sf.passes) == sum(c["bytes"] for c in costs.values()) == ex.min_bytes(ce.case, ce.eager_row)
    assert [p.gpu_ms for p in sf.passes] == [ce.timing[n]["gpu_ns"] / 1e6 for n in ("forward", "backward", "optimizer")]
    # one FLOP count: the passes add up to the row's counted 100 GFLOP; the formula's split kept beside it
    from perflab.workloads.lm import lm_pass_costs

    formula = lm_pass_costs(ce.case, ce.eager_row)
    assert sum(p.flops for p in sf.passes) == pytest.approx(100e9) and sf.flops_analytic == pytest.approx(sum(c["flops"] for c in formula.values()))
    assert [p.flops_analytic for p in sf.passes] == [formula[n]["flops"] for n in ("forward", "backward")] + [0.0]
    d = sf.to_dict()
    assert d["mfu_analytic"] == pytest.approx(d["mfu"] * sf.flops_analytic / 100e9)

    by = {fx.name: fx for fx in ce.fix_results}
    o = ce.timing["optimizer"]["gpu_ns"] / 1e6
    # on the cudagraph base (8 ms: host 0.5, GPU 7.8 ms, one pass): base × max(host, GPU + Δ) ÷ max(host, GPU)
    foreach = by["optimizer:foreach"]
    assert foreach.base == "cudagraph" and foreach.base_ms == 8.0
    assert foreach.predicted_ms == pytest.approx(8.0 * (7.8 + o * (ADAMW_BYTES_PER_PARAM["foreach"] / 28 - 1)) / 7.8)
    assert foreach.predicted_gpu_ms == pytest.approx(7.8 + 2 * o) and foreach.predicted_host_ms == pytest.approx(0.5)
    # in_backward: O' = O (fused bytes), no idle to hide in on a compiled base, the update's host time moves with it
    assert by["optimizer:in_backward"].predicted_ms == pytest.approx(8.0)
    forward_fused = ex.compiled_pass_ms(trace, "forward", 1.5, 0.5)
    assert 0 < forward_fused < ce.timing["forward"]["gpu_ns"] / 1e6  # fusion halves the glue kernels
    ckpt = by["checkpoint"]
    assert ckpt.predicted_ms == pytest.approx(8.0 * (7.8 + forward_fused) / 7.8)
    assert ckpt.measured_ms == 9.0 and ckpt.error == pytest.approx(ckpt.predicted_ms / 9.0 - 1)
    combo = by["compile:reduce-overhead+optimizer:in_backward_stream"]
    assert combo.changes == {"mode": "compile:reduce-overhead", "optimizer": "in_backward_stream"} and combo.predicted_ms is None
    assert combo.measured_ms == 8.0 and combo.measured["first_step_s"] == 40.0

    d = ce.to_dict()
    json.dumps(d)  # --json
    assert d["pass_floors"]["floor_ms"] == pytest.approx(sf.floor_ms) and len(d["fix_predictions"]) == 5
    assert d["fix_predictions"][0]["base"] == "cudagraph" and d["fix_predictions"][0]["speedup_vs_base"] == pytest.approx(8.0 / 8.5)
    assert d["fixes"][0]["speedup"] == pytest.approx(10.0 / 8.0) and d["first_step_s"]["cudagraph"] == 40.0
    buf = io.StringIO()
    render_explanation(Console(file=buf, width=300), ex.Explanation([ce], None, CEILINGS))
    text = buf.getvalue()
    assert "Floors per pass" in text and "optimizer:in_backward_stream" in text and "the floors allow at best MFU" in text
    assert "cudagraph (base, timed with its fixes)" in text
    from perflab.report.explain_markdown import explanation_markdown

    md = explanation_markdown(ex.Explanation([ce], None, CEILINGS))
    assert "| optimizer |" in md and f"**{sf.floor_ms:.3f} ms**" in md and "`checkpoint`: + the forward's GPU time after fusion" in md
    assert (f"| 4 | `checkpoint` | cudagraph | {ckpt.predicted_ms:.3f} | 9.000 | {ckpt.error:+.1%} | {8.0 / 9.0:.2f}× | {10.0 / 9.0:.2f}× | "
            f"0.50 / 0.50 | {ckpt.predicted_gpu_ms:.2f} / 8.80 |") in md
    assert "| 5 | `compile:reduce-overhead+optimizer:in_backward_stream` | as given |" in md
    assert "MFU of counted FLOPs (0.100 TFLOP per step); the formula's 0.090 TFLOP, counted ÷ formula 1.1111" in md


def test_fixes_on_eager_use_the_eager_profiles_host_and_gpu_per_pass(monkeypatch):
    """--fixes-on eager: one session; each prediction is eager × Σ max(host, GPU) after ÷ before, over the profiled
    passes (host: the untraced 4 ms split as the trace issued it)."""
    ce, sessions, _ = run_explain(monkeypatch, ["optimizer:foreach", "checkpoint"], fixes_on="eager")
    assert len(sessions) == 1 and len(sessions[0]) == 4
    host = {p.name: p.host_ms for p in ce.step_floors.passes}
    gpu = {p.name: p.gpu_ms for p in ce.step_floors.passes}
    before = sum(max(host[p], gpu[p]) for p in host)
    by = {fx.name: fx for fx in ce.fix_results}
    o = gpu["optimizer"]
    after = before - max(host["optimizer"], o) + max(host["optimizer"], 3 * o)
    assert by["optimizer:foreach"].predicted_ms == pytest.approx(10.0 * after / before) and by["optimizer:foreach"].base == "eager"
    after = before - max(host["backward"], gpu["backward"]) + max(host["backward"] + host["forward"], gpu["backward"] + gpu["forward"])
    assert by["checkpoint"].predicted_ms == pytest.approx(10.0 * after / before)
    assert by["checkpoint"].predicted_host_ms == pytest.approx(4.0 + host["forward"])


def test_fixes_on_a_named_mode_time_it_with_the_rest_in_one_session(monkeypatch):
    ce, sessions, _ = run_explain(monkeypatch, ["optimizer:foreach"], fixes_on="compile:reduce-overhead")
    assert len(sessions) == 1 and len(sessions[0]) == 4  # eager, cudagraph, the named base, the fix on it
    assert set(ce.measured) == {"cudagraph", "compile:reduce-overhead"}
    (fx,) = ce.fix_results
    assert fx.base == "compile:reduce-overhead" and fx.base_ms == 8.0 and fx.measured_ms == 8.5


def test_a_fix_the_best_mode_refuses_is_measured_on_eager_and_says_so(monkeypatch):
    import perflab.spec as spec

    real = spec.validate_case

    def refuse(case):
        if case.mode == "cudagraph" and case.checkpoint_activations:
            from perflab.errors import PerflabError

            raise PerflabError("checkpoint cannot be captured (a test's refusal)")
        return real(case)

    monkeypatch.setattr(spec, "validate_case", refuse)
    ce, sessions, _ = run_explain(monkeypatch, ["optimizer:foreach", "checkpoint"])
    # session 2: the base, eager (the refused fix's base), the fix on the base and the refused one on eager
    assert len(sessions[1]) == 4 and sum("eager" in label for label in sessions[1]) == 2
    ckpt = next(fx for fx in ce.fix_results if fx.name == "checkpoint")
    assert ckpt.base == "eager" and "eager only on cudagraph: checkpoint cannot be captured" in ckpt.eager_only
    from perflab.report.explain_markdown import explanation_markdown
    import perflab.diagnosis.explanation as ex

    assert "| `checkpoint` | eager only (eager only on cudagraph: checkpoint cannot be captured" in explanation_markdown(
        ex.Explanation([ce], None, CEILINGS))


def test_a_missed_prediction_names_the_term_that_missed():
    from perflab.analysis.fixes import Fix

    fx = Fix("checkpoint", {"checkpoint_activations": True}, 134.7, "m", predicted_host_ms=166.8, predicted_gpu_ms=83.6)
    fx.measured = {"status": "ok", "median_ms": 255.9, "host_issue_ms": 290.0, "device_ms": 84.0}
    assert fx.missed_term == "host: predicted 166.800, measured 290.000 ms"
    fx.measured = {"status": "ok", "median_ms": 140.0, "host_issue_ms": 290.0, "device_ms": 84.0}
    assert fx.missed_term is None  # within 15%


@pytest.mark.parametrize("spec,changes", [
    ("optimizer:foreach", {"optimizer": "foreach"}),
    ("checkpoint", {"checkpoint_activations": True}),
    ("batch:8", {"batch_size": 8}),
    ("compile:max-autotune", {"mode": "compile:max-autotune"}),
    ("cudagraph+optimizer:in_backward", {"mode": "cudagraph", "optimizer": "in_backward"}),
])
def test_fix_specs(spec, changes):
    from perflab.diagnosis.explanation import parse_fix

    assert parse_fix(spec) == changes


@pytest.mark.parametrize("spec", ["speedup", "batch:0", "batch:x", "optimizer:", "compile:fast"])
def test_bad_fix_specs_are_one_line_errors(spec):
    from perflab.errors import PerflabError
    from perflab.diagnosis.explanation import parse_fix

    with pytest.raises(PerflabError, match="unknown fix"):
        parse_fix(spec)


def test_default_fixes_per_family():
    from perflab.diagnosis.explanation import case_fixes, default_fixes

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

    import perflab.diagnosis.explanation as ex
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
    # A synthetic step of one pass: its host needs 10 ms to issue it, its GPU 4 ms; measured 10.5 ms. A fix that adds 1 ms
    # of GPU work cannot lengthen it (the GPU still waits for the host); one that adds 8 ms does, by what rises above the
    # host. On a GPU-bound step (host 2, GPU 8, measured 8.2 ms) the GPU's change carries through, anchored at the measurement.
    from perflab.analysis.fixes import Delta, StepTimes, predict_step_ms

    launch_bound = StepTimes({"step": 10.0}, {"step": 4.0})
    p = predict_step_ms(10.5, launch_bound, Delta({"step": 1.0}, {}, "+1 ms GPU"))
    assert p.ms == pytest.approx(10.5) and p.host_ms == 10.0 and p.gpu_ms == 5.0 and "host the larger" in p.model
    assert predict_step_ms(10.5, launch_bound, Delta({"step": 8.0}, {}, "+8")).ms == pytest.approx(10.5 * 12.0 / 10.0)
    assert predict_step_ms(8.2, StepTimes({"step": 2.0}, {"step": 8.0}), Delta({"step": 1.0}, {}, "+1")).ms == pytest.approx(8.2 * 9.0 / 8.0)
    # a host term of the fix's own: +3 ms of host on the launch-bound step lengthens it by 3 ÷ 10
    assert predict_step_ms(10.5, launch_bound, Delta({}, {"step": 3.0}, "+3 host")).ms == pytest.approx(10.5 * 13.0 / 10.0)
    # without host and GPU times the GPU model stands: base + ΔGPU
    p = predict_step_ms(8.2, None, Delta({"step": 1.0}, {}, "m"))
    assert p.ms == pytest.approx(9.2) and "GPU only" in p.model and p.host_ms is None


def test_held_timing_takes_the_median_of_its_rounds_so_one_preempted_round_is_not_the_rows_host_time(monkeypatch):
    """Three rounds; one whose issuing thread was preempted (1.28 ms against 0.03 ms) and one whose host waited
    for the GPU (None) do not set the row's figures: the median of the good rounds does."""
    from perflab.measure import host

    rounds = iter([host.HeldTiming(0.78e-3, 1.28e-3, 3), host.HeldTiming(None, None, 1, "waited"),
                   host.HeldTiming(0.77e-3, 0.03e-3, 3), host.HeldTiming(0.79e-3, 0.04e-3, 3)])
    monkeypatch.setattr(host, "held_round", lambda *a, **k: next(rounds))
    got = host.held_timing(lambda: None, "cuda", 1e-4, rounds=4)
    assert got.host_s == pytest.approx(0.04e-3) and got.device_s == pytest.approx(0.78e-3)
    assert got.steps == 9 and got.note is None
    # every round failed: the last one's note says why
    monkeypatch.setattr(host, "held_round", lambda *a, **k: host.HeldTiming(None, None, 1, "waited"))
    assert host.held_timing(lambda: None, "cuda", 1e-4).note == "waited"
    # on the CPU: no GPU time
    monkeypatch.undo()
    assert host.held_timing(lambda: None, "cpu", 1e-4) == host.HeldTiming(None, None, 3, "no GPU")


def test_a_mode_far_from_its_prediction_says_why_from_its_held_timing():
    """A mode's prediction models the GPU alone; its held timing says which part missed (figures: deit_tiny bs1 bf16 on
    an H200, docs/performance.md)."""
    from perflab.diagnosis.explanation import mode_miss

    ro = {"status": "ok", "median_ms": 0.494, "host_held_ms": 0.278, "device_ms": 0.491}
    why = mode_miss("compile:reduce-overhead", 0.377, ro, graph_ms=0.520, glue_ms=0.290)
    assert why == ("predicted 0.377 ms, measured 0.494 (-23.7%): the GPU term: predicted 0.377, measured 0.491 ms a step "
                   "(host 0.278 ms); fusion removed 10% of the 0.290 ms the glue kernels take as a graph (the CUDA-graph "
                   "prediction 0.520 ms less the measured GPU time), the model removes 50%")
    slow_host = {"status": "ok", "median_ms": 0.709, "host_held_ms": 0.702, "device_ms": 0.488}
    assert mode_miss("compile:reduce-overhead", 0.377, slow_host).startswith(
        "predicted 0.377 ms, measured 0.709 (-46.8%): host-bound: issuing a step takes the host 0.702 ms, its GPU time is 0.488 ms")
    assert "dynamo's guards" in mode_miss("compile:reduce-overhead", 0.377, slow_host)
    assert "dynamo" not in mode_miss("cudagraph", 0.377, slow_host)
    assert mode_miss("cudagraph", 0.50, {"status": "ok", "median_ms": 0.532, "host_held_ms": 0.034, "device_ms": 0.531}) is None  # −6%
    assert mode_miss("cudagraph", 0.30, {"status": "ok", "median_ms": 0.532}).endswith("which part missed is not known")
    # a host above the GPU but far short of the step does not make it host-bound: the step waits on neither
    short = mode_miss("compile:reduce-overhead", 0.40, {"status": "ok", "median_ms": 1.000, "host_held_ms": 0.500, "device_ms": 0.400})
    assert "host-bound" not in short and "neither term reaches the step: the host issues it in 0.500 ms" in short
    assert mode_miss("cudagraph", 0.30, {"status": "error", "message": "x"}) is None


def test_a_mode_whose_gpu_term_is_within_15_percent_is_not_said_to_have_missed_on_the_gpu():
    """The step missed, but the GPU time held apart is within 15% of the prediction and the host's is below it: the miss
    is in neither term alone, and the line must not blame the GPU term with figures that show it on target."""
    from perflab.diagnosis.explanation import mode_miss

    overlapped_less = {"status": "ok", "median_ms": 0.700, "host_held_ms": 0.300, "device_ms": 0.520}
    why = mode_miss("compile:reduce-overhead", 0.500, overlapped_less, graph_ms=0.600, glue_ms=0.290)
    assert why == ("predicted 0.500 ms, measured 0.700 (-28.6%): not the GPU term (predicted 0.500, measured 0.520 ms a "
                   "step, -3.8%) nor the host's (0.300 ms, below the GPU's): the step as timed is longer than both, so its "
                   "host issue and GPU work overlapped less than the model, which counts the GPU alone, assumes")
    faster = {"status": "ok", "median_ms": 0.400, "host_held_ms": 0.300, "device_ms": 0.480}
    assert mode_miss("cudagraph", 0.500, faster).endswith(
        "(predicted 0.500, measured 0.480 ms a step, +4.2%) nor the host's (0.300 ms, below the GPU's): the step as timed "
        "is shorter than its GPU time held apart, so the two timings disagree")


def test_the_glue_time_fusion_removed_is_taken_from_the_cuda_graphs_measured_gpu_time(monkeypatch):
    """deit_tiny bs1 bf16 on an H200 (docs/performance/explain-fixes.md): the plain graph ran 0.531 ms of GPU work a
    step, reduce-overhead 0.491: fusion removed 0.040 ms, 14% of the glue kernels' 0.290 ms. Against the CUDA-graph
    prediction (0.488 ms, itself 8% short of the graph as measured) it read -1%: the graph model's error counted as
    fusion's. The prediction stands in only where the cudagraph mode was not measured."""
    ce, _, _ = run_explain(monkeypatch, [])
    ce.predictions_ms = {"cudagraph": 0.488, "compile:reduce-overhead": 0.377}
    ce.glue_ms = 0.290
    ro = {"status": "ok", "median_ms": 0.494, "host_held_ms": 0.278, "device_ms": 0.491}
    ce.measured = {"cudagraph": {"status": "ok", "median_ms": 0.532, "host_held_ms": 0.034, "device_ms": 0.531}, "compile:reduce-overhead": ro}
    assert list(ce.mode_misses()) == ["compile:reduce-overhead"]  # cudagraph: -8.3%, within 15%
    assert ce.mode_misses()["compile:reduce-overhead"].endswith(
        "fusion removed 14% of the 0.290 ms the glue kernels take as a graph (the CUDA graph's measured GPU time 0.531 ms less "
        "the measured GPU time), the model removes 50%")
    ce.measured["cudagraph"] = {"status": "oom", "message": "x"}
    assert ce.mode_misses()["compile:reduce-overhead"].endswith(
        "fusion removed -1% of the 0.290 ms the glue kernels take as a graph (the CUDA-graph prediction 0.488 ms less the "
        "measured GPU time), the model removes 50%")


def test_the_glue_time_is_the_graph_time_of_the_glue_kernels(eager):
    from perflab.diagnosis.explanation import glue_graph_ms

    _, per_step = steps_by_hand(eager)
    interval, gap = 1.5, 0.4
    glue = {"elementwise", "copy", "norm", "softmax", "reduction", "triton_fused", "memset"}
    by_hand = np.mean([np.maximum(s["dur_ns"].to_numpy() + gap * 1e3, interval * 1e3)[s["category"].astype(str).isin(glue).to_numpy()].sum()
                       for s in per_step]) / 1e6
    assert glue_graph_ms(eager, interval, gap) == pytest.approx(by_hand, rel=1e-12)
    assert 0 < by_hand < predict_modes(eager, interval, gap)["cudagraph"]


def test_the_report_says_why_a_mode_missed(monkeypatch):
    from perflab.report.explain_markdown import explanation_markdown
    import perflab.diagnosis.explanation as ex

    ce, _, _ = run_explain(monkeypatch, [])
    ce.predictions_ms["cudagraph"] = 5.0  # measured 8.0 ms: host 0.5, GPU 7.8
    md = explanation_markdown(ex.Explanation([ce], None, CEILINGS))
    assert "- cudagraph: predicted 5.000 ms, measured 8.000 (-37.5%): the GPU term: predicted 5.000, measured 7.800 ms a step (host 0.500 ms)" in md
    assert ce.to_dict()["mode_misses"] == {"cudagraph": ce.mode_misses()["cudagraph"]}


def test_explain_on_the_cpu_says_what_it_explains_there(tmp_path):
    # a CPU-only host is told --device cpu by the device check; explain then names the CPU case it takes, not only cuda
    from perflab import api
    from perflab.errors import PerflabError

    (case,) = api.make_cases(model=["deit_tiny_patch16_224"], device="cpu")
    with pytest.raises(PerflabError, match=r"needs a CUDA GPU \(--device cuda\); on the CPU it explains a --parallel case "
                                           r"\(--parallel ddp --world-size 2 --device cpu\)"):
        api.explain(case, out_dir=tmp_path)
