"""A/A and 2× of `perflab ab` on the CPU, the position effect of interleaved blocks, and `compare` of A/A traces.

A tiny model in a temporary git repository: c1, c2 (an empty commit: c1 against c2 is an A/A) and c3 (the model's
work done twice). Parts (``--parts``):

- ``aa``: ``--runs`` A/A `ab` runs (c1 vs c2) for each case (tiny; heavier: batch 8) and each pairing (blocks;
  processes), each with ``--order random --order-seed S``, S cycling through ``--seeds``. Counts the verdicts
  (an A/A must never read faster or slower), the geometric mean of the A/A ratios, the noise floor each run states,
  and, for blocks runs, the position effect (each interleaved round's first block against the others beside it).
- ``double``: ``--double`` runs of c1 vs c3 (the heavier case, blocks), and the true ratio measured separately by one
  longer `ab` (``--rounds 10``): how many read "slower" with a CI that contains it.
- ``before``: A/A blocks runs of the tiny case with another perflab (``--before-src``: the source tree before the
  warm step and the logs, e.g. main's): the position effect before, computed the same way.
- ``traces``: ``--traces`` pairs of ``perflab run`` of one training script (20 timed steps, 3 traced), each pair
  compared with ``perflab compare A/run.json B/run.json --json``: how many claim a difference.

    PYTHONPATH=src python benchmarks/ab_aa_cpu.py --out aa.json [--runs 10] [--parts aa double before traces]
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gitrepo import git, new_repo

MODEL = '''import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.proj = nn.Linear(3 * 8 * 8, 96)
        self.head = nn.Linear(96, num_classes)

    def once(self, x):
        b = x.shape[0]
        tokens = x.unfold(2, 8, 8).unfold(3, 8, 8).reshape(b, 3, -1, 64).permute(0, 2, 1, 3).reshape(b, -1, 192)
        h = self.proj(tokens)
        return self.head((h @ h.transpose(1, 2) @ h).mean(1))

    def forward(self, x):
        return self.once(x)
'''
DOUBLED = MODEL.replace("        return self.once(x)\n", "        return self.once(x) + self.once(x)  # c3: the work twice\n")
COMMON = ["--model", "model.py:Net", "--input-size", "64", "--device", "cpu", "--warmup", "2", "--no-pin", "--family", "classify"]
# 20 blocks of 5 steps a round: a round's B/A is the median of 20 block ratios, which a few blocks a busy 2-core host
# preempts do not move (with 8 blocks, a loaded round's A/A read 0.54 and its floor ±188%)
CASES = {"tiny": COMMON + ["--iters", "100", "--repeats", "20"],
         "heavier": COMMON + ["--batch-size", "8", "--iters", "100", "--repeats", "20"]}
TRAIN = '''import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(64, 256)
for step in range(40):
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()
'''


def make_repo(base: Path) -> Path:
    repo = new_repo(base / "repo")
    (repo / "model.py").write_text(MODEL)
    git(repo, "add", "model.py")
    git(repo, "commit", "-qm", "c1")
    git(repo, "tag", "c1")
    git(repo, "commit", "-q", "--allow-empty", "-m", "c2")
    git(repo, "tag", "c2")
    (repo / "model.py").write_text(DOUBLED)
    git(repo, "commit", "-qam", "c3")
    git(repo, "tag", "c3")
    return repo


def perflab(args: list[str], src: str | None = None, **kwargs) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if src:
        env["PYTHONPATH"] = src
    return subprocess.run([sys.executable, "-m", "perflab", *args], capture_output=True, text=True, env=env, **kwargs)


def position(out: Path) -> dict:
    """The position effect in one blocks run's store: per interleaved round, the block timed first ÷ the geometric mean
    of the others beside it (all the same code in an A/A), and B's block ÷ A's split by which of the two went first."""
    from perflab import api

    rows = api.results(out)
    blocks: dict = collections.defaultdict(list)  # (process, interleaved round) → [(started, ms, version name)]
    for row in rows:
        name = (row.get("version") or {}).get("name")
        for ms, p, r, t in zip(row["samples_ms"], row["sample_processes"], row["sample_rounds"], row["sample_started_s"]):
            blocks[(p, r)].append((t, ms, name))
    first, a_first, b_first = [], [], []
    for these in blocks.values():
        these.sort()
        others = [math.log(ms) for _, ms, _ in these[1:]]
        first.append(math.log(these[0][1]) - sum(others) / len(others))
        by = {name: (t, ms) for t, ms, name in these}
        if "A" in by and "B" in by:
            (a_first if by["A"][0] < by["B"][0] else b_first).append(math.log(by["B"][1] / by["A"][1]))
    return {"first_logs": first, "ba_logs_a_first": a_first, "ba_logs_b_first": b_first}


def ab_run(repo: Path, out: Path, case: str, extra: list[str], src: str | None) -> dict:
    t0 = time.perf_counter()
    done = perflab(["ab", "--repo", str(repo), *CASES[case], *extra, "--out", str(out), "--json"], src)
    seconds = time.perf_counter() - t0
    try:
        data = json.loads(done.stdout)
        c = data["cases"][0]
    except (ValueError, KeyError, IndexError):
        return {"error": (done.stderr or done.stdout)[-600:], "rc": done.returncode, "seconds": seconds}
    ratio = c.get("ratio") or {}
    floor = c.get("floor") or {}
    order = data.get("order") or {}
    return {"verdict": c["verdict"], "verdict_text": c.get("verdict_text"), "ratio": ratio.get("ratio"), "ci": [ratio.get("low"), ratio.get("high")],
            "basis": ratio.get("basis"), "floor": floor.get("fraction"), "floor_source": floor.get("source"),
            "detectable": c.get("detectable"), "needed": c.get("needed"), "flags": c.get("flags"),
            "a_before_b": order.get("A before B"), "seconds": seconds}


def geo(logs: list[float]) -> float | None:
    return math.exp(sum(logs) / len(logs)) if logs else None


def centres(logs: list[float]) -> dict:
    """The geometric mean and the median of ratios given as logs (the median: robust to a block a busy host hit)."""
    return {"geomean": geo(logs), "median": math.exp(statistics.median(logs)) if logs else None, "n": len(logs)}


def part_aa(repo: Path, base: Path, args) -> dict:
    runs, pos = [], collections.defaultdict(list)
    for case in CASES:
        for pairing in ("blocks", "processes"):
            for i in range(args.runs):
                seed = args.seeds[i % len(args.seeds)]
                out = base / f"aa_{case}_{pairing}_{i}"
                extra = ["--a", "c1", "--b", "c2", "--pairing", pairing, "--order", "random", "--order-seed", str(seed)]
                result = dict(ab_run(repo, out, case, extra, args.src), case=case, pairing=pairing, seed=seed, run=i)
                if pairing == "blocks" and "error" not in result:
                    p = position(out)
                    result["first_block_factor"] = geo(p["first_logs"])
                    for k, v in p.items():
                        pos[(case, k)] += v
                runs.append(result)
                print(json.dumps(result), flush=True)
    ok = [r for r in runs if "error" not in r]
    return {"runs": runs, "counts": dict(collections.Counter(r.get("verdict", "error") for r in runs)),
            "false_changes": sum(r.get("verdict") in ("faster", "slower") for r in runs),
            "geomean_ratio": geo([math.log(r["ratio"]) for r in ok]),
            "every_run_states_its_floor": all(r.get("floor") is not None for r in ok) and len(ok) == len(runs),
            "floors": sorted(r["floor"] for r in ok if r.get("floor") is not None),
            "position_after": {f"{case} {k}": centres(v) for (case, k), v in pos.items()}}


def part_double(repo: Path, base: Path, args) -> dict:
    true = ab_run(repo, base / "double_true", "heavier", ["--a", "c1", "--b", "c3", "--rounds", "10", "--no-aa"], args.src)
    print(json.dumps(dict(true, what="true ratio")), flush=True)
    runs = []
    for i in range(args.double):
        result = dict(ab_run(repo, base / f"double_{i}", "heavier", ["--a", "c1", "--b", "c3"], args.src), run=i)
        if "error" not in result and true.get("ratio"):
            result["ci_contains_true"] = result["ci"][0] <= true["ratio"] <= result["ci"][1]
        runs.append(result)
        print(json.dumps(result), flush=True)
    return {"true": true, "runs": runs, "slower": sum(r.get("verdict") == "slower" for r in runs),
            "ci_contains_true": sum(bool(r.get("ci_contains_true")) for r in runs)}


def part_before(repo: Path, base: Path, args) -> dict:
    runs, pos = [], collections.defaultdict(list)
    for i in range(args.before_runs):
        out = base / f"before_{i}"
        result = dict(ab_run(repo, out, "tiny", ["--a", "c1", "--b", "c2"], args.before_src), run=i)
        if "error" not in result:
            p = position(out)
            result["first_block_factor"] = geo(p["first_logs"])
            for k, v in p.items():
                pos[k] += v
        runs.append(result)
        print(json.dumps(result), flush=True)
    return {"src": args.before_src, "runs": runs, "position_before": {k: centres(v) for k, v in pos.items()},
            "geomean_ratio": geo([math.log(r["ratio"]) for r in runs if r.get("ratio")])}


def part_traces(base: Path, args) -> dict:
    script = base / "train.py"
    script.write_text(TRAIN)
    pairs = []
    for i in range(args.traces):
        outs = [base / f"run_{i}_{side}" for side in "ab"]
        for out in outs:
            done = perflab(["run", "--out", str(out), "--", str(script)], args.src)
            if done.returncode != 0:
                print(done.stderr[-600:], file=sys.stderr)
        done = perflab(["compare", str(outs[0] / "run.json"), str(outs[1] / "run.json"), "--json"], args.src)
        try:
            c = json.loads(done.stdout)
            result = {"pair": i, "claims_difference": c.get("claims_difference"), "decided": c.get("decided"),
                      "delta_wall_us": c.get("delta_wall_us"), "delta_wall_ci_us": c.get("delta_wall_ci_us"),
                      "steps_needed": c.get("steps_needed"), "inflated": c.get("inflated"),
                      "untraced": (c.get("untraced") or {}).get("verdict_text"), "first_line": c.get("first_line"),
                      "verdict": c.get("verdict")}
        except ValueError:
            result = {"pair": i, "error": (done.stderr or done.stdout)[-600:]}
        pairs.append(result)
        print(json.dumps(result), flush=True)
    return {"pairs": pairs, "claims": sum(bool(p.get("claims_difference")) for p in pairs),
            "no_claim": sum(p.get("claims_difference") is False for p in pairs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--parts", nargs="+", default=["aa", "double", "before", "traces"], choices=["aa", "double", "before", "traces"])
    parser.add_argument("--runs", type=int, default=10, help="A/A runs per case and pairing")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 7, 12345])
    parser.add_argument("--double", type=int, default=5)
    parser.add_argument("--before-runs", type=int, default=10)
    parser.add_argument("--before-src", default="", help="PYTHONPATH of the perflab to measure the position effect before")
    parser.add_argument("--traces", type=int, default=10)
    parser.add_argument("--src", default=os.environ.get("PYTHONPATH", ""), help="PYTHONPATH of the perflab measured")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="ab_aa_cpu-"))
    repo = make_repo(base)
    results: dict = {"command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                     "load_before": os.getloadavg()}
    for part in args.parts:
        if part == "before" and not args.before_src:
            continue
        results[part] = {"aa": part_aa, "double": part_double, "before": part_before}[part](repo, base, args) if part != "traces" \
            else part_traces(base, args)
        results["load_after_" + part] = os.getloadavg()
        args.out.write_text(json.dumps(results, indent=1))
    summary = {part: {k: v for k, v in results[part].items() if k not in ("runs", "pairs")} for part in args.parts if part in results}
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
