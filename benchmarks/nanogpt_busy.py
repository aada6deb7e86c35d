"""An independent measure of how much of nanoGPT's training step its GPU work fills, to hold ``perflab run``'s verdict
against: nanoGPT's own model (``model.py``, GPT-2 124M at block 1024, bf16 autocast, ``torch.compile``, fused AdamW, TF32,
gradient clipping, one ``loss.item()`` a step, as its ``train.py`` runs it) in a plain loop that does not import perflab.

1. The untraced step: CUDA events around each of ``--steps`` steps after ``--warmup``; the median.
2. A CUDA-only torch.profiler trace (no CPU operators, no shapes: the least a profiler costs) of ``--traced`` steps after
   its own warm-up of 3 (``torch.profiler.schedule``), each step timed by events too.
3. The trace read here with ``json`` (not perflab's reader): the union of its kernels', memcpys' and memsets' intervals,
   ÷ (traced steps × the untraced median): the GPU busy share of the untraced step.

4. With ``--settings``, what each profiler setting costs the step: per setting, untraced steps and then a profiler
   session (its warm-up of 3 thrown away) recording that setting, each step timed by events; traced ÷ untraced.

    python benchmarks/nanogpt_busy.py --nanogpt /path/to/nanoGPT --gas 4 --out busy.json
    python benchmarks/nanogpt_busy.py --nanogpt /path/to/nanoGPT --gas 4 --settings cuda,ops,shapes,stack,shapes+stack --out cost.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch


def union_ns(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


SETTINGS = {"cuda": {}, "ops": {"cpu": True}, "shapes": {"cpu": True, "record_shapes": True},
            "stack": {"cpu": True, "with_stack": True}, "shapes+stack": {"cpu": True, "record_shapes": True, "with_stack": True}}


def setting_cost(name: str, timed, traced: int) -> dict:
    """One profiler setting's cost: untraced steps just before, then a session recording ``name``, steps timed alike."""
    options = dict(SETTINGS[name])
    activities = [torch.profiler.ProfilerActivity.CUDA] + ([torch.profiler.ProfilerActivity.CPU] if options.pop("cpu", False) else [])
    untraced = timed(traced * 2)
    sched = torch.profiler.schedule(wait=0, warmup=3, active=traced, repeat=1)
    with torch.profiler.profile(activities=activities, schedule=sched, on_trace_ready=lambda p: None, **options) as prof:
        steps = timed(3 + traced, between=prof.step)
    base, each = statistics.median(untraced), statistics.median(steps[3:])
    return {"setting": name, "untraced_median_ms": base, "traced_ms": steps[3:], "traced_warmup_ms": steps[:3], "traced_median_ms": each,
            "inflation": each / base}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nanogpt", type=Path, required=True)
    parser.add_argument("--gas", type=int, default=4, help="gradient accumulation steps (micro-batches a step)")
    parser.add_argument("--batch", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--traced", type=int, default=5)
    parser.add_argument("--settings", default="", help="comma-separated profiler settings to cost: cuda (CUDA only), ops (CPU operators "
                        "too), shapes (ops with record_shapes), stack (ops with with_stack), shapes+stack")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    sys.path.insert(0, str(args.nanogpt.resolve()))
    from model import GPT, GPTConfig  # nanoGPT's

    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    config = GPTConfig(block_size=1024, vocab_size=50304, n_layer=12, n_head=12, n_embd=768, dropout=0.0, bias=False)
    model = GPT(config).cuda()
    optimizer = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), "cuda")
    model = torch.compile(model)
    ctx = torch.amp.autocast(device_type="cuda", dtype=torch.bfloat16)
    x = torch.randint(0, 50257, (args.batch, 1024), device="cuda")
    y = torch.randint(0, 50257, (args.batch, 1024), device="cuda")

    def step() -> float:
        for _ in range(args.gas):
            with ctx:
                _, loss = model(x, y)
                loss = loss / args.gas
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    def timed(n: int, between=None) -> list[float]:
        out = []
        for _ in range(n):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            step()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b))
            if between is not None:
                between()
        return out

    timed(args.warmup)
    untraced = timed(args.steps)
    median = statistics.median(untraced)
    path = Path(tempfile.mkdtemp()) / "cuda_only.json.gz"
    sched = torch.profiler.schedule(wait=0, warmup=3, active=args.traced, repeat=1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA], schedule=sched,
                                on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as prof:
        traced = timed(3 + args.traced, between=prof.step)
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    work = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events
            if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    busy_us = union_ns(work)
    span_us = max(b for _, b in work) - min(a for a, _ in work) if work else 0.0
    result = {"gas": args.gas, "batch": args.batch, "untraced_ms": untraced, "untraced_median_ms": median,
              "traced_ms": traced[3:], "traced_warmup_ms": traced[:3], "traced_median_ms": statistics.median(traced[3:]),
              "inflation": statistics.median(traced[3:]) / median, "activities": len(work),
              "busy_ms_per_step": busy_us / 1e3 / args.traced, "busy_share_of_untraced_step": busy_us / 1e3 / args.traced / median,
              "busy_share_of_traced_span": busy_us / span_us if span_us else None, "gpu": torch.cuda.get_device_name()}
    result["settings"] = [setting_cost(name, timed, args.traced) for name in filter(None, args.settings.split(","))]
    for row in result["settings"]:
        print(f"{row['setting']:>13}: untraced {row['untraced_median_ms']:.3f} ms, traced {row['traced_median_ms']:.3f} ms, "
              f"×{row['inflation']:.3f}", flush=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if not isinstance(v, list)}, indent=1))


if __name__ == "__main__":
    main()
