"""How long the Kineto reader takes on one trace, this checkout against another (before and after a change).

    git worktree add /tmp/perflab-before main      # the source to compare with
    PYTHONPATH=src python benchmarks/reader_speed.py tests/data/run/nanogpt_ddp_rank0_h100.json.gz --vs /tmp/perflab-before/src
    PYTHONPATH=src python benchmarks/reader_speed.py tests/data/ranks_cpu/ddp_gloo_rank0.json.gz --vs ... --call cpu_ranks

Each round runs both source trees one after the other, each in a fresh process that reads the trace once (warm-up:
imports, file cache) and then ``--runs`` times; a round reports each tree's median CPU time (``time.process_time``:
the reading process's own, the gunzip thread included, so other jobs on a shared machine disturb it less than the
wall time) and median wall time. The summary is the median over the rounds, and after/before as a ratio.
``--call load`` (default): ``load_kineto(path, ops=True)``, operators and their shapes included (what ``perflab run``
and a CPU-only trace read); ``--call cpu_ranks``: ``trace.cpu_ranks.cpu_rank_activities(path)``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

CALLS = {"load": "from perflab.trace.kineto import load_kineto as f; call = lambda: f(path, ops=True)",
         "cpu_ranks": "from perflab.trace.cpu_ranks import cpu_rank_activities as f; call = lambda: f(path)"}
CHILD = """
import statistics, sys, time
sys.path.insert(0, sys.argv[1])
path, runs = sys.argv[2], int(sys.argv[3])
{call}
call()
cpu, wall = [], []
for _ in range(runs):
    c, w = time.process_time(), time.perf_counter()
    call()
    cpu.append(time.process_time() - c)
    wall.append(time.perf_counter() - w)
print(statistics.median(cpu), statistics.median(wall))
"""


def measure(src: Path, trace: Path, runs: int, call: str) -> tuple[float, float]:
    out = subprocess.run([sys.executable, "-c", CHILD.format(call=CALLS[call]), str(src), str(trace), str(runs)],
                         capture_output=True, text=True, check=True).stdout.split()
    return float(out[0]), float(out[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--vs", type=Path, required=True, help="the other source tree (its src directory)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--runs", type=int, default=15, help="reads per process (the median is kept)")
    parser.add_argument("--call", choices=sorted(CALLS), default="load")
    args = parser.parse_args()
    here = Path(__file__).resolve().parents[1] / "src"
    for path, what in ((args.trace, "trace"), (args.vs / "perflab" / "trace" / "kineto.py", "--vs source tree's reader")):
        if not path.is_file():
            print(f"reader_speed.py: error: {path}: no such file ({what})", file=sys.stderr)
            sys.exit(2)
    results: dict[str, list[tuple[float, float]]] = {"before": [], "after": []}
    for round_ in range(1, args.rounds + 1):
        for label, src in (("before", args.vs), ("after", here)):
            results[label].append(measure(src, args.trace, args.runs, args.call))
        (bc, bw), (ac, aw) = results["before"][-1], results["after"][-1]
        print(f"round {round_}: before {bc * 1e3:.1f} ms CPU, {bw * 1e3:.1f} ms wall; after {ac * 1e3:.1f} ms CPU, {aw * 1e3:.1f} ms wall",
              flush=True)
    cpu = {k: statistics.median(c for c, _ in v) for k, v in results.items()}
    wall = {k: statistics.median(w for _, w in v) for k, v in results.items()}
    print(f"median of {args.rounds} rounds ({args.call}, {args.trace.name}): before {cpu['before'] * 1e3:.1f} ms CPU, "
          f"{wall['before'] * 1e3:.1f} ms wall; after {cpu['after'] * 1e3:.1f} ms CPU, {wall['after'] * 1e3:.1f} ms wall; "
          f"after/before {cpu['after'] / cpu['before']:.3f} (CPU), {wall['after'] / wall['before']:.3f} (wall)")


if __name__ == "__main__":
    main()
