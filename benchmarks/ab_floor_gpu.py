"""`perflab ab` and `track` on a GPU against a ground truth they do not compute.

A temporary git repository holds an own model (``model.py:Net``: patches of a 64×64 image, then ``LAYERS`` square
fp32 linear layers of width 2048 with a GELU, then a head; batch 64 is 4096 tokens a layer, GPU-bound on an H200) at
three commits: c1 (10 layers), c2 (a comment: c1 against c2 is an A/A) and c3 (11 layers: about +10% of the work).

- ``aa``: ``--runs`` A/A `ab` runs (c1 vs c2): the verdict, the ratio and CI, the noise floor each run states.
- ``eleven``: ``--runs`` `ab` runs of c1 vs c3: how many read "slower", and whether each CI holds the true ratio.
- ``truth``: the true 11/10 ratio, measured here without perflab: both models built in this process, each timed in
  ``--truth-rounds`` interleaved rounds of 200 forward calls between two CUDA events; the median of the per-round ratios.
  Beside it, the same in blocks as perflab's interleaved ones run (a warm call, a synchronisation, then n = 1, 5, 20
  calls between two events): what a block's start after an idle GPU adds to each call (the H200's first run: perflab's
  step 0.044-0.048 ms over the 200-call loop's, which moves 1.0980 to 1.0974).
- ``track``: one `perflab track --revs c1,c2,c3 --profile-changes 5`: the change points and the profiled Δ by
  category attached to each.

    PYTHONPATH=src python benchmarks/ab_floor_gpu.py --out ab_floor_gpu.json [--runs 2] [--rounds 5] [--parts aa eleven truth track]

The figures and the command are in docs/performance/regressions.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gitrepo import git, new_repo

ROOT = Path(__file__).resolve().parents[1]
MODEL = '''import torch
from torch import nn

LAYERS = {layers}


class Net(nn.Module):
    def __init__(self, num_classes=10, width={width}):
        super().__init__()
        self.proj = nn.Linear(3 * 8 * 8, width)
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(LAYERS))
        self.head = nn.Linear(width, num_classes)

    def forward(self, x):
        b = x.shape[0]
        tokens = x.unfold(2, 8, 8).unfold(3, 8, 8).reshape(b, 3, -1, 64).permute(0, 2, 1, 3).reshape(b, -1, 192)
        h = self.proj(tokens)
        for layer in self.layers:
            h = torch.nn.functional.gelu(layer(h))
        return self.head(h.mean(1))
'''
CASE = ["--model", "model.py:Net", "--input-size", "64", "--batch-size", "64", "--family", "classify"]
WIDTH = 2048


def make_repo(path: Path) -> Path:
    new_repo(path)
    for tag, text in (("c1", MODEL.format(layers=10, width=WIDTH)), ("c2", "# a comment\n" + MODEL.format(layers=10, width=WIDTH)),
                      ("c3", MODEL.format(layers=11, width=WIDTH))):
        (path / "model.py").write_text(text)
        git(path, "add", "model.py")
        git(path, "commit", "-q", "-m", tag)
        git(path, "tag", tag)
    return path


def perflab(*args, cwd) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""), PYTHONWARNINGS="ignore")
    result = subprocess.run([sys.executable, "-m", "perflab", *map(str, args), "--json"], capture_output=True, text=True, cwd=cwd, env=env)
    if result.returncode != 0:
        raise SystemExit(f"perflab {' '.join(map(str, args))} failed ({result.returncode}): {result.stderr[-2000:]}")
    return json.loads(result.stdout)


def one_case(document) -> dict:
    (case,) = document["cases"]
    ratio = case.get("ratio") or {}
    return {"verdict": case.get("verdict"), "verdict_text": case.get("verdict_text"), "ratio": ratio.get("ratio"),
            "ci": [ratio.get("low"), ratio.get("high")], "floor": case.get("floor"), "detectable": case.get("detectable")}


def truth(rounds: int) -> dict:
    """B/A of c3 against c1 timed here, without perflab: the same shapes, fp32, interleaved rounds of CUDA-event timing."""
    import torch

    models = {}
    for layers in (10, 11):
        scope: dict = {}
        exec(MODEL.format(layers=layers, width=WIDTH), scope)
        torch.manual_seed(0)
        models[layers] = scope["Net"]().cuda().eval()
    x = torch.randn(64, 3, 64, 64, device="cuda")
    ms = {10: [], 11: []}
    with torch.no_grad():
        for layers, model in models.items():
            for _ in range(20):
                model(x)
        for r in range(rounds):
            for layers in ((10, 11) if r % 2 == 0 else (11, 10)):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(200):
                    models[layers](x)
                end.record()
                end.synchronize()
                ms[layers].append(start.elapsed_time(end) / 200)
        blocks = {}  # as perflab's interleaved blocks run: a warm step, a synchronisation, then n steps between two events
        for n in (1, 5, 20):
            per = {10: [], 11: []}
            for r in range(rounds):
                for layers in ((10, 11) if r % 2 == 0 else (11, 10)):
                    models[layers](x)
                    torch.cuda.synchronize()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    for _ in range(n):
                        models[layers](x)
                    end.record()
                    torch.cuda.synchronize()
                    per[layers].append(start.elapsed_time(end) / n)
            blocks[n] = {"ms_10": statistics.median(per[10]), "ms_11": statistics.median(per[11]),
                         "ratio": statistics.median([b / a for a, b in zip(per[10], per[11])])}
    ratios = [b / a for a, b in zip(ms[10], ms[11])]
    return {"ms_10": statistics.median(ms[10]), "ms_11": statistics.median(ms[11]), "ratio": statistics.median(ratios),
            "ratio_range": [min(ratios), max(ratios)], "rounds": rounds, "blocks": blocks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--truth-rounds", type=int, default=20)
    parser.add_argument("--device", default="cuda", help="cpu: a check of the script itself (with --width 64), not a measurement")
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--parts", nargs="+", default=["truth", "aa", "eleven", "track"], choices=["truth", "aa", "eleven", "track"])
    args = parser.parse_args()
    global WIDTH
    WIDTH = args.width
    common = [*CASE, "--device", args.device, "--rounds", str(args.rounds)]
    results: dict = {"rounds": args.rounds, "started": time.strftime("%Y-%m-%d %H:%M"), "commit": git(ROOT, "rev-parse", "--short", "HEAD")}

    def save() -> None:
        args.out.write_text(json.dumps(results, indent=1))

    with tempfile.TemporaryDirectory(prefix="ab-floor-gpu-") as tmp:
        repo = make_repo(Path(tmp) / "repo")
        if "truth" in args.parts:
            results["truth"] = truth(args.truth_rounds) if args.device == "cuda" else None
            if results["truth"]:
                print(f"truth: 11/10 layers {results['truth']['ratio']:.4f} ({results['truth']['ms_10']:.3f} → {results['truth']['ms_11']:.3f} ms)",
                      file=sys.stderr)
            save()
        for part, b in (("aa", "c2"), ("eleven", "c3")):
            if part not in args.parts:
                continue
            runs = []
            for k in range(args.runs):
                t0 = time.monotonic()
                document = perflab("ab", "--repo", repo, "--a", "c1", "--b", b, *common, "--order", "random", "--order-seed", k, "--out", Path(tmp) / f"{part}{k}", cwd=repo)
                runs.append(dict(one_case(document), seconds=round(time.monotonic() - t0, 1)))
                print(f"{part} {k + 1}: {runs[-1]['verdict_text']}, {runs[-1]['ratio']:.4f} ({runs[-1]['ci'][0]:.4f}–{runs[-1]['ci'][1]:.4f}), "
                      f"floor {runs[-1]['floor']}, {runs[-1]['seconds']} s", file=sys.stderr)
                results[part] = {"runs": runs}
                save()
            true = (results.get("truth") or {}).get("ratio") if part == "eleven" else 1.0
            results[part].update({"verdicts": [r["verdict"] for r in runs],
                                  "ci_holds_truth": None if true is None else sum(r["ci"][0] <= true <= r["ci"][1] for r in runs)})
            if part == "eleven" and results.get("truth"):
                results[part]["ci_holds_block_truth"] = {n: sum(r["ci"][0] <= b["ratio"] <= r["ci"][1] for r in runs)
                                                         for n, b in results["truth"]["blocks"].items()}
            save()
        if "track" in args.parts:
            t0 = time.monotonic()
            document = perflab("track", "--repo", repo, "--revs", "c1,c2,c3", *common, "--profile-changes", "5", "--out", Path(tmp) / "track", cwd=repo)
            results["track"] = {"document": document, "seconds": round(time.monotonic() - t0, 1),
                                "change_points": [s.get("change_points") for s in document["cases"]]}
            print(f"track: change points {results['track']['change_points']}, {results['track']['seconds']} s", file=sys.stderr)
            save()
    print(json.dumps({k: {kk: vv for kk, vv in v.items() if kk not in ("runs", "document")} if isinstance(v, dict) else v
                      for k, v in results.items()}, indent=1))


if __name__ == "__main__":
    main()
