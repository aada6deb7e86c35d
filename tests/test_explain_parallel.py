"""`perflab explain --parallel` on two gloo ranks of the CPU (one launch for the base, one for its fix), through the same
launcher, profile and CLI as on GPUs: the communication section's bytes by hand, the accounting closing, the floor's
arithmetic, DDP's buckets as torch rebuilt them, and the FSDP fix's bytes, prediction and measurement."""

import math
import statistics

import pytest

from cli_util import assert_one_line_error, assert_progress_lines, run_cli_here

# the model's parameters by hand: embeddings and output 256 x 64 each, wqkv 3 x 64 x 64, wo 64 x 64, w1, w2, w3 128 x 64 each,
# three RMSNorm weights of 64
PARAMS = 2 * 256 * 64 + 3 * 64 * 64 + 64 * 64 + 3 * 128 * 64 + 3 * 64
MIB = 2**20


@pytest.fixture
def explained(explain_ddp_run):  # conftest: one run, read here and by test_parallel_fsdp.py
    return explain_ddp_run[:2]


def test_its_progress_in_a_pipe_names_each_launch_of_the_ranks(explain_ddp_run):
    """stderr a pipe: a line at the start, every PERFLAB_PROGRESS_S (0.5 s here) and at the end, counting the two launches
    (the base's, the fix's) with the time left once the first has ended."""
    lines = assert_progress_lines(explain_ddp_run[2], "explain", 2, "parts")
    assert any(": gpt_small" in line and "timing on 2 ranks" in line for line in lines), lines
    assert any(line.startswith("perflab explain: 1/2 parts") and ": fix 1 of 1, fsdp:reshard=false: " in line for line in lines), lines


def test_the_communication_bytes_by_hand_and_ddp_buckets_as_torch_rebuilt_them(explained):
    from perflab.analysis.comm import ddp_buckets

    data, _ = explained
    c = data["communication"]
    assert PARAMS == 73920 and c["grad_bytes"] == c["param_bytes"] == 4 * PARAMS  # fp32 gradients, one per parameter
    # ring all-reduce on 2 ranks: 2(N-1)/N x gradient bytes = 1 x 295680 B per rank per step
    assert c["bus_bytes"] == 2 * (2 - 1) * 4 * PARAMS // 2 == 295680
    assert c["collectives"] == [{"collective": "all_reduce", "payload_bytes": 295680, "bus_bytes": 295680, "calls": 2,
                                 "message_bytes": 295680 / 2, "bus_factor": "2(N−1)/N"}]
    # at a 0.1 MiB cap DDP rebuilt two buckets (output, norm, w2, w3 = 131328 B; the rest 164352 B), as ddp_buckets has them
    row = data["row"]
    assert c["buckets"] == row["ddp_buckets"] == [131328, 164352] == ddp_buckets(row["ready_grad_bytes"], int(0.1 * MIB))
    assert row["shard_units"] == 2 and row["copy_gbps"] > 0  # one block and the root


