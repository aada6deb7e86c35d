"""The tables of docs/performance/run.md's whole-loop section, from what benchmarks/run_whole_loop_gpu.sh wrote: per
program perflab's verdict, its mean and median step beside the program's own clock over the same steps, the exposed
input wait's share beside the program's own data meter's, the GPU's busy share (GPM) beside NVML's samples and the
traced kernels' fill, and what the watch cost.

    python benchmarks/whole_loop_table.py OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# how each program's own log lines up with perflab's timed steps (optimizer-boundary steps skip+1 .. skip+steps):
# name → (log, key of the iteration's time, key of its data wait or None, index of the log's first timed line)
OWN = {
    "slow": ("slow_own.jsonl", "batch_ms", "data_ms", 0),
    "ample": ("ample_own.jsonl", "batch_ms", "data_ms", 0),
    "spawn": ("spawn_own.jsonl", "batch_ms", "data_ms", 0),
    "sync": ("sync_own.jsonl", "step_ms", None, 0),
    "nosync": ("nosync_own.jsonl", "step_ms", None, 0),
    "trainer": ("trainer_own.jsonl", "step_ms", None, 1),
    "nonan": ("nonan_own.jsonl", "step_ms", None, 1),
}


def own_window(out: Path, name: str, skip: int, steps: int) -> dict | None:
    """The program's own clock over perflab's timed steps, the last left out: its iteration holds perflab's work at
    the timed window's end (writing the timed steps, starting the profiler), inside the optimizer step that ends it."""
    if name not in OWN or not (out / OWN[name][0]).exists():
        return None
    log, time_key, data_key, offset = OWN[name]
    lines = [json.loads(line) for line in (out / log).read_text().splitlines() if line.strip()]
    if name in ("trainer", "nonan"):  # its log's "step" is the optimizer step the interval ends at
        by_step = {line["step"]: line for line in lines}
        window = [by_step[k] for k in range(skip + 1, skip + steps + 1) if k in by_step]
    else:  # iteration i holds the optimizer step that ends perflab's step i + 1
        window = lines[skip:skip + steps]
    window = window[:-1]
    if not window:
        return None
    wall = sum(line[time_key] for line in window)
    row = {"steps": len(window), "mean_ms": wall / len(window)}
    if data_key:
        row["data_share"] = sum(line[data_key] for line in window) / wall
    return row


def main() -> None:
    out = Path(sys.argv[1])
    rows = []
    for name in ("slow", "ample", "spawn", "trainer", "nonan", "sync", "nosync", "decode"):
        path = out / name / "run.json"
        if not path.exists():
            continue
        report = json.loads(path.read_text())
        options = report.get("options") or {}
        loop = report.get("loop") or {}
        verdict = report.get("verdict") or {}
        own = own_window(out, name, options.get("skip", 0), options.get("steps", 0))
        samples = (report.get("timing") or {}).get("samples_ms") or []
        perflab_mean = sum(samples[:-1]) / (len(samples) - 1) if len(samples) > 1 else None
        busy = loop.get("busy") or {}
        inputs = loop.get("input") or {}
        exposed = (loop.get("per_step") or {}).get("exposed_input_ms") or []
        exposed_share = sum(exposed[:-1]) / sum(samples[:-1]) if len(samples) > 1 and exposed else None
        waited = (loop.get("per_step") or {}).get("input_ms") or []
        wait_share = sum(waited[:-1]) / sum(samples[:-1]) if len(samples) > 1 and waited else None
        sync = loop.get("sync") or {}
        row = {"program": name, "verdict": verdict.get("verdict"), "median_ms": loop.get("median_ms"), "mean_ms": loop.get("mean_ms"),
               "mean_ms_but_last": perflab_mean, "own_mean_ms": own and own["mean_ms"],
               "mean_vs_own": perflab_mean / own["mean_ms"] if own and perflab_mean else None,
               "exposed_share": inputs.get("exposed_share"), "exposed_share_but_last": exposed_share, "wait_share_but_last": wait_share, "own_data_share": own and own.get("data_share"),
               "gpm": busy.get("gpm_graphics_util"), "nvml": busy.get("nvml_util"), "nvml_samples": busy.get("nvml_samples"),
               "traced_fill": verdict.get("kernel_fill"), "inflation": (report.get("traced") or {}).get("inflation"),
               "sync_site": (sync.get("sites") or [{}])[0].get("site"), "syncs_per_step": sync.get("calls_per_step"),
               "waits_per_step": inputs.get("waits_per_step"), "worker_batch_ms": inputs.get("worker_batch_ms"),
               "processes": [(p.get("kind"), p.get("steps_seen")) for p in report.get("processes") or []], "message": verdict.get("message")}
        rows.append(row)
    cost = json.loads((out / "cost.json").read_text()) if (out / "cost.json").exists() else None
    if cost:
        for row in rows:
            per_step_us = (row["syncs_per_step"] or 0) * cost["item_cost_us"] + (row["waits_per_step"] or 0) * cost["next_cost_us"]
            row["watch_cost"] = per_step_us / 1e3 / row["mean_ms"] if row["mean_ms"] else None
    print(json.dumps({"rows": rows, "cost": cost}, indent=1))
    fmt = lambda v, f="{:.3f}": "–" if v is None else f.format(v)  # noqa: E731
    print("\n| program | verdict | median | mean (own clock, same steps) | input wait: all / exposed (own data meter) | GPU busy: GPM / NVML (samples) / traced fill | traced ÷ untraced | watch cost |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['program']} | {r['verdict']} | {fmt(r['median_ms'])} ms | {fmt(r['mean_ms_but_last'])} ms ({fmt(r['own_mean_ms'])}; "
              f"×{fmt(r['mean_vs_own'], '{:.3f}')}) | {fmt(r['wait_share_but_last'], '{:.1%}')} / {fmt(r['exposed_share_but_last'], '{:.1%}')} "
              f"({fmt(r['own_data_share'], '{:.1%}')}) | "
              f"{fmt(r['gpm'], '{:.1%}')} / {fmt(r['nvml'], '{:.1%}')} ({r['nvml_samples']}) / {fmt(r['traced_fill'], '{:.1%}')} | "
              f"×{fmt(r['inflation'], '{:.2f}')} | {fmt(r.get('watch_cost'), '{:.3%}')} |")
    for r in rows:
        print(f"\n{r['program']}: {r['message']}")


if __name__ == "__main__":
    main()
