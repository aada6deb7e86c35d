"""What perflab's set-up adds to the first step it times, as the program's own clock sees it.

Runs benchmarks/programs/host_timed_calls.py alone and under ``perflab run --step decode_step`` and ``--step-range
BENCH`` (``--skip S --steps 20 --trace 0``), in alternating processes, and gives, per mode, the median over the
processes of the program's own time of call S (the first one perflab times) less the median of calls S+1..S+10.

    PYTHONPATH=src python benchmarks/run_arming.py --runs 7 --skip 5 [--compiled]
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PROGRAM = Path(__file__).resolve().parent / "programs" / "host_timed_calls.py"
MODES = {"alone": None, "--step": ["--step", "decode_step"], "--step-range": ["--step-range", "BENCH"]}


def excess_ms(mode: str, skip: int, compiled: bool, out: Path) -> float | None:
    """The program's own time of call ``skip`` less the median of the ten after it; None where the run failed."""
    program = [str(PROGRAM), "--calls", str(skip + 30), "--range", "BENCH"] + (["--compiled"] if compiled else [])
    options = MODES[mode]
    if options is None:
        command = [sys.executable, *program]
    else:
        command = [sys.executable, "-m", "perflab", "run", *options, "--skip", str(skip), "--steps", "20", "--trace", "0",
                   "--out", str(out), "--", *program]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        return None
    times = json.loads(done.stdout.strip().splitlines()[-1])
    return times[skip] - statistics.median(times[skip + 1:skip + 11])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--skip", type=int, default=5)
    parser.add_argument("--compiled", action="store_true")
    args = parser.parse_args()
    found = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.runs):
            for mode in MODES:
                found[mode].append(excess_ms(mode, args.skip, args.compiled, Path(tmp) / "out"))
    for mode, values in found.items():
        failed = values.count(None)
        values = [v for v in values if v is not None]
        if not values:
            print(f"{mode:13} every run failed ({failed})")
            continue
        print(f"{mode:13} first timed call's excess: median {statistics.median(values):7.3f} ms  "
              f"(range {min(values):.3f} to {max(values):.3f}, {len(values)} processes" + (f", {failed} failed" if failed else "") + ")")


if __name__ == "__main__":
    main()
