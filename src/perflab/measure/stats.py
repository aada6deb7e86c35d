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


def median_ci_ranks(n: int, level: float = 0.95) -> tuple[int, int, float]:
    """0-based ranks (lo, hi) of order statistics bracketing the median with coverage ≥ level.

    Coverage of [X(lo), X(hi)] is P(lo < B ≤ hi) for B ~ Binomial(n, 1/2) (1-based ranks lo+1..hi+1).
    The narrowest symmetric pair that reaches the level; with too few samples, the full range.
    """
    if n < 1:
        raise ValueError("no samples")
    pmf = [math.comb(n, k) / 2**n for k in range(n + 1)]
    best = (0, n - 1, 1.0 - 2 * pmf[0] if n > 1 else 0.0)
    for j in range(n // 2, -1, -1):  # j = number of samples below the low bound
        k = n - 1 - j
        if k < j:
            continue
        coverage = sum(pmf[j + 1 : k + 1])
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
