"""Issue 39: inputs that cannot be stored or run are refused up front, in one line with exit status 2."""

import pytest

from cli_util import assert_one_line_error, run_cli_here
from perflab import api
from perflab.errors import PerflabError
from perflab.spec import INT64_MAX, INT64_MIN, Case

TINY = ["bench", "--model", "test:tiny", "--device", "cpu", "--input-size", "32", "--warmup", "0", "--iters", "2", "--repeats", "2"]
PAST = "is past the integers perflab can store and run (signed 64-bit, -2^63 to 2^63-1"


def test_a_spec_with_a_batch_size_past_64_bits_is_refused_in_one_line(tmp_path):
    spec = tmp_path / "big.yaml"
    spec.write_text("defaults: {device: cpu, input_size: 32, model: 'test:tiny'}\ngrid:\n  batch_size: [1, 100000000000000000000000000, 2]\n")
    r = run_cli_here("sweep", spec, "--list")
    assert_one_line_error(r, f"{spec}: grid.batch_size: 100000000000000000000000000 {PAST}")
    assert r.stdout == ""


@pytest.mark.parametrize("flag,value,field", [("--batch-size", 10 ** 26, "batch_size"), ("--seed", 2 ** 70, "seed"),
                                              ("--warmup", 2 ** 63, "warmup"), ("--model-arg", f"d_ff={10 ** 40}", "model_args.d_ff")])
def test_bench_refuses_integers_past_64_bits_before_running(flag, value, field, tmp_path):
    out = tmp_path / "rows.jsonl"
    r = run_cli_here(*TINY, flag, value, "--out", out) if field != "model_args.d_ff" else \
        run_cli_here("bench", "--model", "gpt_small", "--device", "cpu", flag, value, "--out", out)
    shown = "an integer of about 41 digits" if field == "model_args.d_ff" else str(value)
    assert_one_line_error(r, f"{field}: {shown} {PAST}")
    assert r.stdout == "" and not out.exists()  # nothing ran


def test_the_bounds_are_those_of_signed_64_bits():
    assert (INT64_MIN, INT64_MAX) == (-(2 ** 63), 2 ** 63 - 1)
    assert api.make_cases(model=["test:tiny"], device="cpu", seed=INT64_MAX)[0].seed == INT64_MAX  # the largest is taken
    with pytest.raises(PerflabError, match=f"seed: {INT64_MAX + 1} is past"):
        api.make_cases(model=["test:tiny"], device="cpu", seed=INT64_MAX + 1)
    with pytest.raises(PerflabError, match=f"seed: {INT64_MIN - 1} is past"):
        api.make_cases(model=["test:tiny"], device="cpu", seed=INT64_MIN - 1)
    # A Case built in code, not by make_cases, is checked by api.bench before anything is built.
    with pytest.raises(PerflabError, match=f"input_size: {2 ** 64} is past"):
        api.bench([Case(model="test:tiny", device="cpu", input_size=2 ** 64)])


FEWER, MORE = "(fewer put each end of a 95% CI on one or two replicates)", "(more only add time and memory)"


@pytest.mark.parametrize("value, why", [("0", FEWER), ("-1", FEWER), ("99", FEWER), ("100001", MORE)])
def test_bootstrap_is_a_whole_number_from_100_to_100000(value, why, tmp_path):
    r = run_cli_here("report", tmp_path, "--bootstrap", value)  # refused before the store is opened
    assert_one_line_error(r, f"--bootstrap: expected a whole number of replicates from 100 to 100,000, got {value} {why}")
    out = tmp_path / "be"
    r = run_cli_here("breakeven", "--model", "test:tiny", "--variant", "test:tiny", "--device", "cpu", "--bootstrap", value, "--out", out)
    assert_one_line_error(r, "--bootstrap: expected a whole number")
    assert not out.exists()  # refused before the sweep


@pytest.mark.parametrize("text,message", [
    ("defaults: {device: cpu, model: 'test:tiny'}\ngrid:\n  batch_size: [1, 2]\ngrid:\n  batch_size: [8]\n",
     "grid: key given twice (lines 2 and 4); YAML would keep the last silently, so give it once"),
    ("defaults: {device: cpu, model: 'test:tiny'}\ncases:\n  - {batch_size: 1}\n  - {batch_size: 3, batch_size: 4}\n",
     "cases[1].batch_size: key given twice (lines 4 and 4)"),
    ("defaults:\n  device: cpu\n  model: 'test:tiny'\nharness:\n  ncu_where: {batch_size: 1, batch_size: 2}\ngrid: {batch_size: [1]}\n",
     "harness.ncu_where.batch_size: key given twice (lines 5 and 5)"),
])
def test_duplicate_yaml_keys_are_refused_naming_the_key_path(text, message, tmp_path):
    spec = tmp_path / "dup.yaml"
    spec.write_text(text)
    assert_one_line_error(run_cli_here("sweep", spec, "--list"), f"{spec}: {message}")


def test_a_merge_key_is_not_a_duplicate(tmp_path):
    spec = tmp_path / "merge.yaml"
    spec.write_text("grid:\n  - &one {model: ['test:tiny'], device: [cpu], batch_size: [1]}\n  - {<<: *one, batch_size: [2]}\n")
    r = run_cli_here("sweep", spec, "--list")
    assert r.returncode == 0 and r.stdout.splitlines()[-1] == "2 cases"


def _alias_bomb() -> str:
    """Nine levels of nine aliases each: 9^9 (387 million) strings once expanded, in 496 bytes."""
    items = ['&a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi"):
        items.append(f"&{name} [" + ", ".join([f"*{prev}"] * 9) + "]")
    return "defaults: {model: gpt_small, device: cpu}\ngrid:\n  batch_size: [\n    " + ",\n    ".join(items) + "]\n"


def test_a_yaml_alias_bomb_is_refused_in_well_under_2_s_and_300_MB(tmp_path):
    import time
    import tracemalloc

    spec = tmp_path / "bomb.yaml"
    spec.write_text(_alias_bomb())
    assert spec.stat().st_size < 650  # the was 609 bytes
    tracemalloc.start()
    try:
        start = time.perf_counter()
        r = run_cli_here("sweep", spec, "--list")
        took = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert_one_line_error(r, f"{spec}: grid.batch_size: expected a list of integers, got [[\"lol\", ")
    assert len(r.stderr) < 400  # the message shows 80 characters of the value, and serialised no more
    assert took < 2.0 and peak < 300e6, (took, peak)


def test_bootstrap_from_code_too_large_to_print_is_one_line():
    with pytest.raises(PerflabError, match=r"got an integer of about 5001 digits \(more only add time and memory\)"):
        api.check_bootstrap(10 ** 5000)  # repr() refuses past 4300 digits


def test_processes_has_an_upper_bound(tmp_path):
    r = run_cli_here(*TINY, "--processes", "100000")
    assert_one_line_error(r, "--processes: expected a whole number of processes from 1 to 100, got 100000")
    assert r.stdout == ""
