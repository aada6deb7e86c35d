"""Recording traces: perflab's profiled pass and the context manager for a user's loop (CPU here)."""

import gzip
import json

import pytest
import torch

from perflab.errors import PerflabError
from perflab.trace.capture import StepProfiler, record_steps
from perflab.trace.load import load_trace


def annotations(path):
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    return [e["name"] for e in events if e.get("cat") == "user_annotation"]


def test_record_steps_writes_exactly_the_profiled_steps(tmp_path):
    lin = torch.nn.Linear(32, 32)
    x = torch.randn(4, 32)
    path = tmp_path / "t.json.gz"
    record_steps(lambda: lin(x), path, "cpu", steps=3, warmup=1)
    names = annotations(path)
    # one step-range name (torch's), the warm-up step not in the trace
    assert sorted(n for n in names if n.startswith("ProfilerStep")) == ["ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#3"]


def test_a_cpu_only_trace_is_read_with_its_operators_as_the_work(tmp_path):
    path = tmp_path / "cpu.json.gz"
    record_steps(lambda: torch.randn(8, 8) @ torch.randn(8, 8), path, "cpu", steps=2)
    trace = load_trace(path)
    assert trace.cpu_only and len(trace.steps) == 2
    per_step = trace.kernels.groupby("range_id").size()
    assert trace.kernels["name"].astype(str).value_counts()["aten::randn"] == 4 and len(per_step) == 2


def test_step_profiler_records_the_loop_and_ignores_extra_steps(tmp_path):
    path = tmp_path / "loop.json.gz"
    with StepProfiler(steps=2, warmup=1, out=path, cuda=False) as p:
        for _ in range(6):
            torch.randn(16, 16).sum()
            p.step()
    assert path.exists()
    assert sorted(annotations(path)) == ["ProfilerStep#1", "ProfilerStep#2"]
    assert not hasattr(p, "analysis")  # capture hands back a trace; analysis is the API's part


def test_perflab_profile_composes_capture_and_analysis(tmp_path):
    import perflab

    path = tmp_path / "loop.json.gz"
    with perflab.profile(steps=2, warmup=1, out=path) as p:  # (no GPU here: the trace is CPU-only)
        for _ in range(4):
            torch.randn(16, 16).sum()
            p.step()
    assert p.trace_path == path and path.exists()
    assert sorted(annotations(path)) == ["ProfilerStep#1", "ProfilerStep#2"]
    # no GPU: the trace is accounted over torch's operators, each step a window
    assert p.analysis.trace.cpu_only and len(p.analysis.steps) == 2
    assert set(p.analysis.kernels["kind"].astype(str)) == {"cpu_op"}


def test_capture_does_not_import_the_api():
    import subprocess
    import sys

    code = "import sys, perflab.trace.capture; print('perflab.api' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stderr
    import ast
    from pathlib import Path

    import perflab.trace.capture as capture

    tree = ast.parse(Path(capture.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "perflab.api" not in imported


def test_step_profiler_says_when_the_loop_was_too_short(tmp_path):
    with pytest.raises(PerflabError, match="the loop ran 2 steps"):
        with StepProfiler(steps=5, warmup=1, out=tmp_path / "x.json.gz", cuda=False) as p:
            for _ in range(2):
                p.step()
