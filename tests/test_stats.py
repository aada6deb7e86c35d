"""Timing statistics and the timing plan."""

import math

import numpy as np
import pytest

from perflab.measure.checks import MIN_TIMED_ITERS, run_checks
from perflab.stats import median_ci_ranks, summarize
from perflab.measure.timing import plan_timing


def brute_force_coverage(n, lo, hi):
    # P(X(lo) ≤ median ≤ X(hi)) for 0-based order statistics = P(lo < #below ≤ hi), #below ~ Bin(n, 1/2).
    return sum(math.comb(n, k) for k in range(lo + 1, hi + 1)) / 2**n


@pytest.mark.parametrize("n", [6, 10, 20, 21, 50])
def test_median_ci_reaches_95_percent_and_is_the_narrowest_symmetric(n):
    lo, hi, coverage = median_ci_ranks(n)
    assert coverage == pytest.approx(brute_force_coverage(n, lo, hi))
    assert coverage >= 0.95
    assert lo + hi == n - 1  # symmetric
    assert brute_force_coverage(n, lo + 1, hi - 1) < 0.95  # one step narrower is not enough


def test_median_ci_of_20_samples_uses_the_6th_and_15th():
    lo, hi, coverage = median_ci_ranks(20)
    assert (lo, hi) == (5, 14)
    assert coverage == pytest.approx(0.9586, abs=1e-4)


def test_few_samples_give_the_full_range_with_its_true_coverage():
    lo, hi, coverage = median_ci_ranks(5)
    assert (lo, hi) == (0, 4)
    assert coverage == pytest.approx(1 - 2 / 32)


def test_summary_numbers():
    s = summarize([5.0, 1.0, 4.0, 2.0, 3.0, 10.0])
    assert s.median == 3.5
    assert s.mean == pytest.approx(25 / 6)
    assert s.cv == pytest.approx(np.std([5, 1, 4, 2, 3, 10], ddof=1) / (25 / 6))
    assert (s.within_low, s.within_high) == (1.0, 10.0)


def test_plan_with_exact_iters_splits_them_into_blocks():
    plan = plan_timing(step_s=0.01, repeats=20, min_time=1.0, min_iters=50, iters=100)
    assert (plan.n_blocks, plan.block_iters, plan.total_iters) == (20, 5, 100)
    plan = plan_timing(step_s=0.01, repeats=20, min_time=1.0, min_iters=50, iters=2)
    assert (plan.n_blocks, plan.block_iters) == (2, 1)


def test_fast_steps_time_min_time_and_slow_steps_stop_once_the_rule_is_met_twice_over():
    # fast steps: about min_time of timed work, as before (1000 steps of 1 ms), not a bare 50 steps
    assert plan_timing(step_s=0.001, repeats=10, min_time=1.0, min_iters=50, iters=None).block_sizes == [100] * 10
    assert plan_timing(step_s=0.03, repeats=10, min_time=1.0, min_iters=50, iters=None).total_iters == 50  # 34 for the time, 50 by the rule
    # slow steps: twice the steps for min_time (the estimate's margin), below 50; at least one step per block
    mid = plan_timing(step_s=0.02, repeats=10, min_time=0.3, min_iters=50, iters=None)
    assert (mid.n_blocks, mid.block_iters, mid.total_iters) == (10, 3, 30)  # 0.3 s / 20 ms = 15 steps, twice: 30 → 3 per block
    slow = plan_timing(step_s=0.5, repeats=20, min_time=1.0, min_iters=50, iters=None)
    assert (slow.n_blocks, slow.block_iters, slow.total_iters) == (20, 1, 20)  # 3 steps would do; 20 blocks need 20


def test_a_700_ms_step_with_min_time_03_and_10_repeats_plans_10_iterations_not_50():
    # issue 16: gpt_large forward_backward at seq 1024 (711 ms) timed 50 iterations (35.5 s) under the old plan
    plan = plan_timing(step_s=0.7, repeats=10, min_time=0.3, min_iters=50, iters=None)
    assert (plan.n_blocks, plan.block_iters, plan.total_iters) == (10, 1, 10)
    assert plan.total_iters * 0.7 == pytest.approx(7.0)


