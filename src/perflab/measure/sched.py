"""Host contention over the timed loop, read from the kernel's own accounting (Linux ``/proc``).

Two numbers per row, each a fraction of the timed loop's wall time:

- ``host_wait_frac``: the time the timing thread was **runnable but waiting for a CPU** (the run-queue
  delay), the 2nd field of ``/proc/thread-self/schedstat`` (ns; the kernel's ``sched_info.run_delay``).
  Another process or thread on the timing thread's core shows here at once: a busy loop sharing its core
  reads about 0.5 (``tests/data/proc/contended``). A thread blocked in a CUDA synchronise is not runnable
  and adds nothing.
- ``host_steal_frac``: **VM steal**, the time the hypervisor ran something else while a virtual CPU wanted
  to run: the 8th value of the ``cpuN`` lines of ``/proc/stat`` (USER_HZ ticks, usually 100 per second)
  of the CPUs the timing thread may run on (its pinned CPU, else its affinity set), ÷ (wall × USER_HZ ×
  those CPUs). A tick is 10 ms, so over a 1 s loop on one CPU it moves in steps of 1%.

Either one missing (another OS, a kernel without schedstats, a sandbox hiding ``/proc``) is ``None``,
never a guess. The parsers are pure functions of the files' text, tested on samples recorded on a 2-core
VM (``tests/data/proc``). The flag built on them, ``host_contention``, is raised when rows are read
(``measure.canary.mark_host_flags``), with the thresholds below.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Iterable

SCHEDSTAT_PATH = "/proc/thread-self/schedstat"  # the calling thread's (Linux ≥ 3.17)
STAT_PATH = "/proc/stat"
THREAD_STAT_PATH = "/proc/thread-self/stat"

# Thresholds set from measurements (docs/performance.md, "Host contention"): on an H100 host healthy timed loops
# waited 0.00-0.13% of their wall time and a core shared with one busy loop 50% (the 2-core VM: 0.3% and 50%,
# tests/data/proc); 5% is 38x the healthy maximum and a tenth of sharing. Steal: none seen on either host; one
# 10 ms tick per second per CPU is 1%, so 2% is the smallest threshold one tick of rounding cannot cross alone.
HOST_WAIT_THRESHOLD = 0.05
HOST_STEAL_THRESHOLD = 0.02

WAIT_KEY = "host_wait_frac"
STEAL_KEY = "host_steal_frac"


def parse_schedstat(text: str) -> tuple[int, int, int]:
    """``/proc/<pid>/schedstat``: (ns on a CPU, ns runnable but waiting, timeslices). ValueError if malformed."""
    parts = text.split()
    if len(parts) < 3:
        raise ValueError(f"schedstat: expected 3 numbers, got {text!r}")
    run_ns, wait_ns, slices = (int(p) for p in parts[:3])
    return run_ns, wait_ns, slices


def parse_steal(text: str, cpus: Iterable[int] | None = None) -> int:
    """Steal ticks (USER_HZ) in ``/proc/stat``: summed over the ``cpuN`` lines of ``cpus``, or the all-CPU ``cpu``
    line when ``cpus`` is None. ValueError when a CPU asked for has no line, or a line has no steal field."""
    wanted = None if cpus is None else {f"cpu{c}" for c in cpus}
    total, seen = 0, set()
    for line in text.splitlines():
        fields = line.split()
        if not fields or not fields[0].startswith("cpu"):
            continue
        name = fields[0]
        if (wanted is None and name != "cpu") or (wanted is not None and name not in wanted):
            continue
        if len(fields) < 9:  # name + user nice system idle iowait irq softirq steal
            raise ValueError(f"/proc/stat: no steal field in {line!r}")
        total += int(fields[8])
        seen.add(name)
    missing = ({"cpu"} if wanted is None else wanted) - seen
    if missing:
        raise ValueError(f"/proc/stat: no line for {', '.join(sorted(missing))}")
    return total


def parse_thread_cpu(text: str) -> int:
    """The CPU a thread last ran on: field 39 (``processor``) of ``/proc/<pid>/stat``. The 2nd field (the
    command, in parentheses) may hold spaces, so the fields are counted after its closing parenthesis."""
    rest = text[text.rindex(")") + 1:].split()
    return int(rest[39 - 3])  # rest[0] is field 3 (state)


def read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def current_cpu() -> int | None:
    """The CPU this thread is running on (last ran on), or None where /proc does not say."""
    text = read_text(THREAD_STAT_PATH)
    try:
        return parse_thread_cpu(text) if text else None
    except (ValueError, IndexError):
        return None


@dataclass(frozen=True)
class HostSample:
    """What is read at one end of the timed loop."""

    t: float  # perf_counter, s
    schedstat: str | None
    stat: str | None


def sample() -> HostSample:
    """Read the timing thread's schedstat and /proc/stat now (call it from the timing thread)."""
    sched = read_text(SCHEDSTAT_PATH)
    stat = read_text(STAT_PATH)
    return HostSample(time.perf_counter(), sched, stat)


