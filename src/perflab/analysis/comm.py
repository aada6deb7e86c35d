"""The bytes a data-parallel training step must move, and their floor at a measured bus bandwidth.

No torch. Bus bytes follow nccl-tests' definitions (per rank, what crosses its links):

- all-reduce of S bytes over N ranks (ring): 2(N-1)/N x S; busbw = algbw x 2(N-1)/N;
- reduce-scatter / all-gather of S bytes in total: (N-1)/N x S; busbw = algbw x (N-1)/N.

So one floor serves every collective: time >= bus bytes / busbw (busbw as nccl-tests reports it).

DDP all-reduces every gradient once per step, in buckets of ``bucket_cap_mb`` (bucketing changes the number
of collectives, not the bytes). PyTorch's DDP gives its first bucket 1 MiB only when ``bucket_cap_mb`` is left
unset; perflab always passes it (25 by default), so every bucket, the first too, takes the cap (torch 2.13,
``_BucketCapacityConfig``). After the first iterations DDP rebuilds its buckets in the order the gradients became
ready, closing a bucket once it holds the cap or more (``ddp_buckets``). FSDP (full shard) all-gathers the
parameters for the forward, again for the backward when it reshards after forward, and reduce-scatters the
gradients.

A collective's time is modelled as nccl-tests' numbers suggest: a per-call latency plus its bus bytes at the bus
bandwidth (``comm_ms``); the latency is the intercept of the sweep's two smallest sizes (``call_latency_us``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

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


def ddp_bytes(grad_bytes: int, world_size: int, bucket_cap_mb: float = 25.0, first_bucket_mb: float | None = None,
              buckets: list[int] | None = None) -> CommBytes:
    """One all-reduce of every gradient per step, in buckets; bus bytes 2(N-1)/N x gradient bytes (exact, ceil).
    ``buckets``: the buckets' bytes where they are known (DDP's own, or ``ddp_buckets``), else the calls are
    counted as if the gradients were one tensor cut at the cap (``first_bucket_mb``: the first bucket's cap, by
    default the cap itself, as perflab's DDP has it; see the module docstring)."""
    _check(world_size, grad_bytes)
    if buckets is not None:
        calls = len(buckets)
    else:
        cap = int(bucket_cap_mb * MIB)
        first = min(int((bucket_cap_mb if first_bucket_mb is None else first_bucket_mb) * MIB), grad_bytes)
        rest = grad_bytes - first
        calls = (1 if first else 0) + (math.ceil(rest / cap) if rest else 0)
    return CommBytes("ddp", world_size, {"all_reduce": grad_bytes}, all_reduce_bus_bytes(grad_bytes, world_size), calls)


def all_reduce_bus_bytes(nbytes: float, world_size: int) -> int:
    """What one rank sends in a ring all-reduce of ``nbytes``: 2(N-1)/N x nbytes (ceil)."""
    return -(-2 * (world_size - 1) * int(nbytes) // world_size)


def ddp_buckets(grad_sizes: list[int], bucket_cap_bytes: int, first_cap_bytes: int | None = None) -> list[int]:
    """DDP's buckets (bytes each, in the order they are reduced) for gradients of ``grad_sizes`` bytes given in the order
    they become ready: a bucket takes gradients until it holds its cap or more (torch's
    ``_compute_bucket_assignment_by_size``: a gradient is never split), the first bucket at ``first_cap_bytes``
    (default: the cap)."""
    if bucket_cap_bytes <= 0:
        raise ValueError(f"the bucket cap must be positive, got {bucket_cap_bytes}")
    limits = [first_cap_bytes if first_cap_bytes is not None else bucket_cap_bytes, bucket_cap_bytes]
    out, size = [], 0
    for g in grad_sizes:
        size += int(g)
        if size >= limits[min(len(out), 1)]:
            out.append(size)
            size = 0
    if size:
        out.append(size)
    return out


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


def swept_size(sweep: dict, nbytes: float) -> dict:
    """The sweep's row (bytes, time_us, busbw_gbps) of the measured size nearest ``nbytes`` (log scale)."""
    return min(sweep["sizes"], key=lambda r: abs(math.log(r["bytes"]) - math.log(max(nbytes, 1.0))))


def busbw_at(sweep: dict, nbytes: float) -> float:
    """The sweep's bus bandwidth at the measured size nearest ``nbytes`` (log scale), GB/s."""
    return swept_size(sweep, nbytes)["busbw_gbps"]


def call_latency_us(sweep: dict) -> float:
    """The per-call latency of an all-reduce, µs: the intercept at 0 bytes of the line through the sweep's two smallest
    sizes' times (nccl-tests' ``time`` column), within [0, the smaller of the two times] (a noisy host can time the
    smaller size slower)."""
    rows = sorted(sweep["sizes"], key=lambda r: r["bytes"])
    if len(rows) < 2:
        return 0.0
    (s1, t1), (s2, t2) = ((r["bytes"], r["time_us"]) for r in rows[:2])
    alpha = t1 - s1 * (t2 - t1) / (s2 - s1)
    return min(max(alpha, 0.0), t1, t2)


@dataclass(frozen=True)
class CommFloor:
    """A step's collectives against the swept bus bandwidth: their bytes and calls, one call's message, the bus
    bandwidth at the swept size nearest that message and where the sweep came from, the per-call latency, and the
    floor (bus bytes ÷ busbw, ms per step)."""

    bus_bytes: int
    calls: int
    message_bytes: float
    busbw_gbps: float
    busbw_size_bytes: int
    busbw_source: str | None
    latency_us: float
    floor_ms: float

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def modelled_ms(self) -> float:
        """The floor plus each call's latency, ms per step (``comm_ms``)."""
        return self.floor_ms + self.calls * self.latency_us / 1e3


def comm_floor(comm: CommBytes, message_bytes: float, sweep: dict) -> CommFloor:
    """``comm``'s floor at the bus bandwidth ``sweep`` measured at the size nearest one call's ``message_bytes``."""
    row = swept_size(sweep, message_bytes)
    return CommFloor(bus_bytes=comm.bus_bytes, calls=comm.calls, message_bytes=message_bytes, busbw_gbps=row["busbw_gbps"],
                     busbw_size_bytes=row["bytes"], busbw_source=sweep.get("source"), latency_us=call_latency_us(sweep),
                     floor_ms=comm.floor_ms(row["busbw_gbps"]))


def ddp_floor(grad_bytes: int, world_size: int, bucket_cap_mb: float, sweep: dict, buckets: list[int] | None = None) -> CommFloor:
    """A DDP step's floor: every gradient all-reduced once (``ddp_bytes``), one call's message the gradients' bytes
    shared over the calls (a bucket's mean size)."""
    comm = ddp_bytes(grad_bytes, world_size, bucket_cap_mb, buckets=buckets)
    return comm_floor(comm, grad_bytes / max(comm.calls, 1), sweep)


def comm_ms(bus_bytes: float, calls: int, busbw_gb_s: float, latency_us: float) -> float:
    """The modelled time of a step's collectives, ms: their bus bytes at the bus bandwidth plus each call's latency."""
    if busbw_gb_s <= 0:
        raise ValueError(f"bus bandwidth must be positive, got {busbw_gb_s}")
    return bus_bytes / (busbw_gb_s * 1e9) * 1e3 + calls * latency_us / 1e3


def rank_comm_rows(accounts: list[dict], steps: int, rank_step_ms: dict, floor_ms: float | None) -> list[dict]:
    """Per rank, ms per step: its communication, exposed (and of it, waiting for a later rank and transfer, where the
    ranks' collectives lined up), overlapped, the overlap fraction, and measured ÷ the floor. ``accounts``: the merged
    ranks' accounts (``analysis.ranks``, ns over ``steps`` profiled steps, each over the rank's own step windows);
    ``rank_step_ms``: rank → its untraced step. ``traced_step_ms`` is the rank's mean step window: the per-step figures
    are parts of it, and :func:`check_comm_accounts` holds the accounts they come from to that, to the ns."""
    violations = check_comm_accounts(accounts)
    if violations:
        raise CommAccountingError("the communication accounting broke its identities (a bug in perflab, please report it): " + "; ".join(violations))
    rows = []
    for account in accounts:
        r = account["rank"]
        comm_ms = account["comm_ns"] / steps / 1e6
        waiting = account.get("comm_exposed_waiting_ns")
        rows.append({"rank": r, "step_ms": rank_step_ms.get(r), "traced_step_ms": account["window_ns"] / steps / 1e6,
                     "busy_ms": account["busy_ns"] / steps / 1e6,
                     "comm_ms": comm_ms, "exposed_ms": account["comm_exposed_ns"] / steps / 1e6,
                     "waiting_ms": waiting / steps / 1e6 if waiting is not None else None,
                     "transfer_ms": (account["comm_exposed_ns"] - waiting) / steps / 1e6 if waiting is not None else None,
                     "overlapped_ms": account["comm_overlapped_ns"] / steps / 1e6, "overlap_fraction": account["overlap_fraction"],
                     "measured_over_floor": comm_ms / floor_ms if floor_ms else None})
    return rows


class CommAccountingError(ValueError):
    """A per-rank communication figure broke an identity it must keep: perflab's bug, never printed as a result."""


def check_comm_accounts(accounts: list[dict]) -> list[str]:
    """The identities every rank's account keeps, in ns over the same step windows: waiting ≤ exposed ≤ window,
    comm = exposed + hidden, busy ≤ window. Each broken one, named."""
    out = []
    for row in accounts:
        window, busy, comm = row.get("window_ns"), row.get("busy_ns"), row.get("comm_ns")
        exposed, hidden, waiting = row.get("comm_exposed_ns"), row.get("comm_overlapped_ns"), row.get("comm_exposed_waiting_ns")
        if None in (window, busy, comm, exposed, hidden):
            out.append(f"rank {row['rank']}: figures missing")
            continue
        if waiting is not None and not 0 <= waiting <= exposed:
            out.append(f"rank {row['rank']}: waiting {waiting} ns outside 0..exposed {exposed} ns")
        if not 0 <= exposed <= window:
            out.append(f"rank {row['rank']}: exposed {exposed} ns outside 0..its steps' {window} ns")
        if comm != exposed + hidden:
            out.append(f"rank {row['rank']}: communication {comm} ns ≠ exposed {exposed} + hidden {hidden} ns")
        if not 0 <= busy <= window:
            out.append(f"rank {row['rank']}: busy {busy} ns outside 0..its steps' {window} ns")
    return out


def communication_section(*, mode: str | None, world_size: int, grad_bytes: int | None, param_bytes: int | None, sweep: dict | None,
                          accounts: list[dict], steps: int, rank_step_ms: dict, step_ms: float | None, bucket_cap_mb: float | None = None,
                          buckets: list[int] | None = None, fsdp_units: int | None = None, reshard: bool = True,
                          note: str | None = None) -> dict:
    """The ranks' communication against its floor, one section for ``explain --parallel`` and ``perflab run``: the
    collectives a step runs and their bytes (DDP: an all-reduce of the gradients in its buckets, 2(N−1)/N of them on
    the bus; FSDP: the parameters' all-gathers and the gradients' reduce-scatters, (N−1)/N each), the bus bandwidth at
    a message's size from the sweep, the floor (bus bytes ÷ busbw), and per rank its measured, exposed (waiting for a
    later rank + transfer) and overlapped communication per step, the overlap fraction and measured ÷ floor
    (``rank_comm_rows``). ``mode`` None: no data-parallel module was found, the measured communication has no floor."""
    section: dict = {"mode": mode, "world_size": world_size, "steps_profiled": steps, "note": note, "floor_ms": None, "grad_bytes": grad_bytes,
                     "param_bytes": param_bytes, "buckets": buckets, "collectives": None}
    floor = None
    if mode is None:
        section["floor_note"] = "no DistributedDataParallel or FSDP module found: the measured communication without a floor"
    elif sweep and sweep.get("sizes") and grad_bytes is not None:
        n = world_size
        if mode == "ddp":
            step_floor = ddp_floor(grad_bytes, n, bucket_cap_mb, sweep, buckets=buckets)
            section["collectives"] = [{"collective": "all_reduce", "payload_bytes": grad_bytes, "bus_bytes": step_floor.bus_bytes,
                                       "calls": step_floor.calls, "message_bytes": step_floor.message_bytes, "bus_factor": "2(N−1)/N"}]
            section["not_in_floor"] = ("DDP's broadcast of the module's buffers each forward (broadcast_buffers) is communication too, "
                                       "timed with it, but not in the floor")
        else:
            units = fsdp_units or 1
            comm = fsdp_bytes(param_bytes, grad_bytes, n, reshard_after_forward=reshard, units=units)
            step_floor = comm_floor(comm, param_bytes / units, sweep)
            gathers = comm.collectives["all_gather"]
            section["collectives"] = [
                {"collective": "all_gather", "payload_bytes": gathers, "bus_bytes": -(-gathers * (n - 1) // n), "calls": (comm.calls // units - 1) * units,
                 "message_bytes": step_floor.message_bytes, "bus_factor": "(N−1)/N"},
                {"collective": "reduce_scatter", "payload_bytes": grad_bytes, "bus_bytes": -(-grad_bytes * (n - 1) // n), "calls": units,
                 "message_bytes": grad_bytes / units, "bus_factor": "(N−1)/N"}]
        floor = step_floor.floor_ms
        section.update(**step_floor.to_dict(), modelled_ms=step_floor.modelled_ms, floor_fraction=floor / step_ms if step_ms else None)
    section["ranks"] = rank_comm_rows(accounts or [], steps, rank_step_ms, floor if floor and floor > 0 else None)
    return section
