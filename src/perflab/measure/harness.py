"""Run one case, or several together, and produce their result rows.

One case (``run_case``): build the model and a seeded input; check the token schedule and the FLOPs with one eager
forward; build the step for the mode and call it once (compile, capture), under the timed loop's intra-op threads.
Then, with the timing thread pinned to one core (``measure.pinning``; a run option, ``--no-pin`` turns it off): warm
up; estimate the step time; time the host's issue of 3 steps (``measure.host``: ``host_issue_ms``) and the step's
host and GPU times apart, the GPU held by a sleep kernel while the host issues (``host_held_ms``, ``device_ms``,
``host_bound_frac``); synchronise and time the host canary (``measure.canary``); then the timed loop, with nothing
else in it (no profiler, no FLOP counter, no per-step host sync, the garbage collector off), bracketed by reads of
the timing thread's run-queue wait and the VM's steal (``measure.sched``: ``host_wait_frac``, ``host_steal_frac``);
then, with the loop synchronised and NVML's sampler thread ended, the canary again (``host_canary_us`` is the
faster of the two). Peak memory is reset and NVML's energy counter read right before that loop. A failed case's
row gets a canary too, taken after the failure.

Several cases (``run_cases``, the default of bench, demo and explain): each prepared as above, held together while
they fit, then timed in interleaved blocks (``measure.interleave``), with a canary before the rounds and after them, a
contiguous energy pass per case after the rounds; ``run_in_processes`` spreads that over several processes.

An OOM or any other failure of the measurement becomes a row with status ``oom`` or ``error``; a failure that
leaves the CUDA context unusable ends the run (``CudaContextLost``, with the rows so far); bad input (an unknown
model, a keep rate of 2) raises PerflabError before anything runs.
"""

from __future__ import annotations

import contextlib
import gc
import math
import statistics
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from perflab.errors import PerflabError
from perflab.measure import sched
from perflab.measure.canary import CANARY_KEY, HOST_BOUND_KEY, canary_fields, host_canary
from perflab.measure.checks import MIN_TIMED_ITERS, Check, autotune_check, case_checks
from perflab.measure.energy import THROTTLE_REASONS, case_view, open_monitor
from perflab.measure.env import device_name, environment
from perflab.measure.flops import FlopCache, FlopCount, count_flops_once, count_params
from perflab.measure.host import HeldTiming, held_timing, issue_s
from perflab.measure.pinning import HostOptions, intra_op_threads, timing_thread
from perflab.measure.stages import TIMING, Stage
from perflab.measure.timing import TimingPlan, estimate_step_s, plan_timing, time_step
from perflab.models.registry import expected_tokens
from perflab.records.row import new_row
from perflab.runtime.device import gpu_identity, synchronize
from perflab.runtime.modes import compile_counters, compile_stats, compiled_while_timed, make_step, record_autotune
from perflab.runtime.workload import build, memory_cap, step_context
from perflab.spec import Case, validate_case
from perflab.stats import summarize
from perflab.workloads.implementations import implementation

MB = 2**20


def run_case(case: Case, *, monitor=None, on_stage: Callable[[str], None] | None = None, memory_snapshot=None,
             host: HostOptions | None = None, flop_cache: FlopCache | None = None) -> dict:
    """Measure one case. Returns the result row (a dict; see ``result_row_keys`` in the README).

    ``flop_cache``: FLOP counts shared by a sweep's cases (``measure.flops.FlopCache``): a case whose eager step was
    counted by an earlier case (another mode of it) reuses that count instead of running the step under the counter.

    ``host``: run options for the timing thread (pinning, intra-op threads; ``measure.pinning``), not part
    of the case: the default pins.

    ``memory_snapshot``: a path; on a GPU, the CUDA allocator's history from the build to the end of the timed
    loop is written there as a pickle that PyTorch's memory_viz page (pytorch.org/memory_viz) opens.
    """
    case = validate_case(case)
    if memory_snapshot is not None and case.device == "cuda":
        torch.cuda.memory._record_memory_history(max_entries=200_000)
        try:
            return run_case(case, monitor=monitor, on_stage=on_stage, host=host, flop_cache=flop_cache)
        finally:
            from pathlib import Path

            Path(memory_snapshot).parent.mkdir(parents=True, exist_ok=True)
            torch.cuda.memory._dump_snapshot(str(memory_snapshot))
            torch.cuda.memory._record_memory_history(enabled=None)
    stage = on_stage or (lambda _: None)
    monitor = monitor if monitor is not None else open_monitor(case.device)
    env = environment(case.device, monitor.device_info())
    try:
        return _measure(case, monitor, env, stage, host, flop_cache)
    except PerflabError:
        raise
    except Exception as exc:  # a failed measurement is data: the row says what happened
        return _error_row(case, exc, env)
    finally:
        release_compiled([case])
        gc.collect()
        if case.device == "cuda":
            try:
                torch.cuda.empty_cache()
            except Exception:  # a lost context fails here too; the row says so
                pass


def release_compiled(cases) -> None:
    """After compiled cases are measured, drop dynamo's caches and cudagraph trees (``torch._dynamo.reset``). A
    reduce-overhead case's CUDA-graph pool otherwise outlives it, and the next compiled case in the process records
    into that tree: its recording then re-counts the earlier graphs' live outputs (a checkpointed gpt_small read 38%
    above its plain twin measured just before it). The next compile re-traces; inductor's on-disk cache still serves."""
    if any(c.mode.startswith("compile") for c in cases):
        try:
            torch._dynamo.reset()
        except Exception:  # a lost CUDA context fails here too; the rows say so
            pass


def _error_row(case: Case, exc: BaseException, env: dict) -> dict:
    status = "oom" if is_oom(exc) else "error"
    row = failed_row(case, status, f"{type(exc).__name__}: {_first_line(exc)}", env, detail=traceback.format_exc())
    row[CANARY_KEY] = _safe_canary_us()
    if status == "error":
        lost = context_lost_after(case)
        if lost:
            row["fatal"] = row["message"]  # the error itself; the message adds what follows from it
            row["message"] += " (the CUDA context is unusable after it: no further case can run in this process)"
    return row


def context_lost_after(case: Case) -> str | None:
    """After a failed case: why no further case can run on its device in this process, or None."""
    return cuda_context_lost() if case.device == "cuda" else None


