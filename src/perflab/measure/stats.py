"""Summary statistics of timing samples: median, p10/p90, CV, and a distribution-free 95% CI of the median."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class Summary:
    n: int
    median: float
    mean: float
    p10: float
    p90: float
    cv: float  # standard deviation / mean
    ci95_low: float
    ci95_high: float
    ci_coverage: float  # the actual coverage of [ci95_low, ci95_high]; below 0.95 when n is small

    def to_dict(self) -> dict:
        return asdict(self)


def rank_coverage(n: int, lo: int, hi: int) -> float:
    """The coverage, for the median, of [X(lo), X(hi)] (0-based ranks of n values): P(lo < B ≤ hi), B ~ Binomial(n, 1/2)."""
    return sum(math.comb(n, j) for j in range(lo + 1, hi + 1)) / 2**n


def median_ci_ranks(n: int, level: float = 0.95) -> tuple[int, int, float]:
    """0-based ranks (lo, hi) of order statistics bracketing the median with coverage ≥ level (``rank_coverage``).

    The narrowest symmetric pair that reaches the level; with too few samples, the full range.
    """
    if n < 1:
        raise ValueError("no samples")
    best = (0, n - 1, rank_coverage(n, 0, n - 1))
    for j in range(n // 2, -1, -1):  # j = number of samples below the low bound
        k = n - 1 - j
        if k < j:
            continue
        coverage = rank_coverage(n, j, k)
        if coverage >= level:
            return j, k, coverage
    return best


def summarize(samples) -> Summary:
    x = np.sort(np.asarray(samples, dtype=float))
    n = len(x)
    mean = float(x.mean())
    lo, hi, coverage = median_ci_ranks(n)
    return Summary(
        n=n,
        median=float(np.median(x)),
        mean=mean,
        p10=float(np.percentile(x, 10)),
        p90=float(np.percentile(x, 90)),
        cv=float(x.std(ddof=1) / mean) if n > 1 and mean > 0 else 0.0,
        ci95_low=float(x[lo]),
        ci95_high=float(x[hi]),
        ci_coverage=float(coverage),
    )


# ---------------------------------------------------------------------------------------------------
# Confidence intervals that hold from run to run: the hierarchy of a case's samples (blocks within time segments
# within processes), and paired ratios of cases timed together.

# Two-sided 97.5% quantiles of Student's t for 1..30 degrees of freedom (beyond 30, the normal's 1.96 is within 2%).
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
MIN_UNITS = 3  # a level of the hierarchy needs this many units to estimate its spread
FULL_UNITS = 5  # from this many units, the t-interval's 95% is stated; from fewer, what the units' ranks guarantee
TIME_SEGMENTS = 5  # one process's blocks are cut into this many stretches of consecutive rounds


def t975(dof: int) -> float:
    if dof < 1:
        raise ValueError("no degrees of freedom")
    return _T975[dof - 1] if dof <= len(_T975) else 1.96


@dataclass(frozen=True)
class HierarchicalCI:
    """A 95% CI of a case's typical step time (or of a paired ratio) taken across independent units.

    ``level``: what the units are: ``process`` (each process's median; between-process variance is in the
    interval) or ``time`` (stretches of consecutive rounds of one process or more: drift of the host over the
    run is in the interval, a per-process offset is not). ``units``: their medians."""

    low: float
    high: float
    center: float
    level: str
    n_units: int
    units: tuple[float, ...]
    coverage: float = 0.95  # what to state: 0.95 from FULL_UNITS units; below, a distribution-free bound (order_coverage)


def order_coverage(low: float, high: float, values) -> float:
    """The coverage, for the median of the distribution ``values`` are drawn from, that [low, high] is sure of whatever
    that distribution: that of the widest run of order statistics X(i)..X(k) it contains, P(i ≤ B < k) for
    B ~ Binomial(n, 1/2). [min, max] of n values: 1 − 2^(1−n) (2 values: 50%, 3: 75%, 4: 87.5%); 0 where it holds
    fewer than two of them."""
    x = np.sort(np.asarray(values, dtype=float))
    n = len(x)
    inside = np.flatnonzero((x >= low) & (x <= high))
    if len(inside) < 2:
        return 0.0
    return rank_coverage(n, int(inside[0]), int(inside[-1]))  # the widest run of ranks inside


def time_segments(rounds, n_segments: int = TIME_SEGMENTS) -> np.ndarray:
    """The stretch of consecutive rounds each sample falls in: rounds 0..R-1 cut into ``n_segments`` (fewer when
    there are fewer rounds) contiguous, nearly equal stretches."""
    rounds = np.asarray(rounds, dtype=int)
    distinct = np.unique(rounds)
    k = max(1, min(n_segments, len(distinct)))
    position = np.searchsorted(distinct, rounds)  # 0..len(distinct)-1, in time order
    return (position * k) // len(distinct)


def hierarchical_ci(samples, processes=None, rounds=None, n_segments: int = TIME_SEGMENTS) -> HierarchicalCI:
    """95% CI of the median step time from samples that form a hierarchy: blocks, in rounds, in processes.

    The interval is taken across the highest level that has at least ``MIN_UNITS`` units: the processes'
    medians when there are three or more processes, else the medians of stretches of consecutive rounds
    (``time_segments``, per process). Each unit's median is one observation; the interval is a Student-t
    interval on their logarithms (step times are positive and their spread scales with them), so its width
    follows the spread *between* units, which the pooled order statistics of ``summarize`` ignore: blocks of
    one process share that process's host state, and their interval describes the process, not the next run.
    With fewer than ``MIN_UNITS`` units the interval is the pooled order-statistics one (``level`` says so).
    """
    x = np.asarray(samples, dtype=float)
    if len(x) == 0:
        raise ValueError("no samples")
    procs = np.zeros(len(x), dtype=int) if processes is None else np.asarray(processes)
    rnds = np.arange(len(x)) if rounds is None else np.asarray(rounds)
    distinct = np.unique(procs)
    if len(distinct) >= MIN_UNITS:
        level = "process"
        units = [float(np.median(x[procs == p])) for p in distinct]
    else:
        level = "time"
        units = []
        for p in distinct:
            mask = procs == p
            segments = time_segments(rnds[mask], n_segments)
            units += [float(np.median(x[mask][segments == s])) for s in np.unique(segments)]
    if len(units) < MIN_UNITS or min(units) <= 0:
        s = summarize(x)
        return HierarchicalCI(s.ci95_low, s.ci95_high, s.median, "pooled", len(units), tuple(units), s.ci_coverage)
    logs = np.log(units)
    mean, sd = float(logs.mean()), float(logs.std(ddof=1))
    half = t975(len(units) - 1) * sd / math.sqrt(len(units))
    low, high = math.exp(mean - half), math.exp(mean + half)
    # From fewer than FULL_UNITS units, a t-interval's 95% rests on their being normal, which so few cannot show: state
    # what their ranks guarantee instead (at most 75% from 3, 87.5% from 4).
    coverage = 0.95 if len(units) >= FULL_UNITS else min(0.95, order_coverage(low, high, units))
    return HierarchicalCI(low, high, math.exp(mean), level, len(units), tuple(units), coverage)


def paired_ratios(a: dict, b: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ratios a/b of two cases' blocks timed next to each other: the samples of each (``samples_ms``), matched by
    process and round (``sample_processes``, ``sample_rounds``: in an interleaved run every case times one block
    per round, and a comparison's cases are adjacent in each round). Returns (ratios, processes, rounds); empty
    when the two were not timed together."""
    def keyed(row):
        samples = row.get("samples_ms") or []
        rounds = row.get("sample_rounds")
        if rounds is None or len(rounds) != len(samples):
            return {}
        procs = row.get("sample_processes") or [0] * len(samples)
        out = {}
        for value, p, r in zip(samples, procs, rounds):
            out.setdefault((p, r), []).append(value)
        return {k: float(np.median(v)) for k, v in out.items()}

    if not a.get("session") or a.get("session") != b.get("session"):
        return np.array([]), np.array([], dtype=int), np.array([], dtype=int)
    ka, kb = keyed(a), keyed(b)
    keys = sorted(set(ka) & set(kb))
    ratios = np.array([ka[k] / kb[k] for k in keys if kb[k] > 0])
    return ratios, np.array([k[0] for k in keys], dtype=int), np.array([k[1] for k in keys], dtype=int)


