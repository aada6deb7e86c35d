"""perflab run's analysis of real GPU traces: nanoGPT's own train.py (GPT-2 124M, torch.compile, bf16) run under
``perflab run`` on an H100, alone and as two DDP ranks under torchrun (tests/data/run, recorded 2026-11-26)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perflab.analysis.launch import traced_host_issue_ms
from perflab.analysis.op_flops import count_op_flops
from perflab.analysis.comm import communication_section
from perflab.analysis.program import compiled_split
from perflab.trace.kineto import load_kineto

DATA = Path(__file__).parent / "data" / "run"
ONE_GPU = DATA / "nanogpt_h100.json.gz"
RANKS = [DATA / "nanogpt_ddp_rank0_h100.json.gz", DATA / "nanogpt_ddp_rank1_h100.json.gz"]

# GPT-2 124M as nanoGPT trains it here: batch 12, block 1024, 12 layers, 12 heads of 64, vocabulary 50304
B, T, LAYERS, HEADS, HEAD, WIDTH, VOCAB = 12, 1024, 12, 12, 64, 768, 50304


@pytest.fixture(scope="module")
def one_gpu():
    return load_kineto(ONE_GPU, ops=True)


def test_nanogpts_flops_from_its_compiled_steps_operators_equal_the_formula(one_gpu):
    window = (int(one_gpu.steps["start_ns"].min()), int(one_gpu.steps["end_ns"].max()) + 1)
    counted = count_op_flops(one_gpu.ops, window=window, steps=len(one_gpu.steps), kernels=one_gpu.kernels)
    matmuls = 6 * B * T * (LAYERS * 12 * WIDTH * WIDTH + WIDTH * VOCAB)  # forward and backward of every weight, the head too
    attention = LAYERS * 2 * B * HEADS * T * T * (HEAD + HEAD) * (1 + 2.5)  # sdpa forward, and its backward at 2.5×
    assert len(one_gpu.steps) == 3
    assert counted.per_step == matmuls + attention == 10_733_928_579_072
    assert counted.complete and counted.dtype == "bf16" and counted.uncounted_heavy_share == 0.0


def test_the_compiled_regions_hold_the_model_and_the_fused_optimizer_runs_eagerly(one_gpu):
    split = compiled_split(one_gpu)
    assert split["compiled_ns"] + split["eager_ns"] + split["communication_ns"] + split["dynamo_overhead_ns"] == int(one_gpu.kernels["dur_ns"].sum())
    assert split["compiled_share"] > 0.9 and "FusedAdamMathFunctor" in split["eager_top"][0]["name"]


def test_work_launched_outside_the_step_windows_is_not_split(one_gpu):
    """A kernel launched past the last step window (the profiler records on past it) is neither compiled nor eager: a
    planted 1 s kernel after the steps leaves the split as it was."""
    import copy

    import pandas as pd

    before = compiled_split(one_gpu)
    after_steps = int(one_gpu.steps["end_ns"].max()) + 1_000_000
    planted = one_gpu.kernels.iloc[[0]].copy()
    planted["launch_start_ns"], planted["start_ns"], planted["dur_ns"] = after_steps, after_steps + 10_000, 1_000_000_000
    trace = copy.copy(one_gpu)
    trace.kernels = pd.concat([one_gpu.kernels, planted], ignore_index=True)
    assert compiled_split(trace) == before


def test_the_host_floor_leaves_out_the_programs_own_waits(one_gpu):
    # nanoGPT reads loss.item() every iteration: the host waits for the GPU there, which is not time spent issuing
    assert traced_host_issue_ms(one_gpu, without_waits=True) < traced_host_issue_ms(one_gpu)


def test_two_ddp_ranks_merge_into_the_communication_section_against_the_floor():
    from perflab.diagnosis.profiling import account_rank_traces

    recorded = json.loads((DATA / "nanogpt_ddp_h100.json").read_text())
    merged = account_rank_traces([str(p) for p in RANKS], "cuda", 3)
    medians = {int(k): v for k, v in recorded["rank_median_ms"].items()}
    ddp = recorded["ddp"]
    section = communication_section(mode="ddp", grad_bytes=ddp["grad_bytes"], param_bytes=ddp["param_bytes"], bucket_cap_mb=ddp["bucket_cap_mb"],
                                    buckets=ddp["ddp_buckets"], sweep=recorded["all_reduce"], accounts=merged["accounts"], world_size=2, steps=3,
                                    rank_step_ms=medians, step_ms=recorded["step_ms"])
    assert recorded["ddp"]["grad_bytes"] == 4 * 124_373_760  # nanoGPT's GPT-2 124M in fp32 (position embeddings included)
    assert section["bus_bytes"] == recorded["ddp"]["grad_bytes"] and section["calls"] == 14  # DDP's 14 rebuilt buckets
    assert section["floor_ms"] == pytest.approx(section["bus_bytes"] / (section["busbw_gbps"] * 1e9) * 1e3)
    for rank in section["ranks"]:
        assert rank["exposed_ms"] == pytest.approx(rank["waiting_ms"] + rank["transfer_ms"], abs=1e-9)
        assert rank["comm_ms"] == pytest.approx(rank["exposed_ms"] + rank["overlapped_ms"], abs=1e-9)
        assert 0.8 < rank["overlap_fraction"] < 0.95  # compiled DDP hides most of its all-reduces under the backward
    # as rank 0 merged them on the H100 (over the whole trace then; the traces hold nothing outside their steps)
    assert [{k: r[k] for k in old} for r, old in zip(section["ranks"], recorded["communication"]["ranks"])] == recorded["communication"]["ranks"]
    for rank in section["ranks"]:  # parts of the rank's own steps
        assert 0 <= rank["waiting_ms"] <= rank["exposed_ms"] <= rank["traced_step_ms"] and rank["busy_ms"] <= rank["traced_step_ms"]


def test_run_and_explain_parallel_read_one_ddp_floor_from_the_same_step():
    from perflab.diagnosis import explain_parallel
    from perflab.spec import Case

    recorded = json.loads((DATA / "nanogpt_ddp_h100.json").read_text())
    ddp, sweep = recorded["ddp"], recorded["all_reduce"]
    run = communication_section(mode="ddp", grad_bytes=ddp["grad_bytes"], param_bytes=ddp["param_bytes"], bucket_cap_mb=ddp["bucket_cap_mb"],
                                buckets=ddp["ddp_buckets"], sweep=sweep, accounts=[], world_size=2, steps=3, rank_step_ms={}, step_ms=recorded["step_ms"])
    row = {"grad_bytes": ddp["grad_bytes"], "param_bytes": ddp["param_bytes"], "ddp_buckets": ddp["ddp_buckets"], "rank_median_ms": [],
           "median_ms": recorded["step_ms"], "slowest_rank": 0}
    explained = explain_parallel.case_communication(Case(model="gpt_small", workload="train_step", device="cuda", parallel="ddp", world_size=2),
                                                       row, {"accounts": [], "steps": 3}, sweep)
    fields = ("bus_bytes", "calls", "message_bytes", "busbw_gbps", "busbw_size_bytes", "busbw_source", "latency_us", "floor_ms", "floor_fraction")
    assert {k: run[k] for k in fields} == {k: explained[k] for k in fields}
    # by hand: 14 buckets share 474.4 MiB, 33.9 MiB a call, nearest the swept 64 MiB on a log scale (not 16 MiB)
    assert run["calls"] == 14 and run["message_bytes"] == ddp["grad_bytes"] / 14
    assert run["busbw_size_bytes"] == 64 << 20
    size = next(s for s in sweep["sizes"] if s["bytes"] == 64 << 20)
    assert run["floor_ms"] == pytest.approx(2 * (2 - 1) / 2 * ddp["grad_bytes"] / (size["busbw_gbps"] * 1e9) * 1e3)
    assert explained["modelled_ms"] == pytest.approx(run["floor_ms"] + 14 * run["latency_us"] / 1e3)


def test_collectives_launched_before_the_profiler_recorded_are_no_traced_steps_work():
    """Two H200s, nanoGPT, CUDA-only traces cut at perflab's markers: rank 0's trace opens with 10 all-reduces of the
    step before, launched before recording began (no launch call in the trace) and still waiting for rank 1. Counted
    in its first window they gave rank 0 52 collectives against rank 1's 42, and no wait could be matched."""
    from perflab.diagnosis.profiling import account_rank_traces
    from perflab.trace.kineto import load_kineto

    paths = [DATA / f"nanogpt_ddp_cuda_only_h200_rank{r}.json.gz" for r in (0, 1)]
    unlinked = []
    for path in paths:
        k = load_kineto(path).kernels
        comm = k[k["category"].astype(str) == "communication"]
        unlinked.append(int((comm["launch_start_ns"] < 0).sum()))
        assert int((comm["launch_start_ns"] >= 0).sum()) == 42  # 14 buckets x 3 traced steps
    assert unlinked == [10, 0]
    merged = account_rank_traces([str(p) for p in paths], "cuda", 3)
    assert merged["note"] is None and len(merged["waits_per_step"]) == 3  # the collectives line up across the ranks
    for account in merged["accounts"]:
        waiting, exposed = account["comm_exposed_waiting_ns"], account["comm_exposed_ns"]
        assert 0 <= waiting <= exposed and account["comm_exposed_transfer_ns"] == exposed - waiting


