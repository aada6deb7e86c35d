"""The harness: result rows, and each validity check planted and caught."""

import json

import pytest

from perflab import api
from perflab.errors import PerflabError
from perflab.measure.energy import MonitorReport
from perflab.measure.harness import run_case
from perflab.spec import Case

FAST = dict(device="cpu", min_time=0.1, warmup=1, repeats=6)
# A shared CPU can make any short timing noisy, or so slow that the step estimate misses the minimum: high_cv and
# short_timing are then true readings, not planted faults.
NOISE = {"high_cv", "short_timing"}


class FakeMonitor:
    """Stands in for NVML: returns a fixed report for the timed loop."""

    available = True

    def __init__(self, **report):
        self.report = MonitorReport(**report)

    def device_info(self):
        return {"driver": "fake"}

    def begin(self):
        pass

    def end(self):
        return self.report


GOOD_GPU = dict(energy_j=12.0, power_w=300.0, sm_clock_mhz_end=1980)


def test_row_has_the_documented_keys_and_consistent_numbers():
    row = run_case(Case("test:tiny", batch_size=4, **FAST), monitor=FakeMonitor(**GOOD_GPU))
    required = ["case", "status", "model", "method", "keep_rate", "reduction_loc", "tokens", "input_size", "batch_size", "dtype",
                "mode", "device_name", "median_ms", "p10_ms", "p90_ms", "cv", "ci95_ms", "latency_ms_per_batch",
                "latency_ms_per_sample", "throughput_per_s", "gflops", "gmacs", "params_m", "peak_mem_alloc_mb",
                "peak_mem_reserved_mb", "energy_j", "power_w", "flags", "env"]
    assert not [k for k in required if k not in row]
    assert row["status"] == "ok" and set(row["flags"]) <= NOISE
    # The seed's tell-tale identity: throughput × latency per batch = images per batch.
    assert row["throughput_per_s"] * row["latency_ms_per_batch"] / 1000 == pytest.approx(4)
    assert row["latency_ms_per_sample"] == pytest.approx(row["latency_ms_per_batch"] / 4)
    assert row["p10_ms"] <= row["median_ms"] <= row["p90_ms"]
    assert row["ci95_ms"][0] <= row["median_ms"] <= row["ci95_ms"][1]
    assert row["gmacs"] == pytest.approx(row["gflops"] / 2)
    assert len(row["samples_ms"]) == row["n_samples"] == 6
    assert row["timed_iters"] == 6 * row["iters_per_sample"]
    assert row["case"]["model"] == "test:tiny" and row["case_id"] == Case("test:tiny", batch_size=4, **FAST).id
    assert row["host_canary_us"] > 0  # the host canary, timed just before the timed loop


def test_tiny_flops_at_the_measured_batch_size():
    # Tiny: conv 3→32 with 16×16 kernels on 4×4 patches of a 64 px image, then Linear 32→10.
    row = run_case(Case("test:tiny", batch_size=3, input_size=64, **FAST), monitor=FakeMonitor(**GOOD_GPU))
    per_image = 2 * 16 * (3 * 16 * 16) * 32 + 2 * 32 * 10
    assert row["gflops_per_batch"] * 1e9 == pytest.approx(3 * per_image)
    assert row["gflops"] * 1e9 == pytest.approx(per_image)


def test_tokens_recorded_for_token_reduction():
    row = run_case(Case("topk_deit_tiny_patch16_224", keep_rate=(0.1,), reduction_loc=(3, 6, 9), **FAST), monitor=FakeMonitor(**GOOD_GPU))
    assert row["tokens"] == [197, 21, 3, 2]
    assert "tokens_mismatch" not in row["flags"]


@pytest.mark.parametrize(
    "case,monitor,flag",
    [
        (Case("test:drops_batch", batch_size=4, **FAST), FakeMonitor(**GOOD_GPU), "batch_mismatch"),
        (Case("test:tiny", device="cpu", iters=3, warmup=0), FakeMonitor(**GOOD_GPU), "short_timing"),
        (Case("test:jitter", device="cpu", min_time=0.2, warmup=1, repeats=10), FakeMonitor(**GOOD_GPU), "high_cv"),
        (Case("test:tiny", **FAST), FakeMonitor(unavailable="NVML not usable"), "no_power"),
        (Case("test:tiny", **FAST), FakeMonitor(**GOOD_GPU, throttle_reasons=["sw_thermal"]), "throttled"),
        (Case("test:tiny", **FAST), FakeMonitor(**GOOD_GPU, other_processes=[4242]), "other_processes"),
    ],
    ids=["batch_mismatch", "short_timing", "high_cv", "no_power", "throttled", "other_processes"],
)
def test_each_planted_fault_is_flagged_with_a_warning(case, monitor, flag):
    row = run_case(case, monitor=monitor)
    assert row["status"] == "ok"
    assert flag in row["flags"], row["flags"]
    assert len(row["warnings"]) == len(row["flags"])
    others = set(row["flags"]) - {flag} - (NOISE - {flag})
    assert not others, f"unexpected flags {others}"


