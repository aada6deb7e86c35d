"""Where the time goes by module (issue 15 item 4): every kernel attributed to the innermost module range around its
launch, the tree's exclusive times and the unattributed rest closing each pass to the nanosecond, checked against a
hand count on a synthetic trace and against a plain second attribution on a real H100 trace (gpt_small, forward,
seq 1024, fp32, explicit attention, recorded with ``perflab profile --by-module``)."""

import json
import re
from collections import defaultdict

import pytest

from perflab import api
from perflab.analysis.modules import UNATTRIBUTED, module_deltas, module_tree, pass_closure
from reference_trace import DATA_DIR, launch_calls, load_events, us_to_ns

REAL = DATA_DIR / "traces" / "by_module_lm_forward.json.gz"


def _x(cat, name, tid, ts, dur, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1 if cat != "kernel" else 0, "tid": tid if cat != "kernel" else 7,
            "ts": ts, "dur": dur, "args": args}


def synthetic_trace(tmp_path):
    """One step: a forward on thread 1 (model . → a → a.b, then c), a backward whose module ranges are on autograd's
    thread 2, and one launch outside every module range in each pass. Times in µs."""
    events = [
        _x("user_annotation", "step", 1, 0, 300),
        _x("user_annotation", "forward", 1, 0, 100),
        _x("user_annotation", "module:. [Net]", 1, 1, 90),
        _x("user_annotation", "module:a [Block]", 1, 10, 40),
        _x("user_annotation", "module:a.b [Linear]", 1, 15, 10),
        _x("user_annotation", "module:c [Linear]", 1, 55, 30),
        _x("user_annotation", "backward", 1, 105, 80),
        _x("user_annotation", "module_backward:c [Linear]", 2, 110, 20),
        _x("user_annotation", "module_backward:a [Block]", 2, 135, 30),
        _x("user_annotation", "module_backward:a.b [Linear]", 2, 140, 10),
    ]
    launches = [  # (thread, launch µs, kernel duration ns): which module each lands in is written beside it
        (1, 5, 3_000),      # forward, "."
        (1, 12, 4_000),     # forward, a
        (1, 16, 5_000),     # forward, a.b
        (1, 20, 6_000),     # forward, a.b
        (1, 30, 7_000),     # forward, a
        (1, 60, 8_000),     # forward, c
        (1, 95, 9_000),     # forward, outside every module: unattributed
        (2, 112, 10_000),   # backward, c
        (2, 136, 11_000),   # backward, a
        (2, 142, 12_000),   # backward, a.b
        (2, 170, 13_000),   # backward, outside every module range (thread 2, inside the main thread's backward)
    ]
    gpu_at = 1000
    for i, (tid, at, dur_ns) in enumerate(launches):
        events.append(_x("cuda_runtime", "cudaLaunchKernel", tid, at, 1, correlation=100 + i))
        events.append(_x("kernel", f"kernel_{i}", 7, gpu_at, dur_ns / 1000, correlation=100 + i, device=0, stream=7))
        gpu_at += dur_ns / 1000 + 1
    path = tmp_path / "modules.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_the_tree_matches_a_hand_count_and_closes_each_pass_exactly(tmp_path):
    report = api.analyze(synthetic_trace(tmp_path))
    tree = report.modules
    rows = {(r["pass"], r["module"]): r for r in tree.to_dict(orient="records")}
    expected_exclusive = {
        ("forward", "."): 3_000, ("forward", "a"): 11_000, ("forward", "a.b"): 11_000, ("forward", "c"): 8_000,
        ("forward", UNATTRIBUTED): 9_000,
        ("backward", "c"): 10_000, ("backward", "a"): 11_000, ("backward", "a.b"): 12_000, ("backward", "."): 0,
        ("backward", UNATTRIBUTED): 13_000,
    }
    assert {k: v["exclusive_ns"] for k, v in rows.items()} == expected_exclusive
    assert rows[("forward", ".")]["inclusive_ns"] == 33_000 and rows[("forward", "a")]["inclusive_ns"] == 22_000
    assert rows[("backward", ".")]["inclusive_ns"] == 33_000 and rows[("backward", "a")]["inclusive_ns"] == 23_000
    assert rows[("forward", "a.b")]["class"] == "Linear" and rows[("forward", "a")]["kernels_inclusive"] == 4
    assert pass_closure(tree, report.kernels, report.trace.ranges) == {"forward": 0, "backward": 0}
    assert tree.groupby("pass")["exclusive_ns"].sum().to_dict() == {"forward": 42_000, "backward": 46_000}
    assert rows[("forward", UNATTRIBUTED)]["share_exclusive"] == pytest.approx(9 / 42)
    data = report.to_dict()["modules"]
    assert {(r["pass"], r["module"]) for r in data} == set(rows) and data[0]["inclusive_us"] == 33.0


def test_a_real_trace_closes_to_the_nanosecond_and_agrees_with_a_plain_attribution():
    report = api.analyze(REAL)
    tree = report.modules
    assert set(pass_closure(tree, report.kernels, report.trace.ranges).values()) == {0}
    assert int(tree["exclusive_ns"].sum()) == int(report.kernels["dur_ns"].sum())  # every activity counted once
    naive = naive_exclusive(REAL)
    ours = {r["module"]: r["exclusive_ns"] for r in tree.to_dict(orient="records") if r["pass"] == "forward" and r["exclusive_ns"]}
    assert ours == naive
    root = tree[(tree["pass"] == "forward") & (tree["module"] == ".")].iloc[0]
    assert root["class"] == "GPT" and root["share_inclusive"] > 0.95
    attention = tree[(tree["module"] == "layers.0.attention")].iloc[0]
    assert attention["class"] == "Attention" and attention["kernels_inclusive"] > attention["kernels"] > 0


def naive_exclusive(path) -> dict[str, int]:
    """Innermost enclosing module range of each launch, by plain loops over the raw events (same thread, contains the call)."""
    events = load_events(path)
    calls = launch_calls(events)
    tids = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            tids[e["args"]["correlation"]] = e["tid"]
    modules = []
    for e in events:
        match = re.match(r"^module(_backward)?:(\S*) \[", e.get("name", "")) if e.get("ph") == "X" else None
        if match:
            start = us_to_ns(e["ts"])
            modules.append((e["tid"], start, start + us_to_ns(e["dur"]), match.group(2)))
    out = defaultdict(int)
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        corr = e.get("args", {}).get("correlation")
        call, tid = calls.get(corr), tids.get(corr)
        dur = us_to_ns(e["dur"])
        best = None
        if call is not None:
            for m_tid, start, end, name in modules:
                if m_tid == tid and start <= call["start"] and call["end"] <= end and (best is None or start >= best[0]):
                    best = (start, name)
        out[best[1] if best else UNATTRIBUTED] += dur
    return dict(out)


def test_compare_says_which_modules_changed(tmp_path):
    base = module_tree_of(synthetic_trace(tmp_path))
    slower = base.copy()
    slower.loc[slower["module"] == "c", ["exclusive_ns", "inclusive_ns"]] += 4_000
    slower.loc[slower["module"] == ".", "inclusive_ns"] += 4_000
    deltas = module_deltas(base, slower)
    assert deltas.head(4)["delta_ns"].tolist() == [4_000.0] * 4  # c and its parent, forward and backward
    assert set(zip(deltas["pass"], deltas["module"])) == {("forward", "c"), ("forward", "."), ("backward", "c"), ("backward", ".")}


def module_tree_of(path):
    report = api.analyze(path)
    return module_tree(report.kernels, report.trace.ranges)
