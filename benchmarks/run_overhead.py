"""What ``perflab run`` costs the steps it times, two ways.

1. Directly: the host time of perflab's work at one step boundary while timing (the optimizer hook, a CUDA event
   recorded on the current stream, the host clock read), over 2000 boundaries in this process.
2. End to end: a program that times itself (benchmarks/programs/self_timed.py, CUDA events around each step) run alone
   and under ``perflab run --skip S --steps K --trace 0`` (perflab's timed steps are the program's own timed window),
   alternating, ``--pairs`` times; overhead = the median over pairs of (own median under perflab ÷ alone) − 1, with
   perflab's own median beside the program's. Between processes a launch-bound step moves by several percent, so the
   end-to-end figure bounds the overhead only as tightly as that; the direct one says what it is.

    PYTHONPATH=src python benchmarks/run_overhead.py --pairs 5 --out overhead.json -- --steps 120 --skip 20 --width 2048 --layers 8 --batch 2048
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PROGRAM = Path(__file__).resolve().parent / "programs" / "self_timed.py"
OWN = re.compile(r"own median ms: ([\d.]+)")


def hook_cost_us(boundaries: int = 2000) -> dict:
    """Host µs per step boundary of perflab's timing (optimizer hook → event, clock), on this process's device."""
    import time

    import torch

    from perflab.program.boundaries import OptimizerSteps
    from perflab.program.recorder import Recorder, RunOptions

    cuda = torch.cuda.is_available()
    if cuda:
        torch.zeros(1, device="cuda")  # the program has started CUDA
    param = torch.nn.Parameter(torch.zeros(1, device="cuda" if cuda else "cpu"))
    optimizer = torch.optim.SGD([param], lr=0.0)
    source = OptimizerSteps()
    recorder = Recorder(source, RunOptions(skip=1, steps=boundaries + 10, trace=0))
    source.on_start, source.on_end = recorder._on_start, recorder._on_end
    source._hook(optimizer, (), {})  # the skipped step ends: timing begins
    t0 = time.perf_counter()
    for _ in range(boundaries):
        source._hook(optimizer, (), {})
    per = (time.perf_counter() - t0) / boundaries * 1e6
    t0 = time.perf_counter()
    for _ in range(boundaries):
        pass
    return {"us_per_boundary": per - (time.perf_counter() - t0) / boundaries * 1e6, "device": "cuda" if cuda else "cpu", "boundaries": boundaries}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("program_args", nargs="*", default=["--steps", "120", "--skip", "20", "--width", "1024", "--layers", "8"])
    args = parser.parse_args()
    steps, skip = int(args.program_args[args.program_args.index("--steps") + 1]), int(args.program_args[args.program_args.index("--skip") + 1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[1] / "src"), os.environ.get("PYTHONPATH", "")]))
    pairs = []
    for i in range(args.pairs):
        alone = subprocess.run([sys.executable, str(PROGRAM), *args.program_args], capture_output=True, text=True, env=env)
        with tempfile.TemporaryDirectory() as out:
            # perflab's step k ends at the program's step k's optimizer step: its timed steps skip+1 .. steps-1 are the
            # program's own window (its events after steps skip .. steps-1)
            under = subprocess.run([sys.executable, "-m", "perflab", "run", "--skip", str(skip + 1), "--steps", str(steps - skip - 2), "--trace", "0",
                                    "--out", out, "--", str(PROGRAM), *args.program_args], capture_output=True, text=True, env=env)
            report = json.loads((Path(out) / "run.json").read_text())
        a, b = float(OWN.search(alone.stdout)[1]), float(OWN.search(under.stdout)[1])
        pairs.append({"alone_ms": a, "under_perflab_ms": b, "ratio": b / a, "perflab_median_ms": report["timing"]["median_ms"]})
        print(pairs[-1], flush=True)
    ratios = [p["ratio"] for p in pairs]
    hook = hook_cost_us()
    own = statistics.median(p["alone_ms"] for p in pairs)
    summary = {"program": f"{PROGRAM.name} {' '.join(args.program_args)}", "pairs": pairs, "overhead_median": statistics.median(ratios) - 1,
               "overhead_range": [min(ratios) - 1, max(ratios) - 1], "hook": hook, "hook_share_of_step": hook["us_per_boundary"] / 1e3 / own}
    args.out.write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
