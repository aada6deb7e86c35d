"""Data parallelism at the runtime floor, the ranks started; ``measure/parallel.py`` times them, ``report/parallel.py`` shows them.

Several ranks, one process each: started with torch's own machinery, wrapped in DDP or FSDP.

``launch`` starts ``world_size`` processes with ``torch.multiprocessing.start_processes`` (spawn: fresh
interpreters, no CUDA state inherited), each joining one ``torch.distributed`` process group: NCCL on GPUs,
gloo on the CPU. The rendezvous is a file in a fresh temporary directory (``file://``), so runs started at
the same time (tests, sweep workers) can never meet on a TCP port. A launch that fails for a transient
reason (the rendezvous or a connection between ranks) is retried once; ``Launched.launches`` says how many
it took. A rank's exception ends the launch (torch terminates the other ranks) and comes back as
``RankFailed`` with the rank's message.

Every process perflab starts for parallel work runs with NVLink multicast off (``MULTICAST_OFF``): on a
shared host a program using it can take the GPUs out of service.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch

# NCCL's NVLink SHARP (NVLS), PyTorch's symmetric-memory multicast and NVSHMEM's NVLS all create multicast objects.
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

# What a launch failing for a reason that another launch would not meet looks like.
TRANSIENT = re.compile(r"rendezvous|DistNetworkError|Connection (reset|refused|closed)|ECONNRE|Socket Timeout|"
                       r"connectFullMesh|Broken pipe|timed out|Timed out", re.I)
OOM = re.compile(r"OutOfMemoryError|out of memory", re.I)


class RankFailed(RuntimeError):
    """A rank raised; ``rank`` and its ``message`` (the exception's last line), ``oom`` when it ran out of memory."""

    def __init__(self, rank: int | None, message: str, detail: str = ""):
        super().__init__(f"rank {rank}: {message}" if rank is not None else message)
        self.rank, self.message, self.detail = rank, message, detail
        self.oom = bool(OOM.search(message) or OOM.search(detail))
        self.transient = bool(TRANSIENT.search(message) or TRANSIENT.search(detail)) and not self.oom


@dataclass
class Launched:
    results: list[Any]  # each rank's return value (JSON), by rank
    launches: int  # 1, or 2 after a transient failure


def backend_for(device: str) -> str:
    return "nccl" if device == "cuda" else "gloo"


def set_multicast_off(env=os.environ) -> None:
    for key, value in MULTICAST_OFF.items():
        env[key] = value


def launch(fn: Callable[..., Any], world_size: int, args: tuple = (), *, device: str = "cpu", gpus: list[int] | None = None,
           timeout_s: float = 600.0, retries: int = 1) -> Launched:
    """Run ``fn(rank, world_size, device_index, *args)`` in ``world_size`` processes joined in one process group.

    ``fn`` must be importable (a module-level function) and return something JSON can hold. ``gpus``: the
    CUDA device index of each rank (default 0..world_size-1). Raises RankFailed when a rank raised (after one
    retry if the failure was transient)."""
    if device == "cuda":
        gpus = list(gpus) if gpus is not None else list(range(world_size))
        if len(gpus) != world_size:
            raise ValueError(f"{world_size} ranks need {world_size} GPUs, got {gpus}")
    set_multicast_off()  # inherited by the spawned processes (and set again in each)
    launches = 0
    while True:
        launches += 1
        try:
            return Launched(_launch_once(fn, world_size, args, device, gpus, timeout_s), launches)
        except RankFailed as failed:
            if not failed.transient or launches > retries:
                raise


def _launch_once(fn, world_size, args, device, gpus, timeout_s) -> list:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="perflab-ranks-") as tmp:
        tmp_path = Path(tmp)
        init = (tmp_path / "rendezvous").as_uri()
        try:
            mp.start_processes(_rank_main, args=(fn, world_size, args, device, gpus, init, str(tmp_path), timeout_s),
                               nprocs=world_size, join=True, start_method="spawn")
        except mp.ProcessRaisedException as exc:
            raise _failure(exc, tmp_path, world_size) from None
        except mp.ProcessExitedException as exc:
            raise _failure(exc, tmp_path, world_size) from None
        results = []
        for rank in range(world_size):
            path = tmp_path / f"rank{rank}.json"
            if not path.exists():
                raise RankFailed(rank, "ended without a result")
            results.append(json.loads(path.read_text()))
        return results


def _failure(exc, tmp_path: Path, world_size: int) -> RankFailed:
    """The first rank's own error (written by the rank before it raised), else torch's message."""
    for rank in range(world_size):
        path = tmp_path / f"rank{rank}.error.json"
        if path.exists():
            data = json.loads(path.read_text())
            return RankFailed(rank, data["message"], data["detail"])
    text = str(exc).strip()
    return RankFailed(getattr(exc, "error_index", None), text.splitlines()[-1] if text else type(exc).__name__, text)


def cpu_threads_per_rank(world_size: int, cpus: int | None = None) -> int:
    """Intra-op threads for each of ``world_size`` CPU ranks on this host: its CPUs shared out, at least one. torch's
    default is every CPU in every rank: two ranks on two cores ran four threads that spun against each other, and the
    same base step read 436.6 ms in one launch and 9.4 ms in another (150-190 ms against 11.5-13 ms measured again)."""
    cpus = cpus if cpus is not None else len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cpus // max(world_size, 1))


def _rank_main(rank, fn, world_size, args, device, gpus, init, tmp, timeout_s):
    import torch.distributed as dist

    set_multicast_off()
    device_index = None
    if device == "cuda":
        device_index = gpus[rank]
        torch.cuda.set_device(device_index)
    else:
        torch.set_num_threads(cpu_threads_per_rank(world_size))
    try:
        dist.init_process_group(backend_for(device), init_method=init, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout_s), **({"device_id": torch.device("cuda", device_index)} if device == "cuda" else {}))
        result = fn(rank, world_size, device_index, *args)
        Path(tmp, f"rank{rank}.json").write_text(json.dumps(result))
    except BaseException as exc:
        lines = [line for line in str(exc).strip().splitlines() if line.strip()]
        message = f"{type(exc).__name__}: {lines[-1] if lines else ''}".rstrip(": ")
        Path(tmp, f"rank{rank}.error.json").write_text(json.dumps({"message": message, "detail": traceback.format_exc()}))
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------------
# Wrapping a model


def largest_module_list(model: torch.nn.Module) -> torch.nn.ModuleList | None:
    """The model's repeated blocks: its largest ModuleList (perflab's GPT's ``blocks``, a transformers model's ``layers``)."""
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    return max(lists, key=len) if lists else None


def fsdp_shard(reshard: bool) -> Callable[[torch.nn.Module], None]:
    """FSDP2 (``fully_shard``): each block its own unit, then the root; parameters become DTensor shards."""

    def shard(model: torch.nn.Module) -> None:
        from torch.distributed.fsdp import fully_shard

        blocks = largest_module_list(model)
        for block in blocks if blocks is not None else ():
            fully_shard(block, reshard_after_forward=reshard)
        fully_shard(model, reshard_after_forward=reshard)

    return shard


def ddp_wrap(model: torch.nn.Module, device: str, device_index: int | None, bucket_cap_mb: float, grad_view: bool):
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device_index] if device == "cuda" else None, bucket_cap_mb=bucket_cap_mb,
                                   gradient_as_bucket_view=grad_view)


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard; a plain tensor as it is."""
    return t.to_local() if hasattr(t, "to_local") else t
