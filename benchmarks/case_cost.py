"""What a case costs (issue 23, P9): sweep stores compared on the cases they share, before and after a cut.

    python benchmarks/case_cost.py docs/reports/lm_sizes runs/lm_sizes_p9      # the same grid slice: the case ids in both
    python benchmarks/case_cost.py /tmp/before /tmp/after --all                 # every row of each

For each store, over the compared rows: cases per minute from the runner's wall time per case (``wall_s``: from the
parent's start of the worker to its row read, one case at a time) and from the workers' recorded split (``cost_s``),
and the report's "What a case costs" table (the same function as ``perflab report``). docs/performance/sweep-cost.md has the figures.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from perflab.report.markdown import cost_section  # noqa: E402
from perflab.sweep.store import read_rows, store_path  # noqa: E402


def runner_walls(out: Path) -> dict[str, float]:
    with sqlite3.connect(f"file:{store_path(out)}?mode=ro", uri=True) as conn:
        return {case_id: wall for case_id, wall in conn.execute("SELECT case_id, wall_s FROM results") if wall is not None}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stores", nargs="+", type=Path)
    parser.add_argument("--all", action="store_true", help="every row of each store, not only the case ids all of them hold")
    args = parser.parse_args(argv)
    rows = {out: {r["case_id"]: r for r in read_rows(out) if isinstance(r.get("cost_s"), dict)} for out in args.stores}
    common = set.intersection(*(set(r) for r in rows.values()))
    for out in args.stores:
        chosen = [r for case_id, r in rows[out].items() if args.all or case_id in common]
        walls = runner_walls(out)
        wall = [walls[r["case_id"]] for r in chosen if r["case_id"] in walls]
        print(f"== {out}: {len(chosen)} rows" + ("" if args.all else f" (the {len(common)} case ids in every store)"))
        if wall:
            print(f"runner: {sum(wall):.1f} s for {len(wall)} cases, {60 * len(wall) / sum(wall):.2f} cases per minute, "
                  f"median {statistics.median(wall):.2f} s a case")
        print("\n".join(cost_section(chosen)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
