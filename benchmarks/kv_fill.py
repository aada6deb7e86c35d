"""Decode's KV context fill (issue 23, P9): the old way (drawn on the CPU in fp32, converted, copied) against the
new one (``workloads.decode.fill_caches``: drawn in place on the buffer's device), per value.

    python benchmarks/kv_fill.py                      # one layer's K of llama3_8b at batch 8, context 4096, on the CPU
    python benchmarks/kv_fill.py --device cuda        # the same on a GPU

Each way is timed on a freshly allocated buffer (the first touch of its pages is part of a build), the best of
``--repeats``. docs/performance/sweep-cost.md has the figures.
"""

from __future__ import annotations

import argparse
import time

import torch

from perflab.runtime.device import synchronize
from perflab.workloads.decode import fill_caches


class _Cache(torch.nn.Module):
    def __init__(self, shape, dtype, device):
        super().__init__()
        self.register_buffer("k_cache", torch.empty(shape, dtype=dtype, device=device))


def old_fill(module: torch.nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _, buffer in module.named_buffers():
        buffer.copy_((torch.randn(buffer.shape, generator=generator) * 0.5).to(buffer.dtype))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    shape = (args.batch, 8, args.context + 1, 128)  # llama3_8b: 8 KV heads of 128
    n = torch.Size(shape).numel()
    for name, fill in (("old: CPU draw, copy", old_fill), ("new: in place on the device", fill_caches)):
        best = float("inf")
        for _ in range(args.repeats):
            module = _Cache(shape, torch.bfloat16, args.device)
            synchronize(args.device)
            t0 = time.perf_counter()
            fill(module, 0)
            synchronize(args.device)
            best = min(best, time.perf_counter() - t0)
            del module
        print(f"{name:30s} {n / 1e6:.1f} M values  {best:.3f} s  {best / n * 1e9:.2f} ns a value")


if __name__ == "__main__":
    main()
