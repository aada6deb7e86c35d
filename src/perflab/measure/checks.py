"""Validity checks. Each is a flag on the result row and a warning line for the user.

They catch the pitfalls of the seed harness: batches that did not hold the requested images, too little
timed work, noisy samples, power never sampled during the timed loop, throttled clocks, and other
processes sharing the GPU; and a step whose output is NaN or Inf.
"""

from __future__ import annotations

from dataclasses import dataclass

from perflab.spec import AUTOTUNE_MODES
from perflab.stats import modes_words, summarize

CV_THRESHOLD = 0.05
AUTOTUNE_SPREAD = 0.03  # processes' medians of one max-autotune case further apart than this: the report says so
MIN_TIMED_S = 1.0
MIN_TIMED_ITERS = 50
SLOWED_CLOCK_SHARE = 0.95  # a throttle reason counts only where the SM clock fell below this share of its maximum
UNCOUNTED_SHARE = 0.05  # uncounted heavy work at least this share of the step (a lower bound) raises flops_uncounted
UNCOUNTED_FLAG = "flops_uncounted"


# What each flag means in a line without a row's numbers: how a warning that several rows share is said once.
FLAG_SUMMARIES = {
    "batch_mismatch": "a step processed fewer images than requested; per-image numbers would be wrong",
    "short_timing": "too little timed work (under --min-time and 50 iterations); raise --min-time or --iters",
    "high_cv": f"timing samples vary by more than CV {CV_THRESHOLD:.0%}; the machine may be busy or the step too short",
    "bimodal": "the timing samples fall in two modes: the median may be a time no sample took, and their spread is the step's own",
    "no_power": "no power/energy reading",
    "throttled": "GPU clocks were throttled during the timed loop",
    "other_processes": "other processes were using the GPU",
    "non_finite": "the step's output held NaN or Inf",
    "tokens_mismatch": "token counts per stage were not those expected",
    "compiled_while_timed": "dynamo compiled frames during the timed steps: the timing includes compilation",
    "graph_breaks": "compile: graph breaks; the step runs eagerly between them",
    "flops_uncounted": "FLOPs undercounted: ops with no FLOP formula did heavy tensor work; GFLOPs and MFU read low",
    "host_drift": "the host ran at another speed than the run's other cases (host canary)",
    "host_contention": "the timing thread waited for a CPU (other work shared the host)",
}
# Flags of a busy or noisy host: said together in one line, however many rows carry them.
NOISE_FLAGS = ("high_cv", "short_timing", "host_contention", "host_drift")
# two modes on a row whose timing thread waited for a CPU (host_contention): what the report says of them, once
BUSY_BIMODAL = ("the timing samples fall in two modes on a host other work shared (host_contention): the slow mode may be "
                "that work's, not the step's")


def break_reasons_text(stats: dict) -> str:
    """A compiled row's commonest graph-break reasons (``runtime.modes.compile_stats``), "reason ×count; ..."."""
    return "; ".join(f"{r['reason']} ×{r['count']}" for r in stats.get("break_reasons") or [])


@dataclass(frozen=True)
class Check:
    flag: str
    message: str


def case_checks(prepared, report, measured, max_sm_clock_mhz: int | None) -> list[Check]:
    """A measured case's checks, in the order its row lists its flags: ``prepared`` and ``measured`` the harness's
    (``measure.harness.Prepared``, ``Measured``), ``report`` the GPU monitor's reading over its timing (the case's own
    blocks where it was timed with others: ``energy.case_view``), ``max_sm_clock_mhz`` the GPU's."""
    case, checked, gpu_view = prepared.case, prepared.checked, measured.gpu_view
    checks = run_checks(
        requested_batch=case.batch_size,
        processed_batch=prepared.processed,
        timed_s=measured.timed_s,
        timed_iters=measured.timed_iters,
        **spread_of(measured.samples_ms),
        energy_j=measured.energy_j,
        energy_unavailable=measured.energy_unavailable,
        energy_expected_absent=getattr(report, "expected", False),
        throttle_reasons=report.throttle_reasons if slowed(report.throttle_reasons, report.sm_clock_mhz_min, max_sm_clock_mhz) else [],
        throttled_blocks=(gpu_view["throttled_blocks"], gpu_view["read_blocks"]) if gpu_view else None,
        other_processes=report.other_processes,
        tokens_expected=checked.get("tokens_expected"),
        tokens_seen=checked.get("tokens_seen"),
        finite=prepared.finite,
        min_time=case.min_time,
    )
    checks += compile_checks(prepared.compile_stats)
    uncounted = uncounted_check(prepared.flop_count) if prepared.flop_count is not None else None
    if uncounted is not None:
        checks.append(uncounted)
    return checks


