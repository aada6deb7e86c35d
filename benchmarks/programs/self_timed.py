"""A training loop that times itself: CUDA events around each of its steps, and the median of steps SKIP..END printed
as ``own median ms: X``. benchmarks/run_overhead.py runs it alone and under ``perflab run`` to measure what perflab's
untimed hooks and events cost the steps it times.

    python benchmarks/programs/self_timed.py --steps 120 --skip 20 --width 1024 --layers 8
"""

import argparse
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=120)
parser.add_argument("--skip", type=int, default=20)
parser.add_argument("--width", type=int, default=1024)
parser.add_argument("--layers", type=int, default=8)
parser.add_argument("--batch", type=int, default=32)
args = parser.parse_args()

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
layers = []
for _ in range(args.layers):
    layers += [torch.nn.Linear(args.width, args.width), torch.nn.GELU(), torch.nn.LayerNorm(args.width)]
model = torch.nn.Sequential(*layers).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.randn(args.batch, args.width, device=device)
ends = []
for step in range(args.steps):
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if device == "cuda":
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        ends.append(event)
    else:
        ends.append(time.perf_counter())
if device == "cuda":
    torch.cuda.synchronize()
    times = sorted(a.elapsed_time(b) for a, b in zip(ends[args.skip:], ends[args.skip + 1:]))
else:
    times = sorted((b - a) * 1e3 for a, b in zip(ends[args.skip:], ends[args.skip + 1:]))
print(f"own median ms: {times[len(times) // 2]:.4f}", flush=True)
