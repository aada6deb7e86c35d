"""perflab.units: the one set of formatters, each printing as the copy it replaced did."""

from __future__ import annotations

import random

import numpy as np

from perflab import units


def test_missing_figures_read_as_a_dash_each_as_its_copy_had_it():
    nan = float("nan")
    assert units.num(None, ".1f") == units.num(nan, ".1f") == "–"  # md.num
    assert units.num(nan, ".1f", keep_nan=True) == "nan" and units.num(None, ".1f", keep_nan=True) == "–"  # console's _fmt
    assert units.us(None) == units.us(nan) == units.us(np.float32("nan")) == "–"  # trace_console's _in_us
    assert units.ns_us(None) == "–" and units.ns_to_us(None) is None and units.ns_to_us(nan) is None
    assert units.ms(None) == units.pct(None) == units.percent(None) == units.gbps(None) == units.gflops(nan) == "–"
    assert units.pct_of(1, 0) == "–" and units.to_percent(None) is None


def test_digits_and_units():
    assert units.ms(104.3971) == "104.397" and units.ms(1.5, digits=1) == "1.5"
    assert units.ns_ms(1_234_567) == "1.2346" and units.ns_ms(-10_000, signed=True) == "-0.0100" and units.ns_ms(12_345_678, 3) == "12.346"
    assert units.us(47_686.62) == "47,686.6" and units.ns_us(47_686_620) == "47,686.6" and units.ns_to_us(1_234_567) == 1234.567
    assert units.duration(1_250_000) == "1.25 ms" and units.duration(830_000) == "830.0 µs"
    assert units.pct(0.1234) == "12.3%" and units.percent(12.34) == "12.3%" and units.pct_of(1, 8) == "12.5%" and units.to_percent(0.25) == 25
    assert units.gflops(35.144) == "35.14" and units.gflops(0.00025) == "0.00025" and units.gbps(1873.4) == "1873"
    assert units.ms_ci(3.14159, [3.1, 3.2]) == "3.142 [3.100–3.200]" and units.ms_ci(3.14159, None) == units.ms_ci(3.14159, [None, 1]) == "3.142"


def test_a_share_prints_as_the_copy_that_multiplied_by_100_did():
    """report.program's _pct printed f"{100 * x:.1f}%", md's pct f"{x:.1%}"; one formatter serves both."""
    rng = random.Random(53)
    for x in [rng.random() for _ in range(20_000)] + [rng.uniform(-3, 3) for _ in range(20_000)] + [0.0005, 0.00049999, 1, 0]:
        assert units.pct(x) == f"{100 * x:.1f}%"
