"""A plain data-parallel training script, as a user writes one: perflab's gpt_large (the model only), bf16 autocast,
sequence 512, batch 4 per GPU, fused AdamW, ``torch.compile(DDP(model))`` with torch's default dynamo settings (its
recompile limit untouched). It times itself with CUDA events and prints each step's time, so that ``perflab run``'s
figures can be set beside its own.

    torchrun --nproc-per-node 2 benchmarks/programs/compiled_ddp.py --compile
    python -m perflab run --nproc 2 --skip 10 --steps 20 -- benchmarks/programs/compiled_ddp.py --compile
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from perflab.models.lm import GPT, LMConfig

parser = argparse.ArgumentParser()
parser.add_argument("--compile", action="store_true")
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--model", default="gpt_large")
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
times = []
for step in range(args.steps):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
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
late = sorted(times[args.steps // 2:])
print(f"rank {rank}: own median of steps {args.steps // 2}-{args.steps - 1}: {late[len(late) // 2]:.2f} ms", flush=True)
if distributed:
    dist.destroy_process_group()
