"""Do perflab's numbers reproduce from run to run? The measurements behind issue 22 (GPU; about 5-8 minutes).

    PYTHONPATH=src python benchmarks/reproduce.py OUT_DIR [--runs 3] [--settings interleaved sequential hog processes]

The demo's eight cases (DeiT-B and top-k 0.1 at blocks 3, 6, 9; bs 1 and 64; bf16; eager and CUDA graph; what
``perflab demo`` runs) in fresh processes, ``--runs`` times per setting:

- ``demo``: what ``perflab demo`` runs on a GPU: interleaved, samples spread over 3 processes (the CI across them);
- ``interleaved``: ``perflab bench``'s default, every case built and warmed, then timed in seeded random interleaved
  blocks, in one process;
- ``sequential``: ``--no-interleave``, each case timed alone right after its warm-up (perflab before issue 22);
- ``hog``, ``sequential-hog``: one run each with a busy loop pinned to the core the timing thread pins to.

Each run's seed differs (the order of the blocks), as a user's runs would. OUT_DIR gets ``rows.jsonl`` (every
row, with its setting and run), ``summary.md`` (the tables: medians and CIs per run, the spread of each speedup
across runs, paired and unpaired, how often one run's CI covers another's median, the host flags, wall time per
run) and ``probe.json`` (the NVML energy counter's update period and whether the top-k step synchronises).
``--summarize OUT_DIR`` rebuilds summary.md from rows.jsonl without a GPU.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")
DEMO = """
import sys
from perflab import api
from perflab.sweep.store import dumps
interleave, processes, seed = sys.argv[1] == "1", int(sys.argv[2]), int(sys.argv[3])
from dataclasses import replace
cases = [replace(c, seed=seed) for c in api.demo_cases("cuda")]
rows = api.bench(cases, interleave=interleave, processes=processes)
print("ROWS " + dumps(rows))
"""
# name: (interleaved, processes per run, CPU hog on the timing core, runs: None = --runs)
SETTINGS = {
    "demo": (True, 3, False, None),  # what `perflab demo` runs on a GPU
    "interleaved": (True, 1, False, None),  # perflab bench's default
    "sequential": (False, 1, False, None),  # --no-interleave: perflab before issue 22
    "hog": (True, 1, True, 1),
    "sequential-hog": (False, 1, True, 1),
}
HOG = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass\n"


def run_demo(interleave: bool, processes: int, seed: int) -> tuple[list[dict], float]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", DEMO, "1" if interleave else "0", str(processes), str(seed)], capture_output=True,
                         text=True, env=env, timeout=560)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"the demo failed (exit {out.returncode}): {out.stderr.strip()[-2000:]}")
    line = next(line for line in out.stdout.splitlines() if line.startswith("ROWS "))
    return json.loads(line[5:]), wall


def probe() -> dict:
    """The NVML energy counter's update period under load, and whether the top-k bs1 eager step synchronises."""
    import torch

    from perflab import api
    from perflab.runtime.workload import warm_workload

    out = {}
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        for _ in range(50):
            a @ a
        changes, last, t_end = [], pynvml.nvmlDeviceGetTotalEnergyConsumption(handle), time.perf_counter() + 1.0
        while time.perf_counter() < t_end:
            for _ in range(4):
                a @ a
            value = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
            if value != last:
                changes.append(time.perf_counter())
                last = value
        torch.cuda.synchronize()
        gaps = [b - a for a, b in zip(changes, changes[1:])]
        out["energy_counter_updates_per_s"] = len(changes)
        out["energy_counter_period_ms"] = statistics.median(gaps) * 1000 if gaps else None
    except Exception as exc:  # no NVML: say so
        out["energy_counter"] = f"unavailable: {type(exc).__name__}: {exc}"
    (case,) = [c for c in api.demo_cases("cuda") if c.model.startswith("topk") and c.batch_size == 1 and c.mode == "eager"]
    import warnings

    with warm_workload(case) as work, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            work.step()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    out["topk_step_sync_warnings"] = [str(w.message)[:200] for w in caught]
    return out


