"""Cases timed together: built and warmed first, then timed in blocks, in a seeded random interleaved order.

A launch-bound eager step is as fast as the host that issues it, and a shared host's speed moves over seconds
(docs/performance.md: the same eager case moved 2× between processes on an idle H100 host). Timed one after
the other, two cases see different stretches of the host, and their ratio, the speedup a user asks about,
moves with it. Timed in interleaved blocks, a slow stretch falls on both, so it cancels in the ratio of their
blocks, paired in time (``stats.paired_ratio``); and each case's samples are spread over the whole run,
so its confidence interval sees the host's drift over the run (``stats.hierarchical_ci``).

The plan: every round, each case times one block of its steps; the order within a round is random (seeded)
by **group** (cases compared with each other, such as a baseline and its variant at one point), and each
group's cases run next to each other in random order, so the blocks of a pair are adjacent in time. Google
Benchmark's random interleaving does the same for CPU benchmarks.

This module holds the order and the loop; ``measure.harness.run_cases`` builds, warms, pools by memory and
turns the blocks into rows.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Callable, Hashable, Sequence


def interleaved_order(groups: Sequence[Hashable], rounds: int, seed: int = 0, balanced: bool = False,
                      drawn: bool = False) -> list[list[int]]:
    """For each of ``rounds`` rounds, the order in which the cases (indices into ``groups``) time one block each.

    ``groups[i]`` is case i's group: the groups come in a random order each round, each group's cases next to
    each other in a random order. ``balanced``: each group's cases in the order ``balanced_order`` gives (from their
    order in ``groups``), not drawn: each case first equally often, and a drift linear in time cancels by
    construction, where a random draw can put one case first in 6 of 8 rounds. ``balanced`` and ``drawn``: each pair
    of rounds' order of a group's cases is drawn (seeded) and reversed in the pair's second round
    (``drawn_balanced_order``): balanced the same way, and the seed changes the schedule even of one group. Seeded:
    the same arguments give the same order."""
    rng = random.Random(seed)
    members: dict[Hashable, list[int]] = {}
    for index, group in enumerate(groups):
        members.setdefault(group, []).append(index)
    keys = list(members)
    order = []
    for r in range(rounds):
        rng.shuffle(keys)
        this_round = []
        for key in keys:
            if balanced and drawn:
                cases = drawn_balanced_order(members[key], r, f"{seed}:{key!r}")
            elif balanced:
                cases = balanced_order(members[key], r)
            else:
                cases = list(members[key])
                rng.shuffle(cases)
            this_round += cases
        order.append(this_round)
    return order


def balanced_order(items: Sequence, r: int) -> list:
    """``items`` in round ``r`` of a balanced order: rotated by ``r // 2`` and reversed in odd rounds (two items: A B,
    B A, B A, A B, ...). Each pair of rounds gives every item positions that sum to the same (i and n - 1 - i), so a
    drift linear in time falls on each alike and cancels, and each item runs before each other one once; over 2n
    rounds each item is first equally often (two items: once in every pair of rounds)."""
    n = len(items)
    if n == 0:
        return []
    shift = (r // 2) % n
    rotated = list(items[shift:]) + list(items[:shift])
    return rotated[::-1] if r % 2 else rotated


def drawn_balanced_order(items: Sequence, r: int, seed) -> list:
    """``items`` in round ``r`` of a drawn balanced order: per pair of rounds a permutation drawn with ``seed`` (and the
    pair's index), reversed in the pair's second round. Each pair gives every item positions that sum to the same, so
    a drift linear in time cancels, and each item runs before each other one once a pair."""
    drawn = list(items)
    random.Random(f"{seed}:{r // 2}").shuffle(drawn)
    return drawn[::-1] if r % 2 else drawn


@dataclass
class BlockRecord:
    """One timed block of one case."""

    round: int
    ms_per_step: float
    steps: int
    transient_bytes: int | None = None  # allocated above what was allocated at the block's start, at its peak
    load: tuple | None = None  # (before, after) measure.sched samples of the timing thread around the block
    gpu: object | None = None  # measure.energy.BlockReading: the clocks and throttle reasons NVML read while it ran
    started_s: float | None = None  # when it began, in seconds from the session's start (its blocks' order in time)


@dataclass
class SessionTiming:
    """What an interleaved session measured: per case, its blocks; the host canary before and after the rounds."""

    blocks: list[list[BlockRecord]]
    round_canaries_us: list[float | None] = field(default_factory=list)  # before the first round and after the last (or each round's)
    wall_s: float = 0.0


def block_schedule(order: list[list[int]], n_blocks: Sequence[int], block_sizes: Sequence[Sequence[int]]) -> list[list[tuple[int, int]]]:
    """Per round, the (case, steps) blocks to time, in ``order``'s order. Case i's ``n_blocks[i]`` blocks are spread
    evenly over the rounds (block b in round ⌊b·R/n⌋), so a case with fewer blocks than rounds still spans the run."""
    rounds = len(order)
    at: list[dict[int, int]] = [dict() for _ in range(rounds)]
    for i, n in enumerate(n_blocks):
        for b in range(n):
            at[(b * rounds) // n][i] = block_sizes[i][b]
    return [[(i, at[r][i]) for i in this_round if i in at[r]] for r, this_round in enumerate(order)]


WARM_STEPS = 1  # untimed steps of a case right before each of its blocks: no block starts cold


def time_interleaved(steps: Sequence[Callable[[], object]], schedule: list[list[tuple[int, int]]], *,
                     enter: Callable[[int], object], device: str, canary: Callable[[], float | None] | None = None, on_round: Callable[[int], None] | None = None,
                     read_gpu: Callable[[float], object] | None = None, warm: int = WARM_STEPS,
                     canary_each_round: bool = False) -> SessionTiming:
    """Run ``schedule``: per round, each listed case times its block of steps; the host canary (if given) before the
    first round and after the last (``canary_each_round``: before every round instead).

    The canary is kept out of the rounds: run before a round, it slowed the block timed right after it (on the CPU, a
    tiny model's first block of a round ran 7–11% slower than the one beside it, and one warm step left 2.5–4% of
    that: ``benchmarks/position_cpu.py``), a position effect the balanced order spreads over both sides but that widens
    every ratio's spread and, with a plain median of block ratios, leaned B/A above 1. Each block is also preceded by
    ``warm`` untimed steps of its own case, synchronised, so it does not start cold after another case's block.

    ``enter(i)`` returns the context manager case i's steps run in (its grad mode and precision), entered around
    each of its blocks. Each block is bracketed by ``perflab.clock.StepClock`` stamps (CUDA events on the GPU, the
    host clock on the CPU) and synchronised at its end, so a block's time and memory are its own; the start stamp is
    taken after the context is entered, so switching cases costs no timed time. ``read_gpu(since)``: called as each block ends, after its
    timing (``measure.energy``'s ``block_reading``), for what the GPU's clocks did during that block alone."""
    import torch

    from perflab.measure import sched
    from perflab.clock import StepClock
    from perflab.runtime.device import synchronize

    cuda = device == "cuda"
    clock = StepClock(cuda)
    blocks: list[list[BlockRecord]] = [[] for _ in steps]
    canaries: list[float | None] = []
    session0 = time.perf_counter()
    if canary is not None and not canary_each_round:
        canaries.append(canary())
    for r, this_round in enumerate(schedule):
        if on_round is not None:
            on_round(r)
        if canary_each_round:
            canaries.append(canary() if canary is not None else None)
        for i, n in this_round:
            step = steps[i]
            with enter(i):
                for _ in range(warm):
                    step()
                if warm:
                    synchronize(device)
                if cuda:
                    torch.cuda.reset_peak_memory_stats()
                    alloc0 = torch.cuda.memory_allocated()
                clock.reserve(2)
                load0 = sched.sample()
                start = clock.stamp()
                for _ in range(n):
                    step()
                end = clock.stamp()
                synchronize(device)
                load1 = sched.sample()
                t0 = start[1] / 1e9  # perf_counter's clock, in its seconds
                record = BlockRecord(r, clock.read(start, end)[0] / n, n, load=(load0, load1), started_s=t0 - session0)
                if cuda:
                    record.transient_bytes = torch.cuda.max_memory_allocated() - alloc0
                if read_gpu is not None:
                    record.gpu = read_gpu(t0)
                blocks[i].append(record)
    if canary is not None and not canary_each_round:
        canaries.append(canary())
    return SessionTiming(blocks, canaries, time.perf_counter() - session0)
