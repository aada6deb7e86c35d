"""Several ranks' traces at the analysis floor, merged and accounted; ``program/ranks.py`` gathers them under torchrun.

Several ranks' kernel traces: merged, communication as its own category, exact per-rank accounting.

No torch. Each rank's trace is its KernelTable (``trace.load_trace`` of the rank's Kineto file): ``name``, integer-ns
``start_ns``/``end_ns``. Every figure is interval arithmetic on ns and closes:

    compute_only + comm_overlapped + comm_exposed + idle == window

- compute: the union of non-communication kernels; communication: the union of NCCL kernels;
- comm_overlapped: time when a communication kernel and a compute kernel both run (hidden);
- comm_exposed: time when communication runs and no compute kernel does;
- overlap fraction: comm_overlapped / (comm_overlapped + comm_exposed).

Which rank waits for which: an NCCL kernel starts on a rank when that rank arrives at the collective and
spins until every peer has; the i-th collective of a step therefore finishes waiting at the last arrival,
and every other rank waits ``last_arrival - own_arrival`` for that rank. Ranks of one host share a clock
(Kineto puts GPU timestamps on the host's clock), so arrivals compare directly.

A rank's exposed communication splits in two (``exposed_waiting_ns``): the part inside its waits, spent spinning
for a later rank (a straggler's cost, not the collective's: under the profiler one rank's host falls behind and
the other's NCCL kernels wait for it), and the rest, the transfer no compute hides:

    comm_exposed == comm_exposed_waiting + comm_exposed_transfer
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from perflab.analysis.intervals import union_blocks

COMM_RE = re.compile(r"^nccl(Dev)?Kernel|^ncclKernel|AllReduce|ReduceScatter|AllGather|Broadcast|SendRecv|^gloo:", re.I)
COMM = "communication"


def is_comm(name: str) -> bool:
    return bool(COMM_RE.search(str(name)))


def merge_ranks(traces: dict[int, pd.DataFrame]) -> pd.DataFrame:
    """One table: every rank's kernels with a ``rank`` column and ``comm`` (True for NCCL kernels; a rank's table may
    carry its own ``comm``: a CPU rank's, ``trace.cpu_ranks``, where gloo's collectives are ranges on their threads)."""
    parts = []
    for rank in sorted(traces):
        t = traces[rank][["name", "start_ns", "end_ns"]].copy()
        t["start_ns"] = t["start_ns"].astype(np.int64)
        t["end_ns"] = t["end_ns"].astype(np.int64)
        t.insert(0, "rank", int(rank))
        t["comm"] = (traces[rank]["comm"] if "comm" in traces[rank] else t["name"].map(is_comm)).astype(bool).to_numpy()
        parts.append(t)
    if not parts:
        return pd.DataFrame({"rank": [], "name": [], "start_ns": [], "end_ns": [], "comm": []})
    return pd.concat(parts, ignore_index=True).sort_values(["start_ns", "rank"], kind="stable").reset_index(drop=True)


def _blocks(start: np.ndarray, end: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    s = np.clip(np.asarray(start, dtype=np.int64), lo, hi)
    e = np.clip(np.asarray(end, dtype=np.int64), lo, hi)
    keep = e > s
    bs, be, _ = union_blocks(s[keep], e[keep])
    return bs, be


def _intersect_blocks(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The intersection of two sets of disjoint, sorted blocks, as blocks."""
    (as_, ae), (bs, be) = a, b
    i = j = 0
    starts, ends = [], []
    while i < len(as_) and j < len(bs):
        lo = max(int(as_[i]), int(bs[j]))
        hi = min(int(ae[i]), int(be[j]))
        if hi > lo:
            starts.append(lo)
            ends.append(hi)
        if ae[i] < be[j]:
            i += 1
        else:
            j += 1
    return np.array(starts, dtype=np.int64), np.array(ends, dtype=np.int64)


