"""Does the harness add time? Its median against a bare CUDA-event loop around the same model (GPU).

    PYTHONPATH=src python benchmarks/harness_overhead.py [--out FILE.json]

For each setting, the bare loop and the harness run alternately (3 rounds each), so that clock or
thermal drift hits both alike. The bare loop: the same model, input and contexts (no_grad + autocast),
warm-up, then one start event, N steps, one end event, one synchronize; ms per step. The harness:
perflab's run_case with the same warm-up and a comparable number of timed steps.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from perflab.measure.harness import run_case
from perflab.models.registry import build_model
from perflab.runtime.inputs import image_batch
from perflab.runtime.modes import make_step
from perflab.runtime.precision import precision
from perflab.spec import Case, validate_case

SETTINGS = [
    dict(model="deit_base_patch16_224", batch_size=1, dtype="bf16", mode="eager"),
    dict(model="deit_base_patch16_224", batch_size=1, dtype="bf16", mode="cudagraph"),
    dict(model="deit_base_patch16_224", batch_size=64, dtype="bf16", mode="eager"),
    dict(model="topk_deit_base_patch16_224", batch_size=1, dtype="bf16", mode="eager", keep_rate=(0.1,), reduction_loc=(3, 6, 9)),
]


def bare_loop_ms(case: Case, iters: int) -> float:
    torch.manual_seed(case.seed)
    model, _ = build_model(case)
    model = model.cuda()
    x = image_batch(case.batch_size, case.input_size, "cuda", case.seed)
    with torch.no_grad(), precision(case.dtype, "cuda"):
        step = make_step(model, x, case.mode)
        for _ in range(case.warmup + 1):
            step()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            step()
        end.record()
        torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    results = []
    for setting in SETTINGS:
        case = validate_case(Case(device="cuda", min_time=1.0, **setting))
        bare, harness = [], []
        for _ in range(args.rounds):
            row = run_case(case)
            harness.append(row["median_ms"])
            bare.append(bare_loop_ms(case, row["timed_iters"]))
        bare_ms, harness_ms = statistics.median(bare), statistics.median(harness)
        results.append(dict(case=case.label(), bare_ms=bare_ms, harness_ms=harness_ms, ratio=harness_ms / bare_ms, bare_rounds=bare, harness_rounds=harness))
        print(f"{case.label():60s} bare {bare_ms:8.4f} ms  harness {harness_ms:8.4f} ms  harness/bare {harness_ms / bare_ms:.4f}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