@pytest.mark.parametrize("min_time", [0.1, 0.3, 1.0, 2.0])
@pytest.mark.parametrize("repeats", [1, 5, 10, 20, 60])
def test_the_plan_never_gives_a_short_timing_row_for_a_plausible_step_time(min_time, repeats):
    step_times = np.geomspace(1e-6, 10.0, 400)  # 1 µs to 10 s per step
    for step_s in step_times:
        plan = plan_timing(step_s=step_s, repeats=repeats, min_time=min_time, min_iters=MIN_TIMED_ITERS, iters=None)
        assert plan.n_blocks == repeats and min(plan.block_sizes) >= 1
        # the true step may be up to a third faster than the 3-call estimate the plan started from
        for true_step_s in (step_s, 0.67 * step_s):
            timed_s = plan.total_iters * true_step_s
            checks = run_checks(requested_batch=1, processed_batch=1, timed_s=timed_s, timed_iters=plan.total_iters, cv=0.0, energy_j=1.0,
                                energy_unavailable=None, throttle_reasons=[], other_processes=[], min_time=min_time)
            assert "short_timing" not in [c.flag for c in checks], (step_s, true_step_s, plan)
        # min_time's steps, or up to twice as many while short of 50; then one block's rounding
        for_time = math.ceil(min_time / step_s)
        enough = max(for_time, min(MIN_TIMED_ITERS, 2 * for_time))
        assert plan.total_iters == max(repeats, repeats * math.ceil(enough / repeats))


@pytest.mark.parametrize("iters,repeats,sizes", [(39, 20, [2] * 19 + [1]), (25, 20, [2] * 5 + [1] * 15), (7, 3, [3, 2, 2])])
def test_an_uneven_iters_is_kept_exactly(iters, repeats, sizes):
    plan = plan_timing(step_s=0.01, repeats=repeats, min_time=1.0, min_iters=50, iters=iters)
    assert plan.block_sizes == sizes
    assert plan.total_iters == sum(sizes) == iters


# ---------------------------------------------------------------------------------------------------
# One statistics module (perflab.stats): one summary for bench and run, one paired-ratio direction, the t-interval on
# logarithms once


def bench_row_timing(samples):
    from perflab.measure.harness import timing_fields

    return timing_fields({"batch_size": 1, "items_per_step": 1, "gflops_per_batch": 1.0}, samples)


def test_a_run_of_3_steps_states_the_coverage_bench_states_for_3_samples_not_95_percent():
    from perflab.program.recorder import timing_summary
    from perflab.report.program import ci_label

    steps = [10.0, 10.4, 10.1]
    run, row = timing_summary(steps, []), bench_row_timing(steps)
    # three stretches of one step: a t-interval over 3 units, which holds all three: what their ranks guarantee, 75%
    assert run["ci_level"] == row["ci_level"] == "time" and run["ci_units"] == row["ci_units"] == 3
    assert run["ci_coverage"] == row["ci_coverage"] == 0.75
    assert run["ci95_ms"] == row["ci95_ms"] and run["median_ms"] == row["median_ms"] == 10.1
    assert ci_label(run) == "≥75% CI over stretches of the run"
    assert ci_label(timing_summary([10.0 + 0.1 * i for i in range(10)], [])) == "95% CI over stretches of the run"
    assert ci_label(timing_summary([10.0, 10.4], [])) == "order-statistics interval (few stretches): min–max of 2"
    # the keys run.json carried before, the CI under a name that claims no level (ci_ms) and its coverage beside them
    assert set(run) == {"steps", "median_ms", "mean_ms", "p10_ms", "p90_ms", "cv", "ci_ms", "ci95_ms", "ci_level", "ci_units",
                        "ci_coverage", "samples_ms", "host_median_ms"}
    assert run["ci_ms"] == run["ci95_ms"]


def test_the_timing_summary_is_one_typed_record_whose_dict_the_row_carries():
    from perflab.stats import TimingSummary

    s = summarize([5.0, 1.0, 4.0, 2.0, 3.0, 10.0])
    assert isinstance(s, TimingSummary) and s.n == 6
    assert (s.p10, s.p90) == (1.5, 7.5)  # linear between order statistics: 1 + 0.5 × (2 − 1), 5 + 0.5 × (10 − 5)
    row = bench_row_timing([5.0, 1.0, 4.0, 2.0, 3.0, 10.0])
    assert {k: row[k] for k in s.to_dict()} == s.to_dict()
    assert row["ci95_within_ms"] == [1.0, 10.0] and row["n_samples"] == 6
    with pytest.raises(Exception):
        s.median = 0.0  # frozen


