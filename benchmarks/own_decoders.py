"""Your own decoder on the GPU (issue 24): an hf: Llama config in every decode mode, a run that loses the CUDA
context, and gpt-fast's model.py against perflab's llama3_8b.

    PYTHONPATH=src python benchmarks/own_decoders.py --part hf        # benchmarks/models/hf_decode_llama, 4 modes × ctx 256/2048 × bs 1/8
    PYTHONPATH=src python benchmarks/own_decoders.py --part sticky    # bs1 then bs2 of tests/data/models/asserting.py (bs2 asserts)
    PYTHONPATH=src python benchmarks/own_decoders.py --part gptfast --gpt-fast PATH/TO/gpt-fast   # its model.py, llama-3-8b

``hf``: decode, bf16, every mode, timed together (interleaved) in this process; a table of ms per step, tokens/s and
MBU. ``sticky``: the CLI in a subprocess, as a user runs it: its exit status, last stderr line, and the rows its --out
kept. ``gptfast``: gpt-fast's ``Transformer.from_name`` (``--model-arg name=llama-3-8b --family decode``) and
perflab's llama3_8b, decode at context 512, bs 1, compile:reduce-overhead, timed together: time, bytes per step, MBU.
``--out FILE`` writes the rows as JSON lines.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HF = "hf:benchmarks/models/hf_decode_llama"
MODES = ["eager", "compile", "compile:reduce-overhead", "cudagraph"]


def fmt(value, spec):
    return "–" if value is None else format(value, spec)


def table(rows):
    head = ["case", "status", "ms/step [95% CI]", "tokens/s", "GB/step", "MBU", "first step s", "message"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        ci = r.get("ci95_ms") or [None, None]
        lines.append("| " + " | ".join([r["label"], r["status"], f"{fmt(r.get('median_ms'), '.3f')} [{fmt(ci[0], '.3f')}, {fmt(ci[1], '.3f')}]",
                                         fmt(r.get("tokens_per_s"), ".0f"), fmt((r.get("bytes_per_step") or 0) / 1e9 or None, ".4f"),
                                         fmt(r.get("mbu"), ".1%"), fmt(r.get("first_step_s"), ".1f"), (r.get("message") or "")[:120]]) + " |")
    return "\n".join(lines)


def part_hf(args):
    from perflab import api

    os.chdir(ROOT)
    cases = api.make_cases(model=[HF], workload=["decode"], context_len=[256, 2048], batch_size=[1, 8], dtype=["bf16"], mode=MODES,
                           device="cuda", family="decode", warmup=5, min_time=0.5, repeats=10)
    return api.bench(cases)


def part_sticky(args):
    out = Path(args.tmp) / "sticky.jsonl"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run([sys.executable, "-m", "perflab", "bench", "--model", "tests/data/models/asserting.py:Asserting",
                             "--family", "classify", "--input-size", "32", "--batch-size", "1", "2", "4", "--no-interleave",
                             "--device", "cuda", "--min-time", "0.2", "--out", str(out)], capture_output=True, text=True, cwd=ROOT, env=env)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    print(f"exit status {result.returncode}; traceback: {'Traceback' in result.stderr}; last stderr line:\n  {lines[-1] if lines else ''}")
    rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    print("rows kept:", [(r["batch_size"], r["status"], (r.get("message") or "")[:80]) for r in rows])
    return rows


def part_gptfast(args):
    from perflab import api

    path = Path(args.gpt_fast or "") / "model.py"
    if not args.gpt_fast or not path.is_file():
        print(f"own_decoders.py: error: --part gptfast needs --gpt-fast DIR holding gpt-fast's model.py (got {args.gpt_fast})", file=sys.stderr)
        sys.exit(2)
    common = dict(workload=["decode"], context_len=[512], batch_size=[1], dtype=["bf16"], mode=[args.mode], device="cuda", warmup=5,
                  min_time=1.0, repeats=20)
    theirs = api.make_cases(model=[f"{path}:Transformer.from_name"], model_args={"name": "llama-3-8b"}, family="decode", **common)
    ours = api.make_cases(model=["llama3_8b"], **common)
    rows = api.bench(theirs + ours, processes=args.processes)
    from perflab.stats import paired_ratio

    pair = paired_ratio(rows[1], rows[0])  # gpt-fast's (rows[0]) time ÷ perflab's (rows[1])
    if pair:
        print(f"gpt-fast ÷ perflab step time, paired: {pair['ratio']:.4f} (95% CI {pair['ci95'][0]:.4f}–{pair['ci95'][1]:.4f})")
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["hf", "sticky", "gptfast"], required=True)
    parser.add_argument("--gpt-fast", help="gpt-fast's checkout (its model.py)")
    parser.add_argument("--mode", default="compile:reduce-overhead")
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--tmp", default="/tmp")
    parser.add_argument("--out")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    rows = {"hf": part_hf, "sticky": part_sticky, "gptfast": part_gptfast}[args.part](args)
    print(table(rows))
    if args.out:
        with open(args.out, "w") as f:
            for r in rows:
                f.write(json.dumps(r, default=str) + "\n")


if __name__ == "__main__":
    main()
