"""``perflab analyze``: output on good traces, one line and exit 2 on bad input (run as a subprocess)."""

from __future__ import annotations

import gzip
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from reference_trace import CPU_ONLY_TRACE, KINETO_TRACES, NSYS_FIXTURE, summarize

import perflab

SRC = Path(__file__).resolve().parents[1] / "src"
TRACE_IDS = [p.name.split(".")[0] for p in KINETO_TRACES]


def run_analyze(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(SRC) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return subprocess.run([sys.executable, "-m", "perflab", "analyze", *map(str, args)], capture_output=True, text=True, env=env, timeout=120)


def test_json_output_on_a_real_trace():
    path = KINETO_TRACES[TRACE_IDS.index("train_step")]
    done = run_analyze(path, "--json", "--top", "5")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1
    summary = json.loads(lines[0])
    ref = summarize(path)
    for key in ("kernels", "kernel_time_us", "gpu_busy_us", "wall_us", "idle_us", "idle_by_cause_us", "steps", "kernels_per_step",
                "mean_kernel_us", "top_kernels", "categories_us", "gemm_fraction", "ranges", "step_accounting", "launch"):
        assert key in summary, key
    assert summary["kernels"] == ref["kernels"] == 108
    assert summary["kernel_time_us"] * 1000 == pytest.approx(ref["kernel_time_ns"], abs=0.5)
    assert summary["gpu_busy_us"] * 1000 == pytest.approx(ref["busy_ns"], abs=0.5)
    exact = summary["accounting_ns"]
    assert exact["wall_ns"] == exact["busy_ns"] + exact["host_bound_ns"] + exact["kernel_gap_ns"] + exact["other_ns"]
    assert summary["steps"] == 3 and summary["kernels_per_step"] == 36
    assert len(summary["top_kernels"]) == 5
    assert set(summary["top_kernels"][0]) >= {"name", "full_name", "total_us", "count", "share"}
    assert summary["memcpy"] == 3 and summary["memset"] == 6
    assert summary["launch"]["verdict"] == "launch-bound" and summary["launch"]["message"].startswith("launch-bound: the GPU is idle")
    for step in summary["step_accounting"]:
        assert step["wall_us"] == pytest.approx(step["gpu_busy_us"] + sum(step["idle_by_cause_us"].values()), abs=0.002)


def test_table_output_and_csv(tmp_path):
    done = run_analyze(NSYS_FIXTURE, "--csv", tmp_path / "tables", "--step-gap-threshold-us", "1")
    assert done.returncode == 0, done.stderr
    for text in ("GPU busy", "host bound", "kernel gap", "Top", "GPU time by category", "prefetch", "cudaGraphLaunch"):
        assert text in done.stdout, text
    written = sorted(p.name for p in (tmp_path / "tables").iterdir())
    assert written == ["categories.csv", "devices.csv", "kernels.csv", "launch_apis.csv", "ranges.csv", "steps.csv", "top_kernels.csv",
                       "top_memory_ops.csv", "trace_accounting.csv"]
    steps = (tmp_path / "tables" / "trace_accounting.csv").read_text().splitlines()
    header, values = steps[0].split(","), steps[1].split(",")
    row = dict(zip(header, map(int, values)))
    # a 1 µs threshold: the 4.5 µs wait before process 2002's kernels is no longer a kernel gap
    assert (row["busy_ns"], row["host_bound_ns"], row["kernel_gap_ns"], row["other_ns"]) == (8_100, 7_900, 500, 4_500)


def test_python_api():
    report = perflab.analyze(KINETO_TRACES[TRACE_IDS.index("two_streams")], top=1)
    assert len(report.top_kernels) == 1 and report.top_kernels["category"].iloc[0] == "gemm"  # (2 kernel names in all)
    assert len(report.kernels) == 24 and len(report.steps) == 1
    assert report.to_dict()["steps"] == 0  # no step annotations: one window over the whole trace


def bad_input_cases(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    plain = gzip.decompress(KINETO_TRACES[TRACE_IDS.index("eager_vit")].read_bytes())
    compressed = KINETO_TRACES[TRACE_IDS.index("train_step")].read_bytes()
    cases = {
        "missing": (tmp_path / "nope.json", "no such file"),
        "truncated_json": (tmp_path / "truncated.json", "truncated"),
        "truncated_gz": (tmp_path / "truncated.json.gz", "truncated or corrupt gzip"),
        "invalid_json": (tmp_path / "invalid.json", "invalid JSON"),
        "empty_trace": (tmp_path / "empty_trace.json", "no events"),
        "empty_file": (tmp_path / "empty.json", "empty"),
        "no_work": (tmp_path / "annotations.json", "no GPU activity"),
        "sqlite_not_nsys": (tmp_path / "other.sqlite", "not an nsys export"),
        "neither": (tmp_path / "notes.txt", "neither a Kineto JSON trace"),
        "not_a_trace": (tmp_path / "config.json", "no \"traceEvents\""),
    }
    cases["truncated_json"][0].write_bytes(plain[: len(plain) // 2])
    cases["truncated_gz"][0].write_bytes(compressed[: len(compressed) // 2])
    cases["invalid_json"][0].write_text('{"traceEvents": [{"ph": "X", "cat": "kernel", oops}]}')
    cases["empty_trace"][0].write_text('{"traceEvents": []}')
    cases["empty_file"][0].write_bytes(b"")
    with sqlite3.connect(cases["sqlite_not_nsys"][0]) as db:
        db.execute("CREATE TABLE results (x INTEGER)")
    cases["neither"][0].write_text("hello, this is not a trace\n")
    cases["not_a_trace"][0].write_text('{"model": "deit"}')
    cases["no_work"][0].write_text('{"traceEvents": [{"ph": "X", "cat": "user_annotation", "name": "step", "pid": 1, "tid": 1, "ts": 1, "dur": 2}]}')
    return cases


CASES = ["missing", "truncated_json", "truncated_gz", "invalid_json", "empty_trace", "empty_file", "no_work", "sqlite_not_nsys",
         "neither", "not_a_trace"]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_gives_one_line_and_exit_2(tmp_path, case):
    path, message = bad_input_cases(tmp_path)[case]
    done = run_analyze(path)
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout
    assert lines[0].startswith("perflab: error: ") and message in lines[0], lines[0]
    assert done.stdout == ""


def test_bad_flags_give_exit_2():
    done = run_analyze(NSYS_FIXTURE, "--top", "0")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and "--top" in done.stderr


def test_a_cpu_only_trace_is_said_in_cpu_terms():
    """A CPU trace's work is torch's operators (as perflab run says it): no GPU busy, no kernels, no empty CUDA API row."""
    from cli_util import run_cli_here

    done = run_cli_here("analyze", CPU_ONLY_TRACE)
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    for gpu_word in ("GPU", "CUDA", "kernel", "launch →"):
        assert gpu_word not in text, gpu_word
    ref = summarize(CPU_ONLY_TRACE)
    assert f"CPU operators (torch's top-level, per thread) │ {ref['busy_ns'] / 1000:,.1f}" in text
    assert "between operators (the interpreter)" in text and "operator time, summed over 6 operators" in text
    assert "Top 3 operators by total time (share of all operator time)" in text and "Operator time by category" in text
    assert "wall = operators + between operators, exact to the ns" in text  # no other idle in a CPU trace: no column for it
    assert "ops: operators (torch's top-level, per thread)" in text


@pytest.mark.parametrize("text", ['[1, 2]', '{"traceEvents": [1, 2]}'])
def test_valid_json_whose_events_are_not_objects_is_malformed_not_invalid(tmp_path, text):
    """msgspec's ValidationError is a DecodeError: caught as one, a well-formed list of numbers read "invalid JSON
    (truncated?)", sending the user to look for a cut file."""
    from perflab.errors import PerflabError
    from perflab.trace.kineto import load_kineto

    path = tmp_path / "numbers.json"
    path.write_text(text)
    with pytest.raises(PerflabError) as caught:
        load_kineto(path)
    assert "an event is malformed (Expected `object`, got `int`" in str(caught.value)
    assert "invalid JSON" not in str(caught.value) and "truncated" not in str(caught.value)
