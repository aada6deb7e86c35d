"""Does the harness add time? Its median against a bare CUDA-event loop around the same model (GPU).

    PYTHONPATH=src python benchmarks/harness_overhead.py [--out FILE.json]

For each setting, the bare loop and the harness run alternately (5 rounds, the order swapped every
round), so that clock, power-cap or thermal drift hits both alike. The bare loop: the same model, input
and contexts (no_grad + autocast), warm-up, then a plain loop of the same number of steps with a CUDA
event recorded every `block` steps and one synchronize at the end. Two comparisons, like with like:
- median: the median of the bare loop's block means against the harness's reported median;
- mean: the bare loop's total time / steps against the harness's mean (its blocks are equal-sized).
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from perflab.measure.energy import NullMonitor
from perflab.measure.harness import run_case
from perflab.runtime.workload import warm_workload
from perflab.spec import Case, validate_case

SETTINGS = [
    dict(model="deit_base_patch16_224", batch_size=1, dtype="bf16", mode="eager"),
    dict(model="deit_base_patch16_224", batch_size=1, dtype="bf16", mode="cudagraph"),
    dict(model="deit_base_patch16_224", batch_size=64, dtype="bf16", mode="eager"),
    dict(model="topk_deit_base_patch16_224", batch_size=1, dtype="bf16", mode="eager", keep_rate=(0.1,), reduction_loc=(3, 6, 9)),
]


def bare_loop_ms(case: Case, n_blocks: int, block: int) -> tuple[float, float]:
    """(median of block means, whole-loop mean), ms per step."""
    with warm_workload(case) as work:
        events = [torch.cuda.Event(enable_timing=True) for _ in range(n_blocks + 1)]
        events[0].record()
        for b in range(n_blocks):
            for _ in range(block):
                work.step()
            events[b + 1].record()
        torch.cuda.synchronize()
    means = [events[i].elapsed_time(events[i + 1]) / block for i in range(n_blocks)]
    return statistics.median(means), events[0].elapsed_time(events[-1]) / (n_blocks * block)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", type=int, nargs="+", help="indices into SETTINGS to run")
    parser.add_argument("--no-nvml", action="store_true", help="run the harness without its NVML sampler thread (to measure that thread's cost)")
    args = parser.parse_args()
    monitor = NullMonitor("disabled for this benchmark") if args.no_nvml else None
    results = []
    for index, setting in enumerate(SETTINGS):
        if args.only and index not in args.only:
            continue
        case = validate_case(Case(device="cuda", min_time=1.0, **setting))
        plan = run_case(case, monitor=monitor)  # a first harness run fixes the number of steps the bare loop takes
        n_blocks, block = plan["n_samples"], plan["iters_per_sample"]
        rounds = []
        for i in range(args.rounds):
            if i % 2 == 0:
                row, bare = run_case(case, monitor=monitor), bare_loop_ms(case, n_blocks, block)
            else:
                bare, row = bare_loop_ms(case, n_blocks, block), run_case(case, monitor=monitor)
            rounds.append(dict(bare_median=bare[0], bare_mean=bare[1], harness_median=row["median_ms"], harness_mean=row["mean_ms"]))
        med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
        entry = dict(case=case.label(), nvml_sampler=not args.no_nvml, **med, median_ratio=med["harness_median"] / med["bare_median"], mean_ratio=med["harness_mean"] / med["bare_mean"], rounds=rounds)
        results.append(entry)
        print(
            f"{case.label():60s} median: bare {med['bare_median']:8.4f} harness {med['harness_median']:8.4f} ratio {entry['median_ratio']:.4f} | "
            f"mean: bare {med['bare_mean']:8.4f} harness {med['harness_mean']:8.4f} ratio {entry['mean_ratio']:.4f}",
            flush=True,
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
