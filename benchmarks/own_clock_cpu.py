"""A program's own per-step clock, alone and under ``perflab run`` (issue 55: no step more than 2x its neighbours'
median that is not in the program alone).

The program (``benchmarks/programs/own_clock_mlp.py``: a 256-512-256 MLP, AdamW, batch 64, 10 ms of sleep a step, on
one CPU thread) times each of its iterations itself. It runs once alone and once under ``perflab run`` with the
default options (skip 5, steps 20, trace-warmup 3, trace 3); each iteration is divided by the median of its eight
neighbours (four each side), and every iteration above ``--factor`` is listed with the step perflab was in::

    PYTHONPATH=src python benchmarks/own_clock_cpu.py --iters 60 --out own_clock.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PROGRAM = Path(__file__).resolve().parent / "programs" / "own_clock_mlp.py"


def spikes(own: list[float], factor: float) -> list[dict]:
    """Each iteration over ``factor`` times the median of its neighbours (four each side)."""
    found = []
    for i, ms in enumerate(own):
        around = [own[j] for j in range(max(0, i - 4), min(len(own), i + 5)) if j != i]
        ratio = ms / statistics.median(around)
        if ratio > factor:
            found.append({"iteration": i, "ms": round(ms, 2), "ratio": round(ratio, 2)})
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=60)
    parser.add_argument("--factor", type=float, default=2.0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name, prefix in (("alone", []), ("under perflab run", [sys.executable, "-m", "perflab", "run", "--out", str(tmp / "run"), "--"])):
            own_path = tmp / f"{name.replace(' ', '_')}.json"
            command = prefix + ([] if prefix else [sys.executable]) + [str(PROGRAM), str(args.iters), str(own_path)]
            subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            own = json.loads(own_path.read_text())
            result[name] = {"median_ms": round(statistics.median(own), 2), "spikes": spikes(own, args.factor)}
            if prefix:  # what perflab says it did at the boundaries (run.json's recorded.own_work), beside the spikes
                recorded = json.loads((tmp / "run" / "run.json").read_text()).get("recorded") or {}
                result[name]["own_work"] = recorded.get("own_work")
    # perflab's phases by iteration (perflab's step j is iteration j - 1; work at boundary n runs in iteration n - 1):
    # skipped 0-4, timed 5-24, the step between 25, the profiler's warm-up 26-28, traced 29-31, the trace written 32
    result["phases"] = {"timed": [5, 24], "between": 25, "traced": [29, 31], "written": 32}
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
