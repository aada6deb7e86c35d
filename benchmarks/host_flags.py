"""Do the host flags hold on a GPU host? The measurements behind issue 19 (GPU; about 4–5 minutes on an H100).

    PYTHONPATH=src python benchmarks/host_flags.py OUT.md [--demos 3] [--reps 3] [--hog-s 180] [--json OUT.jsonl]

1. **Idle canary**: 30 back-to-back ``host_canary()`` calls in this process, pinned as the harness pins:
   the spread of a healthy host's canary (what ``host_drift``'s threshold must clear).
2. **Demo, no added load**, ``--demos`` times, each in a fresh process (``api.bench(api.demo_cases("cuda"))``,
   what ``perflab demo`` runs): per row the canary diagnostics (before / after / fastest run / CPU-time
   share / CPU), run-queue wait and steal over the timed loop, the launch-bound share, flags and exemptions.
   Expected: no ``host_drift`` or ``host_contention`` on any row.
3. **Demo under a CPU hog**: a busy-looping subprocess pinned to the core the timing thread pins to
   (bounded by ``--hog-s`` seconds and killed at the end), then the demo in a fresh process. Expected: every
   eager row not exempt is flagged ``host_contention``; the GPU-bound rows (exempt) are not.
4. **DeiT-B eager bs1 bf16**, ``--reps`` times each, interleaved, in this process: pinned with one intra-op
   thread (the default), unpinned, pinned with torch's threads, and unpinned with torch's threads (the
   harness before issue 19): median, CV, wait fraction per run, and the median CV of each setting.

Everything goes to OUT.md as markdown tables (and each row, in full, to ``--json``). The same-mode
comparison with timm for eager bs1 is ``benchmarks/vs_timm.py --batch-size 1 --mode eager --dtype bf16``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")
DEMO = """
import json, sys
from perflab import api
from perflab.sweep.store import dumps
rows = api.bench(api.demo_cases("cuda"))
print("ROWS " + dumps(rows))
"""
HOG = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass\n"
KEYS = ("median_ms", "cv", "host_canary_us", "host_canary_before_us", "host_canary_after_us", "host_canary_min_us",
        "host_canary_cpu_frac", "host_cpu", "host_cpu_after", "pinned_cpu", "host_wait_frac", "host_steal_frac",
        "host_issue_ms", "host_bound_frac", "host_canary_ratio")


def fmt(value, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def row_cells(row: dict) -> list[str]:
    flags = [f for f in row.get("flags") or [] if f.startswith("host")]
    exempt = row.get("host_exempt")
    return [row.get("label", "?"), fmt(row.get("median_ms"), ".3f"), fmt(row.get("cv"), ".1%"),
            fmt(row.get("host_canary_us"), ".0f"), f"{fmt(row.get('host_canary_before_us'), '.0f')} / {fmt(row.get('host_canary_after_us'), '.0f')}",
            fmt(row.get("host_canary_min_us"), ".0f"), fmt(row.get("host_canary_ratio"), ".2f"), fmt(row.get("host_canary_cpu_frac"), ".2f"),
            f"{fmt(row.get('host_cpu'), 'd')}/{fmt(row.get('host_cpu_after'), 'd')}", fmt(row.get("pinned_cpu"), "d"),
            fmt(row.get("host_wait_frac"), ".2%"), fmt(row.get("host_steal_frac"), ".2%"), fmt(row.get("host_issue_ms"), ".3f"),
            fmt(row.get("host_bound_frac"), ".2f"), ", ".join(flags) or "–",
            "–" if exempt is None else ("exempt" + (f" (waived {', '.join(exempt)})" if exempt else ""))]


HEAD = ["case", "ms", "CV", "canary µs", "before / after", "fastest", "ratio", "CPU share", "CPU b/a", "pinned", "wait", "steal",
        "issue ms", "host-bound", "host flags", "exemption"]


def demo_in_subprocess() -> list[dict]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    out = subprocess.run([sys.executable, "-c", DEMO], capture_output=True, text=True, env=env, timeout=400)
    if out.returncode != 0:
        raise SystemExit(f"the demo failed (exit {out.returncode}): {out.stderr.strip().splitlines()[-1:]}")
    line = next(line for line in out.stdout.splitlines() if line.startswith("ROWS "))
    return json.loads(line[5:])


def print_rows(title: str, rows: list[dict]) -> None:
    print(f"\n== {title}", flush=True)
    for row in rows:
        print("  " + " · ".join(f"{h}={c}" for h, c in zip(HEAD, row_cells(row))), flush=True)


def idle_canary(calls: int = 30) -> dict:
    from perflab.measure.canary import host_canary
    from perflab.measure.pinning import timing_thread

    host_canary()
    with timing_thread("cuda") as thread:
        runs = [host_canary() for _ in range(calls)]
    medians = [c.median_us for c in runs]
    mid = statistics.median(medians)
    return {"calls": calls, "pinned_cpu": thread.pinned_cpu, "median_us": mid, "min_us": min(medians), "max_us": max(medians),
            "max_off": max(abs(m / mid - 1) for m in medians), "cpu_frac_min": min(c.cpu_frac or 0 for c in runs)}


def start_hog(core: int, seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", HOG.format(seconds=seconds)], preexec_fn=lambda: os.sched_setaffinity(0, {core}))


def pinning_runs(reps: int) -> list[dict]:
    from perflab import api

    (case,) = api.make_cases(model=["deit_base_patch16_224"], batch_size=[1], dtype=["bf16"], mode=["eager"], device="cuda")
    settings = [("pinned, 1 thread (default)", True, True), ("unpinned, 1 thread", False, True),
                ("pinned, torch's threads", True, False), ("unpinned, torch's threads (before)", False, False)]
    out = []
    for rep in range(reps):
        for name, pin, one_thread in settings:
            (row,) = api.bench([case], pin=pin, one_thread=one_thread)
            out.append(dict(row, setting=name, rep=rep))
            print(f"  {name:36} rep {rep}: {row['median_ms']:.3f} ms, CV {row['cv']:.1%}, wait {fmt(row.get('host_wait_frac'), '.2%')}",
                  flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="markdown file to write")
    parser.add_argument("--demos", type=int, default=3, help="unloaded demo runs, each in a fresh process")
    parser.add_argument("--reps", type=int, default=3, help="repetitions of each pinning setting for DeiT-B eager bs1")
    parser.add_argument("--hog-s", type=float, default=180.0, help="upper bound on the CPU hog's life, seconds")
    parser.add_argument("--json", type=Path, help="also write every row as JSON lines")
    args = parser.parse_args()
    if args.demos < 1 or args.reps < 1 or not args.hog_s > 0:
        print("host_flags.py: error: --demos and --reps must be at least 1, --hog-s positive", file=sys.stderr)
        sys.exit(2)
    sys.path.insert(0, SRC)
    from perflab.report.md import md_table
    import torch

    if not torch.cuda.is_available():
        print("host_flags.py: error: needs a CUDA GPU", file=sys.stderr)
        sys.exit(2)
    from perflab.measure.pinning import choose_core
    from perflab.sweep.store import dumps

    args.out.parent.mkdir(parents=True, exist_ok=True)
    started = time.time()
    core = choose_core(os.sched_getaffinity(0))
    parts = [f"# Host flags on {torch.cuda.get_device_name()}",
             f"{len(os.sched_getaffinity(0))} CPUs in the affinity set, timing thread pinned to CPU {core}; load average "
             f"{' '.join(open('/proc/loadavg').read().split()[:3])} at the start; torch {torch.__version__}."]
    all_rows = []

    print("== idle canary", flush=True)
    idle = idle_canary()
    print(f"  {idle}", flush=True)
    parts += ["## 1. Idle canary (this process, pinned)",
              md_table(["calls", "pinned", "median µs", "min µs", "max µs", "largest |x/median − 1|", "lowest CPU share"],
                       [[str(idle["calls"]), fmt(idle["pinned_cpu"], "d"), f"{idle['median_us']:.0f}", f"{idle['min_us']:.0f}",
                         f"{idle['max_us']:.0f}", f"{idle['max_off']:.1%}", f"{idle['cpu_frac_min']:.2f}"]])]

    parts.append("## 2. `perflab demo` cases, no added load (each run a fresh process)")
    for i in range(args.demos):
        rows = demo_in_subprocess()
        print_rows(f"demo {i + 1}", rows)
        all_rows += [dict(r, experiment=f"demo {i + 1}") for r in rows]
        flagged = sum(1 for r in rows if {"host_drift", "host_contention"} & set(r.get("flags") or []))
        parts += [f"### Run {i + 1}: {flagged} of {len(rows)} rows with a host flag", md_table(HEAD, [row_cells(r) for r in rows])]

    print(f"\n== demo under a CPU hog on CPU {core}", flush=True)
    hog = start_hog(core, args.hog_s)
    try:
        time.sleep(0.5)
        rows = demo_in_subprocess()
    finally:
        hog.kill()
        hog.wait()
    print_rows("demo under the hog", rows)
    all_rows += [dict(r, experiment="hog") for r in rows]
    eager = [r for r in rows if r.get("mode") == "eager" and r.get("status") == "ok"]
    missed = [r["label"] for r in eager if "host_exempt" not in r and "host_contention" not in (r.get("flags") or [])]
    wrong = [r["label"] for r in rows if "host_exempt" in r and {"host_drift", "host_contention"} & set(r.get("flags") or [])]
    parts += [f"## 3. The demo with a busy loop pinned to CPU {core} (the timing thread's core)",
              f"Eager rows not exempt and not flagged `host_contention`: {', '.join(missed) or 'none'}. "
              f"Exempt (GPU-bound) rows carrying a host flag: {', '.join(wrong) or 'none'}.",
              md_table(HEAD, [row_cells(r) for r in rows])]

    print("\n== DeiT-B eager bs1 bf16: pinning and intra-op threads", flush=True)
    runs = pinning_runs(args.reps)
    all_rows += [dict(r, experiment="pinning") for r in runs]
    body = [[r["setting"], str(r["rep"]), fmt(r["median_ms"], ".3f"), fmt(r["cv"], ".1%"), fmt(r.get("host_wait_frac"), ".2%"),
             fmt(r.get("pinned_cpu"), "d"), fmt(r.get("timing_threads"), "d"), fmt(r.get("host_canary_us"), ".0f"),
             ", ".join(f for f in r.get("flags") or [] if f != "no_power") or "–"] for r in runs]
    summary = []
    for setting in dict.fromkeys(r["setting"] for r in runs):
        mine = [r for r in runs if r["setting"] == setting]
        summary.append([setting, f"{statistics.median(r['median_ms'] for r in mine):.3f}", f"{statistics.median(r['cv'] for r in mine):.1%}",
                        f"{min(r['median_ms'] for r in mine):.3f}–{max(r['median_ms'] for r in mine):.3f}"])
    parts += ["## 4. DeiT-B eager bs1 bf16: pinned or not, one intra-op thread or torch's (interleaved, one process)",
              md_table(["setting", "median of medians ms", "median CV", "range of medians ms"], summary),
              md_table(["setting", "rep", "median ms", "CV", "wait", "pinned", "threads", "canary µs", "flags"], body)]

    parts.append(f"Took {time.time() - started:.0f} s. Same-mode comparison with timm: "
                 "`PYTHONPATH=src python benchmarks/vs_timm.py --batch-size 1 --mode eager --dtype bf16`.")
    args.out.write_text("\n\n".join(parts) + "\n")
    if args.json:
        args.json.write_text("".join(dumps(r) + "\n" for r in all_rows))
    print(f"\nwrote {args.out} ({time.time() - started:.0f} s)")


if __name__ == "__main__":
    main()