def paired_ratio(a: dict, b: dict) -> dict | None:
    """The median of a/b over blocks timed together, with its hierarchical 95% CI; None when not paired.

    For a speedup of B over A pass (A's row, B's row): a/b > 1 means B's step is shorter. A host slowdown that
    lasts longer than a round lengthens both blocks of a pair, so it cancels in the ratio, where it would not in
    two medians taken at different times."""
    ratios, procs, rounds = paired_ratios(a, b)
    if len(ratios) == 0:
        return None
    ci = hierarchical_ci(ratios, procs, rounds)
    return {"ratio": float(np.median(ratios)), "ci95": [ci.low, ci.high], "level": ci.level, "pairs": int(len(ratios)),
            "units": ci.n_units, "coverage": ci.coverage, "range_of": range_of(ci.low, ci.high, ratios)}


def range_of(low: float, high: float, values) -> int | None:
    """n where [low, high] is the min–max of the n ``values`` (too few for more: ``median_ci_ranks``), else None."""
    values = list(values)
    return len(values) if values and low == min(values) and high == max(values) else None


def ci_coverage_of(row: dict) -> float | None:
    """The coverage a row's ``ci95_ms`` may state (``HierarchicalCI.coverage``): its ``ci_coverage``, or for rows stored
    before it, worked out again from their samples; None where there are none."""
    if row.get("ci_coverage") is not None:
        return row["ci_coverage"]
    samples = row.get("samples_ms")
    if not samples:
        return None
    return hierarchical_ci(samples, row.get("sample_processes"), row.get("sample_rounds")).coverage
