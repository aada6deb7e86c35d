"""A plain data-parallel training script, as a user writes one: perflab's gpt_large (the model only), bf16 autocast,
sequence 512, batch 4 per GPU, fused AdamW, ``torch.compile(DDP(model))`` with torch's default dynamo settings (its
recompile limit untouched). It times itself with CUDA events and prints its median step, so that ``perflab run``'s
figures can be set beside its own. ``--no-sync-steps N`` then runs N more steps under DDP's ``no_sync()`` (no gradient
all-reduce) and prints their median: the step's cost of communication, measured without a profiler.

    torchrun --nproc-per-node 2 benchmarks/programs/compiled_ddp.py --compile
    python -m perflab run --nproc 2 --skip 10 --steps 20 -- benchmarks/programs/compiled_ddp.py --compile
    python -m perflab run --nproc 1,2 --skip 10 --steps 20 -- benchmarks/programs/compiled_ddp.py --compile --no-sync-steps 20
"""

import argparse
import contextlib
import os
import statistics

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from perflab.models.lm import GPT, LMConfig

parser = argparse.ArgumentParser()
parser.add_argument("--compile", action="store_true")
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--model", default="gpt_large")
parser.add_argument("--no-sync-steps", type=int, default=0, help="after --steps, this many steps without the all-reduce (DDP only)")
args = parser.parse_args()

distributed = "RANK" in os.environ
if distributed:
    dist.init_process_group("nccl")
    local = int(os.environ["LOCAL_RANK"])
else:
    local = 0
torch.cuda.set_device(local)
torch.manual_seed(0)
model = GPT(LMConfig.from_name(args.model)).cuda()
if distributed:
    model = DDP(model, device_ids=[local])
if args.compile:
    model = torch.compile(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
tokens = torch.randint(0, 10_000, (4, 513), device="cuda")
x, y = tokens[:, :-1], tokens[:, 1:]
no_sync_steps = args.no_sync_steps if distributed else 0
times = []
for step in range(args.steps + no_sync_steps):
    # model.no_sync reaches DDP through torch.compile's wrapper; gradients then stay local to each rank
    synced = step < args.steps
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    with contextlib.nullcontext() if synced else model.no_sync():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
        loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    end.record()
    end.synchronize()
    times.append(start.elapsed_time(end))
rank = dist.get_rank() if distributed else 0

# the middle half of the synchronised steps: past compilation, before a profiler that perflab starts near the end
first, last = args.steps // 4, 3 * args.steps // 4
print(f"rank {rank}: own median of steps {first}-{last - 1}: {statistics.median(times[first:last]):.2f} ms", flush=True)
if no_sync_steps:
    tail = times[args.steps + no_sync_steps // 2:]  # the second half: past any recompilation no_sync causes
    print(f"rank {rank}: own median without the all-reduce (no_sync), steps {args.steps + no_sync_steps // 2}-"
          f"{args.steps + no_sync_steps - 1}: {statistics.median(tail):.2f} ms", flush=True)
blocks = [f"{statistics.median(times[i:i + 10]):.1f}" for i in range(0, len(times), 10)]
print(f"rank {rank}: median of each 10 steps: {' '.join(blocks)} ms", flush=True)
if distributed:
    dist.destroy_process_group()