def _intersection_ns(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> int:
    """Length of the intersection of two sets of disjoint, sorted blocks."""
    starts, ends = _intersect_blocks(a, b)
    return int((ends - starts).sum())


def _comm_mask(kernels: pd.DataFrame) -> np.ndarray:
    """Which rows are communication: the table's own ``comm`` (merged, or a CPU rank's), else NCCL kernels by name."""
    return kernels["comm"].to_numpy(dtype=bool) if "comm" in kernels else kernels["name"].map(is_comm).to_numpy(dtype=bool)


def _compute_and_comm_blocks(kernels: pd.DataFrame, lo: int, hi: int) -> tuple[tuple, tuple]:
    """One rank's compute and communication, each as disjoint blocks clipped to [lo, hi]."""
    comm = _comm_mask(kernels)
    start = kernels["start_ns"].to_numpy(dtype=np.int64)
    end = kernels["end_ns"].to_numpy(dtype=np.int64)
    return _blocks(start[~comm], end[~comm], lo, hi), _blocks(start[comm], end[comm], lo, hi)


@dataclass(frozen=True)
class RankAccount:
    rank: int
    window_ns: int
    compute_only_ns: int
    comm_overlapped_ns: int
    comm_exposed_ns: int
    idle_ns: int

    @property
    def busy_ns(self) -> int:
        return self.compute_only_ns + self.comm_overlapped_ns + self.comm_exposed_ns

    @property
    def comm_ns(self) -> int:
        return self.comm_overlapped_ns + self.comm_exposed_ns

    @property
    def compute_ns(self) -> int:
        return self.compute_only_ns + self.comm_overlapped_ns

    @property
    def overlap_fraction(self) -> float | None:
        return self.comm_overlapped_ns / self.comm_ns if self.comm_ns else None

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(busy_ns=self.busy_ns, comm_ns=self.comm_ns, compute_ns=self.compute_ns,
                 overlap_fraction=self.overlap_fraction)
        return d


def account_rank(kernels: pd.DataFrame, rank: int = 0, window: tuple[int, int] | None = None,
                 windows: list[tuple[int, int]] | None = None) -> RankAccount:
    """Exact busy/idle/communication split of one rank's kernels over ``window`` (default: first start to last end), or
    summed over ``windows`` (the rank's step windows: what the rank did in its steps, not between or around them)."""
    if windows is not None:
        parts = [account_rank(kernels, rank, window=w) for w in windows]
        return RankAccount(rank=int(rank), window_ns=sum(a.window_ns for a in parts), compute_only_ns=sum(a.compute_only_ns for a in parts),
                           comm_overlapped_ns=sum(a.comm_overlapped_ns for a in parts), comm_exposed_ns=sum(a.comm_exposed_ns for a in parts),
                           idle_ns=sum(a.idle_ns for a in parts))
    if window is None:
        window = (int(kernels["start_ns"].min()), int(kernels["end_ns"].max())) if len(kernels) else (0, 0)
    lo, hi = int(window[0]), int(window[1])
    if hi < lo:
        raise ValueError(f"window ends before it starts: {window}")
    c, m = _compute_and_comm_blocks(kernels, lo, hi)
    compute = int((c[1] - c[0]).sum())
    communication = int((m[1] - m[0]).sum())
    both = _intersection_ns(c, m)
    return RankAccount(rank=int(rank), window_ns=hi - lo, compute_only_ns=compute - both, comm_overlapped_ns=both,
                       comm_exposed_ns=communication - both, idle_ns=(hi - lo) - (compute + communication - both))


def account_ranks(merged: pd.DataFrame, window: tuple[int, int] | None = None,
                  windows: dict[int, list[tuple[int, int]]] | None = None) -> list[RankAccount]:
    """Every rank over one common window (default: the merged trace's first start to last end), or each over its own
    step ``windows`` (rank → [(start, end), ...])."""
    if windows is not None:
        return [account_rank(g, rank=int(r), windows=windows.get(int(r), [])) for r, g in merged.groupby("rank", sort=True)]
    if window is None and len(merged):
        window = (int(merged["start_ns"].min()), int(merged["end_ns"].max()))
    return [account_rank(g, rank=int(r), window=window) for r, g in merged.groupby("rank", sort=True)]


def within_windows(merged: pd.DataFrame, windows: dict[int, list[tuple[int, int]]]) -> pd.DataFrame:
    """The rows of each rank that start inside one of its windows: the activities of its steps (a collective is matched
    across ranks by its order among these, so every rank's steps must be the same steps)."""
    keep = np.zeros(len(merged), dtype=bool)
    rank = merged["rank"].to_numpy()
    start = merged["start_ns"].to_numpy(dtype=np.int64)
    for r, spans in windows.items():
        mine = rank == r
        for lo, hi in spans:
            keep |= mine & (start >= lo) & (start < hi)
    return merged[keep].reset_index(drop=True)


@dataclass(frozen=True)
class Wait:
    collective: int  # the collective's index in the window, in each rank's order
    name: str
    last_rank: int  # the rank everyone waits for (last to arrive)
    waits_ns: dict[int, int]  # per rank: how long it waited for last_rank (0 for last_rank)


def collective_waits(merged: pd.DataFrame) -> list[Wait]:
    """Per collective (matched across ranks by order), the last rank to arrive and every rank's wait for it.

    Raises ValueError when the ranks ran different numbers of collectives (the traces do not line up).
    """
    comm = merged[_comm_mask(merged)]
    per_rank = {int(r): comm[comm["rank"] == r].sort_values("start_ns", kind="stable") for r in sorted(merged["rank"].unique())}
    if not len(comm):
        return []
    counts = {r: len(g) for r, g in per_rank.items()}
    if len(set(counts.values())) != 1:
        raise ValueError(f"ranks ran different numbers of collectives: {counts}")
    out = []
    for i in range(next(iter(counts.values()))):
        arrivals = {r: int(g["start_ns"].iloc[i]) for r, g in per_rank.items()}
        last = max(arrivals, key=lambda r: (arrivals[r], -r))
        name = str(per_rank[last]["name"].iloc[i])
        out.append(Wait(i, name, last, {r: arrivals[last] - a for r, a in arrivals.items()}))
    return out


def waits_per_step(waits: list[Wait], steps: int) -> list[dict]:
    """The waits grouped into ``steps`` equal runs of collectives (a DDP or FSDP step runs the same collectives every
    step): per step, each rank's total wait and the rank that was last to arrive most often (ties: the one waited for longest)."""
    if steps < 1 or len(waits) % steps:
        raise ValueError(f"{len(waits)} collectives do not split into {steps} equal steps")
    per = len(waits) // steps
    out = []
    for k in range(steps):
        chunk = waits[k * per:(k + 1) * per]
        summary = wait_summary(chunk)
        caused: dict[int, int] = {}
        for w in chunk:
            caused[w.last_rank] = caused.get(w.last_rank, 0) + sum(w.waits_ns.values())
        waited_for = max(summary["last_to_arrive"], key=lambda r: (summary["last_to_arrive"][r], caused[r], -r)) if chunk else None
        out.append({"step": k, "collectives": per, "waited_for": waited_for, "waited_ns": summary["waited_ns"]})
    return out


def wait_summary(waits: list[Wait]) -> dict[str, dict[int, int]]:
    """How often each rank was the last to arrive, and each rank's total wait in ns."""
    last: dict[int, int] = {}
    waited: dict[int, int] = {}
    for w in waits:
        last[w.last_rank] = last.get(w.last_rank, 0) + 1
        for r, ns in w.waits_ns.items():
            waited[r] = waited.get(r, 0) + ns
    return {"last_to_arrive": last, "waited_ns": waited}


def exposed_waiting_ns(merged: pd.DataFrame, waits: list[Wait], windows: dict[int, list[tuple[int, int]]] | None = None) -> dict[int, int]:
    """Per rank, the part of its exposed communication spent waiting for a later rank: time inside
    [own arrival, last arrival) of a collective when its communication runs and no compute kernel does, within the
    rank's step ``windows`` where given (so it is part of the exposed time counted over the same windows). Exact (ns)."""
    comm = merged[_comm_mask(merged)]
    out = {}
    for rank, kernels in merged.groupby("rank", sort=True):
        rank = int(rank)
        arrivals = comm[comm["rank"] == rank].sort_values("start_ns", kind="stable")["start_ns"].to_numpy(dtype=np.int64)
        if not waits or len(arrivals) != len(waits):
            out[rank] = 0
            continue
        waited = np.array([w.waits_ns.get(rank, 0) for w in waits], dtype=np.int64)
        keep = waited > 0
        spin = union_blocks(arrivals[keep], arrivals[keep] + waited[keep])[:2]
        spans = windows.get(rank, []) if windows is not None else [(int(kernels["start_ns"].min()), int(kernels["end_ns"].max()))]
        total = 0
        for lo, hi in spans:
            c, m = _compute_and_comm_blocks(kernels, int(lo), int(hi))
            spinning = _intersect_blocks(m, spin)
            total += int((spinning[1] - spinning[0]).sum()) - _intersection_ns(spinning, c)
        out[rank] = total
    return out
