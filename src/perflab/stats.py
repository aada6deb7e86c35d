"""The statistics of timing samples, torch-free and on the bottom floor: measure, analysis, program and report import it.

- **The percentile rule**: linear interpolation between order statistics (:func:`percentile`, numpy's default).
- **Distribution-free CIs of a median**: the pair of order statistics that brackets it with the coverage their ranks
  guarantee (:func:`median_ci_ranks`, :func:`rank_coverage`, :func:`order_coverage`).
- **The t-interval on logarithms**, written once (:func:`log_t_interval`, one sample; :func:`welch_log_ratio`, two):
  step times are positive and their spread scales with them; two estimates' own intervals combined on logarithms, a
  normal interval (:func:`combined_log_interval`).
- **Hierarchical CIs** (:func:`hierarchical_ci`): across processes, else stretches of the run, and the coverage they
  may claim: 95% from ``FULL_UNITS`` units, from fewer what the units' ranks guarantee. Each is centred on the point it
  is printed beside (sectioning), and that point is checked to lie inside it before it is returned (:func:`check_inside`).
- **Two modes** (:func:`modes_of`): samples that fall in two groups with an empty gap between them (steps that alternate
  fast and slow), whose median may be a time no sample took.
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
# Two modes (modes_of): each holds at least MODE_SHARE of the samples and MIN_MODE_SAMPLES of them, from MODES_FROM
# samples; the empty gap between them (on logarithms) is MODE_GAP times either mode's own 10-90% spread or more, and
# the slower mode's median MODE_SEPARATION times the faster's or more. Tuned on simulated unimodal samples (log-normal,
# gamma, uniform, exponential and Pareto tails; 4,000 draws each at 20 and 30 samples): at most 0.2% are called
# bimodal, none from 50 samples; modes 1.5x apart with 3% noise each are found in 92-95% of 20-30 samples, modes 2x
# apart in all.
MODES_FROM, MIN_MODE_SAMPLES, MODE_SHARE, MODE_GAP, MODE_SEPARATION = 20, 3, 0.1, 3.0, 1.2

Z975 = 1.959964  # the normal's 97.5% quantile to six places (combined_log_interval's; t975(None) says 1.96)

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
    """A centre and its Student-t 95% interval, taken on logarithms and turned back: log-centre ± t975(dof) × se. The
    centre is the values' geometric mean (``log_t_interval``) or the estimate sectioning is centred on
    (``sectioned_log_t_interval``)."""

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


def _two_or_more(logs: np.ndarray) -> np.ndarray:
    if len(logs) < 2:
        raise ValueError("a t-interval needs two values or more")
    return logs


def log_t_interval(values) -> LogInterval:
    """The geometric mean of two or more positive values and Student's t 95% interval on their logarithms."""
    logs = _two_or_more(_logs(values))
    n = len(logs)
    return _t_on_logs(float(logs.mean()), float(logs.std(ddof=1)) / math.sqrt(n), n - 1)


def sectioned_log_t_interval(units, center: float) -> LogInterval:
    """Student's t 95% interval on logarithms centred on ``center``, an estimate from all the samples (their median),
    with its standard error from how far the units' own estimates (each unit's median) lie from it:
    se² = Σ(log uᵢ − log center)² / (b − 1) / b over b units, b − 1 degrees of freedom.

    This is *sectioning* (Asmussen & Glynn, Stochastic Simulation, 2007, §III.5; Nakayama, "Confidence intervals for
    quantiles using sectioning when applying variance-reduction techniques", 2014): where the point estimate is a
    quantile of all the samples, the sections' spread about that point gives an asymptotically valid t-interval for it,
    and the point lies inside by construction. Batching (the t-interval around the mean of the sections' medians)
    estimates another quantity: a median of few samples is biased, and with two modes the two can differ by more than
    the interval is wide (steps alternating 0.4 and 41–54 ms: a pooled median of 20.78 ms, an interval of
    21.06–22.62 around the sections'). The ends are the centre times exp(∓half), so the centre is inside exactly, not
    to the rounding of exp(log(centre)); ``LogInterval.center`` is ``center`` itself."""
    logs = _two_or_more(_logs(units))
    if not center > 0:
        raise ValueError("the t-interval on logarithms takes positive values only")
    n = len(logs)
    spread = float(np.sqrt(((logs - math.log(center)) ** 2).sum() / (n - 1)))
    half = t975(n - 1) * spread / math.sqrt(n)
    return LogInterval(center, center * math.exp(-half), center * math.exp(half), n - 1)


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


