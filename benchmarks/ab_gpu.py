"""perflab ab on a GPU: an A/A test of two revisions that differ only in a comment, paired block by block in one
process a round (the default) and process by process, against two separate bench runs (about 7 minutes on an H100).

    PYTHONPATH=src python3 benchmarks/ab_gpu.py OUT [--rounds 3] [--pairings blocks processes] [--store DIR]

The cases are the demo's launch-bound ones: deit_base_patch16_224 and topk_deit_base_patch16_224 (keep 0.1 at blocks
3, 6, 9), batch 1, bf16, eager (``api.demo_cases("cuda")``'s bs1 eager pair). Their models are built-in names, the
same code at both revisions; each version still builds its own copy.

1. A temporary git repository holds one file at two commits that differ only in a comment. ``perflab ab --repo REPO
   --a c1 --b c2 ... --rounds 3`` with each pairing:

   - ``--pairing blocks`` (the default): each round is one fresh process that builds both versions' cases and times
     them interleaved, a case's A and B blocks next to each other; B/A per round is the median of its block ratios.
     Expected: "no change" for both cases, the CI inside 0.952-1.050 (±5%), the per-round ratios within a few percent
     of 1 even where the rounds' A medians differ by tens of percent (a process's own host speed: it cancels).
   - ``--pairing processes``: A and B each in a process of their own, alternated (A B, B A, A B); B/A per round is the
     ratio of the two processes' medians. Expected: per-round ratios as far from 1 as the processes' host speeds
     differ (0.69-1.47 on an H100 VM), so the CI is wide: "inconclusive".

   Where git is missing, A and B are this interpreter twice (``--python-a/--python-b``): processes pairing only, said so.
2. The same cases in two separate ``perflab bench --out`` runs (one process each, as a user would run them before and
   after a change), then ``perflab compare run1.jsonl run2.jsonl``: the unpaired ratio of the two runs' medians.
3. OUT/ab_gpu.md sets them side by side, per pairing and case: the ratio and CI; the per-round B/A ratios; A's
   medians by round (how far the processes' speeds moved); the unpaired ratios ab's own processes give when A of one
   round meets B of another; the two bench runs' ratio with compare's CI.

OUT gets ab_<pairing>.json per pairing, compare.json, run1.jsonl, run2.jsonl and ab_gpu.md; the ab stores go to
--store/<pairing> (default: a temporary directory, removed).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shutil
import statistics
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
    parser.add_argument("--pairings", nargs="+", default=["blocks", "processes"], choices=["blocks", "processes"],
                        help="the ab runs to make (default both: blocks, then processes)")
    parser.add_argument("--store", type=Path, default=None, help="where the ab stores go (default: a temporary directory)")
    parser.add_argument("--device", default="cuda", help="cuda (default), or cpu to try the script itself")
    parser.add_argument("--model", nargs=2, default=MODELS, help="the baseline and its top-k variant (default: the demo's)")
    args = parser.parse_args()
    flags = cases(args.model, args.device)
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="perflab-ab-gpu-"))
    stores = args.store or work
    try:
        repo = work / "repo"
        pairings = list(args.pairings)
        if make_repo(repo):
            versions = ["--repo", repo, "--a", "c1", "--b", "c2"]
            how = "two revisions of a git repository that differ only in a comment"
        else:
            versions = ["--python-a", sys.executable, "--python-b", sys.executable]
            how = f"no git here: the same interpreter twice ({sys.executable}), processes pairing only"
            pairings = ["processes"]
        runs = {}
        for pairing in pairings:
            print(f"ab --pairing {pairing}: {how}", file=sys.stderr, flush=True)
            ab = json.loads(perflab("ab", *versions, *flags, "--rounds", args.rounds, "--pairing", pairing,
                                    "--out", stores / pairing, "--json"))
            (args.out / f"ab_{pairing}.json").write_text(json.dumps(ab, indent=1) + "\n")
            runs[pairing] = (ab, _store_rows(stores / pairing))
        for run in ("run1", "run2"):
            print(f"bench: {run}", file=sys.stderr, flush=True)
            perflab("bench", *flags, "--out", args.out / f"{run}.jsonl", capture=True)
        compared = json.loads(perflab("compare", args.out / "run1.jsonl", args.out / "run2.jsonl", "--json"))
        (args.out / "compare.json").write_text(json.dumps(compared, indent=1) + "\n")
        (args.out / "ab_gpu.md").write_text(summary(runs, compared, how, args.rounds))
        print((args.out / "ab_gpu.md").read_text())
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _store_rows(store: Path) -> list[dict]:
    sys.path.insert(0, str(ROOT / "src"))
    from perflab.sweep.store import Store

    with Store.open(store) as s:
        return s.rows()


def round_ratios(a: dict, b: dict, pairing: str) -> list[float]:
    """B/A per round: blocks, the median over the round's interleaved rounds of B's block ÷ A's; processes, B's
    process median ÷ A's."""
    if pairing != "blocks":
        return [y / x for x, y in zip(a.get("process_medians_ms") or [], b.get("process_medians_ms") or [])]
    keyed = lambda row: {(p, r): v for v, p, r in zip(row["samples_ms"], row["sample_processes"], row["sample_rounds"])}  # noqa: E731
    ka, kb = keyed(a), keyed(b)
    per_round: dict[int, list[float]] = {}
    for key in sorted(set(ka) & set(kb)):
        per_round.setdefault(key[0], []).append(kb[key] / ka[key])
    return [statistics.median(v) for _, v in sorted(per_round.items())]


