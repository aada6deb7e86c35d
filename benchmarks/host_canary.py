"""Does the host canary read the host's speed, steadily, and follow launch-bound eager timings? (CPU)

    PYTHONPATH=src python benchmarks/host_canary.py [--procs 12] [--load-procs 3] [--loads 0 1 2 3] [--out FILE.json]

1. In one process: 20 back-to-back ``host_canary()`` calls; the spread of their medians and each call's cost.
2. Across fresh processes (``--procs``), one after another: each runs one launch-bound eager case through
   the harness (DeiT-Tiny at 32 px, batch 1, fp32 on the CPU, one thread: tiny ops, mostly dispatch) and
   reports its ``host_canary_us`` (taken before the timed loop), a second canary taken after the case,
   and ``median_ms``; then the correlation of canary and eager time over the processes.
3. With 0..N busy-looping processes beside them (``--loads``; the script starts and kills them),
   ``--load-procs`` processes per level: the ratios of canary and eager time to the unloaded medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CASE_CODE = """
import json
from perflab.measure.harness import run_case
from perflab.spec import Case
row = run_case(Case("deit_tiny_patch16_224", input_size=32, batch_size=1, device="cpu", warmup=5, min_time=0.5, repeats=10))
from perflab.measure.canary import host_canary
after = host_canary().median_us
print(json.dumps({"canary_us": row["host_canary_us"], "canary_after_us": after, "median_ms": row["median_ms"], "status": row["status"]}))
"""


def in_process(calls: int = 20) -> dict:
    from perflab.measure.canary import host_canary

    host_canary()  # imports torch
    medians, costs = [], []
    for _ in range(calls):
        t0 = time.perf_counter()
        medians.append(host_canary().median_us)
        costs.append((time.perf_counter() - t0) * 1e3)
    return {"median_us": statistics.median(medians), "min_us": min(medians), "max_us": max(medians),
            "spread": max(medians) / min(medians) - 1, "cost_ms_median": statistics.median(costs)}


def one_process(env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", CASE_CODE], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def across_processes(procs: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    runs = [one_process(env) for _ in range(procs)]
    canary, eager = [r["canary_us"] for r in runs], [r["median_ms"] for r in runs]
    return {"runs": runs, "pearson_canary_eager": statistics.correlation(canary, eager),
            "pearson_before_after": statistics.correlation(canary, [r["canary_after_us"] for r in runs])}


def under_load(loads: list[int], procs: int) -> list[dict]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    results = []
    for load in loads:
        spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(load)]
        try:
            time.sleep(0.5)
            runs = [one_process(env) for _ in range(procs)]
        finally:
            for p in spinners:
                p.kill()
                p.wait()
        results.append({"busy_processes": load, "runs": runs,
                        "canary_us": statistics.median(r["canary_us"] for r in runs),
                        "median_ms": statistics.median(r["median_ms"] for r in runs)})
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, default=12, help="fresh processes, no load")
    parser.add_argument("--load-procs", type=int, default=3, help="fresh processes per load level")
    parser.add_argument("--loads", type=int, nargs="+", default=[0, 1, 2, 3], help="busy processes beside them")
    parser.add_argument("--out", help="also write the results as JSON")
    args = parser.parse_args()
    same = in_process()
    print(f"in one process, 20 calls: median {same['median_us']:.1f} µs per run, {same['min_us']:.1f}–{same['max_us']:.1f} "
          f"(spread {same['spread']:.1%}); each call {same['cost_ms_median']:.2f} ms")
    fresh = across_processes(args.procs)
    print("process | canary µs before | canary µs after | eager ms")
    for i, r in enumerate(fresh["runs"]):
        print(f"{i:7d} | {r['canary_us']:16.0f} | {r['canary_after_us']:15.0f} | {r['median_ms']:.3f}")
    print(f"Pearson r: canary vs eager ms {fresh['pearson_canary_eager']:.2f}; canary before vs after {fresh['pearson_before_after']:.2f}")
    loaded = under_load(args.loads, args.load_procs)
    base = loaded[0]
    print("busy procs | canary µs (per process)        | eager ms (per process)        | canary ×  | eager ×")
    for r in loaded:
        canaries = ", ".join(f"{x['canary_us']:.0f}" for x in r["runs"])
        medians = ", ".join(f"{x['median_ms']:.3f}" for x in r["runs"])
        print(f"{r['busy_processes']:10d} | {canaries:30s} | {medians:29s} | {r['canary_us'] / base['canary_us']:8.2f}× | "
              f"{r['median_ms'] / base['median_ms']:.2f}×")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"in_process": same, "across_processes": fresh, "under_load": loaded}, f, indent=1)


if __name__ == "__main__":
    main()
