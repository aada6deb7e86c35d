"""A deliberately simple second implementation of what perflab's trace loading and accounting compute.

It shares no code with perflab: ``json.load`` of the whole file, plain loops over the events, exact
integer-ns parsing of the timestamps' decimal text, and a plain sort-and-merge interval union. The tests
compare perflab's numbers with these.

Definitions (as in perflab.analysis.accounting): GPU activity = events of cat kernel, gpu_memcpy,
gpu_memset; step annotations = user_annotation ``ProfilerStep#N``, else ``step``; window k = [start k,
start k+1), the last ending at max(its annotation end, end of the last activity launched at or after its
start); the whole-trace window = [min(first step start, first activity start), max(last activity end,
last step end)].
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

DATA_DIR = Path(__file__).parent / "data"
KINETO_TRACES = sorted((DATA_DIR / "traces").glob("*.json.gz"))  # the real H200 traces
NSYS_FIXTURE = DATA_DIR / "nsys_fixture.sqlite"
CPU_ONLY_TRACE = DATA_DIR / "cpu_only.json.gz"  # torch.profiler(activities=[CPU]) on a CPU matmul

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
API_CATS = ("cuda_runtime", "cuda_driver")


def load_events(path) -> list[dict]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        document = json.load(f, parse_float=str)  # keep the decimal text of every float
    return document["traceEvents"]


def us_to_ns(value) -> int:
    """Exact ns from µs written as an int or as decimal text with up to 3 fraction digits."""
    if isinstance(value, int):
        return value * 1000
    text = str(value)
    sign = -1 if text.startswith("-") else 1
    whole, _, fraction = text.lstrip("-").partition(".")
    assert len(fraction) <= 3, f"more than ns resolution: {text}"
    return sign * (int(whole or "0") * 1000 + int((fraction + "000")[:3]))


def gpu_activities(events) -> list[dict]:
    result = []
    for event in events:
        if event.get("ph") == "X" and event.get("cat") in GPU_CATS:
            start = us_to_ns(event["ts"])
            result.append({
                "cat": event["cat"],
                "name": event["name"],
                "start": start,
                "end": start + us_to_ns(event["dur"]),
                "correlation": event.get("args", {}).get("correlation"),
            })
    return result


def top_level_cpu_ops(events) -> list[dict]:
    """A CPU-only trace's work: the cpu_op events not inside another cpu_op of the same thread (pid, tid), each
    "launched" at its own start (no correlation: the windows' last-launch rule reads its start)."""
    ops = []
    for event in events:
        if event.get("ph") == "X" and event.get("cat") == "cpu_op":
            start = us_to_ns(event["ts"])
            ops.append({"cat": "kernel", "name": event["name"], "start": start, "end": start + us_to_ns(event["dur"]),
                        "thread": (event.get("pid"), event.get("tid")), "correlation": None})
    top = []
    for op in ops:
        inside = any(other is not op and other["thread"] == op["thread"] and other["start"] <= op["start"] and op["end"] <= other["end"]
                     and (other["end"] - other["start"], -ops.index(other)) > (op["end"] - op["start"], -ops.index(op)) for other in ops)
        if not inside:
            top.append(op)
    return top


def launch_calls(events) -> dict[int, dict]:
    calls = {}
    for event in events:
        if event.get("ph") == "X" and event.get("cat") in API_CATS and "correlation" in event.get("args", {}):
            start = us_to_ns(event["ts"])
            calls[event["args"]["correlation"]] = {"name": event["name"], "start": start, "end": start + us_to_ns(event["dur"])}
    return calls


def step_annotations(events) -> list[tuple[int, int]]:
    annotations = [e for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation"]
    steps = [e for e in annotations if re.fullmatch(r"ProfilerStep#\d+", e["name"])]
    if not steps:
        steps = [e for e in annotations if e["name"] == "step"]
    spans = []
    for e in steps:
        start = us_to_ns(e["ts"])
        spans.append((start, start + us_to_ns(e["dur"])))
    return sorted(spans)


def union_length(intervals) -> int:
    total = 0
    current_start = current_end = None
    for start, end in sorted(intervals):
        if current_end is None or start > current_end:
            if current_end is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None:
        total += current_end - current_start
    return total


def busy_in(activities, window_start: int, window_end: int) -> int:
    clipped = []
    for a in activities:
        start, end = max(a["start"], window_start), min(a["end"], window_end)
        if end > start:
            clipped.append((start, end))
    return union_length(clipped)


def windows(activities, calls, steps) -> list[tuple[int, int]]:
    if not steps:
        return [trace_window(activities, steps)]
    result = []
    for k, (start, end) in enumerate(steps):
        if k + 1 < len(steps):
            result.append((start, steps[k + 1][0]))
        else:
            last_end = end
            for a in activities:
                call = calls.get(a["correlation"])
                launched = call["start"] if call else a["start"]
                if launched >= start:
                    last_end = max(last_end, a["end"])
            result.append((start, last_end))
    return result


def trace_window(activities, steps) -> tuple[int, int]:
    starts = [min(a["start"] for a in activities)] + [s for s, _ in steps]
    ends = [max(a["end"] for a in activities)] + [e for _, e in steps]
    return min(starts), max(ends)


def summarize(path) -> dict:
    """What perflab must find in the trace at ``path``; a trace with no GPU activity is summarised over its top-level
    CPU operators."""
    events = load_events(path)
    activities = gpu_activities(events) or top_level_cpu_ops(events)
    calls = launch_calls(events)
    steps = step_annotations(events)
    kernels = [a for a in activities if a["cat"] == "kernel"]
    window_list = windows(activities, calls, steps)
    whole = trace_window(activities, steps)
    return {
        "kernels": len(kernels),
        "kernel_time_ns": sum(a["end"] - a["start"] for a in kernels),
        "gpu_activities": len(activities),
        "gpu_activity_time_ns": sum(a["end"] - a["start"] for a in activities),
        "memcpy": sum(1 for a in activities if a["cat"] == "gpu_memcpy"),
        "memset": sum(1 for a in activities if a["cat"] == "gpu_memset"),
        "busy_ns": busy_in(activities, *whole),
        "wall_ns": whole[1] - whole[0],
        "window": whole,
        "steps": len(steps),
        "windows": window_list,
        "window_busy_ns": [busy_in(activities, s, e) for s, e in window_list],
        "unlinked": sum(1 for a in activities if a["correlation"] not in calls),
        "launch_api_by_correlation": {c: call["name"] for c, call in calls.items()},
    }
