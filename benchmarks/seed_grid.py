"""The seed grid on the GPU: 224/448 × bs 1/8/64 × baseline/top-k × eager/cudagraph × bf16/fp32.

    PYTHONPATH=src python benchmarks/seed_grid.py [--out FILE.jsonl] [--modes eager cudagraph ...]

Prints a markdown table (baseline and top-k throughput, speedup, whether the 95% CIs separate) for
docs/performance/token-reduction.md.
"""

from __future__ import annotations

import argparse

from perflab import api
from perflab.report.export import write_rows
from perflab.report.tables import speedup_rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    parser.add_argument("--modes", nargs="+", default=["eager", "cudagraph"])
    parser.add_argument("--dtypes", nargs="+", default=["bf16", "fp32"])
    args = parser.parse_args()
    cases = api.make_cases(
        model=["deit_base_patch16_224", "topk_deit_base_patch16_224"], keep_rate=[0.1], reduction_loc=[3, 6, 9],
        input_size=[224, 448], batch_size=[1, 8, 64], dtype=args.dtypes, mode=args.modes, device="cuda",
    )
    rows = api.bench(cases)
    if args.out:
        write_rows(rows, args.out)
    print("| input | bs | dtype | mode | baseline ms | top-k ms | baseline img/s | top-k img/s | speedup | flags |")
    print("|---:|---:|---|---|---:|---:|---:|---:|---:|---|")
    for p in sorted(speedup_rows(rows), key=lambda p: (p["dtype"], p["input_size"], p["batch_size"], p["mode"])):
        if p["speedup"] is None:
            print(f"| {p['input_size']} | {p['batch_size']} | {p['dtype']} | {p['mode']} | {p['baseline_status']} | {p['variant_status']} | | | | |")
            continue
        sig = "" if p["significant"] else " (CIs overlap)"
        print(
            f"| {p['input_size']} | {p['batch_size']} | {p['dtype']} | {p['mode']} | {p['baseline_ms']:.3f} | {p['variant_ms']:.3f} | "
            f"{p['baseline_tp']:.1f} | {p['variant_tp']:.1f} | {p['speedup']:.2f}×{sig} | {' '.join(p['flags'])} |"
        )


if __name__ == "__main__":
    main()
