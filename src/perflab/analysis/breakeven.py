"""Break-even: at what token count does a token-reduction variant start beating its baseline?

Each model's cost, t(n) in ms per batch at a fixed batch size, is fitted as t(n) = a + b·n + c·n² by
least squares over the per-case medians, with n the sequence length (patches + CLS:
(input size / patch)² + 1). a holds fixed costs (launches, the variant's top-k/gather overhead), b the
per-token work (MLPs, projections), c attention's n² term. The crossover is the smallest n in the
measured range where t_variant(n) − t_baseline(n) changes sign.

Confidence intervals come from a bootstrap over the timing samples: each replicate redraws every case's
``samples_ms`` (the harness's per-block means) with replacement, takes their median, refits both curves
and finds the crossover again. A replicate with no crossover in range is censored to the side it
implies (−inf: the variant is already faster at the smallest size; +inf: still slower at the largest),
so an interval can be open at either end. This covers each case's timing noise, not a wrong model
shape: R² and the largest residual of each fit say how well the quadratic holds. Where cases carry no
samples, the bootstrap resamples the fit's residuals instead (``method`` says which was used).

Pure numpy; no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

PATCH_SIZE = 16
LEVEL = 0.95
# Bootstrap replicates a user may ask for: below 100, each end of a 95% CI rests on one or two replicates; past 100,000
# they only cost time (benchmarks/bootstrap_cost.py: 69 s for 100,000 on a 2-core CPU, the CI's ends 0.05 tokens from 2,000's).
MIN_BOOT, MAX_BOOT = 100, 100_000


@dataclass(frozen=True)
class CostFit:
    """t(n) = a + b·n + c·n² (ms per batch; n in tokens), with bootstrap CIs of a, b, c."""

    a: float
    b: float
    c: float
    r2: float
    max_rel_residual: float  # largest |measured − fitted| / measured over the points
    coef_ci: tuple[tuple[float, float], ...] = ()

    def __call__(self, n):
        n = np.asarray(n, dtype=float)
        return self.a + self.b * n + self.c * n * n

    def formula(self) -> str:
        return f"{self.a:.4g} + {self.b:.4g}·n + {self.c:.4g}·n² ms"


@dataclass(frozen=True)
class BreakevenResult:
    tokens_lo: float
    tokens_hi: float
    baseline: CostFit
    variant: CostFit
    crossover_tokens: float | None  # None: no crossover in [tokens_lo, tokens_hi]
    crossover_ci: tuple[float, float] | None  # may hold -inf / +inf (censored ends)
    variant_faster_above: bool | None  # orientation at the crossover (True: the variant wins at larger n)
    variant_faster_at_lo: bool
    variant_faster_at_hi: bool
    fraction_crossing: float  # share of bootstrap replicates with a crossover in range
    n_boot: int
    method: str  # "samples" or "residuals"
    level: float = LEVEL
    patch_size: int = PATCH_SIZE
    all_crossings: tuple[float, ...] = field(default=())
    # Where the measured medians change sign, between token counts measured for both models:
    # (tokens below, tokens above, linear interpolation of the difference between them).
    measured_crossings: tuple[tuple[float, float, float], ...] = field(default=())

    @property
    def fit_agrees_with_measurements(self) -> bool:
        """False when the fitted crossover (or its absence) contradicts where the measurements change sign."""
        fitted = [self.crossover_tokens] if self.crossover_tokens is not None else []
        if not self.measured_crossings:
            return not fitted
        slack = 1e-6 * (self.tokens_hi - self.tokens_lo)  # a crossing exactly on a measured point counts as inside
        return bool(fitted) and any(lo - slack <= fitted[0] <= hi + slack for lo, hi, _ in self.measured_crossings)

    @property
    def crossover_input_size(self) -> float | None:
        return None if self.crossover_tokens is None else input_size_for_tokens(self.crossover_tokens, self.patch_size)

    @property
    def crossover_input_size_ci(self) -> tuple[float, float] | None:
        if self.crossover_ci is None:
            return None
        return tuple(input_size_for_tokens(v, self.patch_size) for v in self.crossover_ci)

    def summary(self) -> str:
        """One sentence: where the curves cross (with its CI), or that they don't in the measured range."""
        span = f"{self.tokens_lo:.0f}–{self.tokens_hi:.0f} tokens"
        if self.crossover_tokens is None:
            who = "faster" if self.variant_faster_at_lo else "slower"
            return (f"no crossover in {span}: the variant is {who} over the whole range "
                    f"({self.fraction_crossing:.0%} of {self.n_boot} bootstrap replicates cross in range)")
        side = "above" if self.variant_faster_above else "below"
        lo, hi = self.crossover_ci
        s_lo, s_hi = self.crossover_input_size_ci
        text = (f"the variant is faster {side} {self.crossover_tokens:.0f} tokens "
                f"(input ≈ {self.crossover_input_size:.0f} px); {self.level:.0%} CI {_bound(lo)}–{_bound(hi)} tokens "
                f"({_bound(s_lo, 'px')}–{_bound(s_hi, 'px')}), {self.method} bootstrap, n={self.n_boot}")
        if len(self.all_crossings) > 1:
            text += "; the fitted curves cross again at " + ", ".join(f"{n:.0f}" for n in self.all_crossings[1:]) + " tokens"
        return text + self._disagreement()

    def _disagreement(self) -> str:
        if self.fit_agrees_with_measurements:
            return ""
        if not self.measured_crossings:
            return ("; but the measured medians do not change sign in the range: the quadratic fit's crossing is "
                    f"an artefact of its shape (R² {self.baseline.r2:.3f} / {self.variant.r2:.3f}), trust the measurements")
        lo, hi, at = self.measured_crossings[0]
        return (f"; BUT the measured medians change sign between {lo:.0f} and {hi:.0f} tokens (≈ {at:.0f} by linear interpolation, "
                f"input ≈ {input_size_for_tokens(at, self.patch_size):.0f} px): the quadratic does not follow the curves' shape "
                f"(R² {self.baseline.r2:.3f} / {self.variant.r2:.3f}, largest residual {max(self.baseline.max_rel_residual, self.variant.max_rel_residual):.0%}), "
                "so trust the measured bracket")


