"""Break-even: quadratic cost fits, the crossover and its bootstrap CI, on synthetic costs with known answers."""

import math
import subprocess
import sys

import numpy as np
import pytest

from perflab.analysis.breakeven import (
    analyze_rows,
    crossings,
    find_breakeven,
    fit_quadratic,
    input_size_for_tokens,
    tokens_for_input_size,
)

SIZES = np.arange(160, 641, 32)  # the seeds' question: 160..640 px
TOKENS = tokens_for_input_size(SIZES)


def baseline_ms(n):  # attention's n² dominates at large n
    return 1.0 + 0.004 * n + 4e-6 * n * n


def variant_ms(n):  # a fixed top-k/gather overhead, then far fewer tokens
    return 3.0 + 0.001 * n + 4e-7 * n * n


# baseline = variant ⇔ 3.6e-6 n² + 0.003 n − 2 = 0
TRUE_CROSSOVER = (-0.003 + math.sqrt(0.003**2 + 4 * 3.6e-6 * 2.0)) / (2 * 3.6e-6)


def noisy_samples(cost, rng, cv=0.02, k=20):
    return [cost(n) * (1 + cv * rng.standard_normal(k)) for n in TOKENS]


def test_tokens_and_input_size_are_inverse():
    assert tokens_for_input_size(224) == 197 and tokens_for_input_size(448) == 785
    assert input_size_for_tokens(197) == pytest.approx(224) and input_size_for_tokens(785) == pytest.approx(448)


def test_fit_recovers_exact_coefficients():
    n = TOKENS.astype(float)
    assert fit_quadratic(n, baseline_ms(n)) == pytest.approx([1.0, 0.004, 4e-6], rel=1e-6)


def test_crossover_of_synthetic_costs_is_recovered_within_5_percent():
    rng = np.random.default_rng(7)
    result = find_breakeven(TOKENS, noisy_samples(baseline_ms, rng), TOKENS, noisy_samples(variant_ms, rng), n_boot=1000, seed=1)
    assert TRUE_CROSSOVER == pytest.approx(437.2, abs=0.1)
    assert result.crossover_tokens == pytest.approx(TRUE_CROSSOVER, rel=0.05)
    lo, hi = result.crossover_ci
    assert lo <= TRUE_CROSSOVER <= hi and hi - lo < 0.1 * TRUE_CROSSOVER
    assert result.variant_faster_above is True and result.method == "samples"
    assert result.fraction_crossing == 1.0
    assert result.crossover_input_size == pytest.approx(16 * math.sqrt(TRUE_CROSSOVER - 1), rel=0.03)  # ≈ 334 px
    assert result.baseline.c == pytest.approx(4e-6, rel=0.1) and result.baseline.r2 > 0.99
    assert "faster above" in result.summary()


def test_no_crossover_in_range_is_said_so():
    rng = np.random.default_rng(0)
    cheaper = lambda n: 0.5 * baseline_ms(n)  # noqa: E731
    result = find_breakeven(TOKENS, noisy_samples(baseline_ms, rng), TOKENS, noisy_samples(cheaper, rng), n_boot=300)
    assert result.crossover_tokens is None and result.crossover_ci is None
    assert result.variant_faster_at_lo and result.variant_faster_at_hi
    assert result.fraction_crossing == 0.0
    assert result.summary().startswith("no crossover in 101–1601 tokens: the variant is faster")


def test_a_crossover_near_the_edge_gets_an_open_interval():
    # Costs crossing at 105 tokens, just inside the range (101..1601), timed noisily: many replicates put
    # the crossover below the range, so the CI's low end is open rather than made up.
    base = lambda n: 2.0 + 0.01 * n  # noqa: E731
    var = lambda n: 2.0 + 0.01 * 105 + 0.0 * n  # noqa: E731  (flat: crosses the baseline at n = 105)
    rng = np.random.default_rng(0)
    result = find_breakeven(TOKENS, noisy_samples(base, rng, cv=0.05, k=8), TOKENS, noisy_samples(var, rng, cv=0.05, k=8), n_boot=500)
    assert result.crossover_tokens == pytest.approx(105, rel=0.05)
    assert result.crossover_ci[0] == -math.inf and 105 < result.crossover_ci[1] < 130
    assert 0.3 < result.fraction_crossing < 0.95
    assert "below the range" in result.summary()


def test_residual_bootstrap_when_cases_have_no_samples():
    n = TOKENS.astype(float)
    result = find_breakeven(n, [[baseline_ms(k)] for k in n], n, [[variant_ms(k) * 1.001] for k in n], n_boot=200)
    assert result.method == "residuals"
    assert result.crossover_tokens == pytest.approx(TRUE_CROSSOVER, rel=0.05)


