"""Kineto ts/dur text to exact ns: the vectorised parser against decimal.Decimal on every spelling a
trace may use (integers, any number of decimals, trailing zeros, exponents, signs, numbers as strings),
values at and next to the half-ns rounding ties included."""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal, localcontext
from pathlib import Path

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from perflab.errors import PerflabError
from perflab.trace.kineto import _Reader, read_events, us_text_to_ns, us_texts_to_ns

RAWS = msgspec.json.Decoder(list[msgspec.Raw])


def decimal_ns(text: str) -> int:
    """The reference: µs × 1000 rounded half to even at the ns, with no rounding before."""
    with localcontext(prec=1000):
        return int((Decimal(text.strip('"')) * 1000).to_integral_value(ROUND_HALF_EVEN))


def parse(spellings: list[str]) -> np.ndarray:
    """The reader's path: the JSON texts decoded to msgspec.Raw, then the reader's column parser."""
    raws = RAWS.decode("[" + ",".join(spellings) + "]")
    return _Reader(Path("t.json"))._ns(raws)


@st.composite
def values(draw) -> tuple[str, int]:
    """A decimal value as (digits, places after the point): ts-like, dur-like, epoch-like, or a rounding tie."""
    kind = draw(st.sampled_from(["any", "tie", "near_tie", "small", "epoch"]))
    if kind == "epoch":
        whole = draw(st.integers(10**15, 2 * 10**15))
    elif kind == "small":
        whole = draw(st.integers(0, 99))
    else:
        whole = draw(st.integers(0, 10**13))
    if kind in ("tie", "near_tie"):  # ns, then the sub-ns digits: x.xxx5 exactly, just above or just below
        ns = draw(st.integers(0, 999))
        sub = "5" if kind == "tie" else draw(st.sampled_from(["5000001", "4999999", "50000000000001", "49999999999999", "5000", "1", "9"]))
        frac = f"{ns:03d}{sub}"
    else:
        frac = draw(st.text("0123456789", max_size=20))
    frac += "0" * draw(st.integers(0, 3))  # trailing zeros
    return f"{whole}{frac}", len(frac)


def spell(digits: str, places: int, shift: int, exponent_char: str, plus: bool, negative: bool, quoted: bool) -> str:
    """One JSON spelling of digits × 10**-places: plain (shift 0), or with the point moved ``shift`` places
    left and an exponent to make up for it (1234.5 = 1.2345e3 = 12345e-1)."""
    digits = digits.lstrip("0") or "0"
    places_now = places + shift  # digits × 10**-places_now × 10**shift
    if places_now > 0:
        digits = digits.rjust(places_now + 1, "0")
        mantissa = digits[:-places_now] + "." + digits[-places_now:]
    else:
        mantissa = digits + "0" * -places_now if digits != "0" else "0"  # (JSON: no leading zeros)
    text = mantissa if shift == 0 else f"{mantissa}{exponent_char}{'+' if plus and shift > 0 else ''}{shift}"
    text = ("-" if negative else "") + text
    return f'"{text}"' if quoted else text


@st.composite
def spelled(draw) -> str:
    digits, places = draw(values())
    shift = draw(st.sampled_from([0, 0, 0]) | st.integers(-8, 8))
    return spell(digits, places, shift, draw(st.sampled_from("eE")), draw(st.booleans()), draw(st.booleans()) and draw(st.booleans()),
                 draw(st.booleans()) and draw(st.booleans()))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(spelled(), min_size=1, max_size=40))
@example(["1000008.0665311092", "8.066531109150288", "1000000.0", "1.0e6", "1E-3", '"12.5"', "0.0005", "0.0015", "0.0025"])
@example(["4382075239980.014", "12", "0.001", "1.2345675", "1.2345665", "1.2345675000001", "1.2345674999999"])
@example(["0.00012345678901234567", "0.000000000000000000000001", "1e-30", "123456789012345678901234e-20", "-0.0005", "-1.5e-3"])
def test_every_spelling_parses_as_decimal_does(texts):
    expected = [decimal_ns(t) for t in texts]
    assert parse(texts).tolist() == expected
    # each value alone (a slice of one event), and the batch as strings: the same
    assert [int(parse([t])[0]) for t in texts] == expected
    quoted = [t if t.startswith('"') else f'"{t}"' for t in texts]
    assert parse(quoted).tolist() == expected


@settings(max_examples=150, deadline=None)
@given(values(), st.integers(-8, 8), st.booleans())
def test_one_value_spelled_every_way_gives_one_ns(value, shift, negative):
    digits, places = value
    texts = [spell(digits, places, s, e, plus, negative, quoted)
             for s in (0, shift) for e in "eE" for plus in (False, True) for quoted in (False, True)]
    expected = decimal_ns(texts[0])
    assert parse(texts).tolist() == [expected] * len(texts)