def summary(runs: dict, compared: dict, how: str, rounds: int) -> str:
    unpaired_runs = {c["case_id"]: c for c in compared["cases"]}
    first = next(iter(runs.values()))[0]
    lines = [f"# perflab ab on a GPU: an A/A test ({how})", "",
             f"Versions: {'; '.join(v['name'] + ' ' + (v.get('commit') or v.get('python') or '')[:12] + ' torch ' + str(v.get('torch')) for v in first['versions'])}. "
             f"{rounds} rounds; threshold ±{first['threshold']:.0%}.", "",
             "| pairing | case | ab: B/A (95% CI) | verdict | per-round B/A | ab's A medians (ms), by round | unpaired B/A across rounds (min–max) | "
             "two bench runs: run2/run1 (95% CI, within-run) | verdict |", "|" + "---|" * 9]
    deviations = {}
    for pairing, (ab, rows) in runs.items():
        by_case: dict[str, dict[str, dict]] = {}
        for row in rows:
            by_case.setdefault(row["case_id"], {})[row["version"]["name"]] = row
        for case in ab["cases"]:
            sides = by_case.get(case["case_id"], {})
            a_row, b_row = sides.get("A", {}), sides.get("B", {})
            a, b = (row.get("process_medians_ms") or [] for row in (a_row, b_row))
            per_round = round_ratios(a_row, b_row, pairing) if a_row.get("status") == b_row.get("status") == "ok" else []
            deviations.setdefault(pairing, []).extend(abs(math.log(x)) for x in per_round)
            across = [b[j] / a[i] for i, j in itertools.product(range(len(a)), range(len(b))) if i != j]
            run = unpaired_runs.get(case["case_id"]) or {}
            r, rr = case.get("ratio") or {}, run.get("ratio") or {}
            lines.append("| " + " | ".join([
                pairing, case["label"], f"{r.get('ratio', math.nan):.4f} ({r.get('low', math.nan):.4f}–{r.get('high', math.nan):.4f})",
                case["verdict"], ", ".join(f"{v:.4f}" for v in per_round), ", ".join(f"{v:.4g}" for v in a),
                f"{min(across):.4f}–{max(across):.4f}" if across else "–",
                f"{rr.get('ratio', math.nan):.4f} ({rr.get('low', math.nan):.4f}–{rr.get('high', math.nan):.4f})", run.get("verdict", "–"),
            ]) + " |")
    runs_dev = [abs(math.log(c["ratio"]["ratio"])) for c in compared["cases"] if c.get("ratio")]
    lines.append("")
    for pairing, devs in deviations.items():
        if devs:
            lines.append(f"Largest distance from 1 of a per-round B/A, {pairing} pairing: {math.exp(max(devs)) - 1:.2%}.")
    if runs_dev:
        lines.append(f"Of the two bench runs' unpaired ratios: {math.exp(max(runs_dev)) - 1:.2%}.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
