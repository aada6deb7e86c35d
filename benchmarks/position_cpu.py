"""The position effect of interleaved blocks on the CPU, in one process: two copies of a tiny model timed in balanced
interleaved rounds (``measure.interleave.time_interleaved``, as `ab`'s blocks pairing times them), with the host canary
before each round (as perflab did), before the first round and after the last (as it does now) or not at all, and with
0, 1, 3 (``--warm``) untimed warm steps before each block. Per setting, the block
timed first in a round ÷ the block beside it (median and geometric mean over the rounds): 1 where position does not
matter. The settings take turns, a session of ``--rounds`` rounds each, ``--sessions`` times, so the host's load falls
on all alike.

    PYTHONPATH=src python benchmarks/position_cpu.py --out position.json [--rounds 40] [--sessions 10] [--steps 5]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from torch import nn  # noqa: E402

from perflab.measure.canary import host_canary  # noqa: E402
from perflab.measure.interleave import balanced_order, time_interleaved  # noqa: E402


class Net(nn.Module):  # benchmarks/ab_aa_cpu.py's tiny model
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(3 * 8 * 8, 96)
        self.head = nn.Linear(96, 10)

    def forward(self, x):
        b = x.shape[0]
        tokens = x.unfold(2, 8, 8).unfold(3, 8, 8).reshape(b, 3, -1, 64).permute(0, 2, 1, 3).reshape(b, -1, 192)
        h = self.proj(tokens)
        return self.head((h @ h.transpose(1, 2) @ h).mean(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--sessions", type=int, default=10)
    parser.add_argument("--steps", type=int, default=5, help="steps a block (the ab benchmark's tiny case: 40 iters in 8 blocks)")
    parser.add_argument("--batch-size", type=int, default=1, help="1: the ab benchmark's tiny case; 8: its heavier one")
    parser.add_argument("--warm", type=int, nargs="+", default=[0, 1, 3], help="untimed steps before each block, each a setting")
    args = parser.parse_args()
    torch.set_num_threads(1)
    x = torch.randn(args.batch_size, 3, 64, 64)
    models = [Net().eval(), Net().eval()]
    models[1].load_state_dict(models[0].state_dict())
    steps = [lambda m=m: m(x) for m in models]
    for step in steps:
        for _ in range(20):
            step()
    settings = [(canary, warm) for canary in ("each round", "before and after", "none") for warm in args.warm]
    logs: dict = {f"canary {c}, warm {w}": [] for c, w in settings}
    schedule = [[(i, args.steps) for i in balanced_order([0, 1], r)] for r in range(args.rounds)]
    with torch.no_grad():
        for _ in range(args.sessions):
            for canary, warm in settings:
                session = time_interleaved(steps, schedule, enter=lambda i: contextlib.nullcontext(), device="cpu", warm=warm,
                                           canary=(lambda: host_canary(5).median_us) if canary != "none" else None,
                                           canary_each_round=canary == "each round")
                a, b = session.blocks
                for r, (ba, bb) in enumerate(zip(a, b)):
                    first, second = (ba, bb) if schedule[r][0][0] == 0 else (bb, ba)
                    logs[f"canary {canary}, warm {warm}"].append(math.log(first.ms_per_step / second.ms_per_step))
    result = {"command": " ".join(["position_cpu.py", *sys.argv[1:]]), "when": time.strftime("%Y-%m-%d %H:%M"),
              "load": os.getloadavg(), "rounds_each": {k: len(v) for k, v in logs.items()},
              "first_over_second_median": {k: math.exp(statistics.median(v)) for k, v in logs.items()},
              "first_over_second_geomean": {k: math.exp(statistics.fmean(v)) for k, v in logs.items()}}
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
