"""A user's model against perflab's own, through the same harness (GPU): does naming a file or an hf: config cost
anything, and does perflab time transformers' model as transformers' own loop does?

    PYTHONPATH=src python benchmarks/own_model.py --part file   # course_lm.py:large vs gpt_large
    PYTHONPATH=src python benchmarks/own_model.py --part hf     # hf:benchmarks/models/gpt_large_llama vs lm_vs_transformers

Both: train_step, bf16, seq 512, batch 4, eager and compile:reduce-overhead (``--modes``). ``file``: the course-style
LM file (tests/data/models/course_lm.py, gpt_large's dimensions) and the built-in gpt_large, each through
``perflab.bench``. ``hf``: a Llama config of gpt_large's shape built from its config.json by perflab (hf:), and the
same transformers model timed by benchmarks/lm_vs_transformers.py's own loop. Prints a markdown table; ``--out``
also writes the rows as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def perflab_row(model: str, mode: str, args) -> dict:
    from perflab import api

    (case,) = api.make_cases(model=[model], workload=["train_step"], seq_len=[args.seq_len], batch_size=[args.batch_size], dtype=["bf16"],
                             mode=[mode], device="cuda", warmup=5, min_time=1.0, repeats=10, family="lm")
    (row,) = api.bench([case])
    torch.cuda.empty_cache()
    return {"impl": model, "mode": mode, "status": row["status"], "median_ms": row.get("median_ms"), "ci95_ms": row.get("ci95_ms"),
            "params": row.get("params"), "mfu": row.get("mfu"), "gflops_per_batch": row.get("gflops_per_batch"),
            "flops_counted_vs_analytic": row.get("flops_counted_vs_analytic"), "message": row.get("message")}


def transformers_row(mode: str, args) -> dict:
    from lm_vs_transformers import measure

    from perflab.spec import Case, validate_case

    case = validate_case(Case("gpt_large", workload="train_step", seq_len=args.seq_len, batch_size=args.batch_size, dtype="bf16",
                              mode=mode, device="cuda", warmup=5, min_time=1.0, repeats=10))
    row = measure(case, "transformers")
    torch.cuda.empty_cache()
    return {"impl": "transformers (lm_vs_transformers.py loop)", "mode": mode, "status": "ok", **row}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["file", "hf"], required=True)
    parser.add_argument("--modes", nargs="+", default=["eager", "compile:reduce-overhead"])
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    pairs = {"file": ("gpt_large", "tests/data/models/course_lm.py:large"),
             "hf": ("hf:benchmarks/models/gpt_large_llama", None)}[args.part]
    rows = []
    for mode in args.modes:
        a = perflab_row(pairs[0], mode, args)
        b = perflab_row(pairs[1], mode, args) if pairs[1] else transformers_row(mode, args)
        rows += [a, b]
        for r in (a, b):
            print(json.dumps(r), flush=True)
    print(f"\ntrain_step bf16 seq {args.seq_len} bs {args.batch_size} ({torch.cuda.get_device_name()}):")
    print("| mode | A | A ms | B | B ms | B ÷ A |")
    print("|---|---|---|---|---|---|")
    for i in range(0, len(rows), 2):
        a, b = rows[i], rows[i + 1]
        ratio = b["median_ms"] / a["median_ms"] if a.get("median_ms") and b.get("median_ms") else None
        print(f"| {a['mode']} | {a['impl']} | {a.get('median_ms') or a.get('message')} | {b['impl']} | {b.get('median_ms') or b.get('message')} | "
              f"{ratio:.3f} |" if ratio else f"| {a['mode']} | {a['impl']} | {a.get('message')} | {b['impl']} | {b.get('message')} | – |")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
