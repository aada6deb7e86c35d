"""The statistics of timing samples, torch-free and on the bottom floor: measure, analysis, program and report import it.

- **The percentile rule**: linear interpolation between order statistics (:func:`percentile`, numpy's default).
- **Distribution-free CIs of a median**: the pair of order statistics that brackets it with the coverage their ranks
  guarantee (:func:`median_ci_ranks`, :func:`rank_coverage`, :func:`order_coverage`).
- **The t-interval on logarithms**, written once (:func:`log_t_interval`, one sample; :func:`welch_log_ratio`, two):
  step times are positive and their spread scales with them.
- **Hierarchical CIs** (:func:`hierarchical_ci`): across processes, else stretches of the run, and the coverage they
  may claim: 95% from ``FULL_UNITS`` units, from fewer what the units' ranks guarantee.
- **The timing summary** (:class:`TimingSummary`, :func:`summarize`): what ``bench``'s rows and ``perflab run``'s
  run.json carry about their samples.
- **The paired ratio** (:func:`paired_ratio`): B's time ÷ A's over blocks timed next to each other, the direction the
  verdicts read (above 1, B is slower).
- **Ratios on logarithms** (:func:`log_median`): every median or mean of ratios is taken on their logarithms, so a
  change and its inverse weigh alike (the plain median of 0.5 and 2 is 1.25; on logs, 1).
- **What a run can detect** (:func:`detectable_change`, :func:`units_needed`): the smallest change an interval of this
  spread finds four times in five, and how many units (rounds, steps) would find a given one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

LEVEL = 0.95  # the coverage every interval here aims at (t975 quantiles, median_ci_ranks' default)
MIN_UNITS = 3  # a level of the hierarchy needs this many units to estimate its spread
FULL_UNITS = 5  # from this many units, the t-interval's 95% is stated; from fewer, what the units' ranks guarantee
TIME_SEGMENTS = 5  # one process's blocks are cut into this many stretches of consecutive rounds

# Two-sided 97.5% quantiles of Student's t for 1..30 degrees of freedom (beyond 30, the normal's 1.96 is within 2%).
# One-sided 80% quantiles (the 80% power of a detectable change), the same degrees of freedom; beyond 30, the normal's 0.842.
_T80 = (1.376, 1.061, 0.978, 0.941, 0.920, 0.906, 0.896, 0.889, 0.883, 0.879, 0.876, 0.873, 0.870, 0.868, 0.866,
        0.865, 0.863, 0.862, 0.861, 0.860, 0.859, 0.858, 0.858, 0.857, 0.856, 0.856, 0.855, 0.855, 0.854, 0.854)
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def percentile(values, q: float) -> float:
    """The ``q``-th percentile (0–100) of ``values``, interpolated linearly between the order statistics around it."""
    return float(np.percentile(np.asarray(values, dtype=float), q))


# ---------------------------------------------------------------------------------------------------
# Distribution-free: what the ranks of n values guarantee about their distribution's median


def rank_coverage(n: int, lo: int, hi: int) -> float:
    """The coverage, for the median, of [X(lo), X(hi)] (0-based ranks of n values): P(lo < B ≤ hi), B ~ Binomial(n, 1/2)."""
    return sum(math.comb(n, j) for j in range(lo + 1, hi + 1)) / 2**n


def median_ci_ranks(n: int, level: float = LEVEL) -> tuple[int, int, float]:
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


def range_of(low: float, high: float, values) -> int | None:
    """n where [low, high] is the min–max of the n ``values`` (too few for more: ``median_ci_ranks``), else None."""
    values = list(values)
    return len(values) if values and low == min(values) and high == max(values) else None


# ---------------------------------------------------------------------------------------------------
# The t-interval on logarithms


def t975(dof: int | None) -> float:
    """Student's two-sided 95% quantile for ``dof`` degrees of freedom (None: the normal's, a large sample)."""
    if dof is None:
        return 1.96
    if dof < 1:
        raise ValueError("no degrees of freedom")
    return _T975[dof - 1] if dof <= len(_T975) else 1.96


def t80(dof: int | None) -> float:
    """Student's one-sided 80% quantile (None: the normal's 0.842): the margin a change needs beyond a bound to be
    found four times in five."""
    if dof is None:
        return 0.842
    if dof < 1:
        raise ValueError("no degrees of freedom")
    return _T80[dof - 1] if dof <= len(_T80) else 0.842


def log_median(values) -> float:
    """The median of positive values (ratios) taken on their logarithms: exp(median(log x)). Of an odd count, the
    middle value, as the plain median; of an even count, the geometric mean of the middle two, where the plain median
    takes their arithmetic mean and so leans above 1: of 4 block ratios 0.66, 0.66, 1.51, 1.51 (a first-block effect
    falling on each side in turn) the plain median is 1.09, this one 1.00."""
    logs = _logs(values)
    if len(logs) == 0:
        raise ValueError("no values")
    return float(math.exp(np.median(logs)))


@dataclass(frozen=True)
class LogInterval:
    """A geometric centre and its Student-t 95% interval, taken on logarithms and turned back: log-mean ± t975(dof) × se."""

    center: float
    low: float
    high: float
    dof: int

    @property
    def se(self) -> float:
        """The standard error of the log-centre the interval was built from."""
        return math.log(self.high / self.center) / t975(self.dof)


def _t_on_logs(log_mean: float, se: float, dof: int) -> LogInterval:
    half = t975(dof) * se
    return LogInterval(math.exp(log_mean), math.exp(log_mean - half), math.exp(log_mean + half), dof)


def _logs(values) -> np.ndarray:
    x = np.asarray(values, dtype=float)
    if len(x) and not (x > 0).all():
        raise ValueError("the t-interval on logarithms takes positive values only")
    return np.log(x)


def log_t_interval(values) -> LogInterval:
    """The geometric mean of two or more positive values and Student's t 95% interval on their logarithms."""
    logs = _logs(values)
    n = len(logs)
    if n < 2:
        raise ValueError("a t-interval needs two values or more")
    return _t_on_logs(float(logs.mean()), float(logs.std(ddof=1)) / math.sqrt(n), n - 1)