def cuda_context_lost() -> str | None:
    """Why CUDA can no longer be used in this process (a sticky error: device-side assert, illegal address), or None
    if a synchronise and a tiny kernel still work."""
    try:
        torch.cuda.synchronize()
        (torch.ones(1, device="cuda") + 1).item()
        return None
    except Exception as exc:
        return f"{type(exc).__name__}: {_first_line(exc)}"


def _stop_if_lost(rows: list, cases, i: int) -> None:
    """After case ``i``'s row: if it lost the CUDA context, stop the run with the rows measured so far."""
    from perflab.errors import CudaContextLost

    row = rows[i]
    if row is not None and row.get("fatal"):
        done = [r for r in rows if r is not None]
        left = sum(1 for r in rows if r is None)
        raise CudaContextLost(f"{cases[i].label()} left the CUDA context unusable ({row['fatal']}); "
                              f"{left} remaining case(s) cannot run in this process: run them again, or as a sweep "
                              "(perflab sweep runs each case in a fresh process)", done)


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc).lower()
    return "out of memory" in text or "cublas_status_alloc_failed" in text


@dataclass
class Prepared:
    """A case built, checked, counted, compiled and warmed up, ready to time (inside its contexts)."""

    case: Case
    impl: object
    built: object
    step: Callable[[], object]
    checked: dict
    flops: float
    params: int
    trainable: int
    first_step_s: float
    processed: int
    plan: TimingPlan
    issue: float
    issue_step: float
    held: HeldTiming
    finite: bool | None = None  # the last warm-up output (or loss) held no NaN or Inf; None: nothing to check
    resident_bytes: int | None = None  # allocated by this case and held between its steps (CUDA)
    warm_peak_bytes: int | None = None  # the allocator's peak over the calls before timing (CUDA), absolute
    alloc0: int | None = None  # allocated before the case was built (CUDA, cases timed together)
    flops_counted_in: str | None = None  # the case whose identical eager step was counted (a sweep's FLOP cache), if not this
    flop_count: FlopCount | None = None  # the count, with the heavy ops it could not count
    compile_stats: dict | None = None  # compile modes: what dynamo compiled in the first call and the warm-up (runtime.modes)
    compile_after: dict | None = None  # dynamo's counters when the case was warm: a frame compiled after it, compiled while timed
    autotune: dict | None = None  # max-autotune modes: the kernels autotuning chose (runtime.modes.record_autotune)


def _compile_and_warm(case, impl, built, params, trainable, stage, host, alloc0=None, flop_cache=None) -> Prepared:
    """Check, count FLOPs, make the step for the mode and call it once (compile, capture); then, with the timing
    thread set up (``measure.pinning``), warm up, plan the timing and measure the step's host and GPU times apart.
    Runs inside ``memory_cap`` and ``step_context``; with ``alloc0`` (CUDA) it records what the case holds."""
    stage("check")
    checked = impl.check(case, built)
    stage("flops")
    flop_count, counted_in = count_flops_once(case, lambda: built.make_step(built.model), flop_cache)

    stage("compile" if case.mode != "eager" else "warmup")
    if case.device == "cuda":
        # A CUDA graph allocates while it records, in the first calls, and never while it replays: cudagraph trees
        # rebuild a replay's outputs (a compiled step's saved activations, its gradients) from pointers into the graph
        # pool, unseen by the allocated count. The timed loop's peak alone read gpt_large's compiled train step at
        # 11.28 GiB, below its parameters, gradients and AdamW state. So the peak of these calls counts as well
        # (perflab's cudagraph mode captures in make_step; cudagraph trees record at the second call or later).
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    compiling = case.mode.startswith("compile")
    counters0 = compile_counters() if compiling else None
    with intra_op_threads(case.device, host), record_autotune(case.mode) as autotuned:  # no recompile at the first warm-up step
        step = make_step(built, case.mode)
        out = step()  # the first call compiles (compile modes); capture happens in make_step (cudagraph)
        synchronize(case.device)
        if case.device == "cuda" and case.mode.startswith("compile"):
            torch.cuda.reset_peak_memory_stats()  # not autotuning's scratch inputs: the steps from here on
    first_step_s = time.perf_counter() - started  # what the mode costs before its first step is done
    stage("warmup")
    with timing_thread(case.device, host):
        for _ in range(case.warmup):
            out = None  # one step's output alive at a time, as in the timed loop
            out = step()
        synchronize(case.device)
        processed = built.batch_of(out)
        finite = output_is_finite(out)
        # The last warm-up output must not live through the timed loop: a train_forward output holds its
        # autograd graph (every saved activation), which doubled that workload's peak memory.
        del out

        step_s = estimate_step_s(step, case.device)
        plan = plan_timing(step_s, case.repeats, case.min_time, MIN_TIMED_ITERS, case.iters)
        issue, issue_step = issue_s(step, case.device)
        held = held_timing(step, case.device, issue)
        synchronize(case.device)
    warm_peak = torch.cuda.max_memory_allocated() if case.device == "cuda" else None
    prepared = Prepared(case, impl, built, step, checked, flop_count.flops, params, trainable, first_step_s, processed, plan, issue, issue_step,
                        held, finite=finite, warm_peak_bytes=warm_peak, flops_counted_in=counted_in, flop_count=flop_count)
    if compiling:
        prepared.compile_after = compile_counters()
        prepared.compile_stats = compile_stats(counters0, prepared.compile_after)
    if autotuned is not None:
        prepared.autotune = autotuned.result()
    if alloc0 is not None:
        prepared.alloc0 = alloc0
        prepared.resident_bytes = torch.cuda.memory_allocated() - alloc0
    return prepared


