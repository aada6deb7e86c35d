"""Interleaved, paired timing and confidence intervals that hold from run to run (issue 22)."""

import contextlib
import json
import math
from pathlib import Path

import numpy as np
import pytest

from perflab.measure.interleave import block_schedule, interleaved_order
from perflab.stats import hierarchical_ci, log_t_interval, paired_ratio, summarize, t975, time_segments

DATA = Path(__file__).parent / "data" / "reproduce" / "h100_demo_rows.jsonl"


def recorded(setting: str) -> list[dict]:
    return [r for r in map(json.loads, DATA.read_text().splitlines()) if r["setting"] == setting]


# ---------------------------------------------------------------------------------------------------
# The order


def test_every_case_times_one_block_per_round_in_a_seeded_order():
    groups = ["a", "a", "b", "b", "c"]
    order = interleaved_order(groups, rounds=20, seed=3)
    assert len(order) == 20
    assert all(sorted(r) == [0, 1, 2, 3, 4] for r in order)
    assert order == interleaved_order(groups, rounds=20, seed=3)  # reproducible
    assert order != interleaved_order(groups, rounds=20, seed=4)
    assert len({tuple(r) for r in order}) > 5  # the order changes from round to round
    firsts = {r[0] for r in order}
    assert len(firsts) >= 3  # no case always goes first


def test_the_canary_stays_out_of_the_rounds_and_a_discarded_step_starts_each_block_warm(monkeypatch):
    """A planted position effect: a step run right after the host canary costs 1.5 ms, any other 1.0 ms (a simulated
    clock, so the test is deterministic). With the canary before every round and no warm step (as perflab timed), the
    block timed first in each round reads 1.25 ms and its neighbour 1.0, so B/A swings 0.8 / 1.25 with the order; the
    canary before the first round and after the last, and a warm step before each block, leave every block at 1.0."""
    import types

    import perflab.clock
    from perflab.measure.interleave import balanced_order, time_interleaved

    now = {"ns": 0, "last": None}
    monkeypatch.setattr(perflab.clock, "time", types.SimpleNamespace(perf_counter_ns=lambda: now["ns"]))

    def step_of(case):
        def step():
            now["ns"] += 1_500_000 if now["last"] == "canary" else 1_000_000
            now["last"] = case
        return step

    def canary():
        now["last"] = "canary"

    schedule = [[(i, 2) for i in balanced_order([0, 1], r)] for r in range(8)]

    def block_ratios(**options):
        session = time_interleaved([step_of(0), step_of(1)], schedule, enter=lambda i: contextlib.nullcontext(), device="cpu",
                                   canary=canary, **options)
        a, b = session.blocks
        assert [x.steps for x in a] == [2] * 8  # the warm step is not counted in the block
        assert len(session.round_canaries_us) == (8 if options.get("canary_each_round") else 2)
        return [round(y.ms_per_step / x.ms_per_step, 6) for x, y in zip(a, b)]

    assert block_ratios(canary_each_round=True, warm=0) == [0.8, 1.25, 1.25, 0.8] * 2  # A B, B A, B A, A B: whoever goes first pays
    assert block_ratios(canary_each_round=True, warm=1) == [1.0] * 8
    assert block_ratios(warm=0) == [0.8] + [1.0] * 7  # the canary before the rounds: only the first block after it
    assert block_ratios() == [1.0] * 8  # the default: the canary out of the rounds, a warm step before each block


def test_a_groups_cases_are_adjacent_in_every_round():
    groups = ["p", "q", "p", "q", "r", "r"]
    for this_round in interleaved_order(groups, rounds=50, seed=0):
        for group in set(groups):
            positions = sorted(this_round.index(i) for i, g in enumerate(groups) if g == group)
            assert positions == list(range(positions[0], positions[0] + len(positions)))


