"""A/A and 2× of `perflab ab` of a program (a program after --) on the CPU, and `track` over three commits.

A tiny training loop (benchmarks/programs/matmul_steps.py) whose step (a function, ``--step step``) is a 512-wide
matmul's forward and backward WORK times (about 8 ms a matmul on one CPU thread), in a temporary git repository: c1 (WORK = 1), c2 (a comment changed) and c3
(WORK = 2: the work doubled). Parts (``--parts``):

- ``aa``: ``--runs`` A/A runs, ``perflab ab --a-args 1 --b-args 1 --step step --skip 2 --steps 10 --rounds R -- train.py``
  (the same arguments on both sides): the verdicts (an A/A must never read faster or slower), each ratio with its CI,
  the noise floor each run states, and the rounds flagged host_contention.
- ``double``: ``--double`` runs of ``perflab ab --repo REPO --a c2 --b c3 ... -- train.py``: how many read "slower" with
  a CI that holds 2 (the work's ratio; the program's fixed cost a step makes the step's ratio a little less).
- ``track``: ``--tracks`` runs of ``perflab track --repo REPO --revs c1,c2,c3 ... -- train.py``: how many find the one
  change point at c3 and none at c2.

    PYTHONPATH=src python benchmarks/program_ab_cpu.py --out program_ab.json [--runs 10] [--rounds 4] [--parts aa double track]
        [--aa] [--src DIR]

Each ab run's processes get OMP_NUM_THREADS=1. The figures and the command are in docs/performance/regressions.md.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gitrepo import git, new_repo

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = (ROOT / "benchmarks" / "programs" / "matmul_steps.py").read_text()


def make_repo(path: Path) -> Path:
    new_repo(path)
    (path / "train.py").write_text(PROGRAM)
    for tag, text in (("c1", "WORK = 1\n"), ("c2", "# a comment\nWORK = 1\n"), ("c3", "WORK = 2\n")):
        (path / "work.py").write_text(text)
        git(path, "add", "train.py", "work.py")
        git(path, "commit", "-q", "-m", tag)
        git(path, "tag", tag)
    return path


SRC = ROOT / "src"  # the perflab the runs import (--src)


def perflab(*args, cwd) -> dict:
    env = dict(os.environ, PYTHONPATH=str(SRC), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    result = subprocess.run([sys.executable, "-m", "perflab", *map(str, args), "--json"] if "--" not in args else
                            [sys.executable, "-m", "perflab", *map(str, args[:args.index("--")]), "--json", *map(str, args[args.index("--"):])],
                            capture_output=True, text=True, cwd=cwd, env=env)
    if result.returncode != 0:
        raise SystemExit(f"perflab {' '.join(map(str, args))} failed ({result.returncode}): {result.stderr[-2000:]}")
    return json.loads(result.stdout)


def load() -> float:
    return os.getloadavg()[0]


def busy(document, out: Path) -> int:
    """Rounds in which a process was flagged host_contention (from the store's rows)."""
    sys.path.insert(0, str(SRC))
    from perflab.sweep.store import Store

    with Store.open(out) as store:
        rows = store.rows()
    n = len(rows[0]["process_flags"])
    return sum(any("host_contention" in row["process_flags"][i] for row in rows) for i in range(n))


def one_case(document) -> dict:
    (case,) = document["cases"]
    ratio = case["ratio"] or {}
    return {"verdict": case["verdict"], "verdict_text": case["verdict_text"], "ratio": ratio.get("ratio"), "ci": [ratio.get("low"), ratio.get("high")],
            "units": ratio.get("units"), "floor": (case["floor"] or {}).get("fraction"), "detectable": case["detectable"],
            "sides": {s["name"]: s["step_mean_ms"] for s in document["sides"]},
            "verdicts": {s["name"]: (s["verdict"] or {}).get("verdict") for s in document["sides"]}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--double", type=int, default=3)
    parser.add_argument("--tracks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--parts", nargs="+", default=["aa", "double", "track"], choices=["aa", "double", "track"])
    parser.add_argument("--aa", action="store_true", help="every run also times a second copy of A each round (ab --aa): "
                        "the noise floor from that A/A pair instead of B/A's own spread")
    parser.add_argument("--src", type=Path, default=ROOT / "src", help="the perflab source the runs import (default this checkout's)")
    args = parser.parse_args()
    global SRC
    SRC = args.src.resolve()
    common = ["--step", "step", "--skip", "2", "--steps", "10", "--rounds", str(args.rounds)] + (["--aa"] if args.aa else [])
    results: dict = {"rounds": args.rounds, "with_aa": args.aa, "started": time.strftime("%Y-%m-%d %H:%M"),
                     "commit": git(ROOT, "rev-parse", "--short", "HEAD"), "src": str(SRC)}
    with tempfile.TemporaryDirectory(prefix="program-ab-") as tmp:
        repo = make_repo(Path(tmp) / "repo")
        if "aa" in args.parts:
            runs = []
            for k in range(args.runs):
                out = Path(tmp) / f"aa{k}"
                before = load()
                document = perflab("ab", "--a-args", "1", "--b-args", "1", *common, "--out", out, "--", "train.py", cwd=repo)
                runs.append(dict(one_case(document), load=[before, load()], busy_rounds=busy(document, out)))
                print(f"A/A {k + 1}: {runs[-1]['verdict_text']}, {runs[-1]['ratio']:.3f} ({runs[-1]['ci'][0]:.3f}–{runs[-1]['ci'][1]:.3f})",
                      file=sys.stderr)
            results["aa"] = {"runs": runs, "verdicts": dict(collections.Counter(r["verdict"] for r in runs)),
                             "false": sum(r["verdict"] in ("faster", "slower") for r in runs)}
        if "double" in args.parts:
            runs = []
            for k in range(args.double):
                out = Path(tmp) / f"double{k}"
                before = load()
                document = perflab("ab", "--repo", repo, "--a", "c2", "--b", "c3", *common, "--out", out, "--", "train.py", cwd=repo)
                runs.append(dict(one_case(document), load=[before, load()], busy_rounds=busy(document, out)))
                print(f"2× {k + 1}: {runs[-1]['verdict_text']}, {runs[-1]['ratio']:.3f} ({runs[-1]['ci'][0]:.3f}–{runs[-1]['ci'][1]:.3f})",
                      file=sys.stderr)
            results["double"] = {"runs": runs, "slower": sum(r["verdict"] == "slower" for r in runs),
                                 "ci_holds_2": sum(r["ci"][0] <= 2.0 <= r["ci"][1] for r in runs)}
        if "track" in args.parts:
            runs = []
            for k in range(args.tracks):
                out = Path(tmp) / f"track{k}"
                before = load()
                document = perflab("track", "--repo", repo, "--revs", "c1,c2,c3", *common, "--out", out, "--", "train.py", cwd=repo)
                (series,) = document["cases"]
                steps = {p["revision"]: p["step"] for p in series["points"] if p["step"]}
                runs.append({"change_points": series["change_points"], "load": [before, load()], "busy_rounds": busy(document, out),
                             "steps": {rev: {"verdict": s["verdict"], "ratio": (s["ratio"] or {}).get("ratio"),
                                             "ci": [(s["ratio"] or {}).get("low"), (s["ratio"] or {}).get("high")]} for rev, s in steps.items()}})
                print(f"track {k + 1}: change points {series['change_points']}", file=sys.stderr)
            results["track"] = {"runs": runs, "found_at_c3_only": sum(r["change_points"] == ["c3"] for r in runs)}
    args.out.write_text(json.dumps(results, indent=1))
    print(json.dumps({k: {kk: vv for kk, vv in v.items() if kk != "runs"} if isinstance(v, dict) else v for k, v in results.items()}, indent=1))


if __name__ == "__main__":
    main()