def test_the_floor_and_each_rank_against_it(explained):
    from perflab.analysis.comm import busbw_at, call_latency_us

    data, md = explained
    c, steps = data["communication"], data["steps"]
    sweep = c["sweep"]
    assert [r["bytes"] for r in sweep["sizes"]] == [4096, 16384, 262144, 2**20] and "gloo all-reduces" in c["busbw_source"]
    assert c["busbw_gbps"] == busbw_at(sweep, 295680 / 2) == sweep["sizes"][2]["busbw_gbps"]  # 256 KiB: nearest 144 KiB (log scale)
    assert c["floor_ms"] == pytest.approx(295680 / (c["busbw_gbps"] * 1e9) * 1e3)
    assert c["latency_us"] == call_latency_us(sweep) and c["modelled_ms"] == pytest.approx(c["floor_ms"] + 2 * c["latency_us"] / 1e3)
    assert steps == 2 and len(data["rank_accounts"]) == len(c["ranks"]) == 2
    for account, rank in zip(data["rank_accounts"], c["ranks"]):
        # compute only + overlapped + exposed + idle closes the window, to the ns
        assert account["compute_only_ns"] + account["comm_overlapped_ns"] + account["comm_exposed_ns"] + account["idle_ns"] == account["window_ns"]
        assert account["comm_ns"] > 0  # gloo's collectives, on their own threads
        assert rank["comm_ms"] == pytest.approx(account["comm_ns"] / steps / 1e6)
        assert rank["exposed_ms"] == pytest.approx(account["comm_exposed_ns"] / steps / 1e6)
        # exposed = waiting for the other rank + transfer, to the ns
        assert account["comm_exposed_waiting_ns"] + account["comm_exposed_transfer_ns"] == account["comm_exposed_ns"]
        assert 0 <= account["comm_exposed_waiting_ns"] <= account["comm_exposed_ns"]
        assert rank["waiting_ms"] == pytest.approx(account["comm_exposed_waiting_ns"] / steps / 1e6)
        assert rank["measured_over_floor"] == pytest.approx(rank["comm_ms"] / c["floor_ms"])
        assert rank["step_ms"] == data["row"]["rank_median_ms"][rank["rank"]]
    # per step: DDP's broadcast of the model's buffers in the forward, then the two buckets' all-reduces
    assert [w["collectives"] for w in data["waits_per_step"]] == [3, 3]
    assert {p["rank"] for p in data["rank_passes"]} == {0, 1} and all(set(p["ms"]) == {"forward", "backward", "optimizer"} for p in data["rank_passes"])
    assert f"**{c['floor_ms']:.3f} ms**" in md and "| all_reduce | 0.282 | 2(N−1)/N | 0.282 | 2 | 0.141 |" in md
    low, high = data["row"]["scaling_efficiency_ci95"]
    # two pairs of blocks (--repeats 2): their range, which holds the median half the time, is no 95% CI and is not called one
    assert data["row"]["scaling_efficiency_ci_coverage"] == 0.5 and data["row"]["scaling_efficiency_ci_range_of"] == 2
    assert f"scaling efficiency {c['scaling_efficiency']:.3f} (CI (min–max of 2) {low:.3f}–{high:.3f}, from blocks interleaved" in md
    # the efficiency comes with the two figures it is the ratio of, each printed (not the slowest rank's own median)
    row = data["row"]
    assert f"which ran {row['single_gpu_ms']:.3f} ms and {row['step_ms_beside_single']:.3f} ms (medians) in the same rounds" in md
    one, beside = row["beside_single"]["one_samples_ms"], row["beside_single"]["dp_samples_ms"]
    ratios = sorted(a / b for a, b in zip(one, beside))
    assert ratios[0] <= c["scaling_efficiency"] <= ratios[-1]