def test_a_case_with_fewer_blocks_is_spread_over_the_rounds():
    order = interleaved_order(["x", "y"], rounds=10, seed=1)
    schedule = block_schedule(order, n_blocks=[10, 5], block_sizes=[[3] * 10, [7, 7, 7, 7, 7]])
    assert [sum(n for i, n in r if i == 0) for r in schedule] == [3] * 10
    assert [r for r, blocks in enumerate(schedule) if any(i == 1 for i, _ in blocks)] == [0, 2, 4, 6, 8]
    assert sum(n for r in schedule for i, n in r if i == 1) == 35


# ---------------------------------------------------------------------------------------------------
# The hierarchical CI


def test_t_quantiles():
    assert t975(1) == pytest.approx(12.706)
    assert t975(4) == pytest.approx(2.776)
    assert t975(100) == 1.96


def test_time_segments_cut_rounds_into_contiguous_stretches():
    assert list(time_segments(range(20), 5)) == [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4 + [4] * 4
    assert list(time_segments([0, 1, 2], 5)) == [0, 1, 2]


def simulate_run(rng, processes=5, blocks=20, between=0.05, within=0.02):
    """Blocks of one run: each process has its own offset (log-normal, sd ``between``), each block its own noise."""
    offsets = rng.normal(0.0, between, processes)
    x = np.exp(offsets[:, None] + rng.normal(0.0, within, (processes, blocks)))  # true median 1.0
    procs = np.repeat(np.arange(processes), blocks)
    rounds = np.tile(np.arange(blocks), processes)
    return x.ravel(), procs, rounds


def test_the_hierarchical_ci_covers_the_true_median_about_95_percent_where_pooled_order_statistics_do_not():
    rng = np.random.default_rng(0)
    sims, hier, pooled = 1000, 0, 0
    for _ in range(sims):
        x, procs, rounds = simulate_run(rng)
        ci = hierarchical_ci(x, procs, rounds)
        assert ci.level == "process" and ci.n_units == 5
        hier += ci.low <= 1.0 <= ci.high
        s = summarize(x)
        pooled += s.within_low <= 1.0 <= s.within_high
    assert 0.93 <= hier / sims <= 0.97
    assert pooled / sims < 0.5  # today's interval describes one run's blocks, not the next run


def test_a_second_runs_median_lands_in_the_first_runs_ci_about_83_percent_of_the_time():
    # Two independent estimates with the same variance: a correct 95% CI of one covers the other with
    # probability P(|Z| < 1.96 / sqrt(2)) = 83%; the pooled interval far less.
    rng = np.random.default_rng(1)
    hits = pooled = 0
    sims = 600
    for _ in range(sims):
        a, b = simulate_run(rng), simulate_run(rng)
        ci = hierarchical_ci(*a)
        median_b = float(np.median(b[0]))
        hits += ci.low <= median_b <= ci.high
        s = summarize(a[0])
        pooled += s.within_low <= median_b <= s.within_high
    assert 0.78 <= hits / sims <= 0.89
    assert pooled / sims < 0.45


def test_one_process_takes_its_interval_across_stretches_of_the_run():
    # A host 30% slower for the last quarter of the run: the pooled order statistics stay around the fast
    # blocks (the slow ones are beyond their ranks), the stretches disagree and the interval widens to say so.
    x = np.r_[np.full(15, 1.0), np.full(5, 1.3)] * np.exp(np.random.default_rng(2).normal(0, 0.005, 20))
    ci = hierarchical_ci(x, None, np.arange(20))
    assert ci.level == "time" and ci.n_units == 5
    s = summarize(x)
    assert s.within_high < 1.02
    assert ci.high - ci.low > 3 * (s.within_high - s.within_low)
    assert ci.high > 1.1


def test_too_few_units_fall_back_to_order_statistics_and_say_so():
    ci = hierarchical_ci([1.0, 2.0], None, [0, 1])
    assert ci.level == "pooled" and (ci.low, ci.high) == (1.0, 2.0)


# ---------------------------------------------------------------------------------------------------
# Paired ratios


def rows_with_a_slow_host(factor_by_round):
    base = [2.0 * f for f in factor_by_round]
    variant = [2.5 * f for f in factor_by_round]  # always 0.8× as fast, whatever the host
    rounds = list(range(len(factor_by_round)))
    a = {"session": "s1", "samples_ms": base, "sample_rounds": rounds, "sample_processes": [0] * len(rounds)}
    b = {"session": "s1", "samples_ms": variant, "sample_rounds": rounds, "sample_processes": [0] * len(rounds)}
    return a, b


def test_a_host_slowdown_cancels_in_the_paired_ratio():
    slow = [1.0] * 10 + [2.0] * 10  # the host runs at half speed for the second half
    a, b = rows_with_a_slow_host(slow)
    paired = paired_ratio(a, b)  # B's time ÷ A's
    assert paired["ratio"] == pytest.approx(1.25)
    assert paired["ci95"][0] == pytest.approx(1.25) and paired["ci95"][1] == pytest.approx(1.25)
    assert paired["pairs"] == 20
    # Timed one after the other, the baseline in the fast half and the variant in the slow one, the ratio of
    # medians reads 0.4: the seeds' kind of answer.
    assert np.median(a["samples_ms"][:10]) / np.median(b["samples_ms"][10:]) == pytest.approx(0.4)


def test_rows_of_different_sessions_are_not_paired():
    a, b = rows_with_a_slow_host([1.0] * 5)
    b["session"] = "s2"
    assert paired_ratio(a, b) is None
    a.pop("session")
    assert paired_ratio(a, b) is None


def test_the_speedup_table_uses_the_paired_ratio(monkeypatch):
    from perflab.report.tables import pair

    a, b = rows_with_a_slow_host([1.0] * 10 + [2.0] * 10)
    common = dict(input_size=224, batch_size=1, dtype="bf16", mode="eager", status="ok", gflops=1.0, tokens=[197])
    base = dict(a, model="m", median_ms=3.0, throughput_per_s=1000 / 3.0, ci95_ms=[2.0, 4.0], **common)
    variant = dict(b, model="topk_m", median_ms=3.0, throughput_per_s=1000 / 3.0, ci95_ms=[2.5, 5.0], **common)
    entry = pair(base, variant)
    assert entry["paired"] and entry["speedup"] == pytest.approx(0.8)
    assert entry["speedup_unpaired"] == pytest.approx(1.0)
    assert entry["significant"] and not entry["faster"]
    assert entry["latency_delta"] == pytest.approx(0.25)


# ---------------------------------------------------------------------------------------------------
# Recorded H100 rows (benchmarks/reproduce.py, docs/performance/timing.md): the GPU-bound decision and the host flags


def by_label(rows):
    return {r["label"]: r for r in rows}


def test_gpu_bound_is_decided_by_host_and_gpu_times_measured_apart():
    from perflab.measure.canary import host_exempt

    rows = by_label(recorded("demo"))
    graph = rows["deit_base_patch16_224 224px bs1 bf16 cudagraph"]
    assert graph["host_bound_source"] == "held" and graph["host_held_ms"] < 0.1 and graph["device_ms"] > 0.8
    assert host_exempt(graph)
    eager = rows["topk_deit_base_patch16_224 kr0.1@3,6,9 224px bs64 bf16 eager"]
    assert eager["host_held_ms"] > eager["device_ms"] and not host_exempt(eager)  # launch-bound at bs64
    # Every row: exempt exactly when its host needs under half the GPU's time (a host up to 2x slower keeps up).
    for row in recorded("demo") + recorded("sequential-hog"):
        assert row["host_bound_frac"] == pytest.approx(min(1.0, row["host_held_ms"] / row["device_ms"]))
        assert host_exempt(row) == (row["host_held_ms"] / row["device_ms"] < 0.5), row["label"]
    # DeiT-B bs64 eager is GPU-bound (7.7 ms of GPU work) and its host needed 0.45-0.80 of that across processes:
    # exempt on a fast host, not on a slower one.
    fracs = [r["host_bound_frac"] for r in recorded("demo") + recorded("sequential-hog") if r["label"].startswith("deit_base_patch16_224 224px bs64 bf16 eager")]
    assert min(fracs) < 0.5 < max(fracs) < 1


def test_no_host_flag_on_the_unloaded_runs_and_every_launch_bound_row_flagged_under_the_hog():
    from perflab.measure.canary import HOST_FLAGS, mark_host_flags

    def rejudge(rows):
        clean = [dict(r, flags=[f for f in r["flags"] if f not in HOST_FLAGS], warnings=[]) for r in rows]
        return mark_host_flags(clean)

    for setting in ("demo", "interleaved"):
        assert not [r["label"] for r in rejudge(recorded(setting)) if set(r["flags"]) & set(HOST_FLAGS)]
    hog = by_label(rejudge(recorded("hog")))
    for label, row in hog.items():
        if row["mode"] == "eager":
            assert "host_contention" in row["flags"], label
        else:
            assert "host_exempt" in row and "host_contention" not in row["flags"], label


def test_the_bs64_eager_pair_is_host_dependent_and_the_others_are_not():
    from perflab.report.tables import speedup_rows

    pairs = {(p["batch_size"], p["mode"]): p for p in speedup_rows(recorded("demo"))}
    assert pairs[(64, "eager")]["host_dependent"].startswith("baseline GPU-bound, variant launch-bound") or \
        "boundary" in pairs[(64, "eager")]["host_dependent"]
    for key in ((1, "eager"), (1, "cudagraph"), (64, "cudagraph")):
        assert pairs[key]["host_dependent"] is None, key
        assert pairs[key]["paired"]
    assert pairs[(1, "eager")]["speedup"] == pytest.approx(0.79, abs=0.01)
    assert pairs[(64, "cudagraph")]["speedup"] == pytest.approx(2.169, abs=0.002)


def test_recorded_demo_rows_pool_three_processes():
    for row in recorded("demo"):
        assert sorted(set(row["sample_processes"])) == [0, 1, 2]
        ci = hierarchical_ci(row["samples_ms"], row["sample_processes"], row["sample_rounds"])
        assert ci.level == "process"
        # recorded before the CI was centred on the median (sectioning): their CI is the t-interval around the geometric
        # mean of the same three process medians; the one taken now holds the median the rows print beside it
        assert row["ci95_ms"] == pytest.approx([log_t_interval(ci.units).low, log_t_interval(ci.units).high])
        assert ci.center == row["median_ms"] and ci.low <= row["median_ms"] <= ci.high


# ---------------------------------------------------------------------------------------------------
# The harness on the CPU


def test_cases_timed_together_share_a_session_and_every_round(tiny_interleaved_rows):
    rows, cases = tiny_interleaved_rows
    assert [r["case_id"] for r in rows] == [c.id for c in cases]
    sessions = {r["session"] for r in rows}
    assert len(sessions) == 1
    for row in rows:
        assert row["status"] == "ok"
        assert row["sample_rounds"] == list(range(4))
        assert row["n_samples"] == 4 and row["timed_iters"] == 4 * row["iters_per_sample"]
        assert row["ci_level"] in ("time", "pooled")
        assert row["interleaved"]["rounds"] == 4 and len(row["interleaved"]["canaries_us"]) == 2  # before the rounds and after
        assert row["median_ms"] == pytest.approx(float(np.median(row["samples_ms"])))
    assert paired_ratio(rows[0], rows[1])["pairs"] == 4


def test_no_interleave_times_each_case_alone():
    from perflab import api

    cases = api.make_cases(model=["deit_tiny_patch16_224"], input_size=[32], batch_size=[1, 2], device="cpu", iters=4, repeats=2, warmup=1)
    rows = api.bench(cases, interleave=False)
    assert all("session" not in r and "sample_rounds" not in r for r in rows)
    assert [r["n_samples"] for r in rows] == [2, 2]


def test_bad_process_counts_are_one_line():
    from perflab import api
    from perflab.errors import PerflabError

    for bad in (0, 101):
        with pytest.raises(PerflabError, match=rf"^--processes: expected a whole number of processes from 1 to 100, got {bad} \(each builds"):
            api.bench([], processes=bad)


def test_samples_of_several_processes_merge_into_one_row(tiny_interleaved_rows):
    from perflab.measure.harness import merge_processes

    rows, cases = tiny_interleaved_rows
    second = [dict(r, samples_ms=[v * 1.1 for v in r["samples_ms"]], median_ms=r["median_ms"] * 1.1) for r in rows]
    third = [dict(r, samples_ms=[v * 0.9 for v in r["samples_ms"]], median_ms=r["median_ms"] * 0.9) for r in rows]
    merged = merge_processes(cases, [rows, second, third])
    for row, one in zip(merged, rows):
        assert row["processes"] == 3 and row["n_samples"] == 12
        assert row["sample_processes"] == [0] * 4 + [1] * 4 + [2] * 4
        assert row["ci_level"] == "process"
        assert row["process_medians_ms"] == pytest.approx([one["median_ms"], one["median_ms"] * 1.1, one["median_ms"] * 0.9])
        assert row["timed_iters"] == 3 * one["timed_iters"]
        assert row["ci95_ms"][0] < one["median_ms"] * 0.9 < one["median_ms"] * 1.1 < row["ci95_ms"][1]
        assert math.isclose(row["throughput_per_s"], row["batch_size"] * 1000.0 / row["median_ms"])


@pytest.fixture(scope="module")
def tiny_interleaved_rows():
    from perflab import api

    cases = api.make_cases(model=["deit_tiny_patch16_224", "topk_deit_tiny_patch16_224"], keep_rate=[0.5], reduction_loc=[1],
                           input_size=[32], batch_size=[1], device="cpu", iters=8, repeats=4, warmup=1)
    return api.bench(cases), cases


# ---------------------------------------------------------------------------------------------------
# A case that loses the CUDA context (issue 24): the rows before it are kept, the run ends in one line


@pytest.mark.parametrize("interleave", [False, True])
def test_a_sticky_cuda_error_keeps_the_rows_before_it_and_ends_in_one_line(monkeypatch, tmp_path, interleave):
    import json as json_

    from cli_util import run_cli_here
    from perflab.measure import harness

    real = harness._compile_and_warm

    def fails_on_batch_2(case, *args, **kwargs):
        if case.batch_size == 2:
            raise RuntimeError("CUDA error: device-side assert triggered\nCompile with TORCH_USE_CUDA_DSA to enable device-side assertions.")
        return real(case, *args, **kwargs)

    monkeypatch.setattr(harness, "_compile_and_warm", fails_on_batch_2)
    monkeypatch.setattr(harness, "context_lost_after", lambda case: "RuntimeError: CUDA error: device-side assert triggered")
    out = tmp_path / "rows.jsonl"
    flags = [] if interleave else ["--no-interleave"]
    result = run_cli_here("bench", "--model", "deit_tiny_patch16_224", "--input-size", "32", "--batch-size", "1", "2", "4", "--device", "cpu",
                          "--iters", "2", "--repeats", "2", "--warmup", "0", "--out", out, *flags)
    lines = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith(("warning", "error:"))]
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[-1].startswith("perflab: error: deit_tiny_patch16_224 32px bs2 fp32 eager left the CUDA context unusable")
    assert f"{2 if interleave else 1} remaining case(s) cannot run in this process" in lines[-1]
    stored = [json_.loads(line) for line in out.read_text().splitlines()]
    statuses = [(r["batch_size"], r["status"]) for r in stored]
    if interleave:  # bs1 was built and warmed in the pool with bs2, never timed: only the failed row is stored
        assert statuses == [(2, "error")]
    else:
        assert statuses == [(1, "ok"), (2, "error")]
    assert stored[-1]["fatal"] and "device-side assert" in stored[-1]["message"]
    assert "bs2" in result.stdout or "error" in result.stdout


