"""perflab ab on a GPU: an A/A test of two revisions that differ only in a comment, against two separate bench runs
(about 4 minutes on an H100).

    PYTHONPATH=src python3 benchmarks/ab_gpu.py OUT [--rounds 3] [--store DIR]

The cases are the demo's launch-bound ones: deit_base_patch16_224 and topk_deit_base_patch16_224 (keep 0.1 at blocks
3, 6, 9), batch 1, bf16, eager (``api.demo_cases("cuda")``'s bs1 eager pair).

1. A temporary git repository holds one file at two commits that differ only in a comment. ``perflab ab --repo REPO
   --a c1 --b c2 ... --rounds 3``: the versions' processes alternate (A B, B A, A B), each case's B/A time paired per
   round with a 95% CI over the rounds. Expected: "no change" for both cases, the CI inside 0.952-1.050 (±5%).
   Where git is missing, A and B are this interpreter twice (``--python-a/--python-b``): the same A/A test, said so.
2. The same cases in two separate ``perflab bench --out`` runs (one process each, as a user would run them before and
   after a change), then ``perflab compare run1.jsonl run2.jsonl``: the unpaired ratio of the two runs' medians.
3. OUT/ab_gpu.md sets them side by side, per case: the paired ratio and CI; the per-round paired ratios and their
   spread; the unpaired ratios ab's own processes give when A of one round meets B of another (not side by side in
   time); the two bench runs' ratio with compare's CI. Expected: the unpaired ratios move further from 1 than the
   paired ones.

OUT gets ab.json, compare.json, run1.jsonl, run2.jsonl and ab_gpu.md (five files); the ab store goes to --store
(default: a temporary directory, removed).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = ["deit_base_patch16_224", "topk_deit_base_patch16_224"]


def cases(models, device: str) -> list:
    return ["--model", *models, "--keep-rate", "0.1", "--reduction-loc", "3", "6", "9", "--batch-size", "1",
            "--dtype", "bf16" if device == "cuda" else "fp32", "--mode", "eager", "--device", device]


def perflab(*args, capture: bool = True) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH", "")) if p))
    result = subprocess.run([sys.executable, "-m", "perflab", *map(str, args)], env=env, cwd=ROOT, text=True,
                            stdout=subprocess.PIPE if capture else None)
    if result.returncode != 0:
        sys.exit(f"perflab {' '.join(map(str, args[:3]))} ... failed with exit status {result.returncode}")
    return result.stdout or ""


def make_repo(path: Path) -> bool:
    """Two commits of one file that differ only in a comment; False where git is not installed."""
    if shutil.which("git") is None:
        return False
    path.mkdir(parents=True)
    run = lambda *a: subprocess.run(["git", "-C", str(path), *a], check=True, capture_output=True)  # noqa: E731
    run("init", "-q")
    run("config", "user.email", "perflab@example.com")
    run("config", "user.name", "perflab")
    for tag, comment in (("c1", "# the first version"), ("c2", "# the same code, another comment")):
        (path / "notes.py").write_text(f"{comment}\nVALUE = 1\n")
        run("add", "notes.py")
        run("commit", "-q", "-m", tag)
        run("tag", tag)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--store", type=Path, default=None, help="where the ab store goes (default: a temporary directory)")
    parser.add_argument("--device", default="cuda", help="cuda (default), or cpu to try the script itself")
    parser.add_argument("--model", nargs=2, default=MODELS, help="the baseline and its top-k variant (default: the demo's)")
    args = parser.parse_args()
    flags = cases(args.model, args.device)
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="perflab-ab-gpu-"))
    store = args.store or work / "ab"
    try:
        repo = work / "repo"
        if make_repo(repo):
            versions = ["--repo", repo, "--a", "c1", "--b", "c2"]
            how = "two revisions of a git repository that differ only in a comment"
        else:
            versions = ["--python-a", sys.executable, "--python-b", sys.executable]
            how = f"no git here: the same interpreter twice ({sys.executable})"
        print(f"ab: {how}", file=sys.stderr, flush=True)
        ab = json.loads(perflab("ab", *versions, *flags, "--rounds", args.rounds, "--out", store, "--json"))
        (args.out / "ab.json").write_text(json.dumps(ab, indent=1) + "\n")
        for run in ("run1", "run2"):
            print(f"bench: {run}", file=sys.stderr, flush=True)
            perflab("bench", *flags, "--out", args.out / f"{run}.jsonl", capture=True)
        compared = json.loads(perflab("compare", args.out / "run1.jsonl", args.out / "run2.jsonl", "--json"))
        (args.out / "compare.json").write_text(json.dumps(compared, indent=1) + "\n")
        rows = _store_rows(store)
        (args.out / "ab_gpu.md").write_text(summary(ab, compared, rows, how, args.rounds))
        print((args.out / "ab_gpu.md").read_text())
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _store_rows(store: Path) -> list[dict]:
    sys.path.insert(0, str(ROOT / "src"))
    from perflab.sweep.store import Store

    with Store.open(store) as s:
        return s.rows()


def summary(ab: dict, compared: dict, rows: list[dict], how: str, rounds: int) -> str:
    by_case: dict[str, dict[str, dict]] = {}
    for row in rows:
        by_case.setdefault(row["case_id"], {})[row["version"]["name"]] = row
    unpaired_runs = {c["case_id"]: c for c in compared["cases"]}
    lines = [f"# perflab ab on a GPU: an A/A test ({how})", "",
             f"Versions: {'; '.join(v['name'] + ' ' + (v.get('commit') or v.get('python') or '')[:12] + ' torch ' + str(v.get('torch')) for v in ab['versions'])}. "
             f"{rounds} rounds; threshold ±{ab['threshold']:.0%}.", "",
             "| case | ab: B/A paired (95% CI) | verdict | per-round B/A | ab's A medians (ms), by round | unpaired B/A across rounds (min–max) | "
             "two bench runs: run2/run1 (95% CI, within-run) | verdict |", "|" + "---|" * 8]
    for case in ab["cases"]:
        sides = by_case.get(case["case_id"], {})
        a, b = (sides.get(s, {}).get("process_medians_ms") or [] for s in ("A", "B"))
        per_round = [y / x for x, y in zip(a, b)]
        across = [b[j] / a[i] for i, j in itertools.product(range(len(a)), range(len(b))) if i != j]
        run = unpaired_runs.get(case["case_id"]) or {}
        r, rr = case.get("ratio") or {}, run.get("ratio") or {}
        lines.append("| " + " | ".join([
            case["label"], f"{r.get('ratio', math.nan):.4f} ({r.get('low', math.nan):.4f}–{r.get('high', math.nan):.4f})", case["verdict"],
            ", ".join(f"{v:.4f}" for v in per_round), ", ".join(f"{v:.4g}" for v in a),
            f"{min(across):.4f}–{max(across):.4f}" if across else "–",
            f"{rr.get('ratio', math.nan):.4f} ({rr.get('low', math.nan):.4f}–{rr.get('high', math.nan):.4f})", run.get("verdict", "–"),
        ]) + " |")
    paired_dev = [abs(math.log(y / x)) for c in by_case.values() for x, y in zip(c.get("A", {}).get("process_medians_ms") or [],
                                                                              c.get("B", {}).get("process_medians_ms") or [])]
    runs_dev = [abs(math.log(c["ratio"]["ratio"])) for c in compared["cases"] if c.get("ratio")]
    if paired_dev and runs_dev:
        lines += ["", f"Largest distance from 1 of a paired per-round ratio: {math.exp(max(paired_dev)) - 1:.2%}; of the two bench "
                  f"runs' unpaired ratios: {math.exp(max(runs_dev)) - 1:.2%}."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
