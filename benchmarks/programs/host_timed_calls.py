"""A decode-like loop on the CPU that times each call of its step function with the host clock and prints the times
(ms, one JSON list) as its last line. ``--range NAME`` also puts each call in a ``record_function`` range NAME;
``--compiled`` compiles the step (the eager backend: dynamo is loaded, nothing is code-generated).
benchmarks/run_arming.py runs it alone and under ``perflab run --step``/``--step-range`` to measure what perflab adds
to the first step it times.

    python benchmarks/programs/host_timed_calls.py --calls 40
"""

import argparse
import json
import time

import torch
from torch.autograd.profiler import record_function

parser = argparse.ArgumentParser()
parser.add_argument("--calls", type=int, default=40)
parser.add_argument("--range", default=None)
parser.add_argument("--compiled", action="store_true")
args = parser.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)
w = torch.randn(256, 256)


def decode_step(x):
    for _ in range(8):
        x = torch.tanh(x @ w)
    return x


if args.compiled:
    decode_step = torch.compile(decode_step, backend="eager")
x = torch.randn(8, 256)
times = []
for _ in range(args.calls):
    t0 = time.perf_counter()
    if args.range:
        with record_function(args.range):
            x = decode_step(x)
    else:
        x = decode_step(x)
    times.append((time.perf_counter() - t0) * 1e3)
print(json.dumps(times))
