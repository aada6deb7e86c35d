"""The benchmark's synthetic Kineto trace agrees with the reference implementation (so the speed figures
in docs/performance/trace-analysis.md are for a trace that is read right)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from reference_trace import summarize

from perflab.analysis.accounting import account, check_identity
from perflab.trace import load_trace

BENCHMARK = Path(__file__).resolve().parents[1] / "benchmarks" / "analysis_speed.py"


def _benchmark_module():
    spec = importlib.util.spec_from_file_location("analysis_speed", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_synthetic_trace_matches_the_reference(tmp_path):
    path = tmp_path / "synthetic.json"
    written = _benchmark_module().write_synthetic_kineto(path, 1_000)
    json.loads(path.read_text())  # valid JSON
    trace = load_trace(path)
    ref = summarize(path)
    kernels = trace.kernels
    assert written["kernels"] == ref["kernels"] == int((kernels["kind"] == "kernel").sum()) == 1_000
    assert written["kernel_time_ns"] == ref["kernel_time_ns"] == int(kernels.loc[kernels["kind"] == "kernel", "dur_ns"].sum())
    assert written["memcpys"] == ref["memcpy"] == int((kernels["kind"] == "memcpy").sum())
    assert trace.meta["unlinked"] == 0
    assert set(kernels["launch_api"].astype(str)) == {"cudaLaunchKernel", "cuLaunchKernelEx", "cudaMemcpyAsync"}
    accounting = account(kernels, trace.steps)
    assert accounting.steps["busy_ns"].tolist() == ref["window_busy_ns"]
    assert check_identity(accounting.steps)
    assert len(trace.steps) == written["steps"]