def fmt(value, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def summarize(records: list[dict], walls: dict) -> str:
    sys.path.insert(0, SRC)
    from perflab.report.md import md_table
    from perflab.report.tables import speedup_rows

    by_setting: dict[str, dict[int, list[dict]]] = {}
    for r in records:
        by_setting.setdefault(r["setting"], {}).setdefault(r["run"], []).append(r)
    parts = ["# Reproducibility of the demo's eight cases, run to run (benchmarks/reproduce.py)\n"]
    for setting, runs in by_setting.items():
        ids = [r["label"] for r in runs[min(runs)]]
        parts.append(f"## {setting}: {len(runs)} run(s), wall time per run " +
                     ", ".join(f"{walls.get(setting, {}).get(str(k), walls.get(setting, {}).get(k, 0)):.1f} s" for k in sorted(runs)) + "\n")
        body, covered, pairs_total = [], 0, 0
        for label in ids:
            cells, medians, cis = [label], [], []
            for k in sorted(runs):
                row = next(r for r in runs[k] if r["label"] == label)
                if row.get("status") != "ok":
                    cells.append(row.get("status"))
                    continue
                medians.append(row["median_ms"])
                cis.append(row["ci95_ms"])
                cells.append(f"{row['median_ms']:.3f} [{row['ci95_ms'][0]:.3f}, {row['ci95_ms'][1]:.3f}] {row.get('ci_level', '')}"
                             + (" " + ",".join(f for f in row.get("flags") or [] if f.startswith("host")) if any(
                                 f.startswith("host") for f in row.get("flags") or []) else ""))
            for (i, ci), (j, m) in itertools.product(enumerate(cis), enumerate(medians)):
                if i != j:
                    pairs_total += 1
                    covered += ci[0] <= m <= ci[1]
            cells.append(f"{max(medians) / min(medians):.3f}×" if medians else "–")
            row0 = next(r for r in runs[min(runs)] if r["label"] == label)
            cells += [fmt(row0.get("device_ms"), ".3f"), fmt(row0.get("host_held_ms"), ".3f"), fmt(row0.get("host_bound_frac"), ".2f"),
                      fmt(row0.get("gpu_busy_frac"), ".2f"), "exempt" if "host_exempt" in row0 else "–"]
            body.append(cells)
        head = ["case"] + [f"run {k + 1} ms [95% CI]" for k in sorted(runs)] + ["spread", "GPU ms (run 1)", "host ms", "host/GPU",
                                                                                 "GPU busy", "host flags"]
        parts.append(md_table(head, body))
        if pairs_total:
            parts.append(f"\nOne run's 95% CI covers another run's median in **{covered} of {pairs_total}** pairs ({covered / pairs_total:.0%}).\n")
        flagged = sum(1 for rows in runs.values() for r in rows if any(f.startswith("host") for f in r.get("flags") or []))
        parts.append(f"Rows with a host flag: {flagged} of {sum(len(v) for v in runs.values())}.\n")
        sbody = []
        speedups = {k: speedup_rows(runs[k]) for k in sorted(runs)}
        for n, first in enumerate(speedups[min(runs)]):
            point = f"bs{first['batch_size']} {first['mode']}"
            paired = [s[n]["speedup"] for s in speedups.values() if s[n].get("paired")]
            unpaired = [s[n]["speedup_unpaired"] for s in speedups.values() if s[n].get("speedup_unpaired")]
            cis = [s[n].get("speedup_ci95") for s in speedups.values()]
            sbody.append([point, ", ".join(f"{v:.3f}" for v in paired) or "–",
                          "; ".join(f"[{c[0]:.3f}, {c[1]:.3f}]" for c in cis if c) or "–",
                          f"{max(paired) / min(paired):.3f}" if len(paired) > 1 else "–",
                          ", ".join(f"{v:.3f}" for v in unpaired), f"{max(unpaired) / min(unpaired):.3f}" if len(unpaired) > 1 else "–"])
        parts.append(md_table(["top-k vs DeiT-B", "paired speedup per run", "paired 95% CI", "spread", "unpaired (ratio of medians)",
                               "spread"], sbody) + "\n")
        parts.append(correlation_note(runs))
    return "\n".join(parts)


def correlation_note(runs: dict) -> str:
    """Within each interleaved run: do DeiT-B bs1 eager's and top-k bs1 eager's blocks move together (Pearson r of the
    log block times over rounds), and with the round's host canary?"""
    lines = []
    for k in sorted(runs):
        rows = runs[k]
        try:
            base = next(r for r in rows if r["model"] == "deit_base_patch16_224" and r["batch_size"] == 1 and r["mode"] == "eager")
            topk = next(r for r in rows if r["model"].startswith("topk") and r["batch_size"] == 1 and r["mode"] == "eager")
        except StopIteration:
            continue
        if not base.get("sample_rounds") or base.get("session") != topk.get("session"):
            continue
        a = dict(zip(zip(base["sample_processes"], base["sample_rounds"]), base["samples_ms"]))
        b = dict(zip(zip(topk["sample_processes"], topk["sample_rounds"]), topk["samples_ms"]))
        keys = sorted(set(a) & set(b))
        canaries = base.get("interleaved", {}).get("canaries_us") or []
        x, y = [math.log(a[key]) for key in keys], [math.log(b[key]) for key in keys]
        r_ab = pearson(x, y)
        r_ac = pearson([math.log(a[key]) for key in keys if key[1] < len(canaries)],
                       [math.log(canaries[key[1]]) for key in keys if key[1] < len(canaries)]) if canaries else None
        lines.append(f"- run {k + 1}: DeiT-B bs1 eager blocks {min(a.values()):.3f}–{max(a.values()):.3f} ms, top-k "
                     f"{min(b.values()):.3f}–{max(b.values()):.3f} ms; r(DeiT-B, top-k) over rounds {fmt(r_ab, '.2f')}, r(DeiT-B, canary) "
                     f"{fmt(r_ac, '.2f')}; canary per round {fmt(min(canaries) if canaries else None, '.0f')}–"
                     f"{fmt(max(canaries) if canaries else None, '.0f')} µs")
    return ("Blocks of one run, bs1 eager:\n" + "\n".join(lines) + "\n") if lines else ""


def pearson(x, y):
    if len(x) < 3:
        return None
    mx, my = statistics.mean(x), statistics.mean(y)
    sx = math.sqrt(sum((v - mx) ** 2 for v in x))
    sy = math.sqrt(sum((v - my) ** 2 for v in y))
    return sum((a - mx) * (b - my) for a, b in zip(x, y)) / (sx * sy) if sx and sy else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder for rows.jsonl, summary.md and probe.json")
    parser.add_argument("--runs", type=int, default=3, help="runs per setting, each in a fresh process")
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--hog-s", type=float, default=120.0, help="upper bound on the CPU hog's life, seconds")
    parser.add_argument("--no-probe", action="store_true", help="skip the energy-counter and synchronisation probe")
    parser.add_argument("--summarize", action="store_true", help="only rebuild summary.md from OUT/rows.jsonl")
    args = parser.parse_args()
    if args.runs < 1:
        print("reproduce.py: error: --runs must be at least 1", file=sys.stderr)
        sys.exit(2)
    args.out.mkdir(parents=True, exist_ok=True)
    rows_path, walls_path = args.out / "rows.jsonl", args.out / "walls.json"
    if args.summarize:
        if not rows_path.is_file():
            print(f"reproduce.py: error: no {rows_path} to summarise (run it on a GPU first)", file=sys.stderr)
            sys.exit(2)
        records = [json.loads(line) for line in rows_path.read_text().splitlines() if line.strip()]
        walls = json.loads(walls_path.read_text()) if walls_path.exists() else {}
        (args.out / "summary.md").write_text(summarize(records, walls))
        print((args.out / "summary.md").read_text())
        return
    sys.path.insert(0, SRC)
    import torch

    if not torch.cuda.is_available():
        print("reproduce.py: error: needs a CUDA GPU", file=sys.stderr)
        sys.exit(2)
    if not args.no_probe:
        (args.out / "probe.json").write_text(json.dumps(probe(), indent=1))
        print("probe:", (args.out / "probe.json").read_text(), flush=True)
    from perflab.measure.pinning import choose_core

    records, walls = [], {}
    with rows_path.open("w") as sink:
        for setting in args.settings:
            interleave, processes, with_hog, runs = SETTINGS[setting]
            for run in range(runs or args.runs):
                hog = None
                if with_hog:
                    hog = subprocess.Popen([sys.executable, "-c", HOG.format(seconds=args.hog_s)],
                                           preexec_fn=lambda: os.sched_setaffinity(0, {choose_core(os.sched_getaffinity(0))}))
                try:
                    rows, wall = run_demo(interleave, processes, seed=run)
                finally:
                    if hog is not None:
                        hog.kill()
                walls.setdefault(setting, {})[run] = wall
                for row in rows:
                    record = dict(row, setting=setting, run=run)
                    records.append(record)
                    sink.write(json.dumps(record, default=str) + "\n")
                sink.flush()
                print(f"{setting} run {run + 1}: {wall:.1f} s; " + "; ".join(
                    f"{r['label']}: {fmt(r.get('median_ms'), '.3f')}" for r in rows), flush=True)
                walls_path.write_text(json.dumps(walls))
    (args.out / "summary.md").write_text(summarize(records, walls))
    print((args.out / "summary.md").read_text())


if __name__ == "__main__":
    main()
