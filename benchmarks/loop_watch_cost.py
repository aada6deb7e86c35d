"""What perflab run's watch on the whole loop costs the program: host µs per wrapped call, with the watch recording.

- a synchronising call: ``.item()`` of a CUDA scalar (each call waits for the GPU: the wrapper's cost is the time
  beside that wait), with and without the watch;
- a wait for input: ``next()`` of a DataLoader over a tensor already in memory (the wrapper records two step-clock
  stamps, CUDA events on a GPU, and counts the batch), with and without the watch;
- GPM's sample and NVML's utilization read at the timed window's edges (once each a run).

The cost a step is (wrapped calls a step × µs a call) ÷ the step: ``benchmarks/whole_loop_table.py`` prints it per
program from its run.json.

    PYTHONPATH=src python benchmarks/loop_watch_cost.py --calls 20000 --out cost.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

from perflab.clock import StepClock
from perflab.program.loop import LoopWatch


def per_call_us(fn, calls: int) -> float:
    for _ in range(min(calls // 10, 1000)):
        fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    scalar = torch.ones((), device=device)
    loader = DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=1)

    def next_batch(state={"it": None}):
        try:
            return next(state["it"])
        except (StopIteration, TypeError):
            state["it"] = iter(loader)
            return next(state["it"])

    out = {"device": torch.cuda.get_device_name() if cuda else "cpu", "calls": args.calls}
    out["item_alone_us"] = per_call_us(scalar.item, args.calls)
    out["next_alone_us"] = per_call_us(next_batch, args.calls)
    clock = StepClock(cuda)
    watch = LoopWatch(clock=lambda: clock)
    if not cuda:  # on the CPU no tensor synchronises: count the CPU scalar's calls as the watch counts a CUDA one's
        import perflab.program.loop as loop

        loop.synchronises = lambda tensor: True
    watch.install()
    watch.active = True
    try:
        out["item_watched_us"] = per_call_us(scalar.item, args.calls)
        out["next_watched_us"] = per_call_us(next_batch, args.calls)
        watch.take()
    finally:
        watch.remove()
    out["item_cost_us"] = out["item_watched_us"] - out["item_alone_us"]
    out["next_cost_us"] = out["next_watched_us"] - out["next_alone_us"]
    if cuda:
        from perflab.measure.gpu_busy import open_busy_meter

        meter, why = open_busy_meter("cuda", torch.cuda.current_device())
        if meter is not None:
            t0 = time.perf_counter()
            meter.start()
            start_ms = (time.perf_counter() - t0) * 1e3
            time.sleep(0.5)
            t0 = time.perf_counter()
            reading = meter.stop()
            out.update(busy_start_ms=start_ms, busy_stop_ms=(time.perf_counter() - t0) * 1e3, gpm_sample_ms=reading.get("gpm_sample_ms"))
        else:
            out["busy_why"] = why
    print(json.dumps(out, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