def run_checks(
    *,
    requested_batch: int,
    processed_batch: int,
    timed_s: float,
    timed_iters: int,
    cv: float,
    energy_j: float | None,
    energy_unavailable: str | None,
    throttle_reasons: list[str],
    other_processes: list[int],
    throttled_blocks: tuple[int, int] | None = None,
    tokens_expected: list[int] | None = None,
    tokens_seen: list[int] | None = None,
    finite: bool | None = None,
    min_time: float = MIN_TIMED_S,
    min_iters: int = MIN_TIMED_ITERS,
    cv_threshold: float = CV_THRESHOLD,
    energy_expected_absent: bool = False,
    modes: dict | None = None,
    median: float | None = None,
) -> list[Check]:
    """The row's validity checks. ``modes`` and ``median``: the samples' two modes and median (``spread_of``), where
    they fall in two. ``energy_expected_absent``: the device has no power meter (the CPU), so no reading is what was to be expected, not
    a fault: no ``no_power`` (the row says why in ``power_note``)."""
    checks = []
    if processed_batch != requested_batch:
        checks.append(Check("batch_mismatch", f"each step processed {processed_batch} images, not the {requested_batch} requested; per-image numbers would be wrong"))
    if timed_s < min_time and timed_iters < min_iters:
        checks.append(Check("short_timing", f"only {timed_iters} timed iterations over {timed_s:.3f} s (minimum: {min_time:g} s or {min_iters} iterations); raise --min-time or --iters"))
    checks += spread_checks(cv, modes, median, cv_threshold)
    if energy_j is None and not energy_expected_absent:
        checks.append(Check("no_power", f"no power/energy reading: {energy_unavailable or 'unknown reason'}"))
    if throttle_reasons:
        where = "the timed loop" if throttled_blocks is None else f"{throttled_blocks[0]} of this case's {throttled_blocks[1]} timed blocks"
        checks.append(Check("throttled", f"GPU clocks were throttled during {where} ({', '.join(throttle_reasons)})"))
    if other_processes:
        checks.append(Check("other_processes", f"other processes were using the GPU: pid {', '.join(map(str, other_processes))}"))
    if finite is False:
        checks.append(Check("non_finite", "the step's output held NaN or Inf (checked on the last warm-up step): the timing is of a "
                                          "computation gone wrong (a bad init, an overflow in the dtype, a learning rate too high)"))
    if tokens_expected is not None and tokens_seen is not None and tokens_expected != tokens_seen:
        checks.append(Check("tokens_mismatch", f"token counts per stage were {tokens_seen}, expected {tokens_expected}"))
    return checks


def spread_of(samples) -> dict:
    """The figures of samples (ms) that ``spread_checks`` reads, as ``run_checks`` takes them: cv, modes, median."""
    timing = summarize(samples).to_dict()
    return {"cv": timing["cv"], "modes": timing.get("modes"), "median": timing["median_ms"]}


def cv_check(cv: float, cv_threshold: float = CV_THRESHOLD) -> Check | None:
    """``high_cv`` where the samples' coefficient of variation passes the threshold (also for samples pooled over
    several processes)."""
    if cv > cv_threshold:
        return Check("high_cv", f"timing samples vary by CV {cv:.1%} (threshold {cv_threshold:.0%}); the machine may be busy or the step too short")
    return None


def spread_checks(cv: float, modes: dict | None, median: float | None, cv_threshold: float = CV_THRESHOLD) -> list[Check]:
    """What the samples' spread says: ``bimodal`` where they fall in two modes (``stats.modes_of``: each mode's median
    and share, and whether the median lies between them), else ``high_cv`` (``cv_check``). Two modes make a CV that is
    the distance between them, the step's own doing (a step that synchronises every other time, a loader that stalls
    every n steps): ``high_cv`` would blame the machine for it, so the ``bimodal`` line states the CV itself.
    ``modes`` and ``median`` as a row's or run.json's timing holds them (``modes``, ``median_ms``)."""
    if modes:
        spread = f"; the CV of {cv:.1%} is the distance between the modes, not noise" if cv > cv_threshold else ""
        return [Check("bimodal", modes_words(modes, median) + spread)]
    spread = cv_check(cv, cv_threshold)
    return [spread] if spread is not None else []


