"""A program's whole loop at the analysis floor, its figures; ``program/loop.py`` watches the loop as the program runs.

The whole loop of a program's timed steps, from untraced evidence only: what a step is as the program lives it. No torch.

A program's wall time is the sum of its steps, so the **mean** step sets it and the throughput (steps, samples and
tokens per second); the median beside it describes the typical step. A step is split into what fills it, each part
measured without a profiler (``program.loop``, ``measure.gpu_busy``):

- **input**: the host's waits for the next batch (a DataLoader's ``__next__``, or a function ``--input`` names), and the
  part of each wait the GPU spent idle (**exposed**: no queued work hid it; on the CPU, all of it);
- **synchronising calls**: the host's time blocked in them (``.item()``, ``torch.cuda.synchronize``, ...), by source line;
- **the GPU's busy share** of the window: GPM's graphics-engine activity, or NVML's utilization samples;
- **the host's own time**: its clock over the step, less its waits (input and synchronising calls).

**Stalls** are the steps longer than ``stall_factor`` × the median. Their excess over the median is split into the
input, the synchronising calls and the rest (the program's own work between steps: evaluation, checkpoints,
logging), and a stall that comes back every k steps is said to.

Each wait and call is placed in the step whose window (the host's clock at the step's boundaries) holds its start;
those outside every window were between steps. Every figure per step is a mean over the timed steps.
"""

from __future__ import annotations

import bisect
from collections import Counter

import numpy as np

STALL_FACTOR = 1.5  # a step longer than this × the median step is a stall (--stall-factor)
STALLS_SAID = 0.10  # stalls taking more of the wall time than this are said first
INPUT_BOUND = 0.10  # exposed input wait of at least this share of the wall time: input-bound (TraceML's warning level)


def _place(starts_ns, windows_ns) -> list[int | None]:
    """The step each start falls in (its window holds it), or None: between steps."""
    lows = [w[0] for w in windows_ns]
    out = []
    for start in starts_ns:
        i = bisect.bisect_right(lows, start) - 1
        out.append(i if i >= 0 and start < windows_ns[i][1] else None)
    return out


def _per_step(values, places, n: int) -> np.ndarray:
    out = np.zeros(n)
    for value, i in zip(values, places):
        if i is not None and value is not None:
            out[i] += value
    return out


def _period(indices: list[int], excess) -> int | None:
    """k where the stalls come back every k steps: at least three stalls, and two thirds of their gaps equal to k. Only
    the stalls at least half as long as the typical stall's excess count: a step of noise just past the threshold
    does not break the pattern of the long ones."""
    if len(indices) >= 3:
        excess = np.asarray(excess, dtype=float)
        indices = [i for i, e in zip(indices, excess) if e >= 0.5 * float(np.median(excess))]
    if len(indices) < 3:
        return None
    gaps = Counter(b - a for a, b in zip(indices, indices[1:]))
    k, count = gaps.most_common(1)[0]
    return k if k > 1 and count >= (2 * (len(indices) - 1) + 2) // 3 else None


def loop_section(step_ms, host_step_ms, windows_ns, raw: dict | None, busy: dict | None = None, *, stall_factor: float = STALL_FACTOR,
                 batch_size: int | None = None, seq_len: int | None = None, worker_batches: dict | None = None) -> dict | None:
    """The loop of the timed steps. ``step_ms``: each step by the step clock; ``host_step_ms``: the same by the host's;
    ``windows_ns``: each step's (start, end) on the host's clock; ``raw``: ``program.loop.LoopWatch.take``'s columns;
    ``busy``: ``measure.gpu_busy.BusyMeter.stop``'s reading over the same steps; ``batch_size``/``seq_len``: the
    samples a step takes and the tokens a sample has, where the user gives them (else read from the batches);
    ``worker_batches``: the DataLoader workers' batches fetched inside the window (``read_worker_batches``)."""
    steps = np.asarray(step_ms or [], dtype=float)
    n = len(steps)
    if n == 0:
        return None
    windows = [tuple(w) for w in (windows_ns or [])][:n]
    raw = raw or {}
    median, mean = float(np.median(steps)), float(steps.mean())
    wall = float(steps.sum())
    out = {"steps": n, "median_ms": median, "mean_ms": mean, "wall_ms": wall, "steps_per_s": 1000.0 / mean if mean > 0 else None,
           "mean_over_median": mean / median if median > 0 else None}
    host = np.asarray(host_step_ms or [], dtype=float)
    out["host_mean_ms"] = float(host.mean()) if len(host) else None

    waits = raw.get("waits") or {}
    wait_places = _place(waits.get("start_ns") or [], windows) if len(windows) == n else [None] * len(waits.get("start_ns") or [])
    wait_ms = [(e - s) / 1e6 for s, e in zip(waits.get("start_ns") or [], waits.get("end_ns") or [])]
    input_ms = _per_step(wait_ms, wait_places, n)
    exposed_ms = _per_step(waits.get("exposed_ms") or [], wait_places, n)

    syncs = raw.get("syncs") or {}
    sync_places = _place(syncs.get("start_ns") or [], windows) if len(windows) == n else [None] * len(syncs.get("start_ns") or [])
    sync_ms_each = [(e - s) / 1e6 for s, e in zip(syncs.get("start_ns") or [], syncs.get("end_ns") or [])]
    sync_ms = _per_step(sync_ms_each, sync_places, n)
    out["per_step"] = {"input_ms": input_ms.tolist(), "exposed_input_ms": exposed_ms.tolist(), "sync_ms": sync_ms.tolist()}

    out["throughput"] = _throughput(waits, wait_places, n, mean, batch_size, seq_len)
    out["input"] = _input(waits, wait_places, input_ms, exposed_ms, wall, mean, raw, worker_batches)
    out["sync"] = _sync(syncs, sync_places, sync_ms_each, sync_ms, n, wall)
    out["stalls"] = _stalls(steps, median, wall, stall_factor, exposed_ms, sync_ms)
    out["busy"] = _busy(busy, mean)
    if out["host_mean_ms"] is not None:
        # the host's own time a step: its clock, less its waits for input and in synchronising calls
        out["host_own_ms"] = max(out["host_mean_ms"] - float(input_ms.mean()) - float(sync_ms.mean()), 0.0)
    else:
        out["host_own_ms"] = None
    return out