def combined_log_interval(center: float, intervals) -> tuple[float, float]:
    """A normal 95% interval about ``center`` from independent estimates' own 95% intervals, combined on logarithms:
    each interval ``(low, high)`` gives a standard error log(high / low) / (2 × Z975), the errors add in quadrature,
    and the interval is center × exp(∓Z975 × se). A ratio of two medians with each its own CI (``(low, high)`` pairs,
    all positive) is its use: ``regressions.within_run_ratio``. Returns ``(low, high)``."""
    se = math.hypot(*(math.log(high / low) for low, high in intervals)) / (2 * Z975)
    return center * math.exp(-Z975 * se), center * math.exp(Z975 * se)


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
    logarithms centred on the median of all the samples, the point every caller prints beside it, with its width from
    the units' medians' spread about it (``sectioned_log_t_interval``): so it follows the spread *between* units, which
    the pooled order statistics ignore (blocks of one process share that process's host state, and their interval
    describes the process, not the next run), and it always holds its point. With fewer than ``MIN_UNITS`` units the
    interval is the pooled order-statistics one (``level`` says so). ``center`` is the samples' median either way.
    ``ratios``: the samples are ratios, and every median of them (the centre's, the units') is taken on their
    logarithms (``log_median``).
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
    center = median(x)
    if len(units) < MIN_UNITS or min(units) <= 0 or center <= 0:
        low, high, coverage = _pooled_ci(np.sort(x))
        return HierarchicalCI(low, high, center, "pooled", len(units), tuple(units), coverage)
    interval = sectioned_log_t_interval(units, center)
    return HierarchicalCI(interval.low, interval.high, center, level, len(units), tuple(units), t_coverage(interval, units))


# ---------------------------------------------------------------------------------------------------
# Two modes


@dataclass(frozen=True)
class Modes:
    """Samples that fall in two groups with an empty gap between them: each group's median and count, and the gap
    (the fast group's slowest sample, the slow group's fastest: no sample took a time strictly between)."""

    fast_ms: float
    slow_ms: float
    fast_n: int
    slow_n: int
    gap_low_ms: float
    gap_high_ms: float

    @property
    def fast_share(self) -> float:
        return self.fast_n / (self.fast_n + self.slow_n)

    def to_dict(self) -> dict:
        return {"fast_ms": self.fast_ms, "slow_ms": self.slow_ms, "fast_n": self.fast_n, "slow_n": self.slow_n,
                "fast_share": self.fast_share, "gap_ms": [self.gap_low_ms, self.gap_high_ms]}


def modes_words(modes: dict, median: float | None = None) -> str:
    """What two modes (``Modes.to_dict``) say: ``two modes: 10 of 20 samples at 0.4 ms (50%), 10 at 47.5 ms (50%)``,
    and where ``median`` lies in the gap between them, that no sample took it."""
    n = modes["fast_n"] + modes["slow_n"]
    text = (f"two modes: {modes['fast_n']} of {n} samples at {modes['fast_ms']:.4g} ms ({modes['fast_n'] / n:.0%}), "
            f"{modes['slow_n']} at {modes['slow_ms']:.4g} ms ({modes['slow_n'] / n:.0%})")
    low, high = modes["gap_ms"]
    if median is not None and low < median < high:
        text += f"; the median, {median:.4g} ms, lies in the gap between them, a time no sample took: read each mode, not the median"
    return text