def test_the_t_interval_on_logs_by_hand():
    from perflab.stats import log_t_interval, welch_log_ratio

    values = [1.0, 2.0, 4.0]  # logs: 0, ln 2, 2 ln 2; mean ln 2; sd ln 2; t(2) = 4.303
    t = log_t_interval(values)
    half = 4.303 * math.log(2) / math.sqrt(3)
    assert (t.center, t.dof) == (pytest.approx(2.0), 2)
    assert t.low == pytest.approx(2.0 * math.exp(-half)) and t.high == pytest.approx(2.0 * math.exp(half))
    assert t.low == pytest.approx(0.3574, abs=1e-4) and t.high == pytest.approx(11.191, abs=1e-3)  # half-width 1.7220 on the logs
    # Welch: A = (1, 2), B = (4, 8): log-means 0.5 ln 2 and 2.5 ln 2, each variance (ln 2)² / 2 over 2 values;
    # se² = (ln 2)² / 2, equal variances and sizes: df = 2 → t(2)
    w = welch_log_ratio([1.0, 2.0], [4.0, 8.0])
    se = math.log(2) / math.sqrt(2)
    assert (w.center, w.dof) == (pytest.approx(4.0), 2)
    assert (w.low, w.high) == (pytest.approx(4.0 * math.exp(-4.303 * se)), pytest.approx(4.0 * math.exp(4.303 * se)))
    with pytest.raises(ValueError):
        log_t_interval([1.0, -2.0])


def test_one_paired_ratio_reads_b_over_a_everywhere():
    from perflab.analysis.regressions import one_round_blocks_ratio
    from perflab.report.markdown import speedup_cell
    from perflab.report.tables import pair
    from perflab.stats import paired_ratio

    rounds = list(range(20))
    host = [1.0] * 10 + [2.0] * 10  # the host at half speed for the second half: it cancels in each pair
    a = {"session": "s", "samples_ms": [2.0 * h for h in host], "sample_rounds": rounds, "sample_processes": [0] * 20}
    b = {"session": "s", "samples_ms": [2.5 * h for h in host], "sample_rounds": rounds, "sample_processes": [0] * 20}
    assert paired_ratio(a, b)["ratio"] == pytest.approx(1.25)  # B's time ÷ A's: above 1, B is slower
    assert paired_ratio(b, a)["ratio"] == pytest.approx(0.8)
    ratio = one_round_blocks_ratio(a, b)  # ab/track's verdicts read the same direction
    assert ratio.ratio == pytest.approx(1.25) and ratio.basis == "blocks"
    # the speedup of B over A is A's time ÷ B's, and markdown's CI is that paired ratio's, not one made of the medians' CIs
    common = dict(input_size=224, batch_size=1, dtype="bf16", mode="eager", status="ok", gflops=1.0, median_ms=3.0,
                  throughput_per_s=1000 / 3.0)
    entry = pair(dict(a, model="m", ci95_ms=[2.0, 4.0], **common), dict(b, model="topk_m", ci95_ms=[2.5, 5.0], **common))
    assert entry["speedup"] == pytest.approx(0.8)
    assert speedup_cell(entry) == "0.800× [0.800–0.800]"  # from the medians' CI ends it read [0.400–1.600]
    unpaired = pair(dict(a, model="m", session=None, ci95_ms=[2.0, 4.0], **common),
                    dict(b, model="topk_m", session=None, ci95_ms=[2.5, 5.0], **common))
    assert speedup_cell(unpaired) == "1.000× (unpaired)"