def test_training_steps_are_timed_apart_from_inference_and_never_under_a_kept_autocast_cache():
    # Why: a kept autocast cache (which inference pools need for their CUDA graphs) would hand a training step the
    # bf16 casts of its weights from before its optimizer step. Shown here: three SGD steps under a kept cache end
    # with other weights than the same steps with autocast entered per step, as a training loop does.
    import torch

    from perflab import api
    from perflab.measure.harness import _autocast_kept

    def train(kept: bool):
        torch.manual_seed(0)
        layer = torch.nn.Linear(8, 8)
        opt = torch.optim.SGD(layer.parameters(), lr=0.5)
        x = torch.randn(4, 8)
        with (_autocast_kept("cpu") if kept else contextlib.nullcontext()):
            for _ in range(3):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = layer(x).float().pow(2).mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
        return layer.weight.detach().clone()

    assert not torch.equal(train(kept=True), train(kept=False))

    cases = api.make_cases(model=["gpt_small"], layers=1, model_args={"d_model": 32, "n_heads": 4, "d_ff": 64}, family="lm",
                           workload=["train_step", "forward"], seq_len=[8], batch_size=[2, 4], dtype=["bf16"], device="cpu",
                           iters=4, repeats=2, warmup=1)
    rows = api.bench(cases)
    sessions = {r["workload"]: r["session"] for r in rows}
    assert all(r["status"] == "ok" for r in rows)
    assert sessions["train_step"] != sessions["forward"]
    assert {r["session"] for r in rows if r["workload"] == "train_step"} == {sessions["train_step"]}  # still timed together