def slowed(reasons, sm_clock_mhz_min: int | None, max_sm_clock_mhz: int | None) -> bool:
    """A reading throttled in a way that slowed the work: a throttle reason was set and the SM clock fell more than 5%
    below the GPU's maximum. NVML keeps ``sw_power_cap`` set while the power limiter is engaged, also where it takes
    the clock down by a step or two: on an H100 (2026-11-26) the demo's eight cases, interleaved, read it in 18-19 of
    20 blocks of every case, the bs1 ones drawing 160-260 W among them, at 1890-1980 MHz of 1980 (4.5% at the most);
    where the maximum is not known, any reason counts."""
    if not reasons:
        return False
    if not max_sm_clock_mhz or sm_clock_mhz_min is None:
        return True
    return sm_clock_mhz_min < SLOWED_CLOCK_SHARE * max_sm_clock_mhz


def uncounted_check(count) -> Check | None:
    """``flops_uncounted`` where ops with no FLOP formula did at least ``UNCOUNTED_SHARE`` of the step's work (by their
    lower bound, ``measure.flops.FlopCount``); None otherwise."""
    if not count.uncounted or count.uncounted_share_min < UNCOUNTED_SHARE:
        return None
    ops = ", ".join(f"{name} ×{calls}" for name, calls in sorted(count.uncounted.items(), key=lambda kv: -kv[1]))
    return Check(UNCOUNTED_FLAG, f"FLOPs undercounted: ops with no FLOP formula did heavy tensor work ({ops}), at least "
                                 f"{count.uncounted_share_min:.0%} of the step's FLOPs: GFLOPs, TFLOP/s and MFU read low")


def compile_checks(stats: dict | None) -> list[Check]:
    """A compiled case's warnings from what compiling did (``runtime.modes.compile_stats``): frames compiled during the
    timed steps (the timing includes compilation: a recompile, shapes or guards changed), and graph breaks (the step
    runs eagerly between its graphs, and each break is a place compile's fusion stops)."""
    if not stats:
        return []
    checks = []
    again = stats.get("frames_compiled_while_timed") or 0
    if again:
        checks.append(Check("compiled_while_timed", f"dynamo compiled {again} frame(s) during the timed steps: the timing includes "
                                                    "compilation (a recompile: a shape or a guard changed between steps)"))
    if stats.get("graph_breaks"):
        reasons = break_reasons_text(stats)
        checks.append(Check("graph_breaks", f"compile: {stats['graph_breaks']} graph break(s) in {stats['graphs']} graph(s)"
                                            + (f" ({reasons})" if reasons else "") + "; the step runs eagerly between them"))
    return checks


def autotune_check(mode: str, records: list[dict | None], medians_ms: list[float]) -> Check | None:
    """``max_autotune_varies`` for one case of a max-autotune mode measured in several processes (``bench --processes``,
    or the same case in several rows of a store) whose kernel choices differ (``runtime.modes.record_autotune``'s
    signatures), or whose medians are more than ``AUTOTUNE_SPREAD`` apart: its best time is one process's draw."""
    medians = [m for m in medians_ms if m]
    if mode not in AUTOTUNE_MODES or len(medians) < 2:
        return None
    signatures = [r.get("signature") for r in records if r and r.get("signature")]
    distinct = len(set(signatures))
    low, high = min(medians), max(medians)
    spread = high / low - 1.0
    times = f"medians {low:.3f}–{high:.3f} ms, {spread:.1%} apart"
    if distinct > 1:
        return Check("max_autotune_varies", f"{mode}'s kernel choice varies: {distinct} different choices of kernels in {len(medians)} "
                                            f"processes ({times}); one process's time is not what the next would see")
    if spread > AUTOTUNE_SPREAD:
        kernels = ("with the same kernels chosen in each, so not autotuning's choice" if len(signatures) == len(medians)
                   else f"{len(medians) - len(signatures)} process(es) took a compiled graph from inductor's FX graph cache (the kernels "
                        f"of the compile that filled it), not recorded here")
        return Check("max_autotune_varies", f"{mode}'s time varies across {len(medians)} processes ({times}, over "
                                            f"{AUTOTUNE_SPREAD:.0%}); {kernels}")
    return None
