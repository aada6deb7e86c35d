"""One reader for every layout: the same trace written compact, with keys reordered, gzipped, indented or
with times as strings gives the identical analysis; merged ranks are accounted per device; top_kernels
lists kernels only."""

from __future__ import annotations

import decimal
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import numpy as np
import pytest

from perflab.analysis import analyze_trace
from perflab.trace import load_trace
from perflab.trace.schema import INT_KERNEL_COLUMNS

ROOT = Path(__file__).resolve().parents[1]
KERNELS = 400


def _benchmark():
    spec = importlib.util.spec_from_file_location("analysis_speed", ROOT / "benchmarks" / "analysis_speed.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def torch_layout(tmp_path_factory):
    path = tmp_path_factory.mktemp("layouts") / "torch.json"
    written = _benchmark().write_synthetic_kineto(path, KERNELS, blocks_per_step=2)
    return path, written


def _summary(path: Path) -> dict:
    summary = analyze_trace(load_trace(path)).to_dict()
    summary.pop("path")
    summary["meta"].pop("path")
    return summary


def _strings_layout(source: Path, target: Path) -> None:
    """Every ts and dur as a JSON string, and one kernel name with escapes (written \\u0061 for "a")."""
    document = msgspec.json.Decoder(float_hook=decimal.Decimal).decode(source.read_bytes())
    for event in document["traceEvents"]:
        for key in ("ts", "dur"):
            if key in event:
                event[key] = str(event[key])
    text = msgspec.json.encode(document)
    target.write_bytes(text.replace(b'"name":"nvjet_sm90', b'"name":"nvjet_sm9\\u0030', 1))


@pytest.mark.parametrize("layout", ["compact", "reordered", "gzip", "indented", "strings"])
def test_every_layout_gives_the_identical_analysis(torch_layout, tmp_path, layout):
    source, written = torch_layout
    target = tmp_path / ("trace.json.gz" if layout == "gzip" else "trace.json")
    if layout == "strings":
        _strings_layout(source, target)
    else:
        _benchmark().convert_layout(source, target, layout)
    assert target.read_bytes() != source.read_bytes()
    reference, other = load_trace(source), load_trace(target)
    for column in INT_KERNEL_COLUMNS:  # ns-exact, row for row
        assert np.array_equal(reference.kernels[column].to_numpy(), other.kernels[column].to_numpy()), column
    assert (reference.kernels["name"].astype(str) == other.kernels["name"].astype(str)).all()
    assert int((other.kernels["kind"] == "kernel").sum()) == written["kernels"] == KERNELS
    assert int(other.kernels.loc[other.kernels["kind"] == "kernel", "dur_ns"].sum()) == written["kernel_time_ns"]
    assert _summary(target) == _summary(source)


def _merged_ranks(source: Path, target: Path, shift_ns: int = 3_000) -> None:
    """Two ranks in one file: rank 1 is rank 0's events on device 1, from another process and thread,
    shifted by ``shift_ns``, with the same correlation ids (each process counts its own)."""
    decoder = msgspec.json.Decoder(float_hook=decimal.Decimal)
    document = decoder.decode(source.read_bytes())
    rank1 = []
    for event in decoder.decode(msgspec.json.Encoder(decimal_format="number").encode(document["traceEvents"])):
        if event.get("ph") != "X" or "ts" not in event:
            continue
        event["ts"] = event["ts"] + decimal.Decimal(shift_ns) / 1000
        if event.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            event["pid"] = 1
            event["args"]["device"] = 1
        else:
            event["pid"], event["tid"] = 402, 402
        rank1.append(event)
    document["traceEvents"] += rank1
    target.write_bytes(msgspec.json.Encoder(decimal_format="number").encode(document))


def test_merged_ranks_are_accounted_per_device(torch_layout, tmp_path):
    source, written = torch_layout
    target = tmp_path / "two_ranks.json"
    _merged_ranks(source, target)
    one, two = analyze_trace(load_trace(source)), analyze_trace(load_trace(target))
    kernels = two.kernels
    assert sorted(set(kernels["device"])) == [0, 1]
    assert two.trace.meta["unlinked"] == 0
    for device in (0, 1):
        mine = kernels[kernels["device"] == device]
        assert int((mine["kind"] == "kernel").sum()) == KERNELS
        # linked to its own rank's launch (same correlation ids in both processes): rank 1 runs 3 µs later
        assert ((mine["launch_tid"] == (401 if device == 0 else 402))).all()
        assert (mine["launch_start_ns"] <= mine["start_ns"]).all()
    devices = two.devices.set_index("device")
    for device in (0, 1):
        for column in ("wall_ns", "busy_ns", "host_bound_ns", "kernel_gap_ns", "other_ns"):
            assert devices.loc[device, column] == one.devices[column].iloc[0], (device, column)
    assert two.trace_accounting["busy_ns"] == 2 * one.trace_accounting["busy_ns"]
    assert two.steps.groupby("device").size().tolist() == [written["steps"]] * 2
    for table in (two.steps, two.top_kernels, two.top_memory_ops, two.categories, two.ranges, two.launch_apis, two.devices):
        assert sorted(set(table["device"])) == [0, 1]
    summary = two.to_dict()
    assert summary["steps"] == written["steps"] and summary["kernels"] == 2 * KERNELS
    assert {r["device"] for r in summary["top_kernels"]} == {0, 1}
    from perflab.analysis.compare import compare_traces
    from perflab.errors import PerflabError

    with pytest.raises(PerflabError, match="2 devices"):  # compare is per device; it says so rather than mixing them
        compare_traces(one.trace, two.trace)


def test_top_kernels_lists_kernels_only(torch_layout):
    source, written = torch_layout
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    done = subprocess.run([sys.executable, "-m", "perflab", "analyze", str(source), "--json", "--top", "50"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["memcpy"] == written["memcpys"] > 0
    assert summary["top_kernels"] and not any("Memcpy" in r["full_name"] or r["category"] in ("memcpy", "memset")
                                              for r in summary["top_kernels"])
    assert sum(r["count"] for r in summary["top_kernels"]) == KERNELS
    assert [(r["name"], r["count"]) for r in summary["top_memory_ops"]] == [("Memcpy DtoH (Device -> Pinned)", written["memcpys"])]


def test_slices_cut_only_between_events(torch_layout, tmp_path, monkeypatch):
    """Names holding "}, {" and args holding arrays of objects: a slice cut there is refused and moved;
    the result equals the one-slice read."""
    import perflab.trace.kineto as kineto

    source, _ = torch_layout
    document = msgspec.json.Decoder(float_hook=decimal.Decimal).decode(source.read_bytes())
    for event in document["traceEvents"]:
        if event.get("cat") == "cpu_op":
            event["args"]["Input Dims"] = [{"a": 1}, {"b": [{"c": 2}, {"d": 3}]}]
            event["args"]["zz"] = [{"e": i} for i in range(40)]  # last: its "},{" end the event's text
        if event.get("cat") == "user_annotation" and str(event.get("name")).startswith("block"):
            event["name"] = event["name"] + "}, {x"
    target = tmp_path / "nested.json"
    target.write_bytes(msgspec.json.Encoder(decimal_format="number").encode(document))
    whole = analyze_trace(load_trace(target)).to_dict()
    assert any(r["range"].endswith("}, {x") for r in whole["ranges"])
    monkeypatch.setattr(kineto, "CHUNK_BYTES", 1500)  # a few events per slice: many cuts land inside
    refused = []
    check = kineto._cut_was_not_between_events
    monkeypatch.setattr(kineto, "_cut_was_not_between_events", lambda exc: refused.append(str(exc)) or check(exc))
    assert analyze_trace(load_trace(target)).to_dict() == whole
    assert len(refused) > 10  # cuts inside nested values and strings were tried, and moved
