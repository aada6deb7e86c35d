"""Where a DDP step's variance comes from: per step, per rank, on two GPUs.

    PYTHONPATH=src python3 benchmarks/ddp_variance_gpu.py OUT [--model gpt_large] [--steps 40] [--gpus 0,1]

perflab's gpt_large DDP ``train_step`` (seq 512, batch 4 per GPU, bf16, eager) read a CV of 15% over its timed
samples on two H100s, and a paired scaling efficiency CI of 0.673-0.908. This script takes the step apart, each
phase ``--steps`` steps back to back on both ranks, every step timed with CUDA events on the compute stream:

- ``ddp``: the DDP step as perflab times it (twice: first and last, to see drift over the run);
- ``no_sync``: the same step under DDP's ``no_sync()``: no all-reduce, both GPUs computing side by side;
- ``all_reduce``: only the gradients' all-reduce, bucket by bucket (25 MiB buckets, DDP's default), no compute;
- ``ddp_beside``: the DDP step again with rank 0's one-GPU model built beside it (as perflab's paired efficiency
  does), resident but idle;
- ``one_gpu``: rank 0's one-GPU model alone, rank 1 idle (the other rank waits at a barrier);
- ``*_pinned``: the same with each rank's issuing threads on cores of their own (``pinned``), alternated with
  unpinned phases (``ddp_pinned``, ``ddp_unpinned``, ``ddp_pinned_again``), as perflab's ranks do not pin.

Per DDP step it also splits the step on each rank with a communication hook that records a CUDA event where each
gradient bucket is ready: ``compute_ms`` (step start to the last bucket ready: forward and backward) and
``tail_ms`` (last bucket ready to the step's end: the last all-reduce, waiting for the other rank, the optimizer).
A rank whose compute is faster than the other's waits in its tail. And per step, from NVML, each GPU's SM clock and
whether it was held back (throttle reasons other than idle).

OUT gets ddp_variance.json (every step) and ddp_variance.md (per phase and rank: median, CV, p10-p90, the
steps' first-to-last drift).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path



def _nvml(index: int):
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml, pynvml.nvmlDeviceGetHandleByIndex(index)
    except Exception:  # no NVML: clocks left out
        return None, None


def _clock(nvml) -> tuple[int | None, int | None]:
    lib, handle = nvml
    if lib is None:
        return None, None
    reasons = lib.nvmlDeviceGetCurrentClocksThrottleReasons(handle) & ~lib.nvmlClocksThrottleReasonGpuIdle
    return lib.nvmlDeviceGetClockInfo(handle, lib.NVML_CLOCK_SM), int(reasons)


class Mark:
    """A point on the compute stream (a CUDA event), or on the host clock where there is no GPU (a dry run on the CPU)."""

    def __init__(self, cuda: bool):
        import torch

        self.event = torch.cuda.Event(enable_timing=True) if cuda else None
        self.t = 0.0

    def record(self) -> None:
        if self.event is not None:
            self.event.record()
        else:
            self.t = time.perf_counter()

    def synchronize(self) -> None:
        if self.event is not None:
            self.event.synchronize()

    def elapsed_time(self, other: "Mark") -> float:
        return self.event.elapsed_time(other.event) if self.event is not None else (other.t - self.t) * 1e3


@contextlib.contextmanager
def pinned(rank: int, world_size: int, names: list):
    """This rank's issuing threads each on a core of their own: the main thread (the forward, the optimizer) and
    torch's autograd thread for the GPU (``pt_autograd_*``: the backward), disjoint across ranks; every other thread
    of the process on the cores no rank's issuing thread has; one intra-op thread. Restored after."""
    import torch

    cpus = sorted(os.sched_getaffinity(0))
    mine = [cpus[(-1 - 2 * rank) % len(cpus)], cpus[(-2 - 2 * rank) % len(cpus)]]  # wraps on a small host (a dry run)
    rest = set(cpus) - set(cpus[-2 * world_size:]) or set(cpus)
    me, saved = threading.get_native_id(), {}
    for tid in map(int, os.listdir("/proc/self/task")):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                comm = f.read().strip()
            saved[tid] = os.sched_getaffinity(tid)
            autograd = comm.startswith("pt_autograd")
            os.sched_setaffinity(tid, {mine[0]} if tid == me else {mine[1]} if autograd else rest)
            if autograd or tid == me:
                names.append(f"{comm}->{mine[0] if tid == me else mine[1]}")
        except OSError:
            pass
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        for tid, mask in saved.items():
            try:
                os.sched_setaffinity(tid, mask)
            except OSError:
                pass


