"""Does compile:max-autotune reproduce from process to process? Measured on a GPU.

    PYTHONPATH=src python3 benchmarks/autotune_spread.py [--settings independent,shared] [--processes 3]
        [--autotune-rep MS] [--json OUT.jsonl] [-- extra bench flags]

By default it times llama3_8b decode at context 512, batch 1, bf16, ``compile:max-autotune`` (the issue's case) with
``perflab bench ... --format json``, one fresh process per run, ``--processes`` runs per setting:

- **independent**: each process with its own empty inductor cache (``--inductor-cache`` a new directory each): every
  process tunes afresh, as a fresh machine does. Different kernels chosen here are autotuning's variance.
- **shared**: the processes share one inductor cache, empty at first (``--inductor-cache`` one directory): the first
  tunes, the others take its choices (the FX graph cache, else the autotuning cache). A spread left here is not
  autotuning's choice.
- **independent-rep** (with ``--autotune-rep MS``): as independent, with ``TORCHINDUCTOR_DEFAULT_AUTOTUNE_REP=MS`` (each
  candidate benchmarked for MS ms instead of inductor's 100): do more repetitions make the choice stable?

For each process: the median and its CI, the choice signature (equal signatures, equal kernels), what the FX graph
cache served, and each tuned op's kernel with the runner-up's margin; then per setting the medians' spread
(max / min − 1) and how many different choices. Each setting takes about 3 × (model build + compile + timing): on an
H100, about 3–5 minutes cold (independent), less once shared; run one setting per command where a command is bounded.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")
CASE = ["--model", "llama3_8b", "--workload", "decode", "--context-len", "512", "--batch-size", "1", "--dtype", "bf16",
        "--mode", "compile:max-autotune"]


def run_one(cache_dir: str, extra: list[str], env_extra: dict) -> tuple[dict | None, str, float]:
    """One fresh ``perflab bench`` process: its row (None if it printed none), its stderr's tail, its wall seconds."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (SRC, os.environ.get("PYTHONPATH", "")) if p), **env_extra)
    command = [sys.executable, "-m", "perflab", "bench", *CASE, "--format", "json", "--inductor-cache", cache_dir, *extra]
    started = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, env=env)
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return (rows[0] if rows else None), proc.stderr[-2000:], time.perf_counter() - started


def fmt(value, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def describe(row: dict) -> list[str]:
    record = row.get("autotune") or {}
    if row.get("status") != "ok":
        return [f"  status {row.get('status')}: {row.get('message')}"]
    low, high = row.get("ci95_ms") or (None, None)
    lines = [f"  median {fmt(row.get('median_ms'), '.3f')} ms (CI {fmt(low, '.3f')}–{fmt(high, '.3f')}), cv {fmt(row.get('cv'), '.1%')}, "
             f"flags {', '.join(row.get('flags') or []) or '–'}",
             f"  choice signature {record.get('signature')}, FX graph cache {record.get('fx_graph_cache')}, "
             f"closest call {fmt(record.get('closest_margin'), '.1%')}" + (f"; {record['note']}" if record.get("note") else "")]
    for op in record.get("ops") or []:
        runner = f"; runner-up {op['runner_up']} +{op['margin']:.1%}" if op.get("runner_up") else ""
        lines.append(f"    {op['op']} {op['shapes']} ×{op['calls']}: {op['chosen']} {op['chosen_ms'] * 1000:.1f} µs "
                     f"of {op['candidates']} candidates{runner}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", default="independent,shared", help="comma-separated: independent, shared, independent-rep")
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--autotune-rep", type=int, default=None, help="ms per candidate for the independent-rep setting")
    parser.add_argument("--json", type=Path, default=None, help="append every row here (JSON lines, with its setting)")
    args, extra = parser.parse_known_args()
    extra = [a for a in extra if a != "--"]
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    if "independent-rep" in settings and not args.autotune_rep:
        parser.error("independent-rep needs --autotune-rep MS")
    summary = []
    with tempfile.TemporaryDirectory(prefix="perflab-autotune-") as scratch:
        for setting in settings:
            shared = os.path.join(scratch, f"{setting}-shared")
            env_extra = {"TORCHINDUCTOR_DEFAULT_AUTOTUNE_REP": str(args.autotune_rep)} if setting == "independent-rep" else {}
            medians, signatures = [], []
            print(f"## {setting}", flush=True)
            for p in range(args.processes):
                cache = shared if setting == "shared" else os.path.join(scratch, f"{setting}-{p}")
                row, stderr, wall = run_one(cache, extra, env_extra)
                print(f"process {p + 1} ({wall:.0f} s, inductor cache {'shared' if setting == 'shared' else 'its own'}):", flush=True)
                if row is None:
                    print("  no row; stderr:\n" + stderr, flush=True)
                    continue
                print("\n".join(describe(row)), flush=True)
                if args.json is not None:
                    with open(args.json, "a") as out:
                        out.write(json.dumps(dict(row, setting=setting, process=p + 1)) + "\n")
                if row.get("status") == "ok":
                    medians.append(row["median_ms"])
                    signatures.append((row.get("autotune") or {}).get("signature"))
            if medians:
                spread = max(medians) / min(medians) - 1.0
                tuned = [s for s in signatures if s]
                line = (f"{setting}: medians {' / '.join(f'{m:.3f}' for m in medians)} ms, spread {spread:.1%}; "
                        f"{len(set(tuned))} different choice(s) of kernels in the {len(tuned)} process(es) that tuned"
                        + (f", {len(medians) - len(tuned)} served by inductor's FX graph cache" if len(tuned) < len(medians) else ""))
                summary.append(line)
                print(line + "\n", flush=True)
    print("## summary\n" + "\n".join(summary))


if __name__ == "__main__":
    main()