def _measure(case: Case, monitor, env: dict, stage, host: HostOptions | None, flop_cache=None) -> dict:
    """One case alone: prepared, then one contiguous timed loop (sequential timing)."""
    with memory_cap(case):
        stage("build")
        # What this process holds before the case (earlier cases' compiled graphs: a reduce-overhead case's CUDA-graph
        # pool lives as long as dynamo's cache) is not the case's: its peaks are taken above it. Blocks cached but free
        # are handed back first: the case would reuse them, and its reserved peak above a baseline that counted them
        # read less than its allocated peak (an H200 test run: 820 MB reserved against 889 MB allocated).
        if case.device == "cuda":
            gc.collect()
            torch.cuda.empty_cache()
        baseline = memory_peaks(case.device, current=True)
        built = build(case)
        params, trainable = count_params(built.model)
        with step_context(case, built):
            prepared = _compile_and_warm(case, implementation(case), built, params, trainable, stage, host, flop_cache=flop_cache)
            with timing_thread(case.device, host) as thread:
                before = host_canary()  # the host's speed just before the timed loop (fixed grad/autocast state inside)
                stage(TIMING)
                if case.device == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                gc.collect()
                gc_was_enabled = gc.isenabled()
                gc.disable()  # no collection pauses inside the timed loop
                try:
                    monitor.begin()
                    load0 = sched.sample()
                    timing = time_step(prepared.step, prepared.plan, case.device)  # synchronised at its end
                    load1 = sched.sample()
                    compiled_while_timed([prepared])
                    report = monitor.end()  # the sampler thread has ended
                finally:
                    if gc_was_enabled:
                        gc.enable()
                after = host_canary()  # and just after it, with nothing in flight
            peak = memory_peaks(case.device)
            if case.device == "cuda":
                peak = {k: peak[k] - baseline[k] for k in peak}
                peak["alloc"] = max(peak["alloc"], prepared.warm_peak_bytes - baseline["alloc"])  # a graph's, as it recorded
            summary = summarize(timing.samples_ms)
            extra = prepared.impl.after_timing(case, built, prepared.step, {"median_ms": summary.median})
    measured = Measured(
        samples_ms=[float(v) for v in timing.samples_ms], timed_s=timing.timed_s, block_iters=prepared.plan.block_iters,
        timed_iters=prepared.plan.total_iters, energy_j=report.energy_j, power_w=report.power_w, energy_unavailable=report.unavailable,
        peak_alloc=peak["alloc"], peak_reserved=peak["reserved"], canary=canary_fields(before, after),
        contention=sched.contention(load0, load1, thread.cpus), extra=extra,
    )
    checks = case_checks(prepared, report, measured, env.get("max_sm_clock_mhz"))
    row = ok_row(prepared, env, report, measured, thread, checks)
    if case.device == "cuda":
        row["memory_baseline_mb"] = baseline["alloc"] / MB  # held by the process before the case, left out of its peaks
    return row


@dataclass
class Measured:
    """What the timing of one case gave, sequential or interleaved."""

    samples_ms: list[float]
    timed_s: float
    block_iters: int
    timed_iters: int
    energy_j: float | None
    power_w: float | None
    energy_unavailable: str | None
    peak_alloc: int | None
    peak_reserved: int | None
    canary: dict
    contention: dict
    extra: dict
    sample_rounds: list[int] | None = None  # interleaved: the round of each sample
    sample_processes: list[int] | None = None
    sample_started_s: list[float] | None = None  # interleaved: when each sample's block began, from the session's start
    session: dict | None = None  # interleaved: what the session was (id, cases, rounds, seed, canaries)
    gpu_view: dict = field(default_factory=dict)  # interleaved: its blocks throttled and read, each block's SM clock
    run_view: dict = field(default_factory=dict)  # interleaved: the whole run's throttle reasons and SM clock range


def ok_row(prepared: Prepared, env: dict, report, measured: Measured, thread, checks: list[Check]) -> dict:
    """The result row of a measured case; ``checks`` its flags and warnings (``checks.case_checks``)."""
    case, built = prepared.case, prepared.built
    tokens_expected, tokens_seen = prepared.checked.get("tokens_expected"), prepared.checked.get("tokens_seen")
    env = dict(env)
    env.update(
        sm_clock_mhz=report.sm_clock_mhz_end,
        sm_clock_mhz_min=report.sm_clock_mhz_min,
        sm_clock_mhz_max=report.sm_clock_mhz_max,
        throttle_reasons=report.throttle_reasons,
        other_gpu_processes=report.other_processes,
        **measured.run_view,
    )
    row = base_row(case, env)
    items = built.items_per_step
    flops = prepared.flops
    held = prepared.held
    row.update(
        status="ok",
        tokens=tokens_seen if tokens_seen is not None else tokens_expected,
        items_per_step=items,
        iters_per_sample=measured.block_iters,
        timed_iters=measured.timed_iters,
        timed_s=measured.timed_s,
        gflops=flops / case.batch_size / 1e9,
        gmacs=flops / case.batch_size / 2e9,
        gflops_per_batch=flops / 1e9,
        params=prepared.params,
        params_m=prepared.params / 1e6,
        params_trainable_m=prepared.trainable / 1e6,
        energy_j=measured.energy_j,
        power_w=measured.power_w,
        energy_j_per_sample=(measured.energy_j / (measured.timed_iters * case.batch_size)) if measured.energy_j else None,
        **measured.canary,
        **measured.contention,
        host_issue_ms=prepared.issue * 1e3,
        device_ms=held.device_s * 1e3 if held.device_s is not None else None,
        host_held_ms=held.host_s * 1e3 if held.host_s is not None else None,
        **host_bound(prepared),
        pinned_cpu=thread.pinned_cpu,
        timing_threads=thread.threads,
        first_step_s=prepared.first_step_s,
        **({"compile": dict(prepared.compile_stats)} if prepared.compile_stats is not None else {}),
        **({"autotune": prepared.autotune} if prepared.autotune is not None else {}),
        flags=[c.flag for c in checks],
        warnings=[c.message for c in checks],
    )
    if held.note:
        row["held_note"] = held.note
    if measured.energy_j is None and getattr(report, "expected", False):
        row["power_note"] = measured.energy_unavailable  # no meter here (the CPU): said, not flagged
    timing_fields(row, measured.samples_ms, measured.sample_processes, measured.sample_rounds)
    if measured.sample_started_s is not None:
        row["sample_started_s"] = [float(t) for t in measured.sample_started_s]
    if measured.session is not None:
        row["session"] = measured.session["id"]
        row["interleaved"] = measured.session
    row.update(measured.gpu_view)
    if thread.warning:
        row["pin_warning"] = thread.warning
    if case.family_spec.item == "token":
        row["tokens_per_s"] = row["items_per_s"]
    row.update(prepared.impl.analytic(case))
    row["flops_source"] = "counted"  # gflops & co. come from torch.utils.flop_counter on a real step, for every model
    if prepared.flops_counted_in:
        row["flops_counted_in"] = prepared.flops_counted_in  # the same eager step, counted by that case of the sweep
    if prepared.flop_count is not None and prepared.flop_count.uncounted:  # heavy ops with no FLOP formula, by calls
        row["flops_uncounted_ops"] = dict(prepared.flop_count.uncounted)
        row["flops_uncounted_share_min"] = prepared.flop_count.uncounted_share_min
    if row.get("flops_analytic"):
        row["flops_counted_vs_analytic"] = flops / row["flops_analytic"] - 1.0
    if case.is_reference:
        from perflab.models.reference import source_info

        row["model_source"] = source_info(case.model)
    row.update(measured.extra)
    if case.device == "cuda":
        row["peak_mem_alloc_mb"] = measured.peak_alloc / MB if measured.peak_alloc is not None else None
        row["peak_mem_reserved_mb"] = measured.peak_reserved / MB if measured.peak_reserved is not None else None
        if measured.peak_alloc is not None:
            row["memory_breakdown_mb"] = memory_breakdown(built, measured.peak_alloc)
        row.update(utilisation(case, row))
    return row