def _throughput(waits: dict, places, n: int, mean: float, batch_size, seq_len) -> dict:
    """Samples and tokens a step and a second: the user's ``--batch-size`` (× ``--seq-len``), else the batches the
    timed steps took (every step must have taken one for the figure to stand)."""
    if batch_size:
        tokens = batch_size * seq_len if seq_len else None
        source = "--batch-size" + (" × --seq-len" if seq_len else "")
        samples = float(batch_size)
    else:
        samples_each = _per_step(waits.get("samples") or [], places, n)
        tokens_each = _per_step(waits.get("tokens") or [], places, n)
        if not (samples_each > 0).all():
            return {"samples_per_step": None, "tokens_per_step": None, "samples_per_s": None, "tokens_per_s": None,
                    "source": "no batch size: not every timed step took a batch perflab could count (give --batch-size)"}
        samples = float(samples_each.mean())
        tokens = float(tokens_each.mean()) if (tokens_each > 0).all() else None
        source = "the batches the timed steps took"
    per_s = 1000.0 / mean if mean > 0 else None
    return {"samples_per_step": samples, "tokens_per_step": tokens, "samples_per_s": samples * per_s if per_s else None,
            "tokens_per_s": tokens * per_s if tokens and per_s else None, "source": source}


def _input(waits: dict, places, input_ms, exposed_ms, wall: float, mean: float, raw: dict, worker_batches: dict | None) -> dict | None:
    count = sum(1 for p in places if p is not None)
    if not count and not raw.get("loaders"):
        return None
    exposed_total = float(exposed_ms.sum())
    n = len(input_ms)
    out = {"waits": count, "waits_per_step": count / n, "wait_ms_per_step": float(input_ms.mean()),
           "exposed_ms_per_step": float(exposed_ms.mean()), "hidden_ms_per_step": float(max(input_ms.mean() - exposed_ms.mean(), 0.0)),
           "exposed_share": exposed_total / wall if wall > 0 else None, "sources": sorted(set(waits.get("source") or [])),
           "loaders": raw.get("loaders") or [], "named": raw.get("inputs")}
    workers = worker_batches or {}
    if workers.get("ms"):
        out["worker_batch_ms"] = float(np.median(workers["ms"]))
        out["worker_batches"] = len(workers["ms"])
        out["workers_seen"] = len(set(workers.get("pid") or []))
    out["fix"] = _input_fix(out, mean)
    return out


def _input_fix(section: dict, mean: float) -> dict | None:
    """What ends the exposed wait, and what it gains: the wall time less the exposed wait (each step shorter by its
    exposed wait). With the workers' own time per batch, the workers a step needs: enough that they fetch a step's
    batches in the time the step takes without waiting."""
    exposed = section["exposed_ms_per_step"]
    if not exposed or exposed <= 0:
        return None
    predicted = max(mean - exposed, 1e-9)
    fix = {"predicted_mean_ms": predicted, "speedup": mean / predicted}
    loaders = section.get("loaders") or []
    if not loaders:
        return fix
    have = int(loaders[0].get("num_workers") or 0)
    # a batch's time: measured in the workers; with none, the main process fetches each batch inside its wait
    batch_ms = section.get("worker_batch_ms") if have else section["wait_ms_per_step"] / max(section["waits_per_step"], 1e-9)
    if batch_ms:
        need = int(np.ceil(batch_ms * section["waits_per_step"] / predicted))
        fix.update(num_workers=have, batch_ms=batch_ms)
        if have and need < have:
            # the workers make a step's batches faster than the step runs: more of them will not shorten the wait,
            # which is in handing the batches over (the workers' queue, unpickling, collation, pin_memory)
            fix["workers_keep_up"] = True
        else:
            fix["workers_needed"] = max(need + 1, have + 1)
    return fix


