"""Timing statistics and the timing plan."""

import math

import numpy as np
import pytest

from perflab.measure.checks import MIN_TIMED_ITERS, run_checks
from perflab.measure.stats import median_ci_ranks, summarize
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
    assert (s.ci95_low, s.ci95_high) == (1.0, 10.0)


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
