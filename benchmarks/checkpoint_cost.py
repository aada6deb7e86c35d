"""Activation checkpointing per model size: memory saved against time added, both measured.

    PYTHONPATH=src python benchmarks/checkpoint_cost.py checkpoint_cost.md
        [--sizes gpt_small gpt_medium gpt_large] [--workload train_step] [--seq-len 512] [--batch-size 4] [--dtype bf16]
        [--modes eager compile:reduce-overhead] [--min-time 1.0] [--warmup 10] [--device cuda] [--layers N] [--json FILE]
        [--after compile:reduce-overhead] [--alone]

For each size and mode, the plain step and the checkpointed one (``--checkpoint-activations``: each block keeps only its
input and runs its forward again in the backward) are built, warmed and timed together, interleaved (``perflab bench``'s
harness), so the time added is a paired ratio of blocks timed next to each other. Memory, two ways:

- the harness's peak of each row (``peak_mem_alloc_mb``: on a GPU, what the case holds plus its largest rise during a
  timed block, above what the process held before it was built);
- for eager, a memory pass of its own per case (``perflab.measure.memory.step_memory``): the peak over two steps and the
  activations the forward leaves for the backward (the CUDA allocator on a GPU, live tensor bytes on the CPU).

``--after compile:reduce-overhead`` first runs each size's plain step in that mode alone and reports what it leaves
allocated once it is gone (dynamo's cache keeps a reduce-overhead case's CUDA-graph pool): the state in which
explain_training.py read checkpointing's 37.4 GiB peak (issue 25); ``--alone`` then times each case alone, as it did. The
rows' peaks are above what the process held before each case (``held before``, ``memory_baseline_mb``).

The table also gives the host and GPU time of each step (held timing), since an eager checkpoint's cost is mostly host
work: torch's non-reentrant checkpoint calls Python hooks for every tensor a block saves (CPU: about 3.5 forwards of host
time added, not one). The markdown file is rewritten after each size, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

START = time.perf_counter()
GIB = 2**30


def log(message: str) -> None:
    print(f"[{time.perf_counter() - START:7.1f} s] {message}", file=sys.stderr, flush=True)


def _gib(mb) -> str:
    return "–" if mb is None else f"{mb / 1024:.2f}"


def leftover_after(model: str, mode: str, args) -> dict:
    """Run the plain case of ``model`` in ``mode`` alone, as explain_training.py ran its modes before its fixes, and
    measure what the process still holds once it is gone (its rows, the gc and the allocator's cache emptied):
    issue 25's 37.4 GiB checkpoint peak was read after such a case, before peaks were taken above that baseline."""
    import gc

    import torch

    from perflab import api
    from perflab.measure.harness import run_case

    case, = api.make_cases(model=[model], workload=[args.workload], seq_len=[args.seq_len], batch_size=[args.batch_size], dtype=[args.dtype],
                           mode=[mode], device=args.device, warmup=args.warmup, min_time=args.min_time, layers=args.layers)
    cuda = args.device == "cuda"
    before = torch.cuda.memory_allocated() if cuda else None
    row = run_case(case)
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    left = torch.cuda.memory_allocated() - before if cuda else None
    return {"mode": mode, "status": row.get("status"), "median_ms": row.get("median_ms"), "left_mib": left / 2**20 if left is not None else None}


def measure_size(model: str, mode: str, args) -> dict:
    """The plain and checkpointed cases of one size and mode, timed together (and, with --alone, each timed alone, as
    explain_training.py times them); their memory passes (eager)."""
    from perflab import api
    from perflab.measure.memory import step_memory
    from perflab.stats import paired_ratio

    common = dict(model=[model], workload=[args.workload], seq_len=[args.seq_len], batch_size=[args.batch_size], dtype=[args.dtype],
                  mode=[mode], device=args.device, warmup=args.warmup, min_time=args.min_time, layers=args.layers)
    plain_case, = api.make_cases(**common)
    ckpt_case, = api.make_cases(**common, checkpoint_activations=True)
    out = {"model": model, "mode": mode}
    if args.after:
        out["after"] = leftover_after(model, args.after, args)
        log(f"  {args.after} left {out['after']['left_mib']} MiB allocated after it ended")
    plain, ckpt = api.bench([plain_case, ckpt_case], interleave=not args.alone)
    out.update(plain=plain, checkpoint=ckpt)
    if plain.get("status") == "ok" and ckpt.get("status") == "ok":
        out["paired"] = paired_ratio(plain, ckpt)  # checkpoint ÷ plain, blocks timed next to each other
    if mode == "eager":
        out["memory_pass"] = {"plain": step_memory(plain_case), "checkpoint": step_memory(ckpt_case)}
    return out


def table(results: list[dict]) -> str:
    from perflab.report.md import md_table, num

    header = ["model", "params M", "mode", "held before MiB", "plain ms", "checkpoint ms", "added ms", "× (paired, 95% CI)", "plain peak GiB", "checkpoint peak GiB",
              "saved GiB", "saved %", "GiB saved per ms added", "memory pass: peak GiB plain → ckpt", "activations GiB plain → ckpt",
              "host ms plain → ckpt", "GPU ms plain → ckpt"]
    rows = []
    for r in results:
        p, c = r["plain"], r["checkpoint"]
        if p.get("status") != "ok" or c.get("status") != "ok":
            rows.append([r["model"], "–", r["mode"], "–", p.get("status"), c.get("status")] + ["–"] * (len(header) - 6))
            continue
        added = c["median_ms"] - p["median_ms"]
        pm, cm = p.get("peak_mem_alloc_mb"), c.get("peak_mem_alloc_mb")
        mp = r.get("memory_pass")
        if pm is None and mp:  # the CPU: no allocator statistics, the memory pass's live tensor bytes
            pm, cm = mp["plain"]["peak"] / 2**20, mp["checkpoint"]["peak"] / 2**20
        saved = pm - cm if pm is not None and cm is not None else None
        pair = r.get("paired")
        rows.append([
            r["model"], f"{p['params_m']:.1f}", r["mode"], num(p.get("memory_baseline_mb"), ".0f"), f"{p['median_ms']:.3f}", f"{c['median_ms']:.3f}", f"{added:+.3f}",
            f"{pair['ratio']:.3f} ({pair['ci95'][0]:.3f}–{pair['ci95'][1]:.3f})" if pair else f"{c['median_ms'] / p['median_ms']:.3f} (unpaired)",
            _gib(pm), _gib(cm), _gib(saved), num(saved / pm if saved is not None and pm else None, ".1%"),
            num(saved / 1024 / added if saved is not None and added > 0 else None, ".3f"),
            f"{mp['plain']['peak'] / GIB:.2f} → {mp['checkpoint']['peak'] / GIB:.2f}" if mp else "–",
            f"{mp['plain']['activation_bytes'] / GIB:.3f} → {mp['checkpoint']['activation_bytes'] / GIB:.3f}" if mp else "–",
            f"{num(p.get('host_held_ms') or p.get('host_issue_ms'), '.2f')} → {num(c.get('host_held_ms') or c.get('host_issue_ms'), '.2f')}",
            f"{num(p.get('device_ms'), '.2f')} → {num(c.get('device_ms'), '.2f')}",
        ])
    return md_table(header, rows)


def write(path: Path, results: list[dict], args, device: str) -> None:
    caption = (f"Activation checkpointing, {args.workload} seq {args.seq_len} batch {args.batch_size} {args.dtype}, {device}. Each pair timed "
               "together (interleaved); × = checkpoint ÷ plain over blocks timed next to each other. Peaks: the harness's "
               "(above what the process held before each case); the memory pass: each eager case alone, two steps "
               "(the CUDA allocator on a GPU, live tensor bytes on the CPU).")
    after = [f"{r['model']}: {r['after']['mode']} ({r['after']['median_ms']} ms) left {r['after']['left_mib']:.0f} MiB allocated after it ended"
             for r in results if r.get("after") and r["after"].get("left_mib") is not None]
    notes = ("\n\nMemory a compiled case leaves behind in the process (the rows' peaks are taken above it, `held before`): "
             + "; ".join(after) + ".") if after else ""
    path.write_text(f"{caption}\n\n{table(results)}{notes}\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("markdown", type=Path, help="Markdown file to write (rewritten after each size).")
    parser.add_argument("--sizes", nargs="+", default=["gpt_small", "gpt_medium", "gpt_large"])
    parser.add_argument("--workload", default="train_step")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--modes", nargs="+", default=["eager"])
    parser.add_argument("--min-time", type=float, default=1.0)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--layers", type=int, default=None, help="Override each size's depth (a quick run).")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--after", default=None, help="First run each size's plain case in this mode alone (e.g. compile:reduce-overhead) "
                                                      "and report what it leaves allocated: issue 25's checkpoint peak, reproduced.")
    parser.add_argument("--alone", action="store_true", help="Time plain and checkpoint each alone (sequential), as explain_training.py does.")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    from perflab.errors import PerflabError

    try:
        from perflab import api

        for model in args.sizes:  # bad input fails now, not after minutes
            for mode in args.modes:
                api.make_cases(model=[model], workload=[args.workload], seq_len=[args.seq_len], batch_size=[args.batch_size], dtype=[args.dtype],
                               mode=[mode], device=args.device, layers=args.layers, checkpoint_activations=True)
    except PerflabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import torch

    device = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    results = []
    for model in args.sizes:
        for mode in args.modes:
            log(f"{model} {mode}: plain and checkpoint, timed together")
            results.append(measure_size(model, mode, args))
            write(args.markdown, results, args, device)
            r = results[-1]
            log(f"  plain {r['plain'].get('median_ms')} ms, peak {r['plain'].get('peak_mem_alloc_mb')} MiB; checkpoint "
                f"{r['checkpoint'].get('median_ms')} ms, peak {r['checkpoint'].get('peak_mem_alloc_mb')} MiB; paired {r.get('paired')}")
    if args.json:
        slim = [{k: v for k, v in r.items() if k not in ("plain", "checkpoint")} | {
            side: {k: r[side].get(k) for k in ("status", "median_ms", "peak_mem_alloc_mb", "memory_baseline_mb", "host_held_ms", "host_issue_ms",
                                               "device_ms", "params_m", "first_step_s")} for side in ("plain", "checkpoint")} for r in results]
        args.json.write_text(json.dumps(slim))
    print(args.markdown.read_text())
    log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