def rank_main(rank: int, world_size: int, device_index: int | None, model: str, steps: int, warmup: int, seq_len: int = 512,
              layers: int | None = None) -> dict:
    import torch
    import torch.distributed as dist

    from perflab.measure.parallel import _built_on_rank, _step
    from perflab.runtime.workload import build, step_context
    from perflab.spec import Case, validate_case

    cuda = device_index is not None
    device = "cuda" if cuda else "cpu"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    case = validate_case(Case(model=model, workload="train_step", seq_len=seq_len, batch_size=4, dtype="bf16" if cuda else "fp32",
                              device=device, parallel="ddp", world_size=world_size, warmup=warmup, layers=layers))
    built, plain, params, _ = _built_on_rank(case, rank, device, device_index)
    ddp = built.model
    ready: list = []

    def hook(state, bucket):  # DDP's own all-reduce (average), and an event where the bucket's gradients are ready
        event = Mark(cuda)
        event.record()
        ready.append(event)
        tensor = bucket.buffer().div_(world_size)
        return dist.all_reduce(tensor, async_op=True).get_future().then(lambda fut: fut.value()[0])

    ddp.register_comm_hook(None, hook)
    nvml = _nvml(device_index) if cuda else (None, None)
    step = _step(built, "eager", 1)

    def run(name: str, fn, n: int, split: bool = False, active: bool = True) -> dict:
        records = []
        dist.barrier()
        sync()
        for _ in range(n):
            if not active:
                continue
            ready.clear()
            start, end = Mark(cuda), Mark(cuda)
            t0 = time.perf_counter()
            start.record()
            fn()
            end.record()
            host_ms = (time.perf_counter() - t0) * 1e3
            end.synchronize()
            clock, reasons = _clock(nvml)
            record = {"ms": start.elapsed_time(end), "host_ms": host_ms, "sm_mhz": clock, "throttle": reasons}
            if split and ready:
                record["compute_ms"] = start.elapsed_time(ready[-1])
                record["tail_ms"] = ready[-1].elapsed_time(end)
                record["buckets"] = len(ready)
            records.append(record)
        dist.barrier()
        return {"phase": name, "rank": rank, "steps": records}

    out = []
    with step_context(plain, built):
        for _ in range(warmup):
            step()
        out.append(run("ddp", step, steps, split=True))

        def no_sync_step():
            with ddp.no_sync():
                step()

        for _ in range(2):
            no_sync_step()
        out.append(run("no_sync", no_sync_step, steps))
        grads = [p for p in params if p.requires_grad]  # a gradient has its parameter's size and dtype
        buckets, size, limit = [], 0, 25 * 2**20
        for g in reversed(grads):  # DDP fills its buckets in reverse order of the parameters
            if not buckets or size + g.numel() * g.element_size() > limit:
                buckets.append([])
                size = 0
            buckets[-1].append(g.numel())
            size += g.numel() * g.element_size()
        flat = [torch.zeros(sum(b), dtype=grads[0].dtype, device=f"cuda:{device_index}" if cuda else "cpu") for b in buckets]

        def all_reduce():
            for tensor in flat:
                dist.all_reduce(tensor)

        for _ in range(3):
            all_reduce()
        out.append(run("all_reduce", all_reduce, steps))
        del flat
    one = one_step = None
    if rank == 0:
        one = build(plain)
        with step_context(plain, one):
            one_step = _step(one, "eager", 1)
            for _ in range(warmup):
                one_step()
        sync()
    with step_context(plain, built):
        out.append(run("ddp_beside", step, steps, split=True))
    names: list = []
    for name, pin in (("one_gpu", False), ("one_gpu_pinned", True)):
        with pinned(rank, world_size, names) if pin else contextlib.nullcontext():
            if rank == 0:
                with step_context(plain, one):
                    out.append(run(name, one_step, steps))
            else:
                out.append(run(name, None, steps, active=False))
    del one, one_step
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    with step_context(plain, built):
        out.append(run("ddp_again", step, steps, split=True))
        for name, pin in (("ddp_pinned", True), ("ddp_unpinned", False), ("ddp_pinned_again", True)):
            with pinned(rank, world_size, names) if pin else contextlib.nullcontext():
                out.append(run(name, step, steps, split=True))
    return {"rank": rank, "phases": out, "pinned_threads": sorted(set(names)), "buckets": [sum(b) for b in buckets], "gpu": torch.cuda.get_device_name(device_index) if cuda else "cpu"}


