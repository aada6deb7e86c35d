"""Run one case and produce its result row.

Order of work: build the model and a seeded input; check the token schedule and the FLOPs with one eager
forward; build the step for the mode and call it once (compile, capture). Then, with the timing thread
pinned to one core (``measure.pinning``; a run option, ``--no-pin`` turns it off): warm up; estimate the
step time; time the host's issue of 3 steps (``measure.host``: ``host_issue_ms``, and ``host_bound_frac``
= issue ÷ the same steps' time to their synchronise); synchronise and time the host canary (``measure.canary``); then the timed
loop, with nothing else in it (no profiler, no FLOP counter, no per-step host sync, the garbage collector
off), bracketed by reads of the timing thread's run-queue wait and the VM's steal (``measure.sched``:
``host_wait_frac``, ``host_steal_frac``); then, with the loop synchronised and NVML's sampler thread ended,
the canary again (``host_canary_us`` is the faster of the two). Peak memory is reset and NVML's energy
counter read right before that loop. A failed case's row gets a canary too, taken after the failure.

An OOM or any other failure of the measurement becomes a row with status ``oom`` or ``error``; bad input
(an unknown model, a keep rate of 2) raises PerflabError before anything runs.
"""

from __future__ import annotations

import gc
import time
import traceback
from typing import Callable

import torch

from perflab.errors import PerflabError
from perflab.measure import sched
from perflab.measure.canary import CANARY_KEY, canary_fields, host_canary
from perflab.measure.checks import MIN_TIMED_ITERS, run_checks
from perflab.measure.energy import open_monitor
from perflab.measure.env import device_name, environment
from perflab.measure.flops import count_flops, count_params
from perflab.measure.host import issue_s
from perflab.measure.pinning import HostOptions, timing_thread
from perflab.measure.stats import summarize
from perflab.measure.timing import estimate_step_s, plan_timing, time_step
from perflab.models.registry import expected_tokens
from perflab.runtime.device import synchronize
from perflab.runtime.modes import make_step
from perflab.runtime.workload import build, memory_cap, step_context
from perflab.spec import Case, validate_case
from perflab.workloads.registry import implementation

MB = 2**20


def run_case(case: Case, *, monitor=None, on_stage: Callable[[str], None] | None = None, memory_snapshot=None,
             host: HostOptions | None = None) -> dict:
    """Measure one case. Returns the result row (a dict; see ``result_row_keys`` in the README).

    ``host``: run options for the timing thread (pinning, intra-op threads; ``measure.pinning``), not part
    of the case: the default pins.

    ``memory_snapshot``: a path; on a GPU, the CUDA allocator's history from the build to the end of the timed
    loop is written there as a pickle that PyTorch's memory_viz page (pytorch.org/memory_viz) opens.
    """
    case = validate_case(case)
    if memory_snapshot is not None and case.device == "cuda":
        torch.cuda.memory._record_memory_history(max_entries=200_000)
        try:
            return run_case(case, monitor=monitor, on_stage=on_stage, host=host)
        finally:
            from pathlib import Path

            Path(memory_snapshot).parent.mkdir(parents=True, exist_ok=True)
            torch.cuda.memory._dump_snapshot(str(memory_snapshot))
            torch.cuda.memory._record_memory_history(enabled=None)
    stage = on_stage or (lambda _: None)
    monitor = monitor if monitor is not None else open_monitor(case.device)
    env = environment(case.device, monitor.device_info())
    try:
        return _measure(case, monitor, env, stage, host)
    except PerflabError:
        raise
    except Exception as exc:  # a failed measurement is data: the row says what happened
        status = "oom" if is_oom(exc) else "error"
        row = failed_row(case, status, f"{type(exc).__name__}: {_first_line(exc)}", env, detail=traceback.format_exc())
        row[CANARY_KEY] = _safe_canary_us()
        return row
    finally:
        gc.collect()
        if case.device == "cuda":
            torch.cuda.empty_cache()


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc).lower()
    return "out of memory" in text or "cublas_status_alloc_failed" in text