def test_crossings_skip_tangent_roots_and_handle_lines():
    assert crossings([1.0, -2.0, 1.0], 0, 5) == []  # (n − 1)²: touches zero, never changes sign
    assert crossings([-3.0, 1.0, 0.0], 0, 10) == pytest.approx([3.0])
    assert crossings([2.0, -3.0, 1.0], 0, 10) == pytest.approx([1.0, 2.0])
    assert crossings([1.0, 0.0, 0.0], 0, 10) == []


def test_analysis_from_rows_drops_failed_cases_and_says_so():
    rows, base_ids, var_ids = [], [], []
    for size, n in zip(SIZES, TOKENS):
        for model, cost, ids in (("deit", baseline_ms, base_ids), ("topk_deit", variant_ms, var_ids)):
            case_id = f"{model}-{size}"
            ids.append(case_id)
            ok = not (model == "deit" and size == 640)
            rows.append({"case_id": case_id, "model": model, "input_size": int(size), "status": "ok" if ok else "oom",
                         "tokens": [int(n)], "median_ms": cost(n) if ok else None, "samples_ms": [cost(n)] * 3 if ok else None})
    analysis = analyze_rows("t", rows, base_ids, var_ids, n_boot=100)
    assert len(analysis.baseline_rows) == len(SIZES) - 1 and analysis.baseline_model == "deit"
    assert analysis.result.crossover_tokens == pytest.approx(TRUE_CROSSOVER, rel=1e-6)
    assert "1 case(s) missing or failed" in analysis.problem
    too_few = analyze_rows("t", rows, base_ids[:2], var_ids, n_boot=10)
    assert too_few.result is None and "at least 3 distinct token counts" in too_few.problem


def test_analysis_never_imports_torch():
    code = "import sys, perflab.analysis.breakeven, perflab.report.markdown, perflab.sweep.store; assert 'torch' not in sys.modules, 'torch imported'"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_a_fit_that_contradicts_the_measurements_says_so():
    """Medians measured on an H200 (DeiT-B vs top-k 0.1@3,6,9, bs8 bf16 eager): top-k is host-bound and flat
    until ~1000 tokens, which a quadratic cannot follow; its crossing (387) lies where top-k is still slower."""
    from perflab.analysis.breakeven import find_breakeven

    tokens = [101, 145, 197, 257, 325, 401, 485, 577, 677, 785, 901, 1025, 1157, 1297, 1445, 1601]
    base = [2.029, 2.179, 2.118, 2.384, 2.301, 2.401, 2.736, 3.196, 3.763, 4.455, 5.087, 5.864, 6.701, 7.399, 8.282, 9.307]
    topk = [2.738, 2.762, 2.645, 2.744, 2.781, 2.816, 2.767, 2.753, 2.625, 2.813, 3.102, 2.902, 3.248, 3.536, 3.879, 4.277]
    r = find_breakeven(tokens, [[v] for v in base], tokens, [[v] for v in topk], n_boot=200)
    assert r.crossover_tokens is not None and 380 < r.crossover_tokens < 395
    assert r.measured_crossings[0][:2] == (485, 577)
    assert 485 < r.measured_crossings[0][2] < 577
    assert not r.fit_agrees_with_measurements
    assert "BUT the measured medians change sign between 485 and 577 tokens" in r.summary()


def test_a_fit_that_agrees_adds_no_warning():
    from perflab.analysis.breakeven import find_breakeven

    n = [100, 200, 300, 400, 500, 600]
    base = [1 + 0.01 * x for x in n]
    var = [3 + 0.005 * x for x in n]  # crosses at 400
    r = find_breakeven(n, [[v] for v in base], n, [[v] for v in var], n_boot=100)
    assert r.crossover_tokens == pytest.approx(400, rel=1e-6)
    assert r.fit_agrees_with_measurements and "BUT" not in r.summary()


def test_the_ci_holds_its_estimate_even_from_few_or_skewed_replicates():
    """Issue 39: one replicate gave '95% CI 389–389' around an estimate of 387. A percentile interval that misses its
    estimate (few replicates, a skewed bootstrap distribution) is widened to hold it; the percentiles stay the ends."""
    missed = 0
    for seed in range(12):
        rng = np.random.default_rng(seed)
        base, var = noisy_samples(baseline_ms, rng, cv=0.1, k=5), noisy_samples(variant_ms, rng, cv=0.1, k=5)
        for n_boot in (1, 3, 100):
            result = find_breakeven(TOKENS, base, TOKENS, var, n_boot=n_boot, seed=seed)
            lo, hi = result.crossover_ci
            assert lo <= result.crossover_tokens <= hi
            missed += n_boot == 1 and result.crossover_tokens in (lo, hi)  # the one replicate's crossing was elsewhere
    assert missed >= 10  # without the widening, those intervals would have excluded their estimate
    with pytest.raises(ValueError, match="n_boot must be a whole number of bootstrap replicates, 1 or more, got 0"):
        find_breakeven(TOKENS, base, TOKENS, var, n_boot=0)
