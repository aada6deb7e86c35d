"""Unions of integer-ns intervals, vectorised: the building block of every busy-time figure; and the one lookup of the
interval that holds each time (:func:`interval_at`: a launch's step window, pass range, counted operator)."""

from __future__ import annotations

import numpy as np


def union_blocks(start: np.ndarray, end: np.ndarray, presorted: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge intervals [start, end) into disjoint blocks.

    Returns ``(block_start, block_end, order)``: the blocks in time order, and the order that sorts the
    input by start. Intervals that touch (one ends where the next starts) merge; zero-length intervals
    never open a gap.
    """
    start = np.asarray(start, dtype=np.int64)
    end = np.asarray(end, dtype=np.int64)
    order = np.arange(len(start)) if presorted else np.argsort(start, kind="stable")
    if len(start) == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, order
    s, e = start[order], end[order]
    reach = np.maximum.accumulate(e)  # the furthest end of any interval so far
    opens = np.ones(len(s), dtype=bool)
    opens[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(opens)
    last = np.append(first[1:] - 1, len(s) - 1)
    return s[first], reach[last], order


def union_length(start: np.ndarray, end: np.ndarray) -> int:
    block_start, block_end, _ = union_blocks(start, end)
    return int((block_end - block_start).sum())


def union_length_by_group(start: np.ndarray, end: np.ndarray, group: np.ndarray, n_groups: int) -> np.ndarray:
    """The length of the union of each group's intervals (groups are 0..n_groups-1).

    One sort for all groups: each group is shifted to its own stretch of the number line, further apart
    than the whole time span, so that intervals of different groups can never merge.
    """
    if len(start) == 0:
        return np.zeros(n_groups, dtype=np.int64)
    start = np.asarray(start, dtype=np.int64)
    end = np.asarray(end, dtype=np.int64)
    origin = int(start.min())
    stretch = int(end.max()) - origin + 1
    if stretch * max(n_groups, 1) >= 2**62:  # cannot shift without overflow: one union per group
        return np.array([union_length(start[group == g], end[group == g]) for g in range(n_groups)], dtype=np.int64)
    offset = (np.asarray(group, dtype=np.int64) * stretch) - origin
    block_start, block_end, _ = union_blocks(start + offset, end + offset)
    return sum_by_group(block_end - block_start, block_start // stretch, n_groups)


def sum_by_group(values: np.ndarray, group: np.ndarray, n_groups: int) -> np.ndarray:
    """Exact int64 sums per group (np.bincount would sum in float64)."""
    out = np.zeros(n_groups, dtype=np.int64)
    if len(values):
        np.add.at(out, np.asarray(group, dtype=np.int64), np.asarray(values, dtype=np.int64))
    return out


def interval_at(starts: np.ndarray, ends: np.ndarray, times: np.ndarray, closed: bool = False) -> np.ndarray:
    """For each of ``times``, the index of the interval holding it, or -1 where none does.

    ``starts`` must be sorted ascending (sort them, with ``ends``, first); the interval tested for a time is the last one
    starting at or before it (ties: the last of them), so for intervals that overlap pass ``np.maximum.accumulate(ends)``
    to ask whether any interval starting before the time still covers it. An interval holds ``[start, end)``, or
    ``[start, end]`` with ``closed``; where one interval ends as the next starts, a time there is in the next.
    """
    starts = np.asarray(starts)
    ends = np.asarray(ends)
    times = np.asarray(times)
    if len(starts) == 0:
        return np.full(times.shape, -1, dtype=np.int64)
    pos = (np.searchsorted(starts, times, side="right") - 1).astype(np.int64)
    end = ends[np.maximum(pos, 0)]
    inside = (pos >= 0) & ((times <= end) if closed else (times < end))
    return np.where(inside, pos, -1)