def _measure(case: Case, monitor, env: dict, stage, host: HostOptions | None) -> dict:
    impl = implementation(case)
    with memory_cap(case):
        stage("build")
        built = build(case)
        params, trainable = count_params(built.model)
        with step_context(case, built):
            stage("check")
            checked = impl.check(case, built)
            flops = count_flops(built.make_step(built.model))

            stage("compile" if case.mode != "eager" else "warmup")
            started = time.perf_counter()
            step = make_step(built, case.mode)
            out = step()  # the first call compiles (compile modes); capture happens in make_step (cudagraph)
            synchronize(case.device)
            first_step_s = time.perf_counter() - started  # what the mode costs before its first step is done
            stage("warmup")
            with timing_thread(case.device, host) as thread:
                for _ in range(case.warmup):
                    out = step()
                synchronize(case.device)
                processed = built.batch_of(out)
                # The last warm-up output must not live through the timed loop: a train_forward output holds its
                # autograd graph (every saved activation), which doubled that workload's peak memory.
                del out

                step_s = estimate_step_s(step, case.device)
                plan = plan_timing(step_s, case.repeats, case.min_time, MIN_TIMED_ITERS, case.iters)
                issue, issue_step = issue_s(step, case.device)
                synchronize(case.device)  # no GPU work in flight, and no sampler thread yet, while the canary runs
                before = host_canary()  # the host's speed just before the timed loop (fixed grad/autocast state inside)
                stage("timing")
                if case.device == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                gc.collect()
                gc_was_enabled = gc.isenabled()
                gc.disable()  # no collection pauses inside the timed loop
                try:
                    monitor.begin()
                    load0 = sched.sample()
                    timing = time_step(step, plan, case.device)  # synchronised at its end
                    load1 = sched.sample()
                    report = monitor.end()  # the sampler thread has ended
                finally:
                    if gc_was_enabled:
                        gc.enable()
                after = host_canary()  # and just after it, with nothing in flight
            peak = memory_peaks(case.device)
            summary = summarize(timing.samples_ms)
            extra = impl.after_timing(case, built, step, {"median_ms": summary.median})

    tokens_expected, tokens_seen = checked.get("tokens_expected"), checked.get("tokens_seen")
    checks = run_checks(
        requested_batch=case.batch_size,
        processed_batch=processed,
        timed_s=timing.timed_s,
        timed_iters=plan.total_iters,
        cv=summary.cv,
        energy_j=report.energy_j,
        energy_unavailable=report.unavailable,
        throttle_reasons=report.throttle_reasons,
        other_processes=report.other_processes,
        tokens_expected=tokens_expected,
        tokens_seen=tokens_seen,
        min_time=case.min_time,
    )
    env.update(
        sm_clock_mhz=report.sm_clock_mhz_end,
        sm_clock_mhz_min=report.sm_clock_mhz_min,
        sm_clock_mhz_max=report.sm_clock_mhz_max,
        throttle_reasons=report.throttle_reasons,
        other_gpu_processes=report.other_processes,
    )
    row = base_row(case, env)
    median = summary.median
    items = built.items_per_step
    row.update(
        status="ok",
        tokens=tokens_seen if tokens_seen is not None else tokens_expected,
        median_ms=median,
        p10_ms=summary.p10,
        p90_ms=summary.p90,
        mean_ms=summary.mean,
        cv=summary.cv,
        ci95_ms=[summary.ci95_low, summary.ci95_high],
        ci95_coverage=summary.ci_coverage,
        latency_ms_per_batch=median,
        latency_ms_per_sample=median / case.batch_size,
        throughput_per_s=case.batch_size * 1000.0 / median,
        items_per_step=items,
        items_per_s=items * 1000.0 / median,
        samples_ms=[float(v) for v in timing.samples_ms],
        n_samples=summary.n,
        iters_per_sample=plan.block_iters,
        timed_iters=plan.total_iters,
        timed_s=timing.timed_s,
        gflops=flops / case.batch_size / 1e9,
        gmacs=flops / case.batch_size / 2e9,
        gflops_per_batch=flops / 1e9,
        achieved_tflops=flops / (median / 1000.0) / 1e12,
        params=params,
        params_m=params / 1e6,
        params_trainable_m=trainable / 1e6,
        energy_j=report.energy_j,
        power_w=report.power_w,
        energy_j_per_sample=(report.energy_j / (plan.total_iters * case.batch_size)) if report.energy_j else None,
        **canary_fields(before, after),
        **sched.contention(load0, load1, thread.cpus),
        host_issue_ms=issue * 1e3,
        host_bound_frac=min(1.0, issue / issue_step) if issue_step > 0 else None,
        pinned_cpu=thread.pinned_cpu,
        timing_threads=thread.threads,
        first_step_s=first_step_s,
        flags=[c.flag for c in checks],
        warnings=[c.message for c in checks],
    )
    if thread.warning:
        row["pin_warning"] = thread.warning
    if case.family_spec.item == "token":
        row["tokens_per_s"] = row["items_per_s"]
    row.update(impl.analytic(case))
    row["flops_source"] = "counted"  # gflops & co. come from torch.utils.flop_counter on a real step, for every model
    if row.get("flops_analytic"):
        row["flops_counted_vs_analytic"] = flops / row["flops_analytic"] - 1.0
    if case.is_reference:
        from perflab.models.reference import source_info

        row["model_source"] = source_info(case.model)
    row.update(extra)
    if case.device == "cuda":
        row["peak_mem_alloc_mb"] = peak["alloc"] / MB
        row["peak_mem_reserved_mb"] = peak["reserved"] / MB
        row["memory_breakdown_mb"] = memory_breakdown(built, peak["alloc"])
        row.update(utilisation(case, row))
    return row