def _sync(syncs: dict, places, ms_each, sync_ms, n: int, wall: float) -> dict | None:
    sites = syncs.get("sites") or []
    inside = [i for i, p in enumerate(places) if p is not None]
    if not inside:
        return None
    by_site: dict[int, dict] = {}
    for i in inside:
        entry = by_site.setdefault(syncs["site"][i], {"calls": Counter(), "count": 0, "blocked_ms": 0.0})
        entry["calls"][syncs["call"][i]] += 1
        entry["count"] += 1
        entry["blocked_ms"] += ms_each[i]
    rows = [{"site": sites[s], "call": e["calls"].most_common(1)[0][0], "per_step": e["count"] / n,
             "blocked_ms_per_step": e["blocked_ms"] / n} for s, e in by_site.items()]
    rows.sort(key=lambda r: -r["blocked_ms_per_step"])
    return {"calls_per_step": len(inside) / n, "blocked_ms_per_step": float(sync_ms.mean()),
            "blocked_share": float(sync_ms.sum()) / wall if wall > 0 else None, "sites": rows}


def _stalls(steps: np.ndarray, median: float, wall: float, factor: float, exposed_ms: np.ndarray, sync_ms: np.ndarray) -> dict:
    """The steps beyond ``factor`` × the median, their share of the wall time, and what their excess was: the exposed
    input wait and the synchronising calls beyond a typical step's, the rest the program's own work."""
    threshold = factor * median
    stall = np.flatnonzero(steps > threshold)
    out = {"factor": factor, "threshold_ms": threshold, "count": int(len(stall)), "steps": stall.tolist(),
           "share": float(steps[stall].sum()) / wall if wall > 0 else 0.0, "period": _period(stall.tolist(), steps[stall] - median),
           "excess_ms": float((steps[stall] - median).sum()) if len(stall) else 0.0}
    out["said"] = out["share"] > STALLS_SAID
    if len(stall):
        typical = ~np.isin(np.arange(len(steps)), stall)
        base_input = float(np.median(exposed_ms[typical])) if typical.any() else 0.0
        base_sync = float(np.median(sync_ms[typical])) if typical.any() else 0.0
        input_part = sync_part = 0.0
        for i in stall:
            excess = steps[i] - median
            a = min(max(exposed_ms[i] - base_input, 0.0), excess)
            b = min(max(sync_ms[i] - base_sync, 0.0), excess - a)
            input_part, sync_part = input_part + a, sync_part + b
        out["causes_ms"] = {"input": input_part, "sync": sync_part, "own": max(out["excess_ms"] - input_part - sync_part, 0.0)}
        out["cause"] = max(out["causes_ms"], key=out["causes_ms"].get)
        rest = steps[typical]
        out["typical_cv"] = float(rest.std(ddof=1) / rest.mean()) if len(rest) > 1 and rest.mean() > 0 else None
    return out


def _busy(busy: dict | None, mean: float) -> dict | None:
    if not busy:
        return None
    out = dict(busy)
    share = busy.get("busy_share")
    out["busy_ms_per_step"] = share * mean if share is not None else None
    return out


CAUSE_WORDS = {"input": "waiting for input", "sync": "blocked in synchronising calls", "own": "the program's own work between steps"}


def ordinal(n: int) -> str:
    """2nd, 3rd, 4th, 11th, 21st."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def stall_line(loop: dict | None) -> str | None:
    """The first line of a run whose stalls take more than ``STALLS_SAID`` of its wall time; None otherwise."""
    stalls = (loop or {}).get("stalls") or {}
    if not stalls.get("said"):
        return None
    every = ""
    if stalls.get("period"):
        nth = ordinal(stalls["period"])
        every = f", every {nth} step" if stalls["count"] * stalls["period"] <= loop["steps"] + stalls["period"] else \
            f" (the longest every {nth} step)"
    causes = stalls.get("causes_ms") or {}
    excess = stalls.get("excess_ms") or 0.0
    parts = ", ".join(f"{CAUSE_WORDS[k]} {v / excess:.0%}" for k, v in sorted(causes.items(), key=lambda kv: -kv[1]) if excess > 0 and v > 0)
    return (f"{stalls['count']} of {loop['steps']} timed steps{every} took over {stalls['factor']:g}× the median "
            f"({loop['median_ms']:.3f} ms) and {stalls['share']:.0%} of the wall time; the mean step is {loop['mean_ms']:.3f} ms "
            f"(×{loop['mean_over_median']:.2f} the median). What the stalls added: {parts or 'not measured'}")