def test_the_fsdp_fix_predicted_then_measured(explained):
    data, md = explained
    (fix,) = data["fix_predictions"]
    c = data["communication"]
    assert fix["fix"] == fix["parallel"] == "fsdp:reshard=false" and fix["status"] == "ok"
    # FSDP without resharding: (N-1)/N x (1 all-gather of the parameters + the gradients) = (295680 + 295680) / 2; per unit
    # (the block and the root) one all-gather and one reduce-scatter
    assert fix["comm_bus_bytes"] == (4 * PARAMS + 4 * PARAMS) // 2 == 295680 and fix["comm_calls"] == 2 * 2
    # the model: E' = E x M'/M, M = bus bytes at the busbw of the mean message + calls x latency; C' = C - O/2
    sweep, alpha = c["sweep"], c["latency_us"]
    from perflab.analysis.comm import busbw_at

    m_ddp = 295680 / busbw_at(sweep, 295680 / 2) / 1e6 + 2 * alpha / 1e3
    m_fsdp = 295680 / busbw_at(sweep, 4 * PARAMS / 2) / 1e6 + 4 * alpha / 1e3
    base = data["row"]["median_ms"]
    paired = fix["base_ms"]
    # the profile's times as shares of the traced step (window ÷ steps), on the untraced step; anchored at the base beside the fix
    account = data["rank_accounts"][c["slowest_rank"]]
    traced_ms = account["window_ns"] / data["steps"] / 1e6
    exposed = account["comm_exposed_transfer_ns"] / account["window_ns"] * paired  # without waiting for the other rank
    assert fix["predicted_exposed_ms"] == pytest.approx(exposed * m_fsdp / m_ddp)
    optimizer = next(p["ms"]["optimizer"] for p in data["rank_passes"] if p["rank"] == c["slowest_rank"]) / traced_ms * paired
    assert fix["predicted_compute_ms"] == pytest.approx(paired - exposed - optimizer / 2)
    assert 0 < fix["predicted_compute_ms"] < paired
    assert fix["predicted_ms"] == pytest.approx(fix["predicted_compute_ms"] + fix["predicted_exposed_ms"])
    assert fix["error"] == pytest.approx(fix["predicted_ms"] / fix["measured_ms"] - 1)
    assert fix["measured_exposed_ms"] is not None and fix["measured_compute_ms"] == pytest.approx(fix["measured_ms"] - fix["measured_exposed_ms"])
    assert 0 < fix["measured_compute_ms"] <= fix["measured_ms"]
    # the fix and the base timed in interleaved blocks in the fix's launch: each one's step the median of its blocks (a
    # block the slowest rank's), the speedup the median (on logs) over rounds of base block ÷ fix block
    row = fix["row"]
    together, base_beside = row["together"], row["paired"][0]
    assert fix["interleaved"] is True and fix["measured_ms"] == together["median_ms"] == pytest.approx(statistics.median(together["samples_ms"]))
    assert paired == base_beside["median_ms"] == pytest.approx(statistics.median(base_beside["samples_ms"]))
    assert together["sample_rounds"] == base_beside["sample_rounds"] == list(range(len(together["samples_ms"])))
    ratios = [b / f for b, f in zip(base_beside["samples_ms"], together["samples_ms"])]
    assert base_beside["ratio"] == pytest.approx(math.exp(statistics.median(map(math.log, ratios)))) and base_beside["ratio_pairs"] == len(ratios) >= 2
    low, high = fix["throughput_gain_ci95"]
    assert fix["throughput_gain"] == pytest.approx(base_beside["ratio"]) and low <= fix["throughput_gain"] <= high  # the same items per step
    assert fix["alone_ms"] == row["median_ms"]  # the fix's own timing, before the base was built beside it
    assert f"{fix['throughput_gain']:.2f}× ({low:.2f}–{high:.2f})" in md
    assert "E' = E × M' ÷ M" in fix["model"] and "| 1 | `fsdp:reshard=false` | fsdp:reshard=false | eager |" in md


@pytest.mark.parametrize("args, fragment", [
    (["--workload", "forward_backward", "--parallel", "ddp", "--world-size", "2"], "explains a training step"),
    (["--workload", "train_step", "--fixes", "ddp:bucket_cap_mb=100"], "a data-parallel fix applies to a --parallel case"),
    (["--workload", "train_step", "--parallel", "ddp", "--world-size", "2", "--fixes", "optimizer:foreach"], "optimizer is a one-GPU fix"),
    (["--workload", "train_step", "--parallel", "ddp", "--world-size", "2", "--fixes", "ddp:bucket_cap_mb=x"], "--fixes ddp:bucket_cap_mb=x: bucket_cap_mb takes a float"),
    (["--workload", "train_step", "--parallel", "ddp", "--world-size", "2", "--fixes", "ddp:no_sync=0"], "no_sync must be positive"),
    (["--workload", "train_step", "--parallel", "ddp", "--world-size", "2", "--modes", "cudagraph"], "--modes applies to a one-GPU explain"),
    (["--workload", "train_step", "--parallel", "ddp", "--world-size", "2", "--vs", "gpt_small"], "--vs applies to a one-GPU explain"),
])
def test_bad_parallel_explain_input_is_one_line(args, fragment):
    assert_one_line_error(run_cli_here("explain", "gpt_small", "--device", "cpu", *args), fragment)