def _summary(values: list[float]) -> dict:
    if not values:
        return {}
    ordered = sorted(values)
    n = len(ordered)
    mean = statistics.fmean(values)
    third = max(1, n // 3)
    return {"n": n, "median": statistics.median(values), "cv": statistics.pstdev(values) / mean if mean else None,
            "p10": ordered[int(0.1 * (n - 1))], "p90": ordered[int(0.9 * (n - 1))], "min": ordered[0], "max": ordered[-1],
            "first_third": statistics.median(values[:third]), "last_third": statistics.median(values[-third:])}


def report(results: list[dict], args) -> str:
    lines = [f"# Where the DDP step's variance comes from ({args.model} train_step, seq {args.seq_len}, batch 4 a GPU, bf16, eager)", "",
             f"GPUs: {', '.join(r['gpu'] for r in results)}; {args.steps} steps a phase, each timed with CUDA events.", "",
             "| phase | rank | median ms | CV | p10–p90 ms | min–max ms | first third → last third (median ms) | compute ms (CV) | tail ms (CV) | host issue ms | SM MHz (min–max) | steps held back |",
             "|" + "---|" * 12]
    for index, name in enumerate(p["phase"] for p in results[0]["phases"]):
        for result in results:
            phase = result["phases"][index]
            steps = phase["steps"]
            if not steps:
                continue
            s = _summary([x["ms"] for x in steps])
            comp = _summary([x["compute_ms"] for x in steps if "compute_ms" in x])
            tail = _summary([x["tail_ms"] for x in steps if "tail_ms" in x])
            host = _summary([x["host_ms"] for x in steps])
            clocks = [x["sm_mhz"] for x in steps if x["sm_mhz"] is not None]
            held = sum(1 for x in steps if x["throttle"])
            lines.append("| " + " | ".join([
                name, str(result["rank"]), f"{s['median']:.2f}", f"{s['cv']:.1%}", f"{s['p10']:.2f}–{s['p90']:.2f}", f"{s['min']:.2f}–{s['max']:.2f}",
                f"{s['first_third']:.2f} → {s['last_third']:.2f}",
                f"{comp['median']:.2f} ({comp['cv']:.1%})" if comp else "–", f"{tail['median']:.2f} ({tail['cv']:.1%})" if tail else "–",
                f"{host['median']:.2f}", f"{min(clocks)}–{max(clocks)}" if clocks else "–", f"{held} of {len(steps)}"]) + " |")
    lines += ["", "Pinned threads: " + "; ".join(f"rank {r['rank']}: {', '.join(r['pinned_threads'])}" for r in results)]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--model", default="gpt_large")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--gpus", default="0,1")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--layers", type=int, default=None, help="run this many layers (a quick try of the script)")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu: a dry run of the script on two CPU ranks (gloo)")
    args = parser.parse_args()
    from perflab.runtime.parallel import launch

    gpus = [int(g) for g in args.gpus.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    launched = launch(rank_main, len(gpus), (args.model, args.steps, args.warmup, args.seq_len, args.layers), device=args.device,
                      gpus=gpus if args.device == "cuda" else None, timeout_s=900)
    results = launched.results
    (args.out / "ddp_variance.json").write_text(json.dumps(results) + "\n")
    text = report(results, args) + f"\n{time.perf_counter() - started:.0f} s in all.\n"
    (args.out / "ddp_variance.md").write_text(text)
    print(text)


if __name__ == "__main__":
    sys.exit(main())