def test_a_process_that_fails_leaves_the_rows_of_those_that_finished_with_a_warning(monkeypatch, tiny_interleaved_rows):
    import concurrent.futures

    from perflab.measure import harness

    rows, cases = tiny_interleaved_rows

    class Crashes:  # a child process that died (BrokenProcessPool, a lost CUDA context in it, ...)
        def __init__(self, *a, **k):
            pass

        def __enter__(self):
            raise concurrent.futures.process.BrokenProcessPool("A process in the process pool was terminated abruptly")

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", Crashes)
    monkeypatch.setattr(harness, "run_cases", lambda *a, **k: [dict(r) for r in rows])
    merged = harness.run_in_processes(cases, 3)
    for row, one in zip(merged, rows):
        assert row["processes"] == 1 and row["median_ms"] == pytest.approx(one["median_ms"])
        assert row["warnings"][-1].startswith("process 2 of 3 failed (BrokenProcessPool: A process in the process pool")
        assert row["warnings"][-1].endswith("the rows pool the 1 that finished")


def test_processes_of_a_max_autotune_case_that_chose_differently_are_flagged(tiny_interleaved_rows):
    """Issue 39: the merged row keeps each process's choice of kernels and says where they differ."""
    from dataclasses import replace

    from perflab.measure.harness import merge_processes

    rows, cases = tiny_interleaved_rows
    tuned = [replace(c, mode="compile:max-autotune") for c in cases]
    runs = [[dict(r, autotune={"signature": sig, "closest_margin": 0.01, "ops": [], "fx_graph_cache": {"hit": 0, "miss": 1, "bypass": 0}},
                  median_ms=r["median_ms"] * f, samples_ms=[v * f for v in r["samples_ms"]]) for r in rows]
            for sig, f in (("aaaaaaaaaaaa", 1.0), ("bbbbbbbbbbbb", 1.01), ("aaaaaaaaaaaa", 1.0))]
    merged = merge_processes(tuned, runs)
    for row in merged:
        assert [p["signature"] for p in row["autotune_processes"]] == ["aaaaaaaaaaaa", "bbbbbbbbbbbb", "aaaaaaaaaaaa"]
        assert "max_autotune_varies" in row["flags"]
        assert any(w.startswith("compile:max-autotune's kernel choice varies: 2 different choices of kernels in 3 processes") for w in row["warnings"])
    same = merge_processes(tuned, [runs[0], runs[0], runs[0]])
    assert all("max_autotune_varies" not in row["flags"] for row in same)  # the same kernels, the same times