@pytest.mark.parametrize("text, ns", [
    ("0.0005", 0), ("0.0015", 2), ("0.0025", 2), ("1.0005", 1000), ("1.0015", 1002), ("1.0000005", 1000),  # ties: to even
    ("0.0005000001", 1), ("0.0004999999", 0), ("-0.0015", -2), ("-0.0005000001", -1),
    ("1000000.0", 1000000000), ("1.0e6", 1000000000), ("1E-3", 1), ("1e+3", 1000000), ('"1e3"', 1000000),
    ("1000008.0665311092", 1000008067), ("8.066531109150288", 8067),
    ("1712195495505543.201", 1712195495505543201), ("9223372036854775.807", 2**63 - 1),
])
def test_known_values(text, ns):
    assert parse([text]).tolist() == [ns]
    assert parse([text, "1.5"]).tolist() == [ns, 1500]


def test_the_vectorised_path_takes_every_common_spelling():
    texts = [b"4382075239980.014", b"12", b"1000008.0665311092", b"8.066531109150288", b"1000000.0", b"1.0e6",
             b"1E-3", b'"12.5"', b'"-3e2"', b"0.00012345678901234567", b"0.1234567890123456789"]
    ns, rows = us_texts_to_ns(texts)
    assert rows.tolist() == [10]  # only the mantissa of over 18 digits (leading zeros aside) is left to the per-value path
    assert ns[:10].tolist() == [decimal_ns(t.decode()) for t in texts[:10]]


def test_numpy_saturates_on_overflow():
    # us_texts_to_ns relies on it: an int64 token of more than 18 digits is never cut to a small number
    text = b"99999999999999999999 -99999999999999999999 18446744073709551621 9223372036854775808 999999999999999999"
    assert np.fromstring(text, dtype=np.int64, sep=" ").tolist()[:4] == [2**63 - 1] * 4


def test_spellings_outside_the_fast_grammar_go_one_by_one_and_stay_exact():
    # Decimal reads these strings; the vectorised parser leaves them to it (counted)
    texts = ['".5"', '"5."', '"+5"', '"1e+0005"', '"0012.5"']
    reader = _Reader(Path("t.json"))
    assert reader._ns(RAWS.decode("[" + ",".join(texts) + "]")).tolist() == [500, 5000, 5000, 100000000, 12500]


@pytest.mark.parametrize("text", ['"abc"', '""', '"1 2"', '"1e"', '"NaN"', '"Infinity"', '"--1"', "1e400", "-1e400", "9223372036854775.808"])
def test_not_a_number_or_out_of_range_is_one_clear_error(text):
    with pytest.raises(PerflabError, match="timestamp is (not a number|out of range)"):
        parse([text, "1.5"])


def test_tiny_and_huge_exponents():
    assert parse(["1e-400", "0e400", "-1e-400"]).tolist() == [0, 0, 0]
    assert us_text_to_ns("1e-99999999") == 0


def _trace(tmp_path: Path, ts: str, dur: str) -> Path:
    events = [
        f'{{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": {ts}, "dur": 2.5, "args": {{"correlation": 7}}}}',
        f'{{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": {ts}, "dur": {dur}, '
        f'"args": {{"correlation": 7, "device": 0, "stream": 7, "grid": [1, 1, 1], "block": [32, 1, 1]}}}}',
    ]
    path = tmp_path / "t.json"
    path.write_text('{"traceEvents": [' + ",\n".join(events) + "]}")
    return path


def test_a_negative_duration_is_one_clear_error(tmp_path):
    with pytest.raises(PerflabError, match="negative duration"):
        read_events(_trace(tmp_path, "1000.5", "-0.5"))


def test_the_reader_counts_values_parsed_one_by_one(tmp_path):
    raw, meta = read_events(_trace(tmp_path, "1000008.0665311092", "8.066531109150288"))
    assert raw.gpu["start_ns"].tolist() == [1000008067] and raw.gpu["dur_ns"].tolist() == [8067]
    assert meta["times_parsed_one_by_one"] == 0
    raw, meta = read_events(_trace(tmp_path, '"0.1234567890123456789e3"', "8"))  # 19 digits: one by one, for both events
    assert raw.gpu["start_ns"].tolist() == [123457] and meta["times_parsed_one_by_one"] == 2


def test_a_negative_duration_exits_2_with_one_line(tmp_path):
    import subprocess
    import sys

    path = _trace(tmp_path, "1000.5", "-0.5")
    done = subprocess.run([sys.executable, "-m", "perflab", "analyze", str(path)], capture_output=True, text=True)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "negative duration" in done.stderr
