"""Ceilings of this GPU, measured once and cached by GPU name and driver.

- matmul rate per dtype: a large square GEMM (8192³; random data, not zeros), median of timed repeats;
- copy bandwidth: a 1 GiB device-to-device copy, counting bytes read plus bytes written;
- graph kernel interval: the time per kernel when 2,000 tiny kernels replay from one CUDA graph
  (the least a kernel can cost on this GPU, launch overhead removed), and the gap between them
  (interval − the tiny kernel's own duration, read with the profiler): what each kernel adds in a graph;
- eager launch cost: host time per tiny op issued eagerly from Python (what each kernel costs the CPU);
- all-reduce bus bandwidth over several GPUs (``all_reduce_sweep``, ``perflab ceilings --gpus 0,1``): fp32 sum
  all-reduces of 1 MiB to 1 GiB, one process per GPU, algbw and busbw as nccl-tests define them.

The cache lives in ``$PERFLAB_CACHE_DIR`` (default ``~/.cache/perflab``), file ``ceilings.json``.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

import torch

from perflab.clock import StepClock, host_samples_ns
from perflab.runtime.device import gpu_identity

CACHE_VERSION = 2


def cache_path() -> Path:
    root = Path(os.environ.get("PERFLAB_CACHE_DIR", Path.home() / ".cache" / "perflab"))
    return root / "ceilings.json"


def gpu_key() -> str:
    name = gpu_identity().name
    driver = "unknown"
    try:
        import pynvml

        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else str(driver)
    except Exception:
        pass
    return f"{name}|driver {driver}|torch {torch.__version__}"


def _time_cuda(fn, repeats: int, warmup: int = 2, fastest: bool = False) -> float:
    """Median seconds of one call (``fastest``: the least), each call timed with CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    clock = StepClock(cuda=True)
    times = []
    for _ in range(repeats):
        clock.reserve(2)
        start = clock.stamp()
        fn()
        end = clock.stamp()
        torch.cuda.synchronize()
        times.append(clock.read(start, end)[0] / 1000.0)
    return min(times) if fastest else statistics.median(times)


def matmul_tflops(dtype: str, n: int = 8192, repeats: int = 10) -> float:
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32, "fp32": torch.float32}[dtype]
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if dtype == "tf32" else "highest")
    try:
        a = torch.randn(n, n, device="cuda", dtype=torch_dtype)
        b = torch.randn(n, n, device="cuda", dtype=torch_dtype)
        seconds = _time_cuda(lambda: a @ b, repeats)
    finally:
        torch.set_float32_matmul_precision(previous)
    return 2 * n**3 / seconds / 1e12


