"""The timing thread's host setup: pinned to one core, one intra-op thread for CUDA steps; run options.

A launch-bound eager step is one host thread issuing kernels; when the scheduler moves that thread between
cores, or puts another thread on its core, the step waits. So for warm-up and the timed loop (and the host
canaries around it) the harness pins the thread that times the case to one core of its affinity set
(``os.sched_setaffinity(0, {core})``: on Linux, 0 is the calling *thread*); the process's other threads
(CUDA driver threads, torch's CPU pool, a progress bar's refresh) are moved to the other cores, and
perflab's helper threads started meanwhile (the NVML sampler) move themselves there
(:func:`keep_off_timing_core`). The core is the last of the affinity set, or the ``pin_index``-th from the
end, so that sweep workers side by side (one per GPU) take different cores. Afterwards the affinity is
restored. Where the OS refuses (a container's cpuset, a seccomp policy), the case runs unpinned and the
row says why (``pin_warning``); where the OS has no such call (macOS), unpinned without a word.

For CUDA cases the step only issues kernels, so torch's intra-op CPU threads have nothing to do but can
still wake on the timing thread's cores; ``one_thread`` sets ``torch.set_num_threads(1)`` for the same span
and restores it after. CPU cases keep their threads (the step's work runs in them).

These are **run options**, like ``--resume``: not part of a case, so case ids do not change; the row records
what was done (``pinned_cpu``, ``timing_threads``). ``--no-pin`` (and ``pin: false`` under a sweep spec's
``harness``) turns pinning off; ``one_thread`` is an API option (``HostOptions``) so it can be measured.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Iterator


@dataclass(frozen=True)
class HostOptions:
    pin: bool = True  # pin the timing thread to one core for warm-up and the timed loop
    pin_index: int = 0  # which core: the pin_index-th from the end of the affinity set (parallel workers differ)
    one_thread: bool = True  # torch.set_num_threads(1) while a CUDA step is warmed up and timed


@dataclass
class TimingThread:
    """What :func:`timing_thread` did, for the row."""

    pinned_cpu: int | None = None
    cpus: frozenset[int] | None = None  # where the timing thread may run meanwhile (None: unknown)
    warning: str | None = None  # why it is not pinned, when pinning was asked for and refused
    threads: int | None = None  # torch intra-op threads meanwhile


_others: frozenset[int] | None = None  # set while a timing thread is pinned: the cores for everything else


def choose_core(cpus, index: int = 0) -> int:
    """The ``index``-th CPU from the end of ``cpus`` (wrapping around)."""
    ordered = sorted(cpus)
    return ordered[-1 - (index % len(ordered))]


@contextlib.contextmanager
def timing_thread(device: str, options: HostOptions | None = None) -> Iterator[TimingThread]:
    """Pin the calling thread (and set one intra-op thread for CUDA) for the block; restore both after.

    While pinned, the process's other threads that exist now (CUDA driver threads, torch's CPU pool, a
    progress bar's refresh thread) are moved to the other cores, and put back after; threads started
    meanwhile call :func:`keep_off_timing_core`."""
    global _others
    options = options or HostOptions()
    state = TimingThread()
    original = _affinity()
    state.cpus = frozenset(original) if original else None
    moved: dict[int, set[int]] = {}
    if options.pin and original:
        core = choose_core(original, options.pin_index)
        try:
            os.sched_setaffinity(0, {core})
        except OSError as exc:
            state.warning = f"could not pin the timing thread to CPU {core} ({exc.strerror or exc}); timed unpinned"
        else:
            state.pinned_cpu, state.cpus = core, frozenset({core})
            rest = frozenset(original) - {core}
            _others = rest or frozenset(original)
            if rest:
                moved = _move_other_threads(rest)
    previous_threads = None
    import torch

    if options.one_thread and device == "cuda":
        previous_threads = torch.get_num_threads()
        torch.set_num_threads(1)
    state.threads = torch.get_num_threads()
    try:
        yield state
    finally:
        if previous_threads is not None:
            torch.set_num_threads(previous_threads)
        if state.pinned_cpu is not None:
            _others = None
            for tid, mask in moved.items():
                try:
                    os.sched_setaffinity(tid, mask)
                except OSError:  # the thread has ended
                    pass
            try:
                os.sched_setaffinity(0, original)
            except OSError:
                pass


@contextlib.contextmanager
def intra_op_threads(device: str, options: HostOptions | None = None) -> Iterator[None]:
    """The torch intra-op threads that :func:`timing_thread` sets (one for CUDA steps), without pinning: for a
    compiled step's first call. torch.compile guards on the thread count, so a graph compiled under another count
    is compiled again at the first warm-up step, and each compile counts towards dynamo's per-code limit."""
    import torch

    options = options or HostOptions()
    previous = None
    if options.one_thread and device == "cuda":
        previous = torch.get_num_threads()
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if previous is not None:
            torch.set_num_threads(previous)


def _move_other_threads(cpus: frozenset[int]) -> dict[int, set[int]]:
    """Move every other thread of this process to ``cpus``; their previous affinities, by thread id."""
    import threading

    me = threading.get_native_id()
    moved = {}
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except (OSError, ValueError):
        return moved
    for tid in tids:
        if tid == me:
            continue
        try:
            mask = os.sched_getaffinity(tid)
            if not mask <= cpus:
                os.sched_setaffinity(tid, cpus)
                moved[tid] = mask
        except OSError:  # ended meanwhile, or not ours to move
            pass
    return moved


def keep_off_timing_core() -> None:
    """Called first thing in a perflab helper thread: if a timing thread is pinned, run on the other cores.

    A thread inherits its creator's affinity, so one started by the pinned timing thread would share its
    core; ``sched_setaffinity(0, ...)`` called inside the thread moves that thread only."""
    others = _others
    if others:
        try:
            os.sched_setaffinity(0, others)
        except OSError:
            pass


def _affinity() -> set[int] | None:
    getter = getattr(os, "sched_getaffinity", None)
    if getter is None or getattr(os, "sched_setaffinity", None) is None:
        return None
    try:
        return set(getter(0))
    except OSError:
        return None
