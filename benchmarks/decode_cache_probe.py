"""The decode cache's length against its kernels (issue 23): one llama3_8b layer (layers only), bf16, one decode
step at context 512 and 4096, batch 1/8/64, with a cache of context + 1 positions (as perflab allocated it before
2026-11-26) and of that rounded up to a multiple of 8 (gpt-fast's setup_caches, and perflab's now). Per cell:
eager and torch.compile (default) step times (median of 50 single calls, CUDA events around each, so the host's
launch time is in them), and the eager step's three kernels with the most GPU time (torch.profiler, 3 steps).

    PYTHONPATH=src python benchmarks/decode_cache_probe.py      # a CUDA GPU; about 1 minute on an H100

docs/performance/decode.md has the H100's output."""
import sys

import torch

from perflab.measure.ceilings import _time_cuda
from perflab.models.llama import Llama, LlamaConfig, llama_configs
from perflab.workloads.decode import fill_caches

if not torch.cuda.is_available():
    print("decode_cache_probe: needs a CUDA GPU (it times cuBLAS's kernels for each cache length)", file=sys.stderr)
    sys.exit(2)
torch.manual_seed(0)
cfg = LlamaConfig(**dict(llama_configs["llama3_8b"], n_layers=1))
model = Llama(cfg, layers_only=True).to(device="cuda", dtype=torch.bfloat16).eval().requires_grad_(False)


def time_ms(fn, n=50):
    """Median ms of ``n`` single calls, CUDA events around each, after 10 untimed (the ceilings' timer)."""
    return _time_cuda(fn, n, warmup=10) * 1000.0


def top(fn, k=3):
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
    ev = sorted(p.key_averages(), key=lambda e: -e.device_time_total)[:k]
    return "; ".join(f"{e.key[:40]} {e.device_time_total / 3:.0f}us" for e in ev)


for ctx in (512, 4096):
    for batch in (1, 8, 64):
        for length in (ctx + 1, (ctx + 1 + 7) // 8 * 8):
            model.setup_caches(batch, length, torch.bfloat16, device="cuda")
            fill_caches(model, 0)
            x = torch.randn(batch, 1, cfg.dim, device="cuda", dtype=torch.bfloat16) * 0.5
            pos = torch.tensor([ctx], device="cuda")
            eager = lambda: model(x, pos)
            e = time_ms(eager)
            torch._dynamo.reset()
            comp = torch.compile(model)
            c = time_ms(lambda: comp(x, pos))
            print(f"ctx {ctx} bs {batch} cache {length}: eager {e:.3f} ms, compile {c:.3f} ms | {top(eager)}", flush=True)
