"""``analysis.intervals.interval_at``: the one lookup of the interval holding each time (step windows, pass ranges,
counted operators, compiled regions)."""

from __future__ import annotations

import numpy as np

from perflab.analysis.intervals import interval_at


def test_half_open_intervals():
    starts, ends = np.array([10, 20, 40]), np.array([20, 30, 50])
    times = np.array([5, 10, 15, 19, 20, 29, 30, 35, 40, 49, 50, 99])
    # 20 is the end of the first and the start of the second: in the second; 30 ends the second, nothing starts there
    assert interval_at(starts, ends, times).tolist() == [-1, 0, 0, 0, 1, 1, -1, -1, 2, 2, -1, -1]


def test_closed_intervals_hold_their_ends():
    starts, ends = np.array([10, 20, 40]), np.array([20, 30, 50])
    times = np.array([5, 10, 20, 30, 31, 50, 51])
    assert interval_at(starts, ends, times, closed=True).tolist() == [-1, 0, 1, 1, -1, 2, -1]


def test_zero_length_intervals():
    starts, ends = np.array([10, 20]), np.array([10, 20])
    assert interval_at(starts, ends, np.array([10, 20])).tolist() == [-1, -1]
    assert interval_at(starts, ends, np.array([10, 15, 20]), closed=True).tolist() == [0, -1, 1]


def test_ties_and_nested_intervals():
    # two start at 10: the last of them is tested; [0, 100) holds 60 only once its end is carried forward
    starts, ends = np.array([0, 10, 10]), np.array([100, 50, 20])
    assert interval_at(starts, ends, np.array([15, 30, 60])).tolist() == [2, -1, -1]
    assert interval_at(starts, np.maximum.accumulate(ends), np.array([15, 30, 60, 100])).tolist() == [2, 2, 2, -1]


def test_empty():
    assert interval_at(np.array([], dtype=np.int64), np.array([], dtype=np.int64), np.array([1, 2])).tolist() == [-1, -1]
    assert interval_at(np.array([0]), np.array([5]), np.array([], dtype=np.int64)).tolist() == []
    assert interval_at(np.array([0]), np.array([5]), np.array([], dtype=np.int64)).dtype == np.int64


def test_times_in_any_order():
    starts, ends = np.array([0, 100]), np.array([50, 150])
    assert interval_at(starts, ends, np.array([120, 10, 75, 0, 149])).tolist() == [1, 0, -1, 0, 1]


def test_same_as_the_lookups_it_replaced():
    rng = np.random.default_rng(7)
    starts = np.sort(rng.integers(0, 1000, 40))
    ends = starts + rng.integers(0, 60, 40)
    times = rng.integers(-10, 1100, 500)
    # compare.window_of_activities / accounting._activities_per_window / passes: [start, end)
    window = np.searchsorted(starts, times, side="right") - 1
    half_open = np.where((window >= 0) & (times < ends[np.maximum(window, 0)]), window, -1)
    assert (interval_at(starts, ends, times) == half_open).all()
    # op_flops / program: [start, end]
    pos = np.searchsorted(starts, times, side="right") - 1
    ok = pos >= 0
    ok[ok] = ends[pos[ok]] >= times[ok]
    assert ((interval_at(starts, ends, times, closed=True) >= 0) == ok).all()