def test_cpu_runs_say_why_there_is_no_power_without_a_flag():
    row = run_case(Case("test:tiny", **FAST))
    assert "no_power" not in row["flags"] and not any("power" in w for w in row["warnings"])  # expected: no meter on a CPU
    assert row["power_note"] == "power and energy are measured on NVIDIA GPUs only (this run is on the CPU)"
    assert row["energy_j"] is None and row["power_w"] is None


def test_tokens_mismatch_is_flagged(monkeypatch):
    import perflab.models.registry as registry

    monkeypatch.setattr(registry, "expected_tokens", lambda case: [197, 20, 3, 2])
    row = run_case(Case("topk_deit_tiny_patch16_224", keep_rate=(0.1,), reduction_loc=(3, 6, 9), **FAST), monitor=FakeMonitor(**GOOD_GPU))
    assert "tokens_mismatch" in row["flags"]


def test_an_oom_becomes_a_row_and_the_other_cases_still_run():
    cases = [Case("test:tiny", **FAST), Case("test:oom", **FAST), Case("test:fails", **FAST), Case("test:tiny", batch_size=2, **FAST)]
    rows = api.bench(cases)
    assert [r["status"] for r in rows] == ["ok", "oom", "error", "ok"]
    assert "out of memory" in rows[1]["message"]
    assert rows[2]["message"] == "RuntimeError: planted failure (test:fails)"
    assert rows[1]["median_ms"] is None and rows[1]["flags"] == []
    assert all(r["host_canary_us"] > 0 for r in rows)  # failed cases too: the canary is a sample of the host, not of the case
    assert "host_drift" not in rows[1]["flags"] + rows[2]["flags"]  # only ok rows can be flagged


def test_the_canary_does_not_depend_on_the_case_around_it():
    from perflab.measure.harness import failed_row

    # fp32 runs without autocast, bf16 under CPU autocast, a training step with autograd on: the canary runs in a
    # fixed state inside, so all three measure the same work. Loose bound: it is about the state, not the noise.
    cases = [Case("test:tiny", **FAST), Case("test:tiny", dtype="bf16", **FAST), Case("gpt_small", workload="train_step", seq_len=16, layers=1, model_args={"d_model": 64, "d_ff": 96, "n_heads": 4, "vocab_size": 97}, **FAST)]
    canaries = [run_case(c, monitor=FakeMonitor(**GOOD_GPU))["host_canary_us"] for c in cases]
    assert min(canaries) > 0 and max(canaries) < 3 * min(canaries), canaries
    assert failed_row(Case("test:tiny", **FAST), "timeout", "killed", {})["host_canary_us"] is None  # a parent's row: no canary


def test_bad_input_raises_before_anything_runs():
    with pytest.raises(PerflabError, match="keep rate 2 is outside"):
        run_case(Case("topk_deit_tiny_patch16_224", keep_rate=(2.0,), reduction_loc=(3,), device="cpu"))


def test_make_cases_applies_keep_rates_to_reducing_models_only():
    cases = api.make_cases(model=["deit_tiny_patch16_224", "topk_deit_tiny_patch16_224"], keep_rate=[0.1], reduction_loc=[3, 6, 9],
                           batch_size=[1, 8], device="cpu")
    assert len(cases) == 4
    assert {c.keep_rate for c in cases if c.method == "baseline"} == {()}
    assert {c.keep_rate for c in cases if c.method == "topk"} == {(0.1,)}


def test_bench_runs_a_value_given_twice_once(tmp_path):
    """bench --model X X --batch-size 2 1 2: two cases, in the order first given (four rows could not be told apart)."""
    from cli_util import run_cli_here

    out = tmp_path / "rows.jsonl"
    result = run_cli_here("bench", "--model", "test:tiny", "test:tiny", "--batch-size", "2", "1", "2", "--input-size", "32",
                          "--device", "cpu", "--iters", "2", "--repeats", "2", "--warmup", "1", "--no-pin", "--out", out)
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["batch_size"] for r in rows] == [2, 1] and len({r["case_id"] for r in rows}) == 2


