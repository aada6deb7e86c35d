"""Speed of perflab's DeiT-B against timm's, measured by the same harness at the same settings (GPU).

    PYTHONPATH=src python benchmarks/vs_timm.py [--out FILE.jsonl]

ratio = timm median / perflab median: above 1, ours is faster.
"""

from __future__ import annotations

import argparse

from perflab import api
from perflab.report.export import write_rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    args = parser.parse_args()
    cases = api.make_cases(
        model=["deit_base_patch16_224", "timm:deit_base_patch16_224"], batch_size=[1, 64], dtype=["bf16", "fp32"],
        mode=["eager", "cudagraph"], device="cuda",
    )
    rows = api.bench(cases)
    if args.out:
        write_rows(rows, args.out)
    ours = {(r["batch_size"], r["dtype"], r["mode"]): r for r in rows if r["model"] == "deit_base_patch16_224"}
    print(f"{'bs':>3} {'dtype':5} {'mode':10} {'perflab ms':>11} {'timm ms':>9} {'timm/perflab':>13}")
    for r in rows:
        if r["model"].startswith("timm:"):
            o = ours[(r["batch_size"], r["dtype"], r["mode"])]
            if r["status"] == "ok" and o["status"] == "ok":
                print(f"{r['batch_size']:>3} {r['dtype']:5} {r['mode']:10} {o['median_ms']:11.4f} {r['median_ms']:9.4f} {r['median_ms'] / o['median_ms']:13.4f}")
            else:
                print(f"{r['batch_size']:>3} {r['dtype']:5} {r['mode']:10} {o['status']} / {r['status']}: {o.get('message') or r.get('message')}")


if __name__ == "__main__":
    main()