def timing_fields(row: dict, samples, processes=None, rounds=None) -> dict:
    """Set the row's figures that follow from its timing samples (median, spread, CIs, latency, throughput, FLOP/s,
    the GPU's busy share); the samples of several processes are merged this way too (``bench --processes``).

    The timing fields are the summary's (``stats.TimingSummary``): ``ci_ms`` (and ``ci95_ms``, the same for one more
    release) the hierarchical CI (across processes,
    else stretches of the run), ``ci_level`` says which, ``ci_coverage`` what it may claim (0.95 from 5 units or more;
    from fewer, what their ranks guarantee); ``ci95_within_ms`` the order-statistics CI of the pooled blocks."""
    summary = summarize(samples, processes, rounds)
    median = summary.median
    row.pop("modes", None)  # a process's own, where these samples are several processes' merged
    row.update(summary.to_dict())
    row.update(
        ci95_within_ms=[summary.within_low, summary.within_high], ci95_coverage=summary.within_coverage, n_samples=summary.n,
        latency_ms_per_batch=median, latency_ms_per_sample=median / row["batch_size"],
        throughput_per_s=row["batch_size"] * 1000.0 / median,
        items_per_s=row["items_per_step"] * 1000.0 / median,
        achieved_tflops=row["gflops_per_batch"] * 1e9 / (median / 1000.0) / 1e12,
        gpu_busy_frac=min(1.0, row["device_ms"] / median) if row.get("device_ms") is not None else None,
    )
    if rounds is not None:
        row["sample_rounds"] = [int(r) for r in rounds]
        row["sample_processes"] = [int(p) for p in (processes if processes is not None else [0] * len(samples))]
    if "tokens_per_s" in row:
        row["tokens_per_s"] = row["items_per_s"]
    return row


def host_bound(prepared: Prepared) -> dict:
    """``host_bound_frac``: the host's time to issue a step ÷ the GPU's time to run it, each measured with the other
    out of the way (``measure.host.held_timing``); under 0.5 a host up to twice as slow still keeps the GPU fed, so
    the host's speed cannot move the timing. Where the held timing failed (the step synchronises), the older
    reading: issue time ÷ the same steps' time to their synchronise, which a full launch queue pushes towards 1."""
    held = prepared.held
    if held.device_s and held.host_s is not None:
        return {HOST_BOUND_KEY: min(1.0, held.host_s / held.device_s), "host_bound_source": "held"}
    frac = min(1.0, prepared.issue / prepared.issue_step) if prepared.issue_step > 0 else None
    return {HOST_BOUND_KEY: frac, "host_bound_source": "issue" if frac is not None else None}


def output_is_finite(out) -> bool | None:
    """Whether a step's output (a tensor, ``.logits``/``.loss``, or the first tensor of a tuple) holds no NaN or Inf;
    None where there is no floating-point tensor to look at. One synchronisation, outside the timed loop."""
    for candidate in (out, getattr(out, "loss", None), getattr(out, "logits", None)):
        if torch.is_tensor(candidate) and candidate.is_floating_point():
            return bool(torch.isfinite(candidate).all())
    if isinstance(out, (tuple, list)):
        for item in out:
            if torch.is_tensor(item) and item.is_floating_point():
                return bool(torch.isfinite(item).all())
    return None


def memory_peaks(device: str, current: bool = False) -> dict:
    """The CUDA allocator's peaks since the last reset (``current``: what it holds now), bytes; None off the GPU."""
    if device != "cuda":
        return {"alloc": None, "reserved": None}
    if current:
        return {"alloc": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved()}
    return {"alloc": torch.cuda.max_memory_allocated(), "reserved": torch.cuda.max_memory_reserved()}


def memory_breakdown(built, peak_alloc: int) -> dict:
    """Peak allocated memory split into parameters, gradients, optimizer state and the rest (activations,
    workspace, caches), MiB. Gradients count once per trainable parameter when the step has a backward
    (a step that sets them to None at its end still holds them at its peak)."""
    params = sum(p.numel() * p.element_size() for p in built.model.parameters())
    grads = sum(p.numel() * p.element_size() for p in built.model.parameters() if p.requires_grad) if built.has_backward else 0
    optimizer = 0
    if built.optimizer is not None:
        for state in built.optimizer.state.values():
            optimizer += sum(t.numel() * t.element_size() for t in state.values() if torch.is_tensor(t) and t.device.type != "cpu")
    buffers = sum(b.numel() * b.element_size() for b in built.model.buffers())
    rest = peak_alloc - params - grads - optimizer - buffers
    return {"params": params / MB, "grads": grads / MB, "optimizer": optimizer / MB, "buffers": buffers / MB, "rest": rest / MB}


PEAK_KEYS = ("peak_tflops_measured", "copy_gbps_measured", "peak_tflops_datasheet", "bandwidth_gbps_datasheet")


