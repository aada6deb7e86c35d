"""profile, explain and ncu on a real GPU (DeiT-B, the seed's settings)."""

import math

import torch

from perflab import api
from perflab.spec import Case, validate_case

TOPK = dict(keep_rate=(0.1,), reduction_loc=(3, 6, 9))


def test_profile_deit_b_bs1_bf16_eager_is_launch_bound_and_reports_inflation(tmp_path):
    case = validate_case(Case("deit_base_patch16_224", dtype="bf16", device="cuda"))
    result = api.profile_case(case, tmp_path, steps=5)
    report = result["report"]
    assert result["inflation"] > 1.0  # the profiler slows a launch-bound step down
    assert report.verdict.launch_bound, report.verdict
    assert len(report.steps) == 5
    kernels = report.kernels
    assert (kernels["launch_api"].astype(str) != "").all()  # every activity linked to its launch
    ranges = set(kernels["range"].astype(str))
    assert {"block3.attn", "block3.mlp", "block11.mlp", "patch_embed", "head"} <= ranges
    identity = report.steps["busy_ns"] + report.steps["host_bound_ns"] + report.steps["kernel_gap_ns"] + report.steps["other_ns"]
    assert (identity == report.steps["wall_ns"]).all()


def test_profile_context_manager_on_a_user_loop(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 10)).cuda()
    x = torch.randn(32, 256, device="cuda")
    with api.profile(steps=4, out=tmp_path / "loop.json.gz") as p:
        for _ in range(8):
            model(x).sum().backward()
            p.step()
    assert len(p.analysis.steps) == 4
    assert p.analysis.kernel_stats.kernels > 4 * 5


def test_explain_predicts_cuda_graph_time_within_15_percent(tmp_path):
    case, base = api.make_cases(model=["topk_deit_base_patch16_224", "deit_base_patch16_224"], dtype=["bf16"], device="cuda", keep_rate=[0.1], reduction_loc=[3, 6, 9])
    result = api.explain(case, base, out_dir=tmp_path, modes=["cudagraph"])
    for ce in result.cases:
        measured = ce.measured["cudagraph"]["median_ms"]
        predicted = ce.predictions_ms["cudagraph"]
        assert abs(predicted / measured - 1) < 0.15, (ce.case.label(), predicted, measured)
        assert ce.floors.verdict == "launch-bound"
    assert abs(result.comparison.closure_ns()) < 1e-3
    assert result.comparison.b.kernels > result.comparison.a.kernels  # top-k adds kernels


def test_a_reduce_overhead_prediction_is_within_15_percent_or_says_why(tmp_path):
    """deit_tiny bs1 bf16: the GPU-only models missed reduce-overhead by 23-47% on H200 hosts (its call's Python on the
    host, and less fusion than the model's half); each mode is within 15% or carries the reason, from its held timing."""
    (case,) = api.make_cases(model=["deit_tiny_patch16_224"], batch_size=[1], dtype=["bf16"], device="cuda")
    (ce,) = api.explain(case, out_dir=tmp_path).cases
    misses = ce.mode_misses()
    for mode, row in ce.measured.items():
        error = ce.predictions_ms[mode] / row["median_ms"] - 1
        if abs(error) <= 0.15:
            assert mode not in misses
            continue
        reason = misses[mode]
        assert reason.startswith(f"predicted {ce.predictions_ms[mode]:.3f} ms, measured {row['median_ms']:.3f} ({error:+.1%})"), reason
        host, gpu = row.get("host_held_ms") or row.get("host_issue_ms"), row.get("device_ms")
        if host is None or gpu is None:
            assert reason.endswith("which part missed is not known"), reason
        else:
            # host-bound where the host's time is above the GPU's and reaches the step as timed (within 15%)
            bound = host > gpu and host >= row["median_ms"] * 0.85
            assert ("host-bound" in reason) == bound and (f"{gpu:.3f}" in reason), reason


def test_ncu_reads_every_metric_for_at_least_5_kernels(tmp_path):
    from perflab.trace.ncu import METRICS

    case = validate_case(Case("deit_base_patch16_224", dtype="bf16", device="cuda"))
    table, _ = api.ncu(case, top=8, out_dir=tmp_path)
    complete = table.dropna(subset=list(METRICS))
    assert len(complete) >= 5, table
    assert all(not math.isnan(v) for v in complete["duration_ns"])
    assert set(complete["roofline"]) <= {"compute-bound", "memory-bound", "latency-bound"}
