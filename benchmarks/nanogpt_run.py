"""nanoGPT's own ``train.py``, unmodified, under ``perflab run``: perflab's step time beside the iteration times that
nanoGPT prints, and nanoGPT's MFU (which assumes an A100's 312 TFLOP/s bf16 peak) beside perflab's (the measured peak
of this GPU). nanoGPT is not part of perflab: fetch it (github.com/karpathy/nanoGPT) and point --nanogpt at the
checkout; the data are synthetic (random GPT-2 token ids, written with numpy as its prepare.py writes them).

    PYTHONPATH=src python benchmarks/nanogpt_run.py --nanogpt /path/to/nanoGPT --out nanogpt.json            # one GPU
    PYTHONPATH=src python benchmarks/nanogpt_run.py --nanogpt /path/to/nanoGPT --nproc 2 --out ddp.json      # torchrun, DDP

Both runs use nanoGPT's GPT-2 124M defaults (block 1024, compile=True, bf16) with its own config overrides for a short
run: batch 12 per GPU (--batch-size), one micro-batch per GPU per iteration, no evaluation past iteration 0.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

ITER = re.compile(r"^iter (\d+): loss [\d.]+, time ([\d.]+)ms, mfu (-?[\d.]+)%", re.M)


def make_data(root: Path, tokens: int = 4_000_000) -> None:
    data = root / "data" / "synthetic"
    data.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for split, n in (("train", tokens), ("val", tokens // 10)):
        rng.integers(0, 50257, size=n, dtype=np.uint16).tofile(data / f"{split}.bin")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nanogpt", type=Path, required=True)
    parser.add_argument("--nproc", type=int, default=1)
    parser.add_argument("--skip", type=int, default=15)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--trace", type=int, default=3)
    parser.add_argument("--trace-warmup", type=int, default=3)
    parser.add_argument("--gas", type=int, default=None, help="nanoGPT's --gradient_accumulation_steps (default: --nproc; nanoGPT "
                        "divides it over the ranks)")
    parser.add_argument("--no-shapes", action="store_true", help="perflab run --no-shapes: trace without operator shapes")
    parser.add_argument("--nproc-list", default=None, help="perflab run --nproc 1,2: the program at each count, and the scaling")
    parser.add_argument("--iters", type=int, default=55)
    parser.add_argument("--batch-size", type=int, default=12, help="nanoGPT's --batch_size, per GPU and micro-step")
    parser.add_argument("--input", default=None, help="perflab run --input: a function whose calls are waits for input (get_batch)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    root = args.nanogpt.resolve()
    make_data(root)
    run_dir = args.out.with_suffix("").resolve()
    overrides = ["--dataset=synthetic", f"--batch_size={args.batch_size}", f"--gradient_accumulation_steps={args.gas or args.nproc}", f"--max_iters={args.iters}",
                 "--eval_interval=1000000", "--eval_iters=1", "--log_interval=1", "--compile=True", "--always_save_checkpoint=False",
                 "--out_dir=/tmp/nanogpt_out", "--decay_lr=False"]
    nproc = ["--nproc", args.nproc_list] if args.nproc_list else (["--nproc", str(args.nproc)] if args.nproc > 1 else [])
    perflab = [sys.executable, "-m", "perflab", "run", "--skip", str(args.skip), "--steps", str(args.steps), "--trace", str(args.trace),
               "--trace-warmup", str(args.trace_warmup), "--out", str(run_dir)] + nproc + (["--no-shapes"] if args.no_shapes else []) + (["--input", args.input] if args.input else []) + [
                   "--", "train.py", *overrides]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[1] / "src"), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(perflab, cwd=root, env=env, capture_output=True, text=True)
    sys.stderr.write(done.stderr[-6000:])
    if args.nproc_list:  # several runs: the scaling section is the result
        scaling = json.loads((run_dir / "scaling.json").read_text())
        args.out.write_text(json.dumps({"command": " ".join(perflab), "exit_code": done.returncode, "scaling": scaling}, indent=1, default=str))
        print(json.dumps(scaling, indent=1, default=str)[-4000:])
        return
    iters = {int(i): (float(t), float(m)) for i, t, m in ITER.findall(done.stdout)}
    report = json.loads((run_dir / "run.json").read_text())
    # perflab's timed step k (1-based, k = skip+1 .. skip+steps) ends at iteration k-1's optimizer step
    window = [iters[k - 1][0] for k in range(args.skip + 1, args.skip + args.steps + 1) if k - 1 in iters]
    perflab_ms = report.get("step_ms") or report["timing"]["median_ms"]
    nanogpt_ms = statistics.median(window) if window else None
    mfu = [m for i, (_, m) in sorted(iters.items()) if i >= args.skip]
    summary = {
        "command": " ".join(perflab), "exit_code": done.returncode, "nproc": args.nproc,
        "perflab_step_ms": perflab_ms, "perflab_ci95_ms": report["timing"].get("ci95_ms"),
        "nanogpt_iter_ms_median": nanogpt_ms, "nanogpt_iters_compared": len(window),
        "ratio_perflab_over_nanogpt": perflab_ms / nanogpt_ms if nanogpt_ms else None,
        "nanogpt_mfu_pct_last": mfu[-1] if mfu else None, "nanogpt_mfu_assumes": "312 TFLOP/s (an A100's bf16 peak)",
        "perflab_mfu": (report.get("utilisation") or {}).get("mfu"), "perflab_peak_tflops": (report.get("utilisation") or {}).get("peak_tflops"),
        "perflab_flops_per_step": (report.get("flops") or {}).get("flops_per_step"), "flags": [f["flag"] for f in report.get("flags", [])],
        "verdict": report.get("verdict"), "compile": report.get("recorded", {}).get("compile_phases"),
        "limit_hits": report.get("recorded", {}).get("limit_hits"), "compiled": report.get("compiled"),
        "communication": report.get("communication"), "ranks": report.get("ranks"), "traced": report.get("traced"),
        "traced_verdict": report.get("traced_verdict"), "floors": report.get("floors"), "loop": report.get("loop"),
        "mean_ms": (report.get("loop") or {}).get("mean_ms"),
        "nanogpt_iter_ms_mean": statistics.mean(window) if window else None,
    }
    args.out.write_text(json.dumps(summary, indent=1, default=str))
    print(json.dumps({k: summary[k] for k in ("perflab_step_ms", "nanogpt_iter_ms_median", "mean_ms", "nanogpt_iter_ms_mean", "ratio_perflab_over_nanogpt", "nanogpt_mfu_pct_last",
                                               "perflab_mfu", "perflab_peak_tflops", "flags", "exit_code", "verdict")}, indent=1, default=str))
    traced = summary["traced"] or {}
    print("traced:", {k: traced.get(k) for k in ("step_ms", "step_ms_each", "warmup_step_ms", "inflation", "inflated")})
    print(done.stdout[-1500:])


if __name__ == "__main__":
    main()