def utilisation(case: Case, row: dict, peaks: dict | None = None) -> dict:
    """MFU (achieved FLOP/s over the peak matmul rate for the dtype) and, where the family states the bytes a
    step must move, MBU (achieved bytes/s over the copy bandwidth); each against the ceilings measured on
    this GPU (cached) and against the datasheet. One FLOP count per row: the counted one (``flops_source``), for MFU
    and the roofline; where the family has a formula, ``mfu_analytic`` and ``flops_counted_over_analytic`` beside it.
    ``peaks``: the ``PEAK_KEYS`` already read on the row's GPU (a process without CUDA merging rows); default, read here."""
    if peaks is None:
        from perflab.measure.ceilings import get_ceilings
        from perflab.measure.datasheet import datasheet_for

        ceilings = get_ceilings()
        sheet = datasheet_for(gpu_identity().name)
        peaks = {"peak_tflops_measured": ceilings["matmul_tflops"].get(case.dtype), "copy_gbps_measured": ceilings["copy_gbps"],
                 "peak_tflops_datasheet": sheet.tflops(case.dtype) if sheet else None,
                 "bandwidth_gbps_datasheet": sheet.bandwidth_gbps if sheet else None}
    out = {k: peaks.get(k) for k in PEAK_KEYS}
    achieved = row["achieved_tflops"]
    out["mfu"] = achieved / out["peak_tflops_measured"] if out["peak_tflops_measured"] else None  # counted FLOPs: one count per row
    out["mfu_datasheet"] = achieved / out["peak_tflops_datasheet"] if out["peak_tflops_datasheet"] else None
    counted = (row.get("gflops_per_batch") or 0.0) * 1e9
    if row.get("flops_analytic") and counted:  # the formula's count beside it, and the ratio
        out["flops_counted_over_analytic"] = counted / row["flops_analytic"]
        out["mfu_analytic"] = out["mfu"] / out["flops_counted_over_analytic"] if out["mfu"] is not None else None
    if row.get("bytes_per_step"):
        gbps = row["bytes_per_step"] / (row["median_ms"] / 1000.0) / 1e9
        out["achieved_gbps"] = gbps
        out["mbu"] = gbps / out["copy_gbps_measured"] if out["copy_gbps_measured"] else None
        out["mbu_datasheet"] = gbps / out["bandwidth_gbps_datasheet"] if out["bandwidth_gbps_datasheet"] else None
        if counted and out["peak_tflops_measured"]:
            from perflab.analysis.floors import roofline

            out.update(roofline(flops_per_step=counted, bytes_per_step=row["bytes_per_step"], achieved_tflops=achieved,
                                matmul_tflops=out["peak_tflops_measured"], copy_gbps=out["copy_gbps_measured"]))
    return out


def base_row(case: Case, env: dict) -> dict:
    """The keys every row has, whatever its status (``records.row.BASE_FIELDS``, with ``row_format``): the case's here,
    the rest empty until the row is measured or fails."""
    return new_row(
        case_id=case.id,
        case=case.to_dict(),
        model=case.model,
        family=case.family,
        workload=case.workload,
        label=case.label(),
        method=case.method,
        keep_rate=list(case.keep_rate),
        reduction_loc=list(case.reduction_loc),
        input_size=case.input_size,
        seq_len=case.seq_len,
        prompt_len=case.prompt_len,
        context_len=case.context_len,
        new_tokens=case.new_tokens,
        batch_size=case.batch_size,
        dtype=case.dtype,
        mode=case.mode,
        attn=case.attn,
        device=case.device,
        device_name=device_name(env),
        env=env,
    )


def failed_row(case: Case, status: str, message: str, env: dict, detail: str | None = None) -> dict:
    row = base_row(case, env)
    row.update(status=status, message=message, tokens=_safe_tokens(case))
    if detail:
        row["detail"] = detail
    return row


def _safe_canary_us() -> float | None:
    try:
        return host_canary().median_us
    except Exception:
        return None


def _safe_tokens(case: Case):
    try:
        return expected_tokens(case)
    except Exception:
        return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


# ---------------------------------------------------------------------------------------------------
# Several cases timed together: built and warmed first, then timed in interleaved blocks (measure.interleave).

INTERLEAVE_MEMORY_FRACTION = 0.8  # a pool of cases held together stops growing past this share of the GPU's memory


def comparison_group(case: Case) -> tuple:
    """Cases compared with each other in a bench run: the same point, another model (the fields that name a model
    variant are the family's, ``FamilySpec.model_fields``). Their blocks run next to each other in every round."""
    fields = case.to_dict()
    for key in ("model", "model_args", "family") + case.family_spec.model_fields:
        fields.pop(key, None)
    return tuple(sorted((k, repr(v)) for k, v in fields.items()))


def can_interleave(case: Case) -> str | None:
    """Why a case is timed alone rather than with the others (None: it can join)."""
    if case.max_memory is not None:
        return "--max-memory caps the whole process's allocator"
    return None


