"""Bad input to profile, compare, explain and ncu: one line on stderr, exit status 2, nothing on stdout."""

import shutil

import pytest

from cli_util import assert_one_line_error, run_cli

TRACE = "tests/data/traces/eager_vit.json.gz"


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["profile", "--model", "nope", "--device", "cpu"], "unknown model 'nope'"),
        (["profile", "--model", "deit_tiny_patch16_224", "--device", "cpu", "--steps", "0"], "--steps must be at least 1"),
        (["compare", "missing.json.gz", TRACE], "missing.json.gz: no such file"),
        (["compare", "deit_bse", TRACE], "unknown model 'deit_bse'"),
        (["explain", "deit_tiny_patch16_224", "--device", "cpu"], "cudagraph needs a CUDA device"),
        (["explain", "deit_tiny_patch16_224", "--modes", "eager", "--device", "cpu"], "explain reads GPU kernel traces"),
        (["explain", "deit_tiny_patch16_224", "--modes", "turbo", "--device", "cpu"], "unknown mode 'turbo'"),
        pytest.param(["ncu", "deit_tiny_patch16_224", "--device", "cpu"], "Nsight Compute (ncu) is not installed",
                     marks=pytest.mark.skipif(bool(shutil.which("ncu")), reason="ncu is installed here")),
        (["ncu", "deit_tiny_patch16_224", "--top", "0"], "--top must be at least 1"),
    ],
    ids=["profile-model", "profile-steps", "compare-missing-file", "compare-model", "explain-cpu-graph", "explain-cpu", "explain-mode",
         "ncu-absent", "ncu-top"],
)
def test_one_line_and_exit_2(args, fragment):
    r = run_cli(*args, cwd=str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    assert_one_line_error(r, fragment)
    assert r.stdout == ""