def test_decode_takes_the_p90_per_token_time_by_the_one_percentile_rule():
    from types import SimpleNamespace

    from perflab.workloads.decode import Decode

    built = SimpleNamespace(extra={})
    offsets_ms = [1.0, 2.0, 3.0, 5.0, 8.0, 12.0]  # first token after 1 ms, then 1, 1, 2, 3, 4 ms a token

    def step():  # the host stamps perflab.clock.StepClock takes on the CPU, at these offsets
        start = built.extra["token_stamps"][0]
        built.extra["token_stamps"] += [(None, start[1] + round(ms * 1e6)) for ms in offsets_ms]

    case = SimpleNamespace(workload="generate", mode="eager", device="cpu")
    out = Decode().after_timing(case, built, step, {})
    assert out["ttft_ms"] == pytest.approx(1.0)
    # per-token times 1, 1, 2, 3, 4: p90 at rank 3.6, 3 + 0.6 × (4 − 3); the nearest rank read 4
    assert out["tpot_p90_ms"] == pytest.approx(3.6)


# ---------------------------------------------------------------------------------------------------
# Two modes, and no point outside its own interval


def alternating_steps(n=20, seed=55):
    """The planted case: steps that alternate fast (0.4 ms) and slow (41–54 ms), as a program that synchronises every
    other step times them. Their pooled median is the midpoint of the two modes' nearest samples, a time no step took."""
    slow = np.random.default_rng(seed).uniform(41.0, 54.0, n // 2)
    return [v for s in slow for v in (0.4, float(s))]


def test_steps_alternating_fast_and_slow_give_a_median_inside_its_own_ci_and_two_modes_said():
    from perflab.stats import modes_words

    steps = alternating_steps()
    s = summarize(steps)
    # before: a CI around the geometric mean of 5 stretch medians (each the midpoint of 0.4 and one slow step),
    # 21.17–26.38 ms, above the pooled median of 21.14 ms it was printed beside; now 17.48–25.56 around it
    assert s.ci_low <= s.median <= s.ci_high and s.within_low <= s.median <= s.within_high
    assert s.modes is not None and (s.modes.fast_n, s.modes.slow_n) == (10, 10) and s.modes.fast_ms == 0.4
    assert 41.0 <= s.modes.slow_ms <= 54.0 and s.modes.gap_low_ms == 0.4 and s.modes.gap_high_ms == min(steps[1::2])
    words = modes_words(s.to_dict()["modes"], s.median)
    assert words.startswith("two modes: 10 of 20 samples at 0.4 ms (50%), 10 at ")
    assert "lies in the gap between them, a time no sample took" in words
    # run.json and a bench row carry them; a unimodal summary carries no modes key (run.json's keys as before)
    assert s.to_dict()["modes"]["fast_share"] == 0.5 and "modes" not in summarize([1.0 + 0.01 * i for i in range(20)]).to_dict()


def test_the_ci_is_centred_on_the_median_by_sectioning():
    from perflab.stats import hierarchical_ci, t975

    # five stretches of four: their medians 1, 2, 3, 4, 5 (each the midpoint of its middle two), all twenty's median 3.5
    x = [v for m in (1.0, 2.0, 3.0, 4.0, 5.0) for v in (m - 0.1, m - 0.05, m + 0.05, m + 0.1)]
    ci = hierarchical_ci(x, None, range(20))
    assert ci.level == "time" and ci.units == pytest.approx((1.0, 2.0, 3.0, 4.0, 5.0)) and ci.center == float(np.median(x))
    logs = np.log(ci.units)
    se = math.sqrt(((logs - math.log(ci.center)) ** 2).sum() / 4 / 5)  # the units' spread about the centre, not their mean
    assert (ci.low, ci.high) == (pytest.approx(ci.center * math.exp(-t975(4) * se)), pytest.approx(ci.center * math.exp(t975(4) * se)))


def test_no_summary_or_paired_ratio_returns_a_point_outside_its_interval():
    from perflab.stats import IntervalError, check_inside, paired_ratio

    rng = np.random.default_rng(7)
    draws = [np.exp(rng.normal(0, 0.3, 20)), alternating_steps(seed=1), np.r_[np.full(12, 1.0), np.full(8, 9.0)],
             [2.0] * 20, rng.gamma(0.3, 1.0, 17) + 1e-3, [1.0, 100.0, 1.0, 100.0, 1.0]]
    for x in draws:
        s = summarize(x)
        assert s.ci_low <= s.median <= s.ci_high and s.within_low <= s.median <= s.within_high, list(x)
    for x in draws[:3]:
        a = {"session": "s", "samples_ms": [1.0] * len(x), "sample_rounds": list(range(len(x)))}
        r = paired_ratio(a, dict(a, samples_ms=list(x)))
        assert r["ci95"][0] <= r["ratio"] <= r["ci95"][1]
    with pytest.raises(IntervalError, match="the median, 20.781, lies outside its own interval"):
        check_inside(20.781, 21.057, 22.618, "the median")  # the identity, checked before a summary is returned


def test_two_modes_are_found_only_where_the_samples_show_them():
    from perflab.stats import modes_of

    rng = np.random.default_rng(3)
    unimodal = [np.exp(rng.normal(0, 0.3, 20)), 1 + rng.exponential(0.2, 20), rng.gamma(2, 1, 30), rng.uniform(1, 2, 50),
                np.exp(rng.normal(0, 0.02, 200))]
    assert [modes_of(x) for x in unimodal] == [None] * 5
    every_seventh = np.exp(rng.normal(0, 0.01, 70)) * np.where(np.arange(70) % 7 == 0, 3.0, 1.0)  # 10 of 70 steps at 3×
    modes = modes_of(every_seventh)
    assert (modes.fast_n, modes.slow_n) == (60, 10) and modes.slow_ms / modes.fast_ms == pytest.approx(3.0, rel=0.05)
    assert modes_of(alternating_steps()[:18]) is None  # too few samples to tell two modes from chance
    assert modes_of([1.0] * 10 + [1.1] * 10) is None  # two values 10% apart: not worth a mode each


def test_the_spread_of_two_modes_is_said_as_theirs_not_the_machines():
    from perflab.measure.checks import spread_checks, spread_of

    checks = run_checks(requested_batch=1, processed_batch=1, timed_s=2.0, timed_iters=100, energy_j=1.0, energy_unavailable=None,
                        throttle_reasons=[], other_processes=[], **spread_of(alternating_steps()))
    # the spread is the distance between the modes: the bimodal line says its CV, and high_cv does not blame the machine
    assert [c.flag for c in checks] == ["bimodal"] and "machine" not in checks[0].message
    assert checks[0].message.startswith("two modes: 10 of 20 samples at 0.4 ms (50%)")
    assert checks[0].message.endswith("; the CV of 101.5% is the distance between the modes, not noise")
    noisy = spread_checks(0.2, None, 1.0)
    assert [c.flag for c in noisy] == ["high_cv"] and "the machine may be busy" in noisy[0].message


def test_combined_log_interval_is_the_within_run_ratios_interval_to_the_last_bit():
    """stats.combined_log_interval: the normal interval regressions.within_run_ratio computed by hand before, the same
    floats (the same operations in the same order)."""
    from perflab.analysis.regressions import within_run_ratio
    from perflab.stats import Z975, combined_log_interval

    assert Z975 == 1.959964
    assert combined_log_interval(1.5, ((1.9, 2.1), (2.8, 3.3))) == (1.362433370759537, 1.651456906656402)
    assert combined_log_interval(2.0, [(1.0, 4.0)]) == pytest.approx((1.0, 4.0), rel=1e-15)  # one interval: itself
    assert combined_log_interval(3.0, [(1.0, 1.0), (2.0, 2.0)]) == (3.0, 3.0)  # no width: none
    rng = np.random.default_rng(3)
    for _ in range(200):
        ma, mb = rng.uniform(0.1, 100, 2)
        ca = sorted(ma * rng.uniform(0.8, 1.25, 2))
        cb = sorted(mb * rng.uniform(0.8, 1.25, 2))
        se = math.hypot(math.log(ca[1] / ca[0]), math.log(cb[1] / cb[0])) / (2 * 1.959964)  # the code it replaced
        ratio = mb / ma
        before = (ratio * math.exp(-1.959964 * se), ratio * math.exp(1.959964 * se))
        assert combined_log_interval(ratio, (ca, cb)) == before
        r = within_run_ratio({"median_ms": ma, "ci95_ms": ca}, {"median_ms": mb, "ci95_ms": cb})
        assert (r.ratio, r.low, r.high) == (ratio, *before)