def run_cases(cases, *, host: HostOptions | None = None, interleave: bool = True, seed: int = 0, on_case=None,
              groups=None, process_index: int = 0, scopes=None, balanced: bool = False, drawn: bool = False) -> list[dict]:
    """Measure several cases; with ``interleave`` (the default) those that can be held together are built and
    warmed first, then timed in blocks in a seeded random interleaved order (``measure.interleave``), so a slow
    stretch of the host falls on all of them and ratios of their blocks, paired in time, cancel it.

    Cases are pooled while they fit: a pool stops growing when the GPU's reserved memory passes
    ``INTERLEAVE_MEMORY_FRACTION`` of its total, or when a case's build runs out of memory (that case then starts
    the next pool; alone, it is an ``oom`` row). Cases with ``--max-memory`` are timed alone, as are all cases when
    ``interleave`` is False or there is one case. ``groups``: a comparison group per case (default
    :func:`comparison_group`). ``on_case(index, case, stage)`` reports progress. ``process_index`` labels the
    samples (``bench --processes``). ``scopes``: per case, a reusable context manager (or None) entered around each
    piece of that case's own work (its build, each of its blocks, its row): ``references.ModelScope``, where
    ``perflab ab``'s versions read their model references in worktrees of their own. ``balanced``: a group's cases
    take turns in a balanced order (``measure.interleave.balanced_order``, from their order in ``cases``) instead of a
    drawn one; with ``drawn`` too, each pair of rounds' order drawn with ``seed`` and reversed in the pair's second
    (``measure.interleave.drawn_balanced_order``). Returns the rows in the cases' order."""
    scope = _scope_of(scopes, len(cases))
    cases = [_in(scope(i), validate_case, c) for i, c in enumerate(cases)]
    stage_of = (lambda i: (lambda s: on_case(i, cases[i], s))) if on_case else (lambda i: None)
    groups = list(groups) if groups is not None else [comparison_group(c) for c in cases]
    rows: list[dict | None] = [None] * len(cases)
    together = [i for i, c in enumerate(cases) if interleave and can_interleave(c) is None]
    if len(together) < 2:
        together = []
    for i, case in enumerate(cases):
        if i not in together:
            with scope(i):
                rows[i] = run_case(case, on_stage=stage_of(i), host=host)
            if interleave and len(cases) > 1:
                rows[i]["timed_alone"] = can_interleave(case) or "the only case that could be timed with others"
            _stop_if_lost(rows, cases, i)
    # Training steps apart from the rest: they run their own autocast per step (the weights change every step, so
    # their casts must be made afresh), and must not run under the kept cache below.
    trains = {i: implementation(cases[i]).trains(cases[i]) for i in together}
    pending = [i for i in together if not trains[i]] + [i for i in together if trains[i]]
    session_seq = 0
    while pending:
        # Autocast's weight casts must outlive each case's contexts for as long as a pool of inference steps lives: a
        # CUDA graph captured under autocast reads the cached casts, and freeing them made its replay read freed
        # memory. A training step's cached casts would be stale after its optimizer step: no kept cache there.
        kind = trains[pending[0]]
        with (contextlib.nullcontext() if kind else _autocast_kept(cases[pending[0]].device)):
            pool, rest = _fill_pool(cases, [i for i in pending if trains[i] == kind], rows, stage_of, host, scope)
            pending = rest + [i for i in pending if trains[i] != kind]
            for i in range(len(cases)):
                _stop_if_lost(rows, cases, i)
            if pool:
                indices = [entry[0] for entry in pool]
                try:
                    timed = _time_pool(pool, groups, host, seed + session_seq, stage_of, process_index, scope, balanced, drawn)
                except PerflabError:
                    raise
                except Exception as exc:  # the session failed: each of its cases is a failed row, the run goes on
                    timed = [_error_row(cases[i], exc, pool[k][2]) for k, i in enumerate(indices)]
                for i, row in zip(indices, timed):
                    rows[i] = row
                for i in indices:
                    _stop_if_lost(rows, cases, i)
                session_seq += 1
            done = [cases[entry[0]] for entry in pool]
            del pool
        release_compiled(done)
        gc.collect()
        if cases[0].device == "cuda":
            torch.cuda.empty_cache()
    return rows


def _scope_of(scopes, n: int):
    """Case i's scope (the same reusable context manager at each call), or a null context."""
    if scopes is None:
        return lambda i: contextlib.nullcontext()
    scopes = list(scopes)
    if len(scopes) != n:
        raise ValueError(f"run_cases: {len(scopes)} scopes for {n} cases")
    return lambda i: scopes[i] if scopes[i] is not None else contextlib.nullcontext()


def _in(scope, fn, *args, **kwargs):
    with scope:
        return fn(*args, **kwargs)


def _fill_pool(cases, pending, rows, stage_of, host, scope):
    """Prepare pending cases until the pool is full; returns (pool of (index, Prepared, env), still pending)."""
    pool = []
    pending = list(pending)
    while pending:
        i = pending[0]
        case = cases[i]
        stage = stage_of(i) or (lambda _: None)
        monitor = open_monitor(case.device)
        env = environment(case.device, monitor.device_info())
        if case.device == "cuda":
            gc.collect()
            torch.cuda.empty_cache()  # what the case adds to the pool is its own
        try:
            built_ctx = _in(scope(i), _prepare_held, case, stage, host)
        except PerflabError:
            raise
        except Exception as exc:
            if is_oom(exc) and pool:
                break  # full: time this pool, then start the next with this case
            rows[i] = _error_row(case, exc, env)
            pending.pop(0)
            if rows[i].get("fatal"):
                break
            continue
        pool.append((i, built_ctx, env, monitor))
        pending.pop(0)
        if case.device == "cuda":
            total = gpu_identity().total_memory
            if torch.cuda.memory_reserved() > INTERLEAVE_MEMORY_FRACTION * total:
                break
    return pool, pending


def _prepare_held(case: Case, stage, host) -> Prepared:
    """Build the case and ``_compile_and_warm`` it inside its contexts; the contexts are left, and re-entered around
    each of its blocks."""
    impl = implementation(case)
    stage("build")
    alloc0 = torch.cuda.memory_allocated() if case.device == "cuda" else None
    built = build(case)
    params, trainable = count_params(built.model)
    with step_context(case, built):
        return _compile_and_warm(case, impl, built, params, trainable, stage, host, alloc0)


