"""Capture the small, real Kineto traces committed under tests/data/traces (run on a GPU machine).

    PYTHONPATH=src python tests/data/capture_traces.py OUTDIR

Each trace covers a few steps of a small workload, so that it stays well under 2 MiB compressed:
  eager_vit       perflab's topk DeiT-Tiny, bf16, eager, model stages annotated, ProfilerStep windows
  compile_block   a transformer block under torch.compile (Triton kernels launched through cuLaunchKernel)
  cudagraph_vit   DeiT-Tiny captured in a CUDA graph and replayed (kernels launched by cudaGraphLaunch)
  reduce_overhead torch.compile(mode="reduce-overhead") (Triton kernels inside CUDA graph replays)
  two_streams     matmuls on two streams at once, no ProfilerStep annotations
  train_step      forward, backward, AdamW step, and a loss.item() (memcpy DtoH + sync), with memsets
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from perflab.models.registry import build_model
from perflab.spec import Case

ACTIVITIES = [ProfilerActivity.CPU, ProfilerActivity.CUDA]


def profile_steps(path: Path, step, steps: int = 3, warmup: int = 1, use_schedule: bool = True) -> None:
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    if use_schedule:
        # repeat=1 and on_trace_ready: export the active window itself (after the window, an endless
        # schedule starts a new cycle, and a later export would hold only that cycle's few events).
        sched = schedule(wait=0, warmup=warmup, active=steps, repeat=1)
        with profile(activities=ACTIVITIES, record_shapes=True, schedule=sched, on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as prof:
            for _ in range(warmup + steps):
                with record_function("step"):
                    step()
                torch.cuda.synchronize()
                prof.step()
        print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")
        return
    else:
        with profile(activities=ACTIVITIES, record_shapes=True) as prof:
            for _ in range(steps):
                step()
            torch.cuda.synchronize()
        prof.export_chrome_trace(str(path))
    print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")


def vit(model="topk_deit_tiny_patch16_224"):
    kw = dict(keep_rate=(0.5,), reduction_loc=(3, 6, 9)) if model.startswith("topk") else {}
    model, _ = build_model(Case(model, device="cuda", **kw))
    return model.cuda()


class TransformerBlock(nn.Module):
    def __init__(self, dim=256, heads=4):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


def main(outdir: str) -> None:
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)

    model = vit()
    model.annotate = True
    x = torch.randn(1, 3, 224, 224, device="cuda")
    with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
        profile_steps(out / "eager_vit.json.gz", lambda: model(x))
    model.annotate = False

    block = TransformerBlock().cuda()
    xb = torch.randn(8, 64, 256, device="cuda")
    compiled = torch.compile(block)
    with torch.inference_mode():
        profile_steps(out / "compile_block.json.gz", lambda: compiled(xb))

    plain = vit("deit_tiny_patch16_224")
    x = torch.randn(2, 3, 224, 224, device="cuda")
    with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                plain(x)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            plain(x)
        profile_steps(out / "cudagraph_vit.json.gz", graph.replay)

    ro = torch.compile(TransformerBlock().cuda(), mode="reduce-overhead")
    with torch.inference_mode():
        def ro_step():
            torch.compiler.cudagraph_mark_step_begin()
            return ro(xb)

        profile_steps(out / "reduce_overhead.json.gz", ro_step)

    a = torch.randn(2048, 2048, device="cuda")
    b = torch.randn(2048, 2048, device="cuda")
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()

    def two_streams():
        with torch.cuda.stream(s1):
            for _ in range(4):
                a @ a
        with torch.cuda.stream(s2):
            for _ in range(4):
                torch.relu(b @ b)
        torch.cuda.synchronize()

    profile_steps(out / "two_streams.json.gz", two_streams, steps=2, use_schedule=False)

    net = nn.Sequential(nn.Linear(512, 1024), nn.GELU(), nn.Linear(1024, 10)).cuda()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    data = torch.randn(64, 512, device="cuda")
    target = torch.randint(0, 10, (64,), device="cuda")

    def train_step():
        opt.zero_grad(set_to_none=False)  # zero_grad without set_to_none launches memsets/fills
        loss = nn.functional.cross_entropy(net(data), target)
        loss.backward()
        opt.step()
        return loss.item()

    profile_steps(out / "train_step.json.gz", train_step)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/traces")
