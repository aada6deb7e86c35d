"""What torch.profiler's own calls cost the program's thread on a GPU: start, stop and the trace's export, for the
sessions ``perflab run`` opens (issue 55: perflab's work at a step boundary lands in the program's step), and what a
forked child's export costs the parent (the fork alone) against exporting in the program's process.

The workload is benchmarks/programs/compiled_gpt_sync.py's model, eager (more kernels a step than compiled): GPT-2
small, batch 8, 512 tokens, bf16 autocast, fused AdamW. Each session records ``--steps`` steps after a warm step::

    PYTHONPATH=src python benchmarks/profiler_costs_gpu.py --out profiler_costs.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

SESSIONS = {  # name: (activities, record_shapes)
    "cuda only (the accounted pass)": ([ProfilerActivity.CUDA], False),
    "cpu and cuda, shapes (the pass with shapes)": ([ProfilerActivity.CPU, ProfilerActivity.CUDA], True),
    "cpu only, shapes": ([ProfilerActivity.CPU], True),
}


def workload(compiled: bool = False, sync: bool = False):
    """One training step of the loop's model; ``compiled``: under ``torch.compile``; ``sync``: it reads the loss
    (``.item()``), as compiled_gpt_sync.py does every step."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=1024)
    model = GPT2LMHeadModel(config).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    forward = torch.compile(model) if compiled else model
    batch = torch.randint(0, config.vocab_size, (8, 512), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = forward(input_ids=batch, labels=batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item() if sync else loss

    return step


def ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1e3, 3)


def session(step, activities, shapes: bool, steps: int, folder: Path, name: str) -> dict:
    out = {}
    t0 = time.perf_counter()
    prof = profile(activities=activities, record_shapes=shapes)
    prof.start()
    out["start_ms"] = ms(t0)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    out["steps_ms"] = ms(t0)
    t0 = time.perf_counter()
    prof.stop()
    out["stop_ms"] = ms(t0)
    path = folder / f"{name}.json"
    t0 = time.perf_counter()
    prof.export_chrome_trace(str(path))
    out["export_ms"] = ms(t0)
    out["trace_mb"] = round(path.stat().st_size / 1e6, 2)
    return out, prof


def forked_export(prof, path: Path) -> dict:
    """The export in a forked child: the parent's cost is the fork; the child writes and leaves with os._exit."""
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        try:
            prof.export_chrome_trace(str(path))
            os._exit(0)
        except BaseException:
            os._exit(1)
    fork_ms = ms(t0)
    t0 = time.perf_counter()
    _, status = os.waitpid(pid, 0)
    wait_ms = ms(t0)
    ok = os.waitstatus_to_exitcode(status) == 0 and path.exists()
    events = len(json.loads(path.read_text())["traceEvents"]) if ok else None
    return {"fork_ms_in_parent": fork_ms, "child_export_ms": wait_ms, "child_ok": ok, "events": events}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    step = workload()
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    result = {"step_ms": round((time.perf_counter() - t0) * 1e3 / 5, 3), "sessions": {}}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for r in range(args.rounds):
            for name, (acts, shapes) in SESSIONS.items():
                costs, prof = session(step, acts, shapes, args.steps, folder, f"r{r}")
                if name.startswith("cuda only"):
                    costs["forked"] = forked_export(prof, folder / f"fork{r}.json")
                    costs["forked"]["events_in_parent_export"] = len(json.loads((folder / f"r{r}.json").read_text())["traceEvents"])
                prof.profiler = None
                result["sessions"].setdefault(name, []).append(costs)
                print(name, costs, file=sys.stderr, flush=True)
    text = json.dumps(result, indent=1)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