def memory_peaks(device: str) -> dict:
    if device != "cuda":
        return {"alloc": None, "reserved": None}
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


def utilisation(case: Case, row: dict) -> dict:
    """MFU (achieved FLOP/s over the peak matmul rate for the dtype) and, where the family states the bytes a
    step must move, MBU (achieved bytes/s over the copy bandwidth); each against the ceilings measured on
    this GPU (cached) and against the datasheet."""
    from perflab.measure.ceilings import get_ceilings
    from perflab.measure.datasheet import datasheet_for

    ceilings = get_ceilings()
    sheet = datasheet_for(torch.cuda.get_device_name())
    out = {"peak_tflops_measured": ceilings["matmul_tflops"].get(case.dtype), "copy_gbps_measured": ceilings["copy_gbps"]}
    out["peak_tflops_datasheet"] = sheet.tflops(case.dtype) if sheet else None
    out["bandwidth_gbps_datasheet"] = sheet.bandwidth_gbps if sheet else None
    achieved = row["achieved_tflops"]
    out["mfu"] = achieved / out["peak_tflops_measured"] if out["peak_tflops_measured"] else None
    out["mfu_datasheet"] = achieved / out["peak_tflops_datasheet"] if out["peak_tflops_datasheet"] else None
    if row.get("bytes_per_step"):
        gbps = row["bytes_per_step"] / (row["median_ms"] / 1000.0) / 1e9
        out["achieved_gbps"] = gbps
        out["mbu"] = gbps / ceilings["copy_gbps"]
        out["mbu_datasheet"] = gbps / sheet.bandwidth_gbps if sheet else None
        if row.get("flops_analytic") and out["peak_tflops_measured"]:
            from perflab.analysis.floors import roofline

            analytic_tflops = row["flops_analytic"] / (row["median_ms"] / 1000.0) / 1e12
            out.update(roofline(flops_per_step=row["flops_analytic"], bytes_per_step=row["bytes_per_step"], achieved_tflops=analytic_tflops,
                                matmul_tflops=out["peak_tflops_measured"], copy_gbps=ceilings["copy_gbps"]))
    return out


def base_row(case: Case, env: dict) -> dict:
    """The keys every row has, whatever its status."""
    return {
        "case_id": case.id,
        "case": case.to_dict(),
        "status": None,
        "message": None,
        "model": case.model,
        "family": case.family,
        "workload": case.workload,
        "label": case.label(),
        "method": case.method,
        "keep_rate": list(case.keep_rate),
        "reduction_loc": list(case.reduction_loc),
        "tokens": None,
        "input_size": case.input_size,
        "seq_len": case.seq_len,
        "prompt_len": case.prompt_len,
        "context_len": case.context_len,
        "new_tokens": case.new_tokens,
        "batch_size": case.batch_size,
        "dtype": case.dtype,
        "mode": case.mode,
        "attn": case.attn,
        "device": case.device,
        "device_name": device_name(env),
        "median_ms": None,
        "p10_ms": None,
        "p90_ms": None,
        "cv": None,
        "ci95_ms": None,
        "latency_ms_per_batch": None,
        "latency_ms_per_sample": None,
        "throughput_per_s": None,
        "gflops": None,
        "gmacs": None,
        "params_m": None,
        "peak_mem_alloc_mb": None,
        "peak_mem_reserved_mb": None,
        "energy_j": None,
        "power_w": None,
        CANARY_KEY: None,  # µs per host canary run (measure.canary); None where no canary was taken
        "flags": [],
        "warnings": [],
        "env": env,
    }


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