def test_the_merged_verdict_leaves_out_waiting_by_the_inflation_the_communication_table_prints():
    """The same two nanoGPT ranks (gas 8, two H200s), merged as rank 0 merges them. Each rank's own clock put its traced
    steps within the limit here, but the communication table beside the verdict prints traced steps ~×1.3 the untraced:
    the verdict judges by those printed figures, as the scaling table does, and names the waiting it leaves out."""
    from perflab.analysis.program import rank_inflation
    from perflab.program.ranks import merge
    from perflab.program.report import RunReport

    def rank(r):
        path = DATA / f"nanogpt_ddp_cuda_only_h200_rank{r}.json.gz"
        evidence = {"step_ms": 114.021, "busy_ms": 102.930, "host_ms": 60.0, "categories_ms": {"gemm": 60.0}, "cpu_only": False,
                    "communication_apart": True, "host_source": "the traced steps", "inflated": False, "inflation": 1.05}
        return RunReport(timing={"median_ms": 114.021 - r}, device="cuda", rank=r, world_size=2,
                         recorded={"steps_seen": 30, "trace_path": str(path)},
                         traced={"steps": 3, "inflation_limit": 1.10, "inflated": False, "inflation": 1.05}, verdict_evidence=evidence)

    merged = merge({0: rank(0), 1: rank(1)}, 2)
    rows = merged["communication"]["ranks"]
    printed = max(row["traced_step_ms"] / row["step_ms"] for row in rows)  # the table's two columns, divided here
    assert printed > 1.10 and max(map(rank_inflation, rows)) == pytest.approx(printed)
    most = max(rows, key=lambda row: row["exposed_ms"] / row["traced_step_ms"])
    message = merged["verdict"]["message"]
    assert f"{most['waiting_ms']:.3f} ms is waiting for a peer, left out of the verdict" in message
    assert f"the traced steps ran ×{printed:.2f} the untraced" in message


