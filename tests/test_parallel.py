"""A data-parallel step on the CPU: two gloo ranks through the same launcher and bench path as two GPUs (one launch)."""

import json
import math
import statistics

import pytest

from cli_util import run_cli

TINY = ["--model", "gpt_small", "--workload", "train_step", "--layers", "1", "--model-arg", "d_model=64", "--model-arg", "n_heads=2",
        "--model-arg", "d_ff=128", "--model-arg", "vocab_size=256", "--seq-len", "16", "--batch-size", "2", "--iters", "4",
        "--repeats", "2", "--warmup", "1", "--device", "cpu"]


@pytest.fixture(scope="module")
def ddp_row():
    result = run_cli("bench", *TINY, "--parallel", "ddp", "--world-size", "2", "--format", "json", timeout=300)
    assert result.returncode == 0, result.stderr
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("{")]
    return json.loads(line)


def test_ddp_row_per_rank_timing(ddp_row):
    row = ddp_row
    assert row["status"] == "ok" and row["backend"] == "gloo" and row["world_size"] == 2 and row["launches"] == 1
    assert row["case"]["parallel"] == "ddp" and row["case"]["world_size"] == 2 and row["label"].endswith("ddpx2")
    medians = row["rank_median_ms"]
    assert len(medians) == 2 and all(len(s) == 2 for s in row["rank_samples_ms"])
    assert row["median_ms"] == row["step_ms"] == max(medians) == medians[row["slowest_rank"]]
    # the one-device case timed on rank 0 in blocks interleaved with the ranks' step: the efficiency is the median over
    # rounds of one-device block ÷ data-parallel block (the slowest rank's) of the same round
    beside = row["beside_single"]
    assert row["single_gpu_timing"].startswith("interleaved") and beside["one_rounds"] == beside["dp_rounds"] == [0, 1]
    ratios = [o / d for o, d in zip(beside["one_samples_ms"], beside["dp_samples_ms"])]
    assert row["scaling_efficiency"] == pytest.approx(math.exp(statistics.median(map(math.log, ratios)))) and row["scaling_efficiency_pairs"] == 2  # on logs
    low, high = row["scaling_efficiency_ci95"]
    assert low <= row["scaling_efficiency"] <= high
    assert row["single_gpu_ms"] == pytest.approx(statistics.median(beside["one_samples_ms"]))
    assert row["step_ms_beside_single"] == pytest.approx(statistics.median(beside["dp_samples_ms"]))
    # throughput over both ranks: 2 ranks x 2 sequences x 16 tokens per step
    assert row["items_per_step"] == 64
    assert row["items_per_s"] == pytest.approx(64 * 1000 / row["median_ms"])
    assert row["throughput_per_s"] == pytest.approx(4 * 1000 / row["median_ms"])


def test_ddp_ranks_agree_and_communication(ddp_row):
    row = ddp_row
    assert row["ranks_agree"] is True and "ranks_disagree" not in row["flags"]
    assert row["rank_loss"][0] != row["rank_loss"][1]  # each rank trained on its own batch
    assert row["multicast_off"] is True  # NCCL_NVLS_ENABLE=0 & co. in both spawned ranks
    # fp32 gradients, one per parameter; ring all-reduce on 2 ranks moves 2(2-1)/2 = 1x their bytes per rank
    assert row["grad_bytes"] == 4 * row["params"] and row["comm_bus_bytes"] == row["grad_bytes"]
    assert row["comm_collectives"] == {"all_reduce": row["grad_bytes"]}
    for memory in row["rank_memory"]:
        assert memory["params_mb"] * 2**20 == row["param_bytes"] and memory["optimizer_mb"] == 2 * memory["params_mb"]