def test_autocast_casts_each_weight_once_across_steps():
    """With bf16 the timed steps must not re-cast the weights (the seed harness did, every step)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from perflab.runtime.workload import precision

    lin = torch.nn.Linear(64, 64)
    x = torch.randn(4, 64)
    with torch.no_grad(), precision("bf16", "cpu"):  # the contexts the harness holds around its loop
        lin(x)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(3):
                lin(x)
    copies = sum(e.count for e in prof.key_averages() if e.key == "aten::_to_copy")
    assert copies == 3  # the input, once per step; the weight and bias were cast before and cached


def test_iters_is_the_exact_number_of_timed_steps():
    row = run_case(Case("test:tiny", device="cpu", iters=7, repeats=3, warmup=0), monitor=FakeMonitor(**GOOD_GPU))
    assert row["timed_iters"] == 7 and row["n_samples"] == 3


def test_utilisation_of_a_decode_row_with_an_h100s_ceilings(monkeypatch):
    """The GPU-only part of a row (MFU, MBU, roofline), fed the H100's measured ceilings: checked on the CPU."""
    import perflab.measure.ceilings as ceilings
    from perflab.measure import harness
    from perflab.runtime.device import GpuIdentity

    monkeypatch.setattr(ceilings, "get_ceilings", lambda refresh=False: {"matmul_tflops": {"bf16": 787.1}, "copy_gbps": 2971.0})
    monkeypatch.setattr(harness, "gpu_identity", lambda *a: GpuIdentity(0, "NVIDIA H100 80GB HBM3", "GPU-0", (9, 0), 85_520_809_984, 132))
    case = Case("llama3_8b", workload="decode", context_len=512, dtype="bf16", device="cuda")
    bytes_per_step, flops, counted = 15_077_228_544, 16_060_000_000, 16_100_000_000
    row = {"median_ms": 6.815, "bytes_per_step": bytes_per_step, "flops_analytic": flops, "gflops_per_batch": counted / 1e9,
           "achieved_tflops": counted / 6.815e-3 / 1e12}
    out = harness.utilisation(case, row)
    assert out["mbu"] == pytest.approx(bytes_per_step / 6.815e-3 / 1e9 / 2971.0) == pytest.approx(0.7447, abs=1e-4)
    assert out["mbu_datasheet"] == pytest.approx(bytes_per_step / 6.815e-3 / 1e9 / 3350.0)
    # one FLOP count per row: MFU and the roofline by the counted FLOPs; the formula's count beside them, with the ratio
    assert out["roofline_bound"] == "memory" and out["arithmetic_intensity"] == pytest.approx(counted / bytes_per_step)
    assert out["roofline_fraction"] == pytest.approx(out["mbu"])  # below the ridge the roof is intensity × bandwidth
    assert out["mfu"] == pytest.approx(counted / 6.815e-3 / 1e12 / 787.1)
    assert out["flops_counted_over_analytic"] == pytest.approx(counted / flops)
    assert out["mfu_analytic"] == pytest.approx(flops / 6.815e-3 / 1e12 / 787.1)


def test_no_warmup_output_lives_through_the_timed_loop(monkeypatch):
    """A train_forward step returns logits that hold their autograd graph: the harness must drop the last warm-up
    output before timing, or every saved activation of one extra step counts in the measured peak memory."""
    import weakref

    from perflab.measure import harness

    outputs = []
    real_make_step = harness.make_step

    def recording_make_step(built, mode):
        step = real_make_step(built, mode)

        def recorded():
            out = step()
            outputs.append(weakref.ref(out))
            return out

        return recorded

    alive_at_timing = []
    real_time_step = harness.time_step

    def checking_time_step(step, plan, device):
        alive_at_timing.append(sum(ref() is not None for ref in outputs))
        return real_time_step(step, plan, device)

    monkeypatch.setattr(harness, "make_step", recording_make_step)
    monkeypatch.setattr(harness, "time_step", checking_time_step)
    case = Case("gpt_small", workload="train_forward", layers=1, model_args={"d_model": 32, "d_ff": 64, "n_heads": 2}, seq_len=8,
                batch_size=2, device="cpu", warmup=2, iters=2, repeats=2)
    row = harness.run_case(case)
    assert row["status"] == "ok", row.get("message")
    assert len(outputs) >= 3 and alive_at_timing == [0]


def test_compiled_cases_release_dynamos_caches_and_graph_trees_when_measured(monkeypatch):
    # a reduce-overhead case's CUDA-graph tree must not outlive it: the next compiled case would record into it
    from types import SimpleNamespace

    import torch

    from perflab.measure.harness import release_compiled

    calls = []
    monkeypatch.setattr(torch._dynamo, "reset", lambda: calls.append(1))
    release_compiled([SimpleNamespace(mode="eager"), SimpleNamespace(mode="cudagraph")])
    assert calls == []
    release_compiled([SimpleNamespace(mode="eager"), SimpleNamespace(mode="compile:reduce-overhead")])
    assert calls == [1]
    release_compiled([])
    assert calls == [1]
