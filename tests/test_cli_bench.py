"""perflab bench from the command line: outputs, and one-line errors with exit status 2."""

import csv
import io
import json

import pytest

from cli_util import assert_one_line_error, run_cli_here
from perflab.cli_argv import expand_multi_value_options


def test_must_show_deit_base_gmacs_on_the_cpu():
    r = run_cli_here("bench", "--model", "deit_base_patch16_224", "--device", "cpu", "--input-size", "224", "--batch-size", "1", "--iters", "2", "--format", "json")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(rows) == 1
    assert rows[0]["gmacs"] == pytest.approx(17.58, rel=0.005)
    assert rows[0]["tokens"] == [197]
    assert rows[0]["timed_iters"] == 2
    # 2 iterations are under the 50-iteration minimum: flagged unless they took the 1 s minimum time (a slow host)
    assert ("short_timing" in rows[0]["flags"]) == (rows[0]["timed_s"] < 1.0), (rows[0]["timed_s"], rows[0]["flags"])
    assert ("warning:" in r.stderr) == bool(rows[0]["flags"])  # a flag is a warning, and only a flag is


def test_json_and_csv_outputs_for_a_grid(tmp_path):
    args = ["bench", "--model", "test:tiny", "--device", "cpu", "--batch-size", "1", "2", "--input-size", "32", "64", "--min-time", "0.05", "--warmup", "1"]
    r = run_cli_here(*args, "--format", "json", "--out", tmp_path / "rows.csv")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [(row["input_size"], row["batch_size"]) for row in rows] == [(32, 1), (32, 2), (64, 1), (64, 2)]
    assert all(row["status"] == "ok" for row in rows)
    assert all(row["host_canary_us"] > 0 and row["host_canary_ratio"] > 0 for row in rows)  # ratio: to the run's median
    table = list(csv.DictReader(io.StringIO((tmp_path / "rows.csv").read_text())))
    header = (tmp_path / "rows.csv").read_text().splitlines()[0].split(",")
    # the study's columns first, each named for what it holds: its "flops" held GMACs, and is named so (once)
    assert header[:9] == ["run_name", "tp", "latency_ms", "time_total", "gmacs", "max_memory", "no_params", "no_params_trainable", "power"]
    assert "flops" not in header and header.count("gmacs") == 1
    assert len(table) == 4
    for row, rec in zip(rows, table):
        assert float(rec["tp"]) == pytest.approx(row["throughput_per_s"], rel=1e-3)
        assert float(rec["latency_ms"]) == pytest.approx(row["latency_ms_per_batch"], rel=1e-3)  # per batch, documented
        assert float(rec["gmacs"]) == pytest.approx(row["gmacs"], rel=1e-3) and float(rec["gflops"]) == pytest.approx(2 * row["gmacs"], rel=1e-2)
        assert rec["case_id"] == row["case_id"]
        assert float(rec["host_canary_us"]) == pytest.approx(row["host_canary_us"], rel=1e-3)


def test_table_output_lists_every_case():
    r = run_cli_here("bench", "--model", "test:tiny", "test:drops_batch", "--device", "cpu", "--batch-size", "4", "--min-time", "0.05", "--warmup", "1")
    assert r.returncode == 0, r.stderr
    assert "test:tiny" in r.stdout and "test:drops_batch" in r.stdout
    assert "host µs" in r.stdout
    assert "batch_mismatch" in r.stdout and "processed 1 images, not the 4 requested" in " ".join(r.stderr.split())  # wrapped to the width


def test_oom_case_is_a_row_and_the_rest_run():
    r = run_cli_here("bench", "--model", "test:oom", "test:tiny", "--device", "cpu", "--min-time", "0.05", "--warmup", "1", "--format", "json")
    assert r.returncode == 0, r.stderr
    statuses = [json.loads(line)["status"] for line in r.stdout.splitlines()]
    assert statuses == ["oom", "ok"]


