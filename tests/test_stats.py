"""Timing statistics and the timing plan."""

import math

import numpy as np
import pytest

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


def test_plan_aims_for_min_time_and_min_iters():
    plan = plan_timing(step_s=0.001, repeats=20, min_time=1.0, min_iters=50, iters=None)
    assert plan.total_iters * 0.001 == pytest.approx(1.0, rel=0.05)
    slow = plan_timing(step_s=0.5, repeats=20, min_time=1.0, min_iters=50, iters=None)
    assert (slow.n_blocks, slow.block_iters) == (20, 3)  # 50 iterations at least, 3 per block


@pytest.mark.parametrize("iters,repeats,sizes", [(39, 20, [2] * 19 + [1]), (25, 20, [2] * 5 + [1] * 15), (7, 3, [3, 2, 2])])
def test_an_uneven_iters_is_kept_exactly(iters, repeats, sizes):
    plan = plan_timing(step_s=0.01, repeats=repeats, min_time=1.0, min_iters=50, iters=iters)
    assert plan.block_sizes == sizes
    assert plan.total_iters == sum(sizes) == iters