def _time_pool(pool, groups, host, seed, stage_of, process_index, scope, balanced: bool = False, drawn: bool = False) -> list[dict]:
    """Time a pool of prepared cases in interleaved rounds; their rows, in the pool's order."""
    import uuid

    from perflab.measure.interleave import block_schedule, interleaved_order, time_interleaved

    indices = [i for i, *_ in pool]
    prepared = [p for _, p, _, _ in pool]

    @contextlib.contextmanager
    def within(k):  # case k of the pool: its scope, then its grad mode and precision
        with scope(indices[k]), step_context(prepared[k].case, prepared[k].built):
            yield

    device = prepared[0].case.device
    rounds = max(p.plan.n_blocks for p in prepared)
    monitor = pool[0][3]
    stage = stage_of(indices[0]) or (lambda _: None)

    def on_round(r):
        stage(Stage(f"timing {len(pool)} cases together, round {r + 1}/{rounds}", "round", r, rounds, indices))

    with timing_thread(device, host) as thread:
        order = interleaved_order([groups[i] for i in indices], rounds, seed, balanced=balanced, drawn=drawn)
        schedule = block_schedule(order, [p.plan.n_blocks for p in prepared], [p.plan.block_sizes for p in prepared])
        gc.collect()
        gc_was_enabled = gc.isenabled()
        gc.disable()
        counters0 = compile_counters() if any(p.compile_stats is not None for p in prepared) else None
        try:
            monitor.begin()
            session = time_interleaved([p.step for p in prepared], schedule, enter=within,
                                       device=device, canary=lambda: host_canary().median_us,
                                       on_round=on_round, read_gpu=monitor.block_reading)
            report = monitor.end()
        finally:
            if gc_was_enabled:
                gc.enable()
        compiled_while_timed(prepared, since=counters0)
        extras, energy = [], []
        for k, p in enumerate(prepared):
            with within(k):
                median = float(np.median([b.ms_per_step for b in session.blocks[k]]))
                energy.append(_energy_pass(p, monitor, median))
                extras.append(p.impl.after_timing(p.case, p.built, p.step, {"median_ms": median}))
    canaries = [c for c in session.round_canaries_us if c is not None]
    info = {"id": uuid.uuid4().hex[:12], "cases": len(pool), "rounds": rounds, "seed": seed, "process": process_index,
            "wall_s": session.wall_s, "canaries_us": canaries}
    rows = []
    for k, p in enumerate(prepared):
        blocks = session.blocks[k]
        timed_s = sum(b.ms_per_step * b.steps for b in blocks) / 1000.0
        energy_j, power_w, unavailable = energy[k]
        unavailable = report.unavailable or unavailable
        canary = {CANARY_KEY: statistics.median(canaries) if canaries else None,
                  "host_canary_before_us": canaries[0] if canaries else None, "host_canary_after_us": canaries[-1] if canaries else None,
                  "host_canary_min_us": min(canaries) if canaries else None}
        peak_alloc = None
        if device == "cuda":
            # What the case holds between steps (its growth of the allocator while it was built and warmed, the cache
            # emptied before) plus its blocks' largest rise above that. Reserved memory is the pool's, shared by the
            # cases held together, so it is not given per case.
            peak_alloc = max(p.resident_bytes + max(b.transient_bytes for b in blocks), p.warm_peak_bytes - p.alloc0)
        measured = Measured(
            samples_ms=[b.ms_per_step for b in blocks], timed_s=timed_s, block_iters=blocks[0].steps if blocks else 0,
            timed_iters=sum(b.steps for b in blocks), energy_j=energy_j, power_w=power_w,
            energy_unavailable=None if energy_j else unavailable, peak_alloc=peak_alloc, peak_reserved=None, canary=canary,
            contention=sched.contention_over([b.load for b in blocks], thread.cpus), extra=extras[k],
            sample_rounds=[b.round for b in blocks], sample_processes=[process_index] * len(blocks), session=info,
            sample_started_s=[b.started_s for b in blocks],
        )
        env = pool[k][2]
        own, measured.gpu_view, measured.run_view = case_view(report, [b.gpu for b in blocks], env.get("max_sm_clock_mhz"))  # its own blocks
        checks = case_checks(p, own, measured, env.get("max_sm_clock_mhz"))
        with scope(indices[k]):  # where its model's source is read (model_source)
            rows.append(ok_row(p, env, own, measured, thread, checks))
    return rows


ENERGY_PASS_S = 1.0  # contiguous seconds of a case's steps for its energy reading in an interleaved run


def _energy_pass(p: Prepared, monitor, median_ms: float) -> tuple[float | None, float | None, str | None]:
    """(energy J, mean power W, why not) of one contiguous stretch of ``ENERGY_PASS_S`` of the case's steps, run after
    the interleaved rounds. NVML's energy counter moves every 100 ms on an H100 (measured, docs/performance.md), so
    the counter read at the ends of 50 ms blocks gives each block a neighbour's energy; a stretch of ten updates
    reads the case's own. The figure is scaled to the case's timed steps, as a sequential loop reports it."""
    if p.case.device != "cuda" or monitor.energy_mj() is None:
        return None, None, None
    steps = max(1, math.ceil(ENERGY_PASS_S * 1000.0 / median_ms))
    torch.cuda.synchronize()
    e0, t0 = monitor.energy_mj(), time.perf_counter()
    for _ in range(steps):
        p.step()
    torch.cuda.synchronize()
    e1, wall = monitor.energy_mj(), time.perf_counter() - t0
    if e0 is None or e1 is None or not e1 > e0:
        return None, None, "the energy counter did not advance during the energy pass"
    power = (e1 - e0) / 1000.0 / wall
    return power * wall / steps * p.plan.total_iters, power, None


@contextlib.contextmanager
def _autocast_kept(device: str):
    """Keep autocast's weight-cast cache alive between blocks: the cache is cleared when the outermost autocast
    context exits, so an outer (disabled) one is held over the session while each block enters its case's own."""
    with torch.autocast(device, enabled=False):
        yield


# ---------------------------------------------------------------------------------------------------
# A run spread over several processes (bench --processes N, as pyperf spreads its samples over workers).


def run_in_processes(cases, processes: int, *, host: HostOptions | None = None, interleave: bool = True, seed: int = 0,
                     on_case=None, groups=None) -> list[dict]:
    """Measure the cases in ``processes`` processes, one after another: this one, then fresh ones (spawned, so
    each builds, compiles and warms up from nothing). Each case's samples from all of them make one row, and its
    CI is taken across the processes' medians (``stats.hierarchical_ci``, ``ci_level: process`` from
    three processes on): between-process variance, the part one process cannot see, is in the interval. Each
    process times its own seeded interleaved order. ``process_medians_ms`` keeps each process's median."""
    import concurrent.futures
    import multiprocessing

    cases = [validate_case(c) for c in cases]
    local = [c.model for c in cases if c.model.startswith("object:")]
    if local and processes > 1:
        raise PerflabError(f"--processes {processes}: {local[0]} is a model object of this Python process, which a fresh process "
                           "cannot see; save it in a file and pass path/file.py:NAME, or use one process")
    runs = [run_cases(cases, host=host, interleave=interleave, seed=seed, on_case=on_case, groups=groups, process_index=0)]
    context = multiprocessing.get_context("spawn")
    host = host or HostOptions()
    failed = None
    for p in range(1, processes):
        if on_case:
            on_case(0, cases[0], Stage(f"process {p + 1}/{processes}", "process", p, processes))
        try:
            with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
                runs.append(pool.submit(_child_run, [c.to_dict() for c in cases], host, interleave, seed + p, groups, p).result())
        except Exception as exc:  # a process that crashed, or lost its CUDA context: keep the processes that finished
            failed = f"process {p + 1} of {processes} failed ({type(exc).__name__}: {_first_line(exc) or 'no message'}); " \
                     f"the rows pool the {len(runs)} that finished"
            break
    rows = merge_processes(cases, runs)
    if failed:
        for row in rows:
            row["warnings"] = list(row.get("warnings") or []) + [failed]
    return rows