def test_launch_retries_a_transient_failure_once(monkeypatch):
    from perflab.runtime import parallel

    calls = []

    def flaky(fn, world_size, args, device, gpus, timeout_s):
        calls.append(1)
        if len(calls) == 1:
            raise parallel.RankFailed(1, "DistNetworkError: Connection reset by peer")
        return ["a", "b"]

    monkeypatch.setattr(parallel, "_launch_once", flaky)
    launched = parallel.launch(print, 2)
    assert launched.results == ["a", "b"] and launched.launches == 2

    def broken(*args):
        raise parallel.RankFailed(0, "ValueError: bad shape")

    monkeypatch.setattr(parallel, "_launch_once", broken)
    with pytest.raises(parallel.RankFailed, match="bad shape"):
        parallel.launch(print, 2)
    oom = parallel.RankFailed(0, "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert oom.oom and not oom.transient


def test_parse_parallel():
    from perflab.errors import PerflabError
    from perflab.spec import parse_parallel

    assert parse_parallel("ddp") == ("ddp", {"bucket_cap_mb": 25.0, "grad_view": False, "no_sync": 1})
    assert parse_parallel("ddp:bucket_cap_mb=100,grad_view=true") == ("ddp", {"bucket_cap_mb": 100.0, "grad_view": True, "no_sync": 1})
    assert parse_parallel("fsdp:reshard=false") == ("fsdp", {"reshard": False})
    for bad in ("tp", "ddp:reshard=false", "ddp:no_sync=0", "fsdp:reshard=maybe", "ddp:bucket_cap_mb"):
        with pytest.raises(PerflabError):
            parse_parallel(bad)


def test_a_fix_merges_its_options_with_the_case_s():
    from perflab.spec import format_parallel, merge_parallel, parse_parallel

    assert format_parallel(*parse_parallel("ddp:grad_view=1,bucket_cap_mb=100.0")) == "ddp:bucket_cap_mb=100,grad_view=true"
    assert format_parallel(*parse_parallel("ddp:bucket_cap_mb=25")) == "ddp"  # the defaults are left out
    assert merge_parallel("ddp:bucket_cap_mb=100", "ddp:grad_view=true") == "ddp:bucket_cap_mb=100,grad_view=true"
    assert merge_parallel("ddp:no_sync=4", "ddp:no_sync=1") == "ddp"
    assert merge_parallel("ddp:grad_view=true", "fsdp") == "fsdp" and merge_parallel("fsdp", "ddp:bucket_cap_mb=0.1") == "ddp:bucket_cap_mb=0.1"


@pytest.mark.parametrize("args, fragment", [
    (["--parallel", "ddp", "--gpus", "0"], "needs at least 2 GPUs"),
    (["--parallel", "pp", "--world-size", "2", "--device", "cpu"], "unknown mode 'pp'"),
    (["--parallel", "ddp", "--device", "cpu"], "--world-size"),
    (["--gpus", "0,1"], "add --parallel"),
    (["--parallel", "ddp", "--gpus", "0,0"], "lists a GPU twice"),
    (["--parallel", "ddp:bucket_cap_mb=x", "--world-size", "2", "--device", "cpu"], "bucket_cap_mb takes a float"),
    (["--parallel", "ddp", "--world-size", "1", "--device", "cpu"], "at least 2 ranks"),
    (["--parallel", "fsdp", "--world-size", "2", "--device", "cpu", "--workload", "forward"], "forward_backward and train_step"),
])
def test_bad_parallel_input_is_one_line(args, fragment):
    from cli_util import assert_one_line_error, run_cli_here

    workload = [] if "--workload" in args else ["--workload", "train_step"]
    assert_one_line_error(run_cli_here("bench", "--model", "gpt_small", *workload, *args), fragment)


def test_sweep_gives_a_case_its_ranks_slots(tmp_path):
    from perflab.errors import PerflabError
    from perflab.spec import Case
    from perflab.sweep.runner import GROUP, check_slots_fit, pin_index, slot_env

    env = slot_env(GROUP.join(["gpu2", "gpu3"]), 4)
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3" and pin_index("gpu2+gpu3") == 2
    case = Case(model="gpt_small", workload="train_step", parallel="ddp", world_size=2, device="cpu")
    check_slots_fit([case], ["w0", "w1"])
    with pytest.raises(PerflabError, match="runs 2 ranks, one per slot; this sweep has 1 GPUs"):
        check_slots_fit([case], ["gpu0"])


def test_parallel_fields_in_a_sweep_spec_and_case_ids():
    from perflab import api
    from perflab.spec import Case

    experiment = api.load_experiment("experiments/lm_parallel.yaml")
    assert [(c.parallel, c.world_size) for c in experiment.cases].count(("ddp", 2)) == 4
    assert len(experiment.cases) == 12
    plain = Case(model="gpt_small", workload="train_step")
    assert "parallel" not in plain.to_dict() and "world_size" not in plain.to_dict()  # ids of earlier cases unchanged


def test_the_lm_reports_parallel_section_gives_the_efficiency_with_its_ci(ddp_row):
    from perflab.report.parallel import sections

    text = "\n".join(sections([ddp_row, {"case": {"parallel": None}}]))
    low, high = ddp_row["scaling_efficiency_ci95"]
    assert text.startswith("## Training on several GPUs\n") and "timed in interleaved blocks" in text
    line = next(l for l in text.splitlines() if l.startswith("| gpt_small |"))
    assert f"| {ddp_row['scaling_efficiency']:.3f} ({low:.3f}–{high:.3f}) |" in line and f"| {ddp_row['step_ms_beside_single']:.2f} | {ddp_row['single_gpu_ms']:.2f} |" in line


def test_cpu_ranks_share_the_hosts_cpus_out_and_the_columns_name_the_cpu(ddp_row):
    import io

    from rich.console import Console

    from perflab.report.parallel import scaling_table
    from perflab.runtime.parallel import cpu_threads_per_rank

    # two ranks that each ran torch's default (every CPU) fought over the cores: the same step read 150-190 ms, not 11-13
    assert [cpu_threads_per_rank(2, cpus=c) for c in (1, 2, 3, 8)] == [1, 1, 1, 4] and cpu_threads_per_rank(4, cpus=8) == 2
    assert ddp_row["threads_per_rank"] == cpu_threads_per_rank(2)
    buffer = io.StringIO()
    Console(file=buffer, width=400).print(scaling_table([ddp_row]))
    text = buffer.getvalue()
    assert "GPU" not in text and "step beside 1 process (ms)" in text and "against one process" in text


def test_a_scaling_efficiency_with_a_ci_wider_than_a_factor_2_is_flagged():
    from perflab.measure.parallel import WIDE_EFFICIENCY_FLAG, efficiency_check

    wide = efficiency_check({"scaling_efficiency": 0.167, "scaling_efficiency_ci95": [0.032, 0.960], "scaling_efficiency_pairs": 20})
    assert wide.flag == WIDE_EFFICIENCY_FLAG and "0.032–0.960, a factor 30.0 wide" in wide.message
    assert "--repeats, 20 now" in wide.message  # more pairs narrow it; longer blocks of as few pairs did not (on two H100s)
    assert efficiency_check({"scaling_efficiency": 0.9, "scaling_efficiency_ci95": [0.85, 0.95]}) is None
    assert efficiency_check({"scaling_efficiency": 0.9, "scaling_efficiency_ci95": None}) is None
