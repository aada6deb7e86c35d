"""Speed of perflab's DeiT-B against timm's, measured by the same harness at the same settings (GPU).

    PYTHONPATH=src python benchmarks/vs_timm.py [--batch-size 1 64] [--dtype bf16 fp32] [--mode eager cudagraph] [--no-pin] [--out FILE.jsonl]

ratio = timm median / perflab median: above 1, ours is faster. Each pair is measured back to back in one
process, in the same mode (eager bs1 alone: ``--batch-size 1 --mode eager --dtype bf16``, about 20 s).
"""

from __future__ import annotations

import argparse

from perflab import api
from perflab.report.export import write_rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    parser.add_argument("--batch-size", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--dtype", nargs="+", default=["bf16", "fp32"])
    parser.add_argument("--mode", nargs="+", default=["eager", "cudagraph"])
    parser.add_argument("--no-pin", action="store_true", help="time with the timing thread unpinned")
    args = parser.parse_args()
    from perflab.errors import PerflabError

    try:
        cases = api.make_cases(
            model=["deit_base_patch16_224", "timm:deit_base_patch16_224"], batch_size=args.batch_size, dtype=args.dtype,
            mode=args.mode, device="cuda",
        )
    except PerflabError as exc:  # a bad --mode, --dtype or --batch-size: one line, not a traceback
        parser.error(str(exc))
    # perflab's case then timm's at each point, back to back (make_cases orders by model first)
    cases = sorted(cases, key=lambda c: (c.batch_size, c.dtype, c.mode, c.model.startswith("timm:")))
    rows = api.bench(cases, pin=not args.no_pin)
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
