"""The bytes a data-parallel training step must move, and their floor at a measured bus bandwidth.

No torch. Bus bytes follow nccl-tests' definitions (per rank, what crosses its links):

- all-reduce of S bytes over N ranks (ring): 2(N-1)/N x S; busbw = algbw x 2(N-1)/N;
- reduce-scatter / all-gather of S bytes in total: (N-1)/N x S; busbw = algbw x (N-1)/N.

So one floor serves every collective: time >= bus bytes / busbw (busbw as nccl-tests reports it).

DDP all-reduces every gradient once per step, in buckets of ``bucket_cap_mb`` (the first bucket is 1 MiB
in PyTorch's DDP; bucketing changes the number of collectives, not the bytes). FSDP (full shard) all-gathers
the parameters for the forward, again for the backward when it reshards after forward, and reduce-scatters
the gradients.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MIB = 1 << 20


@dataclass(frozen=True)
class CommBytes:
    mode: str
    world_size: int
    collectives: dict[str, int]  # collective name -> its payload bytes S per step
    bus_bytes: int  # per rank, per step
    calls: int  # collectives per step

    def floor_ms(self, busbw_gb_s: float) -> float:
        """Bus bytes / bus bandwidth (GB/s = 1e9 B/s), in ms."""
        if busbw_gb_s <= 0:
            raise ValueError(f"bus bandwidth must be positive, got {busbw_gb_s}")
        return self.bus_bytes / (busbw_gb_s * 1e9) * 1e3


def _check(world_size: int, *sizes: int) -> None:
    if world_size < 2:
        raise ValueError(f"world_size must be at least 2, got {world_size}")
    if any(s < 0 for s in sizes):
        raise ValueError("byte counts must be non-negative")


def ddp_bytes(grad_bytes: int, world_size: int, bucket_cap_mb: float = 25.0, first_bucket_mb: float = 1.0) -> CommBytes:
    """One all-reduce of every gradient per step, in buckets; bus bytes 2(N-1)/N x gradient bytes (exact, ceil)."""
    _check(world_size, grad_bytes)
    cap = int(bucket_cap_mb * MIB)
    first = min(int(first_bucket_mb * MIB), grad_bytes)
    rest = grad_bytes - first
    calls = (1 if first else 0) + (math.ceil(rest / cap) if rest else 0)
    bus = -(-2 * (world_size - 1) * grad_bytes // world_size)
    return CommBytes("ddp", world_size, {"all_reduce": grad_bytes}, bus, calls)


def fsdp_bytes(param_bytes: int, grad_bytes: int, world_size: int, reshard_after_forward: bool = True,
               units: int = 1) -> CommBytes:
    """FSDP full shard: all-gather forward (+ backward when resharding) and reduce-scatter of the gradients."""
    _check(world_size, param_bytes, grad_bytes)
    gathers = 2 if reshard_after_forward else 1
    n1 = world_size - 1
    bus = -(-(gathers * param_bytes + grad_bytes) * n1 // world_size)
    collectives = {"all_gather": gathers * param_bytes, "reduce_scatter": grad_bytes}
    return CommBytes("fsdp", world_size, collectives, bus, (gathers + 1) * units)


def busbw_all_reduce(size_bytes: int, seconds: float, world_size: int) -> tuple[float, float]:
    """nccl-tests' (algbw, busbw) in GB/s for an all-reduce of ``size_bytes`` that took ``seconds``."""
    if seconds <= 0:
        raise ValueError(f"time must be positive, got {seconds}")
    algbw = size_bytes / seconds / 1e9
    return algbw, algbw * 2 * (world_size - 1) / world_size