def tokens_for_input_size(input_size, patch_size: int = PATCH_SIZE):
    """ViT sequence length at this resolution: (size / patch)² patches plus the CLS token."""
    return (np.asarray(input_size) // patch_size) ** 2 + 1


def input_size_for_tokens(tokens: float, patch_size: int = PATCH_SIZE) -> float:
    """The (real-valued) input size whose sequence length is ``tokens``; the inverse of the above."""
    if not math.isfinite(tokens):
        return tokens
    return patch_size * math.sqrt(max(tokens - 1.0, 0.0))


def fit_quadratic(n: Sequence[float], y: Sequence[float]) -> np.ndarray:
    """Least-squares (a, b, c) of y = a + b·n + c·n²."""
    n = np.asarray(n, dtype=float)
    y = np.asarray(y, dtype=float)
    _check_points(n, y)
    scale = n.max()
    coef_scaled, *_ = np.linalg.lstsq(_design(n / scale), y, rcond=None)
    return _unscale(coef_scaled, scale)


def crossings(diff_coef: Sequence[float], lo: float, hi: float) -> list[float]:
    """Points in [lo, hi] where a + b·n + c·n² changes sign (tangent roots excluded), ascending."""
    a, b, c = (float(v) for v in diff_coef)
    scale = max(abs(lo), abs(hi), 1.0)
    poly = [c * scale * scale, b * scale, a]  # in x = n / scale, for conditioning
    if not any(poly):
        return []
    out = []
    for root in np.roots(poly):
        if abs(root.imag) > 1e-9 * max(1.0, abs(root.real)):
            continue
        n = float(root.real) * scale
        if lo <= n <= hi and _changes_sign(a, b, c, n, hi - lo):
            out.append(n)
    return sorted(out)


def find_breakeven(
    n_baseline: Sequence[float],
    samples_baseline: Sequence[Sequence[float]],
    n_variant: Sequence[float],
    samples_variant: Sequence[Sequence[float]],
    *,
    n_boot: int = 2000,
    seed: int = 0,
    level: float = LEVEL,
    patch_size: int = PATCH_SIZE,
) -> BreakevenResult:
    """Fit both costs and find where they cross, with a bootstrap CI (see the module docstring).

    ``samples_*[i]`` are the timing samples (ms per batch) of the case at ``n_*[i]`` tokens; a case with
    one value (a median without its samples) switches the bootstrap to residual resampling.

    The CI is the replicates' percentile interval, widened where needed to hold the estimate itself: a skewed bootstrap
    distribution (or few replicates) can put both percentiles on one side of it, and an interval that excludes its own
    estimate says nothing a reader can use.
    """
    if isinstance(n_boot, bool) or not isinstance(n_boot, (int, np.integer)) or n_boot < 1:
        raise ValueError(f"n_boot must be a whole number of bootstrap replicates, 1 or more, got {n_boot!r}")
    nb, sb = _as_points(n_baseline, samples_baseline)
    nv, sv = _as_points(n_variant, samples_variant)
    lo, hi = float(max(nb.min(), nv.min())), float(min(nb.max(), nv.max()))
    if lo >= hi:
        raise ValueError("the baseline and variant token ranges do not overlap")
    yb = np.array([np.median(s) for s in sb])
    yv = np.array([np.median(s) for s in sv])
    coef_b, coef_v = fit_quadratic(nb, yb), fit_quadratic(nv, yv)
    found = crossings(coef_v - coef_b, lo, hi)
    crossover = found[0] if found else None
    faster_above = None if crossover is None else bool(_poly(coef_v - coef_b, min(hi, crossover + 1e-6 * (hi - lo) + 1e-9)) < 0)

    rng = np.random.default_rng(seed)
    method = "samples" if all(len(s) > 1 for s in sb + sv) else "residuals"
    boot_b = _bootstrap_coefs(nb, sb, coef_b, n_boot, rng, method)
    boot_v = _bootstrap_coefs(nv, sv, coef_v, n_boot, rng, method)
    censored = np.array([_censored_crossover(cv - cb, lo, hi, faster_above) for cb, cv in zip(boot_b, boot_v)])
    fraction = float(np.mean(np.isfinite(censored)))
    alpha = (1.0 - level) / 2
    ci = None
    if crossover is not None:
        ci = (min(float(np.percentile(censored, 100 * alpha, method="lower")), crossover),
              max(float(np.percentile(censored, 100 * (1 - alpha), method="higher")), crossover))
    d_lo, d_hi = _poly(coef_v - coef_b, lo), _poly(coef_v - coef_b, hi)
    return BreakevenResult(
        tokens_lo=lo, tokens_hi=hi,
        baseline=_cost_fit(nb, yb, coef_b, boot_b, alpha), variant=_cost_fit(nv, yv, coef_v, boot_v, alpha),
        crossover_tokens=crossover, crossover_ci=ci, variant_faster_above=faster_above,
        variant_faster_at_lo=bool(d_lo < 0), variant_faster_at_hi=bool(d_hi < 0),
        fraction_crossing=fraction, n_boot=n_boot, method=method, level=level, patch_size=patch_size,
        all_crossings=tuple(found), measured_crossings=measured_crossings(nb, yb, nv, yv),
    )


def measured_crossings(nb, yb, nv, yv) -> tuple[tuple[float, float, float], ...]:
    """Sign changes of (variant − baseline) between consecutive token counts measured for both."""
    base = dict(zip(map(float, nb), yb))
    var = dict(zip(map(float, nv), yv))
    common = sorted(set(base) & set(var))
    diff = [var[n] - base[n] for n in common]
    out = []
    for (n0, d0), (n1, d1) in zip(zip(common, diff), zip(common[1:], diff[1:])):
        if (d0 < 0) != (d1 < 0) and d0 != d1:
            out.append((n0, n1, n0 + (n1 - n0) * d0 / (d0 - d1)))
    return tuple(out)


def points_from_rows(rows: Sequence[dict], case_ids: Sequence[str], patch_size: int = PATCH_SIZE):
    """(tokens, samples_ms per case, the rows used) for the ``ok`` rows among ``case_ids``, by input size.

    Tokens are the model's input sequence length (the first stage of ``tokens``, else from the size).
    """
    by_id = {r.get("case_id"): r for r in rows}
    used = [by_id[i] for i in case_ids if i in by_id and by_id[i].get("status") == "ok"]
    used.sort(key=lambda r: r["input_size"])
    tokens = [float((r.get("tokens") or [tokens_for_input_size(r["input_size"], patch_size)])[0]) for r in used]
    samples = [list(r.get("samples_ms") or [r["median_ms"]]) for r in used]
    return tokens, samples, used


def _as_points(n, samples) -> tuple[np.ndarray, list[np.ndarray]]:
    n = np.asarray(n, dtype=float)
    samples = [np.atleast_1d(np.asarray(s, dtype=float)) for s in samples]
    if len(samples) != len(n):
        raise ValueError("one list of samples per token count")
    if any(len(s) == 0 for s in samples):
        raise ValueError("a case has no timing samples")
    _check_points(n, np.array([np.median(s) for s in samples]))
    return n, samples


def _check_points(n: np.ndarray, y: np.ndarray) -> None:
    if len(np.unique(n)) < 3:
        raise ValueError(f"a quadratic fit needs at least 3 distinct token counts, got {len(np.unique(n))}")
    if not (np.all(np.isfinite(n)) and np.all(np.isfinite(y))):
        raise ValueError("token counts and timings must be finite")


def _design(x: np.ndarray) -> np.ndarray:
    return np.stack([np.ones_like(x), x, x * x], axis=-1)


def _unscale(coef_scaled, scale: float) -> np.ndarray:
    coef_scaled = np.asarray(coef_scaled, dtype=float)
    return coef_scaled * np.array([1.0, 1.0 / scale, 1.0 / (scale * scale)])


def _poly(coef, n: float) -> float:
    a, b, c = coef
    return float(a + b * n + c * n * n)


def _changes_sign(a, b, c, n, width) -> bool:
    eps = 1e-6 * max(width, 1.0)
    left, right = a + b * (n - eps) + c * (n - eps) ** 2, a + b * (n + eps) + c * (n + eps) ** 2
    return left * right < 0


def _bootstrap_coefs(n, samples, coef, n_boot, rng, method) -> np.ndarray:
    """(n_boot, 3) coefficients refitted to resampled data."""
    scale = n.max()
    pinv = np.linalg.pinv(_design(n / scale))  # (3, m): the same least squares for every replicate
    if method == "samples":
        y = np.empty((n_boot, len(n)))
        for j, s in enumerate(samples):
            y[:, j] = np.median(s[rng.integers(0, len(s), size=(n_boot, len(s)))], axis=1)
    else:
        fitted = _design(n) @ coef
        residuals = np.array([np.median(s) for s in samples]) - fitted
        y = fitted + residuals[rng.integers(0, len(n), size=(n_boot, len(n)))]
    return (y @ pinv.T) * np.array([1.0, 1.0 / scale, 1.0 / (scale * scale)])


def _censored_crossover(diff, lo, hi, faster_above) -> float:
    found = crossings(diff, lo, hi)
    if found:
        return found[0]
    variant_faster = _poly(diff, 0.5 * (lo + hi)) < 0
    # With the variant winning at large n: faster everywhere means it crossed below the range.
    below = variant_faster if faster_above in (True, None) else not variant_faster
    return -math.inf if below else math.inf


def _cost_fit(n, y, coef, boot, alpha) -> CostFit:
    fitted = _design(n) @ coef
    ss_res = float(np.sum((y - fitted) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    ci = tuple((float(np.percentile(boot[:, k], 100 * alpha)), float(np.percentile(boot[:, k], 100 * (1 - alpha)))) for k in range(3))
    return CostFit(
        a=float(coef[0]), b=float(coef[1]), c=float(coef[2]),
        r2=1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0,
        max_rel_residual=float(np.max(np.abs(y - fitted) / np.abs(y))),
        coef_ci=ci,
    )


def _bound(value: float, unit: str = "") -> str:
    if value == -math.inf:
        return "below the range"
    if value == math.inf:
        return "above the range"
    return f"{value:.0f}{(' ' + unit) if unit else ''}"


@dataclass
class BreakevenAnalysis:
    """A break-even analysis over stored result rows: the points used, and the result or why there is none."""

    name: str
    baseline_rows: list
    variant_rows: list
    result: BreakevenResult | None
    problem: str | None = None

    @property
    def baseline_model(self) -> str | None:
        return self.baseline_rows[0]["model"] if self.baseline_rows else None

    @property
    def variant_model(self) -> str | None:
        return self.variant_rows[0]["model"] if self.variant_rows else None


def analyze_rows(name: str, rows: Sequence[dict], baseline_ids: Sequence[str], variant_ids: Sequence[str], *,
                 patch_size: int = PATCH_SIZE, n_boot: int = 2000, seed: int = 0) -> BreakevenAnalysis:
    """Break-even of the variant rows against the baseline rows (selected by case id; failed rows dropped)."""
    nb, sb, rows_b = points_from_rows(rows, baseline_ids, patch_size)
    nv, sv, rows_v = points_from_rows(rows, variant_ids, patch_size)
    missing = len(baseline_ids) - len(rows_b) + len(variant_ids) - len(rows_v)
    try:
        result = find_breakeven(nb, sb, nv, sv, n_boot=n_boot, seed=seed, patch_size=patch_size)
    except ValueError as exc:
        why = f"{exc} ({len(rows_b)} baseline and {len(rows_v)} variant cases measured ok; {missing} missing or failed)"
        return BreakevenAnalysis(name, rows_b, rows_v, None, why)
    return BreakevenAnalysis(name, rows_b, rows_v, result, f"{missing} case(s) missing or failed, left out" if missing else None)