def test_gpu_rank_traces_passes_and_glue_read_on_the_cpu():
    """The GPU side of the accounting, on a stored one-GPU train_step trace given as two ranks (no NCCL kernels): each
    pass's GPU time and each category's per step, and the glue explain's compile fix fuses."""
    from pathlib import Path

    from perflab.analysis.ranks import is_comm
    from perflab.diagnosis.explanation import GLUE_CATEGORIES
    from perflab.diagnosis.explain_parallel import comm_step
    from perflab.diagnosis.profiling import account_rank_traces
    from perflab.spec import Case
    from perflab.trace import load_trace

    path = Path(__file__).parent / "data" / "traces" / "lm_train_step_explicit.json.gz"
    kernels = load_trace(path).kernels
    out = account_rank_traces([path, path], "cuda", steps=2)
    assert out["note"] is None and [w["collectives"] for w in out["waits_per_step"]] == [0, 0]
    for account in out["accounts"]:
        assert account["comm_ns"] == 0 and account["overlap_fraction"] is None
        assert account["compute_only_ns"] + account["idle_ns"] == account["window_ns"]
    passes = out["rank_passes"][0]
    assert set(passes["ms"]) == {"forward", "backward", "optimizer"}
    assert not kernels["name"].map(is_comm).any()
    assert sum(passes["category_ms"].values()) == pytest.approx(kernels["dur_ns"].sum() / 2 / 1e6)  # every kernel, per step
    glue = kernels[kernels["category"].astype(str).isin(GLUE_CATEGORIES)]["dur_ns"].sum() / 2 / 1e6
    case = Case(model="gpt_small", workload="train_step", device="cpu", parallel="ddp", world_size=2)
    row = {"slowest_rank": 0, "median_ms": 10.0, "grad_bytes": 4, "param_bytes": 4, "rank_median_ms": [10.0, 9.0]}
    step = comm_step(case, row, dict(out, steps=2), None)
    scale = 10.0 / (out["accounts"][0]["window_ns"] / 2 / 1e6)  # the traced step's times on the untraced step of 10 ms
    assert glue > 0 and step.glue_ms == pytest.approx(glue * scale) and step.optimizer_ms == pytest.approx(passes["ms"]["optimizer"] * scale)
    assert step.exposed_ms == 0.0


def test_many_buckets_are_summarised_in_the_text_and_few_are_listed():
    from perflab.analysis.comm import MIB
    from perflab.report.explain_parallel import bucket_text

    assert bucket_text([131328, 164352]) == "0.125, 0.157 MiB"
    many = [int(48.828 * MIB)] + [25 * MIB] * 143 + [int(25.005 * MIB), int(48.833 * MIB)]  # gpt_large's 146 on two H200s
    assert bucket_text(many) == "146 buckets, the first 48.828 MiB, then 25.000–25.005 MiB, the last 48.833 MiB"


def test_explain_on_the_cpu_defaults_to_fp32_and_says_which_dtype_it_used(monkeypatch):
    """explain --parallel on the CPU (gloo) without --dtype: fp32, not a GPU's bf16 autocast, and the output says so."""
    import json

    from cli_util import run_cli_here
    from perflab import api

    seen = []

    class Explained:
        def to_dict(self):
            return {"cases": [c.to_dict() for c in seen]}

    monkeypatch.setattr(api, "explain", lambda case, other, **kw: seen.append(case) or Explained())
    done = run_cli_here("explain", "gpt_small", "--workload", "train_step", "--parallel", "ddp", "--world-size", "2", "--device", "cpu",
                        "--json")
    assert done.returncode == 0, done.stderr
    assert [c.dtype for c in seen] == ["fp32"]
    assert json.loads(done.stdout)["dtype_note"] == "dtype fp32: explain's default on the CPU (bf16 on a GPU, fp32 on the CPU; --dtype to choose)"
    assert api.explain_dtype("cuda")[0] == "bf16"
    seen.clear()
    assert run_cli_here("explain", "gpt_small", "--workload", "train_step", "--parallel", "ddp", "--world-size", "2", "--device", "cpu",
                        "--dtype", "bf16", "--json").returncode == 0
    assert [c.dtype for c in seen] == ["bf16"]  # a dtype given is the dtype used
