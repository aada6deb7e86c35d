"""The ncu pass, every launch against a few launches per launch configuration (issue 23's cost cut): the decode
grid's ncu cases (llama3_8b at context 512, batch 1, bf16, eager) read their top four kernels' counters both ways.
Per case and way: the wall time of ``perflab.api.ncu`` (a profile pass, then ncu in a child process), and per
kernel the DRAM % of peak, duration, achieved GB/s and the launches the means stand for (and how many ncu profiled).

    PYTHONPATH=src python benchmarks/ncu_per_config.py --out ncu_per_config.json           # one layer, both ways
    PYTHONPATH=src python benchmarks/ncu_per_config.py --full --ways 2 --out full.json      # the 8B model, sampled

Needs a CUDA GPU and ncu. Not yet run: the session that wrote it had no GPU time left (docs/performance/decode.md)."""
import argparse
import json
import sys
import tempfile
import time

from perflab import api
from perflab.errors import PerflabError

parser = argparse.ArgumentParser()
parser.add_argument("--full", action="store_true", help="the whole llama3_8b (default: one layer, layers only)")
parser.add_argument("--ways", type=int, nargs="+", default=[2, 0], help="per_config values: 0 = every launch")
parser.add_argument("--mode", default="eager")
parser.add_argument("--out", default="ncu_per_config.json")
args = parser.parse_args()
if min(args.ways) < 0:
    parser.error("--ways: launches per configuration, 0 (every launch) or more")

shape = {} if args.full else {"layers": 1, "layers_only": True}
try:
    (case,) = api.make_cases(model=["llama3_8b"], workload=["decode"], context_len=[512], batch_size=[1], dtype=["bf16"],
                             mode=[args.mode], device="cuda", **shape)
except PerflabError as exc:
    print(f"ncu_per_config: {exc}", file=sys.stderr)
    sys.exit(2)


def count(value):
    """A launch count, None for a top kernel ncu did not profile (no counters)."""
    return None if value != value else int(value)


results = []
for per_config in args.ways:
    start = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            table, _ = api.ncu(case, top=4, out_dir=tmp, per_config=per_config)
    except PerflabError as exc:
        print(f"ncu_per_config: {exc}", file=sys.stderr)
        sys.exit(2)
    seconds = time.perf_counter() - start
    kernels = [{"name": r["name"], "dram_pct": r["dram_throughput_pct"], "duration_us": r["duration_ns"] / 1e3,
                "gbps": r["dram_bytes"] / r["duration_ns"], "launches": count(r["launches"]), "profiled": count(r["profiled"])}
               for r in table.to_dict(orient="records")]
    results.append({"case": case.label(), "per_config": per_config, "seconds": seconds, "kernels": kernels})
    print(f"{case.label()}  per_config={per_config}  {seconds:.1f} s", flush=True)
    for k in kernels:
        print(f"  {k['name'][:48]:48s} DRAM {k['dram_pct']:5.1f}%  {k['duration_us']:8.2f} us  {k['gbps']:6.0f} GB/s  "
              f"{k['launches']} launches, {k['profiled']} profiled", flush=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