def test_the_merge_of_an_fsdp_programs_ranks_floors_its_all_gathers_and_reduce_scatters_and_not_no_shard():
    """The merge reads rank 0's FSDP layout (``fsdp``, without ``ddp``) into explain's FSDP collectives; FSDP1's NO_SHARD
    (an all-reduce) keeps its measured communication without a floor. The traces: the two nanoGPT ranks above."""
    from perflab.program.ranks import merge
    from perflab.program.report import RunReport

    sweep = {"sizes": [{"bytes": 2**20, "time_us": 20.0, "busbw_gbps": 50.0}, {"bytes": 2**24, "time_us": 200.0, "busbw_gbps": 100.0}]}

    def rank(r, fsdp):
        path = DATA / f"nanogpt_ddp_cuda_only_h200_rank{r}.json.gz"
        return RunReport(timing={"median_ms": 114.021 - r}, device="cuda", rank=r, world_size=2, recorded={"steps_seen": 30, "trace_path": str(path)},
                         traced={"steps": 3}, ddp=None, fsdp=fsdp, all_reduce=sweep)

    layout = {"sharding_strategy": "FULL_SHARD", "units": 4, "reshard_after_forward": True, "param_bytes": 64 * 2**20, "grad_bytes": 64 * 2**20}
    comm = merge({0: rank(0, layout), 1: rank(1, layout)}, 2)["communication"]
    assert comm["mode"] == "fsdp" and [c["collective"] for c in comm["collectives"]] == ["all_gather", "reduce_scatter"]
    # 2 × 64 MiB gathered + 64 MiB reduce-scattered, half of each on the bus: 96 MiB in 12 calls at 100 GB/s (16 MiB a unit)
    assert (comm["bus_bytes"], comm["calls"], comm["busbw_gbps"]) == (96 * 2**20, 12, 100.0)
    assert comm["floor_ms"] == pytest.approx(96 * 2**20 / 100e9 * 1e3)
    no_shard = merge({0: rank(0, dict(layout, sharding_strategy="NO_SHARD")), 1: rank(1, layout)}, 2)["communication"]
    assert no_shard["mode"] is None and no_shard["floor_ms"] is None and "NO_SHARD" in no_shard["floor_note"]
    assert [r["rank"] for r in no_shard["ranks"]] == [0, 1]