def _welch(xa: np.ndarray, xb: np.ndarray) -> tuple[float, float, int]:
    """(mean of B − mean of A, its standard error, Welch–Satterthwaite degrees of freedom rounded down) of two
    independent samples of two or more values each."""
    na, nb = len(xa), len(xb)
    if na < 2 or nb < 2:
        raise ValueError("Welch's interval needs two values or more on each side")
    va, vb = float(xa.var(ddof=1)) / na, float(xb.var(ddof=1)) / nb
    se2 = va + vb
    dof = se2 ** 2 / (va ** 2 / (na - 1) + vb ** 2 / (nb - 1)) if se2 > 0 else na + nb - 2
    return float(xb.mean() - xa.mean()), math.sqrt(se2), max(1, int(math.floor(dof)))


def welch_log_ratio(a, b) -> LogInterval:
    """B ÷ A of two independent samples' geometric means (two or more positive values each), with Welch's t 95% interval
    on the difference of their log-means (Welch–Satterthwaite degrees of freedom, rounded down)."""
    return _t_on_logs(*_welch(_logs(a), _logs(b)))


@dataclass(frozen=True)
class Difference:
    """B's mean − A's of two independent samples, with Welch's t 95% interval: ``se`` its standard error, ``dof`` its
    degrees of freedom."""

    delta: float
    low: float
    high: float
    se: float
    dof: int

    @property
    def decided(self) -> bool:
        """Whether the interval excludes no difference."""
        return self.low > 0 or self.high < 0


def welch_difference(a, b) -> Difference:
    """B's mean − A's of two independent samples (two or more values each: traced steps' times), with Welch's t 95%
    interval (Welch–Satterthwaite degrees of freedom, rounded down)."""
    delta, se, dof = _welch(np.asarray(a, dtype=float), np.asarray(b, dtype=float))
    half = t975(dof) * se
    return Difference(delta, delta - half, delta + half, se, dof)


# ---------------------------------------------------------------------------------------------------
# What a run can detect: the power of its interval


def detectable_change(se: float, dof: int | None, band: float = 0.0) -> float:
    """The smallest change, on the scale ``se`` is on (logarithms of a ratio; ns of a difference), that an estimate
    with standard error ``se`` finds four times in five, where a change is called when its 95% interval excludes no
    change and the estimate lies beyond ``band``: it must clear both t975·se and ``band``, each with t80·se to spare."""
    if se < 0 or band < 0:
        raise ValueError("a standard error and a band are not negative")
    return max((t975(dof) + t80(dof)) * se, band + t80(dof) * se)


def units_needed(sd: float, effect: float, band: float = 0.0, most: int = 1000, dof_of=lambda n: n - 1) -> int | None:
    """How many units (rounds, steps a side), each of spread ``sd`` (the standard error of one), would settle an
    estimate of ``effect`` (the same scale): beyond ``band``, to find it four times in five (``detectable_change``);
    within it, for its 95% interval to stay inside the band. None where more than ``most`` would not (an effect on the
    band's edge, or no spread to go by). ``dof_of(n)``: the degrees of freedom of n units (n − 1 by default)."""
    effect = abs(effect)
    if not sd > 0 or not math.isfinite(sd):
        return None
    for n in range(2, most + 1):
        se = sd / math.sqrt(n)
        dof = dof_of(n)
        if effect > band and detectable_change(se, dof, band) <= effect:
            return n
        if effect < band and effect + t975(dof) * se <= band:
            return n
    return None


