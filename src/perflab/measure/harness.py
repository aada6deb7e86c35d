"""Run one case and produce its result row.

Order of work: build the model and a seeded input; check the token schedule and the FLOPs with one eager
forward; build the step for the mode (compile, capture); warm up; estimate the step time; then the timed
loop, with nothing else in it (no profiler, no FLOP counter, no per-step host sync). Peak memory is reset
and NVML's energy counter read right before that loop.

An OOM or any other failure of the measurement becomes a row with status ``oom`` or ``error``; bad input
(an unknown model, a keep rate of 2) raises PerflabError before anything runs.
"""

from __future__ import annotations

import gc
import traceback
from typing import Callable

import torch

from perflab.errors import PerflabError
from perflab.measure.checks import MIN_TIMED_ITERS, run_checks
from perflab.measure.energy import open_monitor
from perflab.measure.env import device_name, environment
from perflab.measure.flops import count_flops, count_params
from perflab.measure.stats import summarize
from perflab.measure.timing import estimate_step_s, plan_timing, time_step
from perflab.models.registry import build_model, expected_tokens
from perflab.runtime.device import synchronize
from perflab.runtime.inputs import image_batch
from perflab.runtime.modes import make_step
from perflab.runtime.precision import precision
from perflab.spec import Case, validate_case

MB = 2**20


def run_case(case: Case, *, monitor=None, on_stage: Callable[[str], None] | None = None) -> dict:
    """Measure one case. Returns the result row (a dict; see ``result_row_keys`` in the README)."""
    case = validate_case(case)
    stage = on_stage or (lambda _: None)
    monitor = monitor if monitor is not None else open_monitor(case.device)
    env = environment(case.device, monitor.device_info())
    try:
        return _measure(case, monitor, env, stage)
    except PerflabError:
        raise
    except Exception as exc:  # a failed measurement is data: the row says what happened
        status = "oom" if is_oom(exc) else "error"
        return failed_row(case, status, f"{type(exc).__name__}: {_first_line(exc)}", env, detail=traceback.format_exc())
    finally:
        gc.collect()
        if case.device == "cuda":
            torch.cuda.empty_cache()


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc).lower()
    return "out of memory" in text or "cublas_status_alloc_failed" in text


def _measure(case: Case, monitor, env: dict, stage) -> dict:
    torch.manual_seed(case.seed)
    stage("build")
    model, vit_config = build_model(case)
    model = model.to(case.device)
    params, trainable = count_params(model)
    x = image_batch(case.batch_size, case.input_size, case.device, case.seed)
    tokens_expected = expected_tokens(case)

    # no_grad, not inference_mode: under inference_mode autocast does not cache its weight casts, so
    # every step would re-cast every weight (3 casts per Linear instead of 1, measured with the profiler).
    with torch.no_grad(), precision(case.dtype, case.device):
        stage("check")
        tokens_seen = None
        if vit_config is not None:
            model.tokens_seen = []
            model(x)
            tokens_seen, model.tokens_seen = model.tokens_seen, None
        flops = count_flops(lambda: model(x))

        stage("compile" if case.mode != "eager" else "warmup")
        step = make_step(model, x, case.mode)
        out = step()  # the first call compiles (compile modes)
        stage("warmup")
        for _ in range(case.warmup):
            out = step()
        synchronize(case.device)
        processed = int(out.shape[0])

        step_s = estimate_step_s(step, case.device)
        plan = plan_timing(step_s, case.repeats, case.min_time, MIN_TIMED_ITERS, case.iters)
        stage("timing")
        if case.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        monitor.begin()
        timing = time_step(step, plan, case.device)
        report = monitor.end()

    summary = summarize(timing.samples_ms)
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
        flags=[c.flag for c in checks],
        warnings=[c.message for c in checks],
    )
    if case.device == "cuda":
        row["peak_mem_alloc_mb"] = torch.cuda.max_memory_allocated() / MB
        row["peak_mem_reserved_mb"] = torch.cuda.max_memory_reserved() / MB
    return row


def base_row(case: Case, env: dict) -> dict:
    """The keys every row has, whatever its status."""
    return {
        "case_id": case.id,
        "case": case.to_dict(),
        "status": None,
        "message": None,
        "model": case.model,
        "method": case.method,
        "keep_rate": list(case.keep_rate),
        "reduction_loc": list(case.reduction_loc),
        "tokens": None,
        "input_size": case.input_size,
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


def _safe_tokens(case: Case):
    try:
        return expected_tokens(case)
    except Exception:
        return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""