def copy_gbps(nbytes: int = 2**30, repeats: int = 10, device: torch.device | str = "cuda") -> float:
    """The device's copy bandwidth (GB/s, bytes read + written) for a copy of ``nbytes``: the fastest of ``repeats``
    after two untimed, a ceiling as the matmul peaks are (a shared host's stall can slow a copy, never speed one up).
    On a GPU each copy is timed by CUDA events; elsewhere by the host's clock around a synchronised copy. The one
    copy bandwidth: the cached peaks' and a data-parallel case's (``measure.parallel``) both come from here."""
    device = torch.device(device)
    n = max(int(nbytes) // 4, 1)
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    if device.type == "cuda":
        seconds = _time_cuda(lambda: dst.copy_(src), repeats, fastest=True)
    else:
        seconds = min(host_samples_ns(lambda: dst.copy_(src), repeats, warmup=2)) / 1e9
    return 2 * n * 4 / seconds / 1e9


def graph_kernel_interval_us(kernels: int = 2000) -> tuple[float, float]:
    """(start-to-start interval, gap between consecutive kernels), µs, for tiny kernels in a CUDA graph."""
    from torch.autograd import DeviceType

    from perflab.trace.capture import Tracer

    x = torch.zeros(1, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        x.add_(1)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(kernels):
            x.add_(1)
    interval = _time_cuda(graph.replay, repeats=5) / kernels * 1e6
    averages = []  # torch's per-kernel summary of one replay, kernels only (no trace is written)
    tracer = Tracer(None, "cuda", steps=1, warmup=0, cpu_ops=False, on_ready=lambda prof: averages.extend(prof.key_averages()))
    tracer.start()
    try:
        graph.replay()
        tracer.step(before_stop=torch.cuda.synchronize)
    finally:
        tracer.stop()
    gpu_events = [e for e in averages if e.device_type == DeviceType.CUDA and e.count >= kernels // 2]
    duration = max(gpu_events, key=lambda e: e.count).device_time if gpu_events else 0.0
    return interval, max(interval - duration, 0.0)


def eager_launch_us(kernels: int = 2000) -> float:
    x = torch.zeros(1, device="cuda")
    for _ in range(100):
        x.add_(1)
    torch.cuda.synchronize()

    def issue():
        for _ in range(kernels):
            x.add_(1)

    return statistics.median(ns / kernels / 1e3 for ns in host_samples_ns(issue, 5, after=torch.cuda.synchronize))


def measure_ceilings() -> dict:
    return {
        "version": CACHE_VERSION,
        "gpu": gpu_key(),
        "matmul_tflops": {dtype: matmul_tflops(dtype) for dtype in ("bf16", "fp16", "tf32", "fp32")},
        "copy_gbps": copy_gbps(),
        **dict(zip(("graph_kernel_interval_us", "graph_kernel_gap_us"), graph_kernel_interval_us())),
        "eager_launch_us": eager_launch_us(),
        "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def get_ceilings(refresh: bool = False) -> dict:
    """This GPU's ceilings, from the cache when it holds this GPU/driver/torch, else measured (seconds)."""
    key = gpu_key()
    cache = _read_cache()
    entry = cache.get(key)
    if entry and entry.get("version") == CACHE_VERSION and not refresh:
        return entry
    kept = {k: v for k, v in (entry or {}).items() if k.startswith("all_reduce_")}  # measured apart, on several GPUs
    entry = measure_ceilings() | kept
    cache[key] = entry
    _write_cache(cache)
    return entry


def cached_ceilings() -> dict | None:
    """This GPU's ceilings from the cache, without measuring (None when they were never measured here)."""
    entry = _read_cache().get(gpu_key())
    return entry if entry and entry.get("version") == CACHE_VERSION else None


def _read_cache() -> dict:
    """The ceilings cache: GPU key → its entry; empty when there is none (a damaged cache is re-measured, not trusted)."""
    path = cache_path()
    try:
        return json.loads(path.read_text()) if path.exists() else {}
    except (OSError, json.JSONDecodeError):
        return {}


def _write_cache(cache: dict) -> None:
    path = cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(cache, indent=1))
    tmp.replace(path)


# ---------------------------------------------------------------------------------------------------
# All-reduce bus bandwidth, as nccl-tests measures it (all_reduce_perf): several ranks, one process per GPU

ALL_REDUCE_SIZES = tuple(2**k for k in range(20, 31, 2))  # 1 MiB, 4 MiB, ..., 1 GiB


def all_reduce_sweep(gpus: list[int] | None, sizes=ALL_REDUCE_SIZES, iters: int = 20, warmup: int = 5, device: str = "cuda",
                     world_size: int | None = None) -> dict:
    """Time an in-place fp32 sum all-reduce of each size on the ranks (one per GPU; gloo processes on the CPU):
    per size the slowest rank's mean time, ``algbw = bytes / time`` and ``busbw = algbw × 2(N−1)/N`` (GB/s), as
    nccl-tests define them. Returns ``{"world_size", "gpus", "sizes": [{bytes, time_us, algbw_gbps, busbw_gbps}],
    "busbw_gbps": the largest busbw}``."""
    from perflab.runtime.parallel import launch

    world = len(gpus) if gpus else int(world_size or 2)
    launched = launch(all_reduce_rank, world, (list(sizes), iters, warmup), device=device, gpus=gpus)
    times = launched.results[0]  # every rank returns the same (the slowest rank's) times
    return dict(sweep_result(sizes, times, world, gpus, device), launches=launched.launches)


def sweep_result(sizes, times: list[float], world: int, gpus, device: str) -> dict:
    """An all-reduce sweep's result from each size's slowest-rank seconds (``all_reduce_sweep``'s, or a run's ranks')."""
    from perflab.analysis.comm import busbw_all_reduce

    rows = []
    for size, seconds in zip(sizes, times):
        algbw, busbw = busbw_all_reduce(size, seconds, world)
        rows.append({"bytes": size, "time_us": seconds * 1e6, "algbw_gbps": algbw, "busbw_gbps": busbw})
    return {"world_size": world, "gpus": gpus, "device": device, "sizes": rows, "busbw_gbps": max(r["busbw_gbps"] for r in rows),
            "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}


def all_reduce_rank(rank: int, world_size: int, device_index, sizes: list[int], iters: int, warmup: int) -> list[float]:
    import torch.distributed as dist

    device = torch.device("cuda", device_index) if device_index is not None else torch.device("cpu")
    clock = StepClock(cuda=device.type == "cuda")
    out = []
    for size in sizes:
        x = torch.ones(size // 4, dtype=torch.float32, device=device)
        for _ in range(warmup):
            dist.all_reduce(x)
        _sync(device)
        clock.reserve(2)
        dist.barrier()
        start = clock.stamp()
        for _ in range(iters):
            dist.all_reduce(x)
        end = clock.stamp()
        _sync(device)
        seconds = clock.read(start, end)[0] / 1e3 / iters
        slowest = torch.tensor([seconds], dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        out.append(float(slowest.item()))
        del x
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def all_reduce_key(world_size: int) -> str:
    return f"all_reduce_{world_size}"


def get_all_reduce(gpus: list[int], refresh: bool = False) -> dict:
    """The all-reduce sweep of these GPUs, from the ceilings cache (under the first GPU's key) or measured and cached."""
    with torch.cuda.device(gpus[0]):
        key = gpu_key()
    cache = _read_cache()
    found = (cache.get(key) or {}).get(all_reduce_key(len(gpus)))
    if found and not refresh:
        return found
    found = all_reduce_sweep(gpus)
    cache.setdefault(key, {})[all_reduce_key(len(gpus))] = found
    _write_cache(cache)
    return found


def cache_all_reduce(world_size: int, sweep: dict) -> None:
    """Keep an all-reduce sweep a run's ranks measured on this GPU (the current device) for ``world_size`` ranks, as
    ``perflab ceilings --gpus`` would have: later runs read it from the cache."""
    cache = _read_cache()
    cache.setdefault(gpu_key(), {})[all_reduce_key(world_size)] = sweep
    _write_cache(cache)


def cached_all_reduce(world_size: int) -> dict | None:
    """This GPU's cached all-reduce sweep for ``world_size`` ranks, without measuring (None when not measured yet)."""
    cache = _read_cache()
    return (cache.get(gpu_key()) or {}).get(all_reduce_key(world_size)) if cache else None
