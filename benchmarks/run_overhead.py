"""What ``perflab run`` costs the steps it times: a program that times itself (benchmarks/programs/self_timed.py,
CUDA events around each step) run alone and under ``perflab run --skip S --steps K --trace 0`` (perflab's timed steps
are the program's own timed window), alternating, ``--pairs`` times. The overhead is the median over pairs of
(the program's own median under perflab ÷ alone) − 1; perflab's own median is set beside the program's.

    PYTHONPATH=src python benchmarks/run_overhead.py --pairs 3 --out overhead.json
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
    summary = {"program": f"{PROGRAM.name} {' '.join(args.program_args)}", "pairs": pairs, "overhead_median": statistics.median(ratios) - 1,
               "overhead_range": [min(ratios) - 1, max(ratios) - 1]}
    args.out.write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