# ---------------------------------------------------------------------------------------------------
# Confidence intervals that hold from run to run: the hierarchy of a case's samples (blocks within time segments
# within processes)


@dataclass(frozen=True)
class HierarchicalCI:
    """A CI of a case's typical step time (or of a paired ratio) taken across independent units.

    ``level``: what the units are: ``process`` (each process's median; between-process variance is in the
    interval), ``time`` (stretches of consecutive rounds of one process or more: drift of the host over the
    run is in the interval, a per-process offset is not) or ``pooled`` (too few units: the order statistics of all
    samples). ``units``: their medians. ``coverage``: what it may state (``t_coverage``, ``median_ci_ranks``)."""

    low: float
    high: float
    center: float
    level: str
    n_units: int
    units: tuple[float, ...]
    coverage: float = LEVEL


def t_coverage(interval: LogInterval, units) -> float:
    """The coverage a t-interval over ``units`` may state: 95% from ``FULL_UNITS`` units; from fewer, its 95% rests on
    their being normal, which so few cannot show, so what their ranks guarantee (at most 75% from 3, 87.5% from 4)."""
    if len(units) >= FULL_UNITS:
        return LEVEL
    return min(LEVEL, order_coverage(interval.low, interval.high, units))


def time_segments(rounds, n_segments: int = TIME_SEGMENTS) -> np.ndarray:
    """The stretch of consecutive rounds each sample falls in: rounds 0..R-1 cut into ``n_segments`` (fewer when
    there are fewer rounds) contiguous, nearly equal stretches."""
    rounds = np.asarray(rounds, dtype=int)
    distinct = np.unique(rounds)
    k = max(1, min(n_segments, len(distinct)))
    position = np.searchsorted(distinct, rounds)  # 0..len(distinct)-1, in time order
    return (position * k) // len(distinct)


def _pooled_ci(sorted_x: np.ndarray) -> tuple[float, float, float]:
    """The order-statistics CI of the median of all samples (sorted), and its coverage."""
    lo, hi, coverage = median_ci_ranks(len(sorted_x))
    return float(sorted_x[lo]), float(sorted_x[hi]), float(coverage)


def hierarchical_ci(samples, processes=None, rounds=None, n_segments: int = TIME_SEGMENTS, ratios: bool = False) -> HierarchicalCI:
    """CI of the median step time from samples that form a hierarchy: blocks, in rounds, in processes.

    The interval is taken across the highest level that has at least ``MIN_UNITS`` units: the processes'
    medians when there are three or more processes, else the medians of stretches of consecutive rounds
    (``time_segments``, per process). Each unit's median is one observation; the interval is the t-interval on
    their logarithms (``log_t_interval``), so its width follows the spread *between* units, which the pooled
    order statistics ignore: blocks of one process share that process's host state, and their interval describes
    the process, not the next run. With fewer than ``MIN_UNITS`` units the interval is the pooled order-statistics
    one (``level`` says so). ``ratios``: the samples are ratios, and every median of them is taken on their logarithms
    (``log_median``).
    """
    x = np.asarray(samples, dtype=float)
    if len(x) == 0:
        raise ValueError("no samples")
    median = log_median if ratios else (lambda v: float(np.median(v)))
    procs = np.zeros(len(x), dtype=int) if processes is None else np.asarray(processes)
    rnds = np.arange(len(x)) if rounds is None else np.asarray(rounds)
    distinct = np.unique(procs)
    if len(distinct) >= MIN_UNITS:
        level = "process"
        units = [median(x[procs == p]) for p in distinct]
    else:
        level = "time"
        units = []
        for p in distinct:
            mask = procs == p
            segments = time_segments(rnds[mask], n_segments)
            units += [median(x[mask][segments == s]) for s in np.unique(segments)]
    if len(units) < MIN_UNITS or min(units) <= 0:
        low, high, coverage = _pooled_ci(np.sort(x))
        return HierarchicalCI(low, high, median(x), "pooled", len(units), tuple(units), coverage)
    interval = log_t_interval(units)
    return HierarchicalCI(interval.low, interval.high, interval.center, level, len(units), tuple(units),
                          t_coverage(interval, units))


# ---------------------------------------------------------------------------------------------------
# The timing summary