def contention(before: HostSample, after: HostSample, cpus: Iterable[int] | None, user_hz: int | None = None) -> dict:
    """``{host_wait_frac, host_steal_frac}`` between two samples, each None where its file is missing or unreadable.

    ``cpus``: the CPUs the thread could run on (its pinned CPU, else its affinity set); None: all (the ``cpu`` line).
    """
    return contention_over([(before, after)], cpus, user_hz)


def contention_over(stretches: Iterable[tuple[HostSample, HostSample]], cpus: Iterable[int] | None, user_hz: int | None = None) -> dict:
    """:func:`contention` over several stretches of time (the blocks of one case in an interleaved run): the wait and
    the steal summed over the stretches, ÷ their summed wall time. A figure is None where any stretch lacks it."""
    stretches = list(stretches)
    out = {WAIT_KEY: None, STEAL_KEY: None}
    wall = sum(after.t - before.t for before, after in stretches)
    if not stretches or not wall > 0:
        return out
    try:
        if all(b.schedstat and a.schedstat for b, a in stretches):
            waited = sum(max(0, parse_schedstat(a.schedstat)[1] - parse_schedstat(b.schedstat)[1]) for b, a in stretches)
            out[WAIT_KEY] = waited / 1e9 / wall
    except ValueError:
        pass
    if all(b.stat and a.stat for b, a in stretches):
        cpus = sorted(cpus) if cpus is not None else None
        n = len(cpus) if cpus is not None else _n_cpus(stretches[0][0].stat)
        hz = user_hz or _user_hz()
        try:
            ticks = sum(max(0, parse_steal(a.stat, cpus) - parse_steal(b.stat, cpus)) for b, a in stretches)
            out[STEAL_KEY] = ticks / hz / wall / n if n and hz else None
        except ValueError:
            pass
    return out


def _n_cpus(stat: str) -> int:
    return sum(1 for line in stat.splitlines() if line.startswith("cpu") and line[3:4].isdigit())


def _user_hz() -> int | None:
    try:
        return os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError, AttributeError):
        return None


def process_age_s() -> float | None:
    """Seconds since this process started (``/proc/self/stat`` field 22 against ``/proc/stat``'s ``btime``): the
    interpreter's start and the imports before the caller. None where /proc does not say."""
    stat, boot = read_text("/proc/self/stat"), read_text(STAT_PATH)
    hz = _user_hz()
    if not stat or not boot or not hz:
        return None
    try:
        start_ticks = int(stat[stat.rindex(")") + 1:].split()[22 - 3])
        btime = next(int(line.split()[1]) for line in boot.splitlines() if line.startswith("btime "))
    except (ValueError, IndexError, StopIteration):
        return None
    return max(0.0, time.time() - (btime + start_ticks / hz))