def modes_of(samples) -> Modes | None:
    """The two modes of ``samples`` (positive times), or None where they show one.

    The split is at the widest gap between consecutive sorted samples, on logarithms, that leaves each side at least
    ``MODE_SHARE`` and ``MIN_MODE_SAMPLES`` of the samples; it is two modes where that gap is ``MODE_GAP`` times each
    side's own 10–90% spread or more and the slow side's median is ``MODE_SEPARATION`` times the fast side's or more
    (from ``MODES_FROM`` samples: fewer make a wide gap by chance; see the constants). Steps that alternate fast and
    slow (a step that synchronises every other time, a data loader that stalls every n steps) make a median that may
    be a time no step took, and a CV that is the distance between the modes, not noise."""
    x = np.asarray(samples, dtype=float)
    if len(x) < MODES_FROM or not (x > 0).all():
        return None
    x = np.sort(x)
    logs = np.log(x)
    n = len(logs)
    least = max(MIN_MODE_SAMPLES, math.ceil(MODE_SHARE * n))
    gaps = logs[least:n - least + 1] - logs[least - 1:n - least]  # split at i: the gap logs[i] - logs[i - 1]
    i = least + int(np.argmax(gaps))
    fast, slow = logs[:i], logs[i:]
    spread = max(percentile(fast, 90) - percentile(fast, 10), percentile(slow, 90) - percentile(slow, 10))
    gap = logs[i] - logs[i - 1]
    fast_ms, slow_ms = math.exp(float(np.median(fast))), math.exp(float(np.median(slow)))
    if gap < MODE_GAP * spread or gap == 0 or slow_ms < MODE_SEPARATION * fast_ms:
        return None
    return Modes(fast_ms, slow_ms, i, n - i, float(x[i - 1]), float(x[i]))


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
    modes: Modes | None = None  # the samples' two modes (``modes_of``), None where they show one

    def to_dict(self) -> dict:
        """The timing fields a result row and run.json carry (ms); the row adds the pooled CI and its count itself.
        ``ci_ms`` is the CI, ``ci_coverage`` the level it may claim; ``ci95_ms`` holds the same interval for one more
        release (it held a 50% interval for 2 samples: the name claimed a level it did not have). ``modes`` only where the
        samples show two (``modes_of``), as a flag is only where it holds: a reader that updates a dict with these
        removes an earlier ``modes`` first (``measure.harness.timing_fields``)."""
        return {"median_ms": self.median, "mean_ms": self.mean, "p10_ms": self.p10, "p90_ms": self.p90, "cv": self.cv,
                "ci_ms": [self.ci_low, self.ci_high], "ci95_ms": [self.ci_low, self.ci_high], "ci_level": self.ci_level, "ci_units": self.ci_units,
                "ci_coverage": self.ci_coverage, "samples_ms": list(self.samples),
                **({"modes": self.modes.to_dict()} if self.modes else {})}


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
    check_inside(ci.center, ci.low, ci.high, "the median")
    check_inside(ci.center, within_low, within_high, "the median")
    return TimingSummary(
        n=n, median=ci.center, mean=mean, p10=percentile(x, 10), p90=percentile(x, 90),
        cv=float(x.std(ddof=1) / mean) if n > 1 and mean > 0 else 0.0,
        ci_low=ci.low, ci_high=ci.high, ci_level=ci.level, ci_units=ci.n_units, ci_coverage=ci.coverage,
        within_low=within_low, within_high=within_high, within_coverage=within_coverage,
        samples=tuple(float(v) for v in samples), modes=modes_of(x),
    )


class IntervalError(ValueError):
    """A point estimate outside its own interval: perflab's bug, never printed or stored as a result."""


def check_inside(point: float, low: float, high: float, what: str) -> None:
    """The identity every summary keeps before it is returned: its point lies in its own interval."""
    if not low <= point <= high:
        raise IntervalError(f"{what}, {point!r}, lies outside its own interval [{low!r}, {high!r}]")


def ci_note(coverage: float | None, range_of: int | None) -> str:
    """What a CI of less than 95% coverage states instead (``HierarchicalCI.coverage``): ``min–max of 2`` where it is
    the range of its values, else ``≥87.5%`` (a bound, so never rounded up); empty for a 95% CI."""
    if coverage is None or coverage >= 0.95:
        return ""
    return f"min–max of {range_of}" if range_of else f"≥{int(coverage * 1000) / 10:g}%"


def row_ci_note(row: dict) -> str:
    """What a row's CI (``ci95_ms``; run.json's timing alike) states where it is less than 95% (``ci_note``): ``≥75%``,
    ``min–max of 2``; empty for a 95% CI or none. Every table that prints a row's CI labels it by this."""
    ci = row.get("ci95_ms")
    if not ci:
        return ""
    samples = row.get("samples_ms") or []
    return ci_note(ci_coverage_of(row), range_of(ci[0], ci[1], samples) if row.get("ci_level") == "pooled" else None)


def ci_coverage_of(row: dict) -> float | None:
    """The coverage a row's ``ci95_ms`` may state (``HierarchicalCI.coverage``): its ``ci_coverage``, or for rows stored
    before it, worked out again from their samples; None where there are none."""
    if row.get("ci_coverage") is not None:
        return row["ci_coverage"]
    samples = row.get("samples_ms")
    if not samples:
        return None
    # their places in the hierarchy, where each sample has one (a row damaged or written by hand may not)
    procs, rounds = (v if isinstance(v, list) and len(v) == len(samples) else None
                     for v in (row.get("sample_processes"), row.get("sample_rounds")))
    return hierarchical_ci(samples, procs, rounds).coverage


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
    check_inside(ci.center, ci.low, ci.high, "the paired ratio")
    return {"ratio": ci.center, "ci95": [ci.low, ci.high], "level": ci.level, "pairs": int(len(ratios)),
            "units": ci.n_units, "coverage": ci.coverage, "range_of": range_of(ci.low, ci.high, ratios)}
