"""A/A of `perflab ab` on the CPU: one commit against itself, N runs at each of several --order-seed values, and how many
verdicts said "faster" or "slower" (an A/A must say "no change" or "inconclusive"). A tiny model in a temporary git
repository, as tests/test_versions.py builds it.

    PYTHONPATH=src python benchmarks/ab_aa_cpu.py --runs 10 --seeds 0 1 7 12345 --out aa.json
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODEL = '''import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.proj = nn.Linear(3 * 8 * 8, 96)
        self.head = nn.Linear(96, num_classes)

    def forward(self, x):
        b = x.shape[0]
        tokens = x.unfold(2, 8, 8).unfold(3, 8, 8).reshape(b, 3, -1, 64).permute(0, 2, 1, 3).reshape(b, -1, 192)
        h = self.proj(tokens)
        return self.head((h @ h.transpose(1, 2) @ h).mean(1))
'''
CASE = ["--model", "model.py:Net", "--input-size", "64", "--device", "cpu", "--iters", "40", "--repeats", "8", "--warmup", "2",
        "--no-pin", "--family", "classify"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 7, 12345])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    repo = Path(tempfile.mkdtemp()) / "repo"
    repo.mkdir()
    (repo / "model.py").write_text(MODEL)
    for cmd in (["init", "-q"], ["config", "user.email", "aa@example.com"], ["config", "user.name", "aa"], ["add", "model.py"],
                ["commit", "-qm", "c1"], ["tag", "c1"], ["commit", "-q", "--allow-empty", "-m", "c2"], ["tag", "c2"]):
        subprocess.run(["git", "-C", str(repo), *cmd], check=True)
    results = []
    for seed in args.seeds:
        for run in range(args.runs):
            out = repo.parent / f"ab_{seed}_{run}"
            t0 = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "perflab", "ab", "--repo", str(repo), "--a", "c1", "--b", "c2", *CASE,
                                   "--rounds", str(args.rounds), "--order-seed", str(seed), "--out", str(out), "--json"],
                                  capture_output=True, text=True)
            try:
                data = json.loads(done.stdout)
                case = data["cases"][0]
                ratio = case.get("ratio") or {}
                results.append({"seed": seed, "run": run, "ratio": ratio.get("ratio"), "ci": [ratio.get("low"), ratio.get("high")],
                                "verdict": case.get("verdict"), "order": case.get("order") or data.get("order"),
                                "seconds": time.perf_counter() - t0})
            except (ValueError, KeyError, IndexError):
                results.append({"seed": seed, "run": run, "error": (done.stderr or done.stdout)[-400:], "rc": done.returncode})
            print(json.dumps(results[-1]), flush=True)
    counts = collections.Counter(r.get("verdict", "error") for r in results)
    args.out.write_text(json.dumps({"counts": counts, "results": results}, indent=1))
    print(dict(counts))


if __name__ == "__main__":
    main()