@dataclass(frozen=True)
class TimingSummary:
    """What a set of timing samples (ms) says: their centre and spread, the hierarchical CI of the median with the
    coverage it may claim, and the order-statistics CI of the pooled samples.

    ``ci_level`` names the units the CI is taken over (``process``, ``time``, ``pooled``: ``HierarchicalCI.level``),
    ``ci_units`` how many, ``ci_coverage`` the coverage the interval may state (below 0.95 from fewer than
    ``FULL_UNITS`` units). ``within_*``: the pooled samples' order-statistics CI and its coverage."""

    n: int
    median: float
    mean: float
    p10: float
    p90: float
    cv: float  # standard deviation / mean
    ci_low: float
    ci_high: float
    ci_level: str
    ci_units: int
    ci_coverage: float
    within_low: float
    within_high: float
    within_coverage: float
    samples: tuple[float, ...]

    def to_dict(self) -> dict:
        """The timing fields a result row and run.json carry (ms); the row adds the pooled CI and its count itself.
        ``ci_ms`` is the CI, ``ci_coverage`` the level it may claim; ``ci95_ms`` holds the same interval for one more
        release (it held a 50% interval for 2 samples: the name claimed a level it did not have)."""
        return {"median_ms": self.median, "mean_ms": self.mean, "p10_ms": self.p10, "p90_ms": self.p90, "cv": self.cv,
                "ci_ms": [self.ci_low, self.ci_high], "ci95_ms": [self.ci_low, self.ci_high], "ci_level": self.ci_level, "ci_units": self.ci_units,
                "ci_coverage": self.ci_coverage, "samples_ms": list(self.samples)}


def summarize(samples, processes=None, rounds=None) -> TimingSummary:
    """The summary of timing samples; ``processes`` and ``rounds`` (one a sample) place them in the hierarchy
    (``hierarchical_ci``); without them, one process timed the samples in order."""
    x = np.sort(np.asarray(samples, dtype=float))
    n = len(x)
    if n == 0:
        raise ValueError("no samples")
    mean = float(x.mean())
    ci = hierarchical_ci(samples, processes, rounds)
    within_low, within_high, within_coverage = _pooled_ci(x)
    return TimingSummary(
        n=n, median=float(np.median(x)), mean=mean, p10=percentile(x, 10), p90=percentile(x, 90),
        cv=float(x.std(ddof=1) / mean) if n > 1 and mean > 0 else 0.0,
        ci_low=ci.low, ci_high=ci.high, ci_level=ci.level, ci_units=ci.n_units, ci_coverage=ci.coverage,
        within_low=within_low, within_high=within_high, within_coverage=within_coverage,
        samples=tuple(float(v) for v in samples),
    )


def ci_note(coverage: float | None, range_of: int | None) -> str:
    """What a CI of less than 95% coverage states instead (``HierarchicalCI.coverage``): ``min–max of 2`` where it is
    the range of its values, else ``≥87.5%`` (a bound, so never rounded up); empty for a 95% CI."""
    if coverage is None or coverage >= 0.95:
        return ""
    return f"min–max of {range_of}" if range_of else f"≥{int(coverage * 1000) / 10:g}%"


def ci_coverage_of(row: dict) -> float | None:
    """The coverage a row's ``ci95_ms`` may state (``HierarchicalCI.coverage``): its ``ci_coverage``, or for rows stored
    before it, worked out again from their samples; None where there are none."""
    if row.get("ci_coverage") is not None:
        return row["ci_coverage"]
    samples = row.get("samples_ms")
    if not samples:
        return None
    return hierarchical_ci(samples, row.get("sample_processes"), row.get("sample_rounds")).coverage


# ---------------------------------------------------------------------------------------------------
# Paired ratios of cases timed together


def block_ratios(a: dict, b: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """B ÷ A of two cases' blocks timed next to each other: the samples of each (``samples_ms``), matched by process
    and round (``sample_processes``, ``sample_rounds``: in an interleaved run every case times one block per round,
    and a comparison's cases are adjacent in each round). Returns (ratios, processes, rounds); empty when the two were
    not timed together."""
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
    keys = [k for k in sorted(set(ka) & set(kb)) if ka[k] > 0]
    ratios = np.array([kb[k] / ka[k] for k in keys])
    return ratios, np.array([k[0] for k in keys], dtype=int), np.array([k[1] for k in keys], dtype=int)


def paired_ratio(a: dict, b: dict) -> dict | None:
    """B's time ÷ A's over blocks timed together (``block_ratios``): their median on logarithms (``log_median``), with
    its hierarchical CI and the coverage it may state; None when the two were not paired.

    Above 1, B's step is longer. For a speedup of B over A (A's time ÷ B's) pass (B's row, A's row). A host slowdown
    that lasts longer than a round lengthens both blocks of a pair, so it cancels in the ratio, where it would not in
    two medians taken at different times."""
    ratios, procs, rounds = block_ratios(a, b)
    if len(ratios) == 0:
        return None
    ci = hierarchical_ci(ratios, procs, rounds, ratios=True)
    return {"ratio": log_median(ratios), "ci95": [ci.low, ci.high], "level": ci.level, "pairs": int(len(ratios)),
            "units": ci.n_units, "coverage": ci.coverage, "range_of": range_of(ci.low, ci.high, ratios)}
