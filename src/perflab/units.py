"""Numbers and units as perflab prints them: one set of formatters for every table, line and page (report's, and
analysis' messages), so that a millisecond or a share reads the same wherever it is printed.

A floor-0 module (tests/test_layers.py): it imports no other perflab module, so any stage may use it.

Each formatter returns the text of one figure; ``–`` (``NONE``) stands for a figure that is not there. Where two
places printed one unit differently (their digits, NaN or None), both ways are kept, as a parameter or a named
variant, so that nothing printed changes."""

from __future__ import annotations

import math

NONE = "–"  # a missing figure


def missing(value) -> bool:
    """None or a float NaN (numpy's float64 is one; a float32 is not, and prints as ``nan``)."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def num(value, spec: str = ".3g", empty: str = NONE, *, keep_nan: bool = False) -> str:
    """A number in ``spec``; ``empty`` for none (None or NaN; ``keep_nan``: None only, NaN printed as ``nan``)."""
    if value is None or (not keep_nan and missing(value)):
        return empty
    return format(value, spec)


def ms(value, digits: int = 3) -> str:
    """Milliseconds (a value in ms) to ``digits`` decimals: ``104.397``; ``–`` for None."""
    return NONE if value is None else f"{value:.{digits}f}"


def ns_ms(ns: float, digits: int = 4, signed: bool = False) -> str:
    """Nanoseconds in ms to ``digits`` decimals: ``1.2345``; ``signed``: a difference, ``+1.2345`` / ``-0.0100``."""
    return f"{ns / 1e6:{'+' if signed else ''}.{digits}f}"


def ms_ci(median: float, ci) -> str:
    """A median in ms with its interval, ``3.142 [3.100–3.200]``; the median alone where the interval has an end
    missing."""
    ci = ci or (None, None)
    return f"{median:.3f} [{ci[0]:.3f}–{ci[1]:.3f}]" if None not in ci else f"{median:.3f}"


def us(value) -> str:
    """Microseconds (a value in µs) with thousands separators: ``47,686.6``; ``–`` for none (None or NaN, numpy's too)."""
    return NONE if value is None or value != value else f"{value:,.1f}"


def ns_us(ns) -> str:
    """Nanoseconds in µs, as ``us`` prints them."""
    return us(None if ns is None else ns / 1000)


def ns_to_us(ns, digits: int = 3) -> float | None:
    """Nanoseconds as a number of µs rounded to ``digits`` decimals (a record's field, not text); None for none."""
    return None if missing(ns) else round(float(ns) / 1000.0, digits)


def duration(ns: float) -> str:
    """Nanoseconds in the unit that reads best in a sentence: ``1.25 ms`` from a millisecond up, else ``830.0 µs``."""
    return f"{ns / 1e6:.2f} ms" if ns >= 1e6 else f"{ns / 1e3:.1f} µs"


def pct(fraction) -> str:
    """A fraction as a percentage: 0.1234 → ``12.3%``; ``–`` for None."""
    return NONE if fraction is None else f"{fraction:.1%}"


def percent(value) -> str:
    """A value already in percent: 12.34 → ``12.3%``; ``–`` for None."""
    return NONE if value is None else f"{value:.1f}%"


def pct_of(part, whole) -> str:
    """``part`` as a percentage of ``whole``; ``–`` where ``whole`` is 0 (or none)."""
    return f"{100 * part / whole:.1f}%" if whole else NONE


def to_percent(fraction) -> float | None:
    """A fraction as a number of percent (a figure to format later); None for None."""
    return None if fraction is None else 100 * fraction


def gflops(value) -> str:
    """GFLOPs: two decimals from 0.1 up (35.14, 0.83), else two significant digits (a tiny decode's 0.00025, not 0.00);
    ``–`` for none (None or NaN)."""
    if missing(value):
        return NONE
    return f"{value:.2f}" if abs(value) >= 0.1 else f"{value:.2g}"


def gbps(value) -> str:
    """GB/s, whole: ``1873``; ``–`` for None."""
    return NONE if value is None else f"{value:.0f}"