def _autotune_brief(record: dict | None) -> dict | None:
    """One process's autotuning, as a merged row keeps it: its signature, closest call and the FX graph cache's part."""
    if not record:
        return None
    return {k: record.get(k) for k in ("signature", "closest_margin", "fx_graph_cache", "note") if record.get(k) is not None}


def _merge_gpu_views(row: dict, ok: list[dict]) -> None:
    """The processes' GPU views as one: the clock ranges and throttle reasons (the case's own and the run's, in ``env``)
    over all processes, and the per-block fields (``energy.case_view``) counted over all, each block's clock in the
    pooled samples' order."""
    envs = [r.get("env") or {} for r in ok]
    env = row["env"] = dict(row.get("env") or {})
    for prefix in ("", "run_"):
        if not any(f"{prefix}throttle_reasons" in e for e in envs):
            continue
        names = {name for e in envs for name in e.get(f"{prefix}throttle_reasons") or []}
        env[f"{prefix}throttle_reasons"] = [name for name in THROTTLE_REASONS.values() if name in names]
        for key, pick in ((f"{prefix}sm_clock_mhz_min", min), (f"{prefix}sm_clock_mhz_max", max)):
            values = [e[key] for e in envs if e.get(key) is not None]
            env[key] = pick(values) if values else None
    views = [r for r in ok if r.get("read_blocks")]
    if views:
        for key in ("throttled_blocks", "reason_blocks", "read_blocks"):
            row[key] = sum(r.get(key) or 0 for r in views)
        row["sample_sm_clock_mhz"] = [c for r in ok for c in (r.get("sample_sm_clock_mhz") or [None] * len(r["samples_ms"]))]


def _child_run(case_dicts, host, interleave, seed, groups, process_index) -> list[dict]:
    cases = [Case.from_dict(d) for d in case_dicts]
    rows = run_cases(cases, host=host, interleave=interleave, seed=seed, groups=groups, process_index=process_index)
    for row in rows:
        row.pop("detail", None)
    return rows


def merge_processes(cases, runs: list[list[dict]], read_peaks: bool = True) -> list[dict]:
    """One row per case from each process's row: samples pooled (labelled by process and round), the timing figures
    recomputed from them, energy and timed work summed, the canary the median of the processes'. A case that failed
    in any process keeps the first failure's row, with how many processes measured it. ``read_peaks=False``: MFU and
    MBU from the peaks the rows hold (a parent that must not touch CUDA: ``sweep.versions``)."""
    from perflab.measure.checks import spread_checks

    merged = []
    for k, case in enumerate(cases):
        per_process = [run[k] for run in runs]
        ok = [r for r in per_process if r.get("status") == "ok"]
        if len(ok) < len(per_process):
            row = dict(next(r for r in per_process if r.get("status") != "ok"))
            row["processes"] = len(per_process)
            row["processes_ok"] = len(ok)
            merged.append(row)
            continue
        row = dict(ok[0])
        samples, procs, rounds, starts = [], [], [], []
        for p, r in enumerate(ok):
            n = len(r["samples_ms"])
            samples += r["samples_ms"]
            procs += [p] * n
            rounds += r.get("sample_rounds") or list(range(n))
            starts += r.get("sample_started_s") or [None] * n
        if None in starts:  # each from its own process's session start, where every process's row says
            row.pop("sample_started_s", None)
        else:
            row["sample_started_s"] = starts
        for key in ("timed_s", "timed_iters"):
            row[key] = sum(r[key] for r in ok)
        energies = [r.get("energy_j") for r in ok]
        if None not in energies:
            row["energy_j"] = sum(energies)
            row["power_w"] = statistics.mean(r["power_w"] for r in ok)
            row["energy_j_per_sample"] = row["energy_j"] / (row["timed_iters"] * row["batch_size"])
        canaries = [r[CANARY_KEY] for r in ok if r.get(CANARY_KEY) is not None]
        row[CANARY_KEY] = statistics.median(canaries) if canaries else None
        for key in ("host_wait_frac", "host_steal_frac"):
            values = [r.get(key) for r in ok if r.get(key) is not None]
            row[key] = max(values) if values else None
        for key in ("peak_mem_alloc_mb", "peak_mem_reserved_mb"):
            values = [r.get(key) for r in ok if r.get(key) is not None]
            row[key] = max(values) if values else None
        _merge_gpu_views(row, ok)
        row["process_medians_ms"] = [r["median_ms"] for r in ok]
        row["processes"] = len(ok)
        row["sessions"] = [r.get("session") for r in ok]
        timing_fields(row, samples, procs, rounds)
        # every check but the spread's is the processes' (any one's flag stands); the spread is of the pooled samples
        checks = {f: w for r in ok for f, w in zip(r.get("flags") or [], r.get("warnings") or []) if f not in ("high_cv", "bimodal")}
        if any(r.get("autotune") for r in ok):
            row["autotune_processes"] = [_autotune_brief(r.get("autotune")) for r in ok]
        varies = autotune_check(case.mode, [r.get("autotune") for r in ok], row["process_medians_ms"])
        if varies is not None:
            checks[varies.flag] = varies.message
        if "throttled" in checks and row.get("read_blocks"):
            checks["throttled"] = f"GPU clocks were throttled during {row['throttled_blocks']} of this case's {row['read_blocks']} timed " \
                                  f"blocks over {len(ok)} processes ({', '.join(row['env']['throttle_reasons'])})"
        for spread in spread_checks(row["cv"], row.get("modes"), row["median_ms"]):
            checks[spread.flag] = f"{spread.message} (samples of {len(ok)} processes)"
        row["flags"], row["warnings"] = list(checks), list(checks.values())
        if case.device == "cuda":
            row.update(utilisation(case, row, None if read_peaks else {k: row.get(k) for k in PEAK_KEYS}))
        merged.append(row)
    return merged
