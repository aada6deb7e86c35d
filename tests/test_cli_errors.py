"""Bad input to profile, compare, explain and ncu: one line on stderr, exit status 2, nothing on stdout."""

import shutil

import pytest

from cli_util import assert_one_line_error, run_cli_here

TRACE = "tests/data/traces/eager_vit.json.gz"


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["profile", "--model", "nope", "--device", "cpu"], "unknown model 'nope'"),
        (["profile", "--model", "deit_tiny_patch16_224", "--device", "cpu", "--steps", "0"], "--steps must be at least 1"),
        (["compare", "missing.json.gz", TRACE], "missing.json.gz: no such file"),
        (["compare", "deit_bse", TRACE], "unknown model 'deit_bse'"),
        (["explain", "deit_tiny_patch16_224", "--device", "cpu"], "explain reads GPU kernel traces"),
        (["profile", "--model", "deit_tiny_patch16_224", "--device", "cpu"], "needs a CUDA GPU"),
        (["compare", "deit_tiny_patch16_224", "topk_deit_tiny_patch16_224", "--keep-rate", "0.5", "--reduction-loc", "3", "--device", "cpu"], "needs a CUDA GPU"),
        (["compare", TRACE, "tests/data/traces/two_streams.json.gz"], "has step annotations and two_streams.json.gz has none"),
        (["analyze", TRACE, "--step-gap-threshold-us", "inf"], "must be a finite number"),
        (["analyze", TRACE, "--csv", "README.md"], "exists and is not a directory"),
        (["bench", "--model", "test:tiny", "--device", "cpu", "--out", "no_such_dir/rows.csv"], "does not exist"),
        (["explain", "deit_tiny_patch16_224", "--modes", "eager", "--device", "cpu"], "explain reads GPU kernel traces"),
        pytest.param(["explain", "deit_tiny_patch16_224", "--modes", "turbo", "--device", "cuda"], "CUDA was requested but is not available",
                     marks=pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a GPU is present")),
        pytest.param(["ncu", "deit_tiny_patch16_224", "--device", "cpu"], "Nsight Compute (ncu) is not installed",
                     marks=pytest.mark.skipif(bool(shutil.which("ncu")), reason="ncu is installed here")),
        (["ncu", "deit_tiny_patch16_224", "--top", "0"], "--top must be at least 1"),
        (["ncu", "deit_tiny_patch16_224", "--per-config", "-1"], "--per-config must be 0 (every launch) or more, got -1"),
        (["compare", "llama3_8b", "llama3_8b", "--workload", "decode", "--mode", "eager", "--mode", "compile", "--mode", "cudagraph"],
         "--mode: give one value (both sides) or two (A's, then B's), got 3"),
        (["compare", TRACE, "llama3_8b", "--mode", "eager", "--mode", "compile"], "two values of an option (A's, then B's) are for two cases"),
        (["compare", "llama3_8b", "llama3_8b", "--layers", "1", "--layers-only", "--workload", "decode", "--mode", "eager", "--mode", "compile",
          "--dtype", "bf16", "--device", "cpu"], "needs a CUDA GPU"),
        (["compare", "llama3_8b", "llama3_8b", "--layers", "1", "--workload", "decode", "--context-len", "128", "--context-len", "99999",
          "--device", "cpu"], "longer than llama3_8b's max_seq_len"),
        (["bench", "--model", "gpt_small", "--workload", "train_step", "--optimizer", "sgd", "--device", "cpu"], "unknown optimizer 'sgd'"),
        (["bench", "--model", "gpt_small", "--workload", "forward", "--checkpoint-activations", "--device", "cpu"],
         "--checkpoint-activations applies to the forward_backward and train_step workloads"),
        (["explain", "gpt_small", "--workload", "train_step", "--fixes-on", "fastest", "--device", "cpu"],
         "--fixes-on 'fastest': use best (the fastest mode measured), eager, or a mode"),
        # --steps is the profiled pass's: refused before any case is timed, in every command that profiles
        (["explain", "deit_tiny_patch16_224", "--device", "cpu", "--steps", "0"], "--steps must be at least 1, got 0"),
        (["compare", TRACE, "deit_tiny_patch16_224", "--device", "cpu", "--steps", "0"], "--steps must be at least 1, got 0"),
    ],
    ids=["profile-model", "profile-steps", "compare-missing-file", "compare-model", "explain-cpu", "profile-cpu", "compare-cpu",
         "compare-steps-mismatch", "analyze-inf", "analyze-csv-file", "bench-out-dir", "explain-cpu-modes", "explain-no-cuda",
         "ncu-absent", "ncu-top", "ncu-per-config", "compare-three-modes", "compare-trace-two-modes", "compare-two-modes-cpu", "compare-b-context-too-long",
         "bench-optimizer", "bench-checkpoint-forward", "explain-fixes-on", "explain-steps", "compare-steps"],
)
def test_one_line_and_exit_2(args, fragment):
    r = run_cli_here(*args, cwd=str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    assert_one_line_error(r, fragment)
    assert r.stdout == ""


def test_a_refused_profile_leaves_no_directory_behind(tmp_path):
    out = tmp_path / "traces"
    r = run_cli_here("profile", "--model", "deit_tiny_patch16_224", "--device", "cpu", "--out", out)
    assert_one_line_error(r, "needs a CUDA GPU")
    assert not out.exists()


def test_an_output_directory_that_is_a_file_is_one_line(tmp_path):
    from perflab.paths import make_out_dir
    from perflab.errors import PerflabError

    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(PerflabError, match="exists and is not a directory"):
        make_out_dir(f)
    with pytest.raises(PerflabError, match="cannot create the output directory"):
        make_out_dir(f / "sub")