@pytest.mark.parametrize(
    "args,fragments",
    [
        (["--model", "deit_bse_patch16_224"], ["unknown model 'deit_bse_patch16_224'", "did you mean deit_base_patch16_224"]),
        (["--model", "nope"], ["unknown model 'nope'; known models: image deit_tiny_patch16_224", "language gpt_small", "decode llama2_7b",
                               "llama3_8b", "hf:DIR"]),  # every family's, not the image models' alone
        (["--model", "topk_deit_base_patch16_224", "--keep-rate", "0", "--reduction-loc", "3"], ["keep rate 0 is outside (0, 1]"]),
        (["--model", "topk_deit_base_patch16_224", "--keep-rate", "1.5", "--reduction-loc", "3"], ["keep rate 1.5 is outside (0, 1]"]),
        (["--model", "topk_deit_base_patch16_224", "--keep-rate", "0.1", "--reduction-loc", "3", "12"], ["reduction location 12 is beyond the depth"]),
        (["--model", "deit_base_patch16_224", "--input-size", "225"], ["input size 225 is not divisible by the patch size 16"]),
        (["--model", "deit_base_patch16_224", "--device", "cuda"], ["CUDA was requested but is not available"]),
        (["--model", "deit_base_patch16_224", "--dtype", "fp8"], ["unknown dtype 'fp8'"]),
        (["--model", "deit_base_patch16_224", "--mode", "turbo"], ["unknown mode 'turbo'"]),
        (["--model", "deit_base_patch16_224", "--mode", "cudagraph", "--device", "cpu"], ["cudagraph needs a CUDA device"]),
        (["--model", "deit_base_patch16_224", "--format", "xml"], ["unknown format 'xml'"]),
        (["--model", "deit_base_patch16_224", "--batch-size", "x"], ["--batch-size"]),
        (["--model", "topk_deit_base_patch16_224"], ["needs --keep-rate and --reduction-loc"]),
        (["--model", "deit_base_patch16_224", "--keep-rate", "0.1", "--reduction-loc", "3"], ["does not reduce tokens"]),
        (["--modle", "x"], ["No such option"]),
        ([], ["--model"]),
    ],
    ids=["unknown-model", "unknown-model-far", "keep-rate-0", "keep-rate-1.5", "loc-beyond-depth", "size-not-divisible", "no-cuda", "bad-dtype",
         "bad-mode", "cudagraph-on-cpu", "bad-format", "non-integer", "missing-keep-rate", "keep-rate-on-baseline", "bad-flag", "no-model"],
)
def test_bad_input_gives_one_line_and_exit_2(args, fragments):
    r = run_cli_here("bench", *args, *([] if "--device" in args else ["--device", "cpu"]))
    assert_one_line_error(r, *fragments)
    assert r.stdout == ""


def test_multi_value_options_expand_and_keep_other_tokens():
    argv = ["bench", "--model", "a", "b", "--batch-size", "1", "8", "--seed", "3", "--keep-rate=0.1", "--reduction-loc", "3", "6", "9"]
    assert expand_multi_value_options(argv) == [
        "bench", "--model", "a", "--model", "b", "--batch-size", "1", "--batch-size", "8", "--seed", "3", "--keep-rate", "0.1",
        "--reduction-loc", "3", "--reduction-loc", "6", "--reduction-loc", "9",
    ]


def test_demo_runs_the_small_cpu_version_and_pairs_top_k_with_its_baseline():
    from perflab import api

    cases = api.demo_cases("cpu")
    assert sorted((c.model, c.batch_size) for c in cases) == [
        ("deit_tiny_patch16_224", 1), ("deit_tiny_patch16_224", 8), ("topk_deit_tiny_patch16_224", 1), ("topk_deit_tiny_patch16_224", 8)]
    r = run_cli_here("demo", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert "Top-k vs baseline" in r.stdout and "197→21→3→2" in r.stdout
    assert r.stdout.count("2.51 → 0.83") == 2  # DeiT-Tiny GFLOPs per image, baseline → top-k, at bs 1 and 8
    # warnings, each said once, under the tables: at most one line for the 4 rows; no power reading is no warning on a CPU
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning")]
    assert len(warnings) <= 1, r.stderr
    assert "no_power" not in r.stderr and "no_power" not in r.stdout
