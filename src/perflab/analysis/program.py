"""``perflab run``'s report at the analysis floor, its figures; ``report/program.py`` prints it.

A user's program's report (``perflab run``): its timed steps, its traced steps accounted, its FLOPs from its
operators, MFU and MBU against the measured peaks, the floors' verdict, and what the compiler did. No torch.

- **Step time**: the untraced timed steps (``program.recorder``), median with a 95% CI over stretches of the run.
- **Accounting**: the traced steps (``ProfilerStep#n`` windows), exactly as ``perflab analyze`` accounts a trace:
  wall = busy + host-bound + kernel gap + other, to the ns; on the CPU the work is the top-level operators.
- **FLOPs** (``analysis.op_flops``): counted from the traced steps' operators and their recorded shapes; where the
  count could not see part of the heavy work (a Triton matmul template, a CUDA graph's replay, an operator with no
  formula), it says so and how much, and MFU is marked a lower bound.
- **Bytes**: the parameters and buffers of the program's modules on the device, each once: what a step that reads
  every weight (and a KV cache held as a buffer) once must move at least; MBU = bytes ÷ step ÷ the copy bandwidth.
- **Floors and verdict** (``analysis.floors``, as ``perflab explain`` gives them): compute = FLOPs ÷ the matmul peak
  of the dtype most FLOPs ran in; memory = bytes ÷ copy bandwidth; launch = kernels per step × the least kernel
  interval; host = the traced CPU time to issue a step, less the time it waited inside synchronising calls (a
  ``loss.item()`` each step), × (untraced ÷ traced step). The largest binds.
- **Compiled or eager**: the share of the traced steps' work (GPU kernel time, communication apart: DDP's reducer
  launches its collectives from its hooks, outside any graph; on the CPU operator time) launched from inside a compiled
  region (dynamo's ``Torch-Compiled Region``, AOTAutograd's ``CompiledFunction`` and
  ``CompiledFunctionBackward``, inductor's ``CompiledFxGraph``) against the rest, which ran eagerly.
"""

from __future__ import annotations

import re

import numpy as np

from perflab.analysis.accounting import account
from perflab.analysis.floors import compute_floors
from perflab.analysis.intervals import interval_at
from perflab.analysis.launch import idle_after_syncs, traced_host_issue_ms
from perflab.analysis.op_flops import count_op_flops
from perflab.analysis.ranks import is_comm
from perflab.analysis.trace_report import analyze_trace
from perflab.records.run_report import RunReport
from perflab.stats import ci_coverage_of, ci_note

# the autograd engine runs a compiled backward as "autograd::engine::evaluate_function: CompiledFunctionBackward": on the
# CPU that top-level operator is the compiled backward's work (141 of 182 ms of a small LM's step: eager without this)
COMPILED_REGION = re.compile(r"^Torch-Compiled Region|(?:^|: )CompiledFunction(?:Backward)?$|^## Call CompiledFxGraph|^CompiledFxGraph")
DYNAMO_OVERHEAD = re.compile(r"^TorchDynamo Cache Lookup$|^Pregraph bytecode$|^AOTDispatcher Runtime Wrapper")


def compiled_split(trace) -> dict | None:
    """Work launched inside compiled regions and outside them, in the traced step windows: {"compiled_ns",
    "eager_ns", "compiled_share"}; None when the trace has no compiled region (nothing compiled ran)."""
    ops = trace.ops
    if ops is None or not len(ops):
        return None
    names = ops["name"].astype(str)
    marked = names.str.contains(COMPILED_REGION.pattern, regex=True).to_numpy()
    if not marked.any():
        return None
    work = trace.kernels
    if not trace.cpu_only:
        work = work[_launched_in_steps(work, trace.steps)]
    dur = work["dur_ns"].to_numpy()
    if trace.cpu_only:  # the work is the top-level operators: a compiled region is one of them
        inside = work["name"].astype(str).str.contains(COMPILED_REGION.pattern, regex=True).to_numpy()
        overhead = work["name"].astype(str).str.match(DYNAMO_OVERHEAD.pattern).to_numpy()
    else:
        launch, tid = work["launch_start_ns"].to_numpy(), work["launch_tid"].to_numpy()
        inside = np.zeros(len(work), dtype=bool)
        for thread in np.unique(tid[tid >= 0]).tolist():
            rows = marked & (ops["tid"].to_numpy() == thread)
            starts, ends = ops["start_ns"].to_numpy()[rows], ops["end_ns"].to_numpy()[rows]
            mine = np.flatnonzero(tid == thread)
            # inside when a marked region on the thread started before the launch and ends after it: regions nest, so
            # the outermost holding the launch is enough, and every region's interval is tested
            order = np.argsort(starts)
            starts, ends = starts[order], np.maximum.accumulate(ends[order])
            inside[mine[interval_at(starts, ends, launch[mine], closed=True) >= 0]] = True
        overhead = np.zeros(len(work), dtype=bool)
    comm = work["category"].astype(str).eq("communication").to_numpy()
    compiled = int(dur[inside & ~comm].sum())
    eager = int(dur[~inside & ~overhead & ~comm].sum())
    total = compiled + eager
    return {"compiled_ns": compiled, "eager_ns": eager, "dynamo_overhead_ns": int(dur[overhead].sum()), "communication_ns": int(dur[comm].sum()),
            "compiled_share": compiled / total if total else None, "eager_share": eager / total if total else None,
            "eager_top": _top_names(work[~inside & ~overhead & ~comm], 3)}


def _launched_in_steps(work, steps) -> np.ndarray:
    """Per GPU activity, whether it was launched inside a step window (its start where no launch was recorded): a
    profiler session can record past its last step window (work launched after the step's end, before the stop), and a
    kernel launched from no recorded operator would otherwise read as eager. Every one where the trace has no step
    window."""
    if steps is None or not len(steps):
        return np.ones(len(work), dtype=bool)
    launch = work["launch_start_ns"].to_numpy()
    when = np.where(launch >= 0, launch, work["start_ns"].to_numpy())
    order = np.argsort(steps["start_ns"].to_numpy(), kind="stable")
    starts, ends = steps["start_ns"].to_numpy()[order], steps["end_ns"].to_numpy()[order]
    return interval_at(starts, np.maximum.accumulate(ends), when, closed=True) >= 0


def _top_names(work, n: int) -> list[dict]:
    if not len(work):
        return []
    grouped = work.groupby(work["name"].astype(str))["dur_ns"].sum().sort_values(ascending=False).head(n)
    return [{"name": name, "ns": int(ns)} for name, ns in grouped.items()]


INFLATION_LIMIT = 1.10  # traced ÷ untraced step beyond which the traced accounting describes the profiler (--inflation-limit)
GPU_BOUND_FILL = 0.85  # kernels filling this share of the untraced step: the GPU sets it, whatever the host does
# a busy share this near GPU_BOUND_FILL is not placed on either side by its measure: GPM read 0.6–2.4 points under a
# known busy share over 2 s windows (benchmarks/gpu_busy_truth.py), and transformers' Trainer read 80.8–85.1% over runs
NEAR_FILL_LINE = 0.025
SYNC_BOUND = 0.05  # the GPU idle after synchronising calls of at least this share of the step: synchronisation-bound
COMMUNICATION = "communication"  # trace.categories' name for NCCL's kernels


def traced_section(timing: dict, traced_step_ms: list[float], trace_warmup: int, window_ms: float | None, steps: int, trace,
                   inflation_limit: float) -> dict:
    """The traced steps beside the untraced ones: each traced step's time by the same clock as the timed steps (the
    profiler's ``trace_warmup`` steps first, apart), their median ÷ the untraced median (the inflation) and whether it
    passes ``inflation_limit``; without the clock's figures, the trace's own step windows."""
    times = [float(x) for x in traced_step_ms or []]
    warmup = int(trace_warmup or 0)
    each = times[warmup:] if len(times) > warmup else []
    traced_ms = float(np.median(each)) if each else window_ms
    median = timing.get("median_ms")
    inflation = traced_ms / median if traced_ms and median else None
    return {"steps": steps, "step_ms": traced_ms, "step_ms_each": each, "warmup_step_ms": times[:warmup], "window_ms": window_ms,
            "untraced_ms": median, "inflation": inflation, "inflation_limit": inflation_limit,
            "inflated": bool(inflation is not None and inflation > inflation_limit), "trace_path": trace.meta.get("path"), "cpu_only": trace.cpu_only}


def program_report(*, timing: dict, device: str | None, traced_step_ms: list[float] = (), trace_warmup: int = 0,
                   inflation_limit: float = INFLATION_LIMIT, trace, shapes_trace=None, ceilings: dict | None = None,
                   model_bytes: dict | None = None, tf32: bool = False, top: int = 10, loop: dict | None = None,
                   tf32_conv: bool = False) -> dict:
    """The report of one rank's run. ``timing``: the timed steps' summary (median_ms, ci95, ...); ``trace``: the traced
    steps' Trace (read with its operators), or None; ``traced_step_ms``: the traced steps by the timed steps' clock, the
    profiler's ``trace_warmup`` steps first; ``ceilings``: the GPU's measured peaks (``perflab ceilings``), or
    None (the CPU); ``model_bytes``: the modules' parameter and buffer bytes on the device; ``shapes_trace``: the
    short pass recorded with operator shapes, the FLOPs' source (recording shapes slows a step, so the accounted trace
    has none); without it the FLOPs are counted from ``trace`` (a trace from elsewhere, recorded with shapes).
    ``loop``: the untraced steps' whole loop (``analysis.loop.loop_section``): the verdict rests on it first; without a
    trace it is the verdict's only evidence."""
    report = {"timing": timing, "device": device, "traced": None, "accounting": None, "flops": None, "utilisation": None,
              "floors": None, "verdict": None, "compiled": None}
    if trace is None:
        evidence = {"step_ms": timing.get("median_ms"), "busy_ms": None, "cpu_only": device != "cuda", **loop_evidence(loop)}
        if loop and (evidence.get("busy_share") is not None or evidence.get("input_exposed_share") is not None):
            report["verdict_evidence"] = evidence
            verdict = step_verdict(evidence, None, None)
            if evidence["cpu_only"] and verdict["verdict"] == "unknown":
                verdict = None  # a CPU run with no trace and no input wait: nothing to say
            report["verdict"] = verdict
        return report
    analysed = analyze_trace(trace, top=top)
    summary = analysed.to_dict()
    steps = analysed.accounting.steps
    n_steps = max(int(summary["steps"] or 0), 1)
    window_ms = float(np.median(steps["wall_ns"])) / 1e6 if len(steps) else None
    window = (int(trace.steps["start_ns"].min()), int(steps["end_ns"].max())) if len(trace.steps) else None
    if shapes_trace is not None:
        shaped = shapes_trace.steps
        shape_window = (int(shaped["start_ns"].min()), int(shaped["end_ns"].max())) if len(shaped) else None
        flops = count_op_flops(shapes_trace.ops, window=shape_window, steps=max(len(shaped), 1), kernels=shapes_trace.kernels)
    else:
        flops = count_op_flops(trace.ops, window=window, steps=n_steps, kernels=trace.kernels)
    traced = traced_section(timing, traced_step_ms, trace_warmup, window_ms, n_steps, trace, inflation_limit)
    report["traced"] = traced
    report["accounting"] = {k: summary[k] for k in ("wall_us", "gpu_busy_us", "idle_us", "idle_by_cause_us", "accounting_ns", "kernels",
                                                    "kernels_per_step", "top_kernels", "categories_us", "step_accounting", "launch")}
    report["flops"] = flops.to_dict()
    # a GPU's accounted trace holds no operators (trace.capture.Tracer: they slow the host): the pass with shapes has them
    with_ops = trace if trace.ops is not None and len(trace.ops) else shapes_trace
    if with_ops is not None:
        report["compiled"] = compiled_split(with_ops)
    elif not trace.cpu_only:  # no operator anywhere: the kernels alone cannot say which ran in a compiled region
        report["compiled"] = {"compiled_share": None, "unknown": "no operators were recorded (the pass with shapes was left out)"}
    report["traced_verdict"] = summary["launch"]["message"]
    median = timing.get("median_ms")
    # the GPU's time per step: all the traced steps' busy time over their number. A GPU-bound step's kernels run on past
    # the host's step boundary into the next window, so one window's busy time is not its step's; their sum is the steps'
    busy_ms = float(steps["busy_ns"].sum()) / len(steps) / 1e6 if len(steps) else None
    categories_ms = {c: us / 1e3 / n_steps for c, us in summary["categories_us"].items()}
    compute_ms = _compute_busy_ms(trace)
    if compute_ms is not None:  # under DDP: the fill is the compute's; exposed communication has its own verdict
        busy_ms = compute_ms
        categories_ms.pop(COMMUNICATION, None)
    host_ms, host_source = _host_floor(trace, traced, timing)
    if host_ms is not None and not traced["inflated"] and window_ms and host_ms > window_ms * 1.01:
        # an identity: the host's time to issue a step is counted inside the step's own window, so it cannot pass it;
        # a figure that does was counted over another window (perflab's bug), and is not printed as the host's
        host_ms, host_source = None, (f"not used: the host's issue time ({host_ms:.3f} ms) came out longer than the traced step it "
                                      f"issues ({window_ms:.3f} ms), counted over another window")
    operator_share = _operator_share(summary) if trace.cpu_only else None
    traced_busy_ms, busy_basis = None, None
    if trace.cpu_only and traced["inflated"] and busy_ms is not None and operator_share is not None and median:
        # the profiler slows every CPU operator: the traced steps' operator time (×1.5-20 the untraced step) is not the
        # step's; their share of the traced step, of the untraced one, is what the verdict speaks of
        traced_busy_ms, busy_ms = busy_ms, operator_share * median
        busy_basis = (f"the operators' share of the traced steps ({operator_share:.0%}) of the untraced median step: the traced steps "
                      f"ran ×{traced['inflation']:.2f} the untraced ones, their own operator time {traced_busy_ms:.3f} ms")
    evidence = {"step_ms": median, "busy_ms": busy_ms, "communication_apart": compute_ms is not None, "categories_ms": categories_ms,
                "traced_busy_ms": traced_busy_ms, "busy_basis": busy_basis,
                "host_ms": host_ms, "host_source": host_source, "inflation": traced["inflation"],
                "inflated": traced["inflated"], "cpu_only": trace.cpu_only, "cpu_verdict": summary["launch"] if trace.cpu_only else None,
                "operator_share": operator_share,
                "sync_idle": idle_after_syncs(trace), "host_bound_idle_ms": _host_bound_idle_ms(summary),
                **loop_evidence(loop)}
    if ceilings and median and not trace.cpu_only:
        report.update(_floors(ceilings, flops, model_bytes, median, evidence, summary, tf32, tf32_conv))
    report["verdict_evidence"] = evidence
    report["verdict"] = step_verdict(evidence, report.get("floors"), report.get("utilisation"))
    return report


def _host_bound_idle_ms(summary: dict) -> float | None:
    """The traced steps' host-bound idle per step: the GPU ran dry and waited for the host's next launch (the accounting)."""
    acc = summary.get("accounting_ns") or {}
    steps = summary.get("steps") or 0
    return acc["host_bound_ns"] / steps / 1e6 if acc.get("host_bound_ns") is not None and steps else None


def _operator_share(summary: dict) -> float | None:
    """A CPU trace's operators' share of its traced steps (the accounting's busy time over its wall)."""
    acc = summary.get("accounting_ns") or {}
    return acc["busy_ns"] / acc["wall_ns"] if acc.get("wall_ns") else None


def _compute_busy_ms(trace) -> float | None:
    """The GPU's busy time per traced step with the communication kernels left out, where the trace has some; None
    otherwise. An NCCL kernel runs from its launch until every rank has joined it, so its time is waiting as much as
    work: counted as busy, a rank that waits for another looks GPU-bound (two H200s: 40.3 ms of "GPU work" in a 30.2 ms
    step). The compute kernels' union over the same step windows is the work the step must do."""
    kernels = trace.kernels
    if trace.cpu_only or kernels is None or not len(kernels) or not len(trace.steps):
        return None
    comm = kernels["name"].map(is_comm).to_numpy(dtype=bool)  # as the per-rank communication table beside it counts it
    if not comm.any():
        return None
    steps = account(kernels[~comm], trace.steps).steps
    return float(steps["busy_ns"].sum()) / len(steps) / 1e6 if len(steps) else None


def _host_floor(trace, traced: dict, timing: dict) -> tuple[float | None, str | None]:
    """The host's time to issue a step, less its waits for the GPU (synchronising calls, launches blocked on a full queue).
    From the traced steps when they ran as the untraced ones did; when the profiler inflated them, from the host's own
    clock over the untraced steps, less the waits the trace saw (an upper bound: a slower host waits less)."""
    if trace.cpu_only:
        return None, None
    if not traced["inflated"]:
        return traced_host_issue_ms(trace, without_waits=True), "the traced steps' issue time, less the host's waits for the GPU"
    host = timing.get("host_median_ms")
    if host is None:
        return None, None
    waits = traced_host_issue_ms(trace) - traced_host_issue_ms(trace, without_waits=True)
    return max(host - waits, 0.0), "the host's clock over the untraced steps, less the waits for the GPU the trace saw"


def precision_flops(flops, tf32: bool, tf32_conv: bool) -> dict[str, int]:
    """The FLOPs per precision they ran at: by input dtype, with fp32's moved to TF32 where the program let that kind of
    work run on TF32 tensor cores (``tf32``: matmuls, ``torch.backends.cuda.matmul.allow_tf32``; ``tf32_conv``: cuDNN's
    convolutions, ``torch.backends.cudnn.allow_tf32``, on by torch's default). A ResNet-50 in fp32 held against the fp32
    (non-tensor-core) peak read MFU 98.4% on an H200; its convolutions ran on TF32."""
    by = dict(flops.by_dtype)
    fp32 = by.pop("fp32", 0)
    conv = min(flops.conv_by_dtype.get("fp32", 0), fp32)
    for precision, n in (("tf32" if tf32_conv else "fp32", conv), ("tf32" if tf32 else "fp32", fp32 - conv)):
        if n:
            by[precision] = by.get(precision, 0) + n
    return by


def _floors(ceilings: dict, flops, model_bytes: dict | None, median_ms: float, evidence: dict, summary, tf32: bool,
            tf32_conv: bool = False) -> dict:
    """The floors of the untraced step: compute, memory and launch from what the step does; host from the traced host's
    issue time at steady state less its waits for the GPU (left out, 0, when the traced steps were inflated). The
    compute peak is that of the precision most FLOPs ran at (``precision_flops``)."""
    by_precision = precision_flops(flops, tf32, tf32_conv) if flops.known else {}
    dtype = max(by_precision, key=by_precision.get) if by_precision else None  # no FLOPs seen: no dtype to hold them against
    peak = (ceilings.get("matmul_tflops") or {}).get(dtype) if dtype else None
    step_bytes = (model_bytes or {}).get("param_bytes", 0) + (model_bytes or {}).get("buffer_bytes", 0)
    kernels_per_step = float(summary["kernels_per_step"] or 0.0)
    floors = compute_floors(measured_ms=median_ms, flops_per_step=flops.per_step if peak else 0.0, matmul_tflops=peak or 1.0,
                            bytes_per_step=step_bytes, copy_gbps=ceilings["copy_gbps"], kernels_per_step=kernels_per_step,
                            kernel_interval_us=ceilings["graph_kernel_interval_us"], host_issue_ms=evidence["host_ms"] or 0.0,
                            gpu_busy_ms=evidence["busy_ms"])
    util = floors.utilisation()["measured"]
    floors_dict = floors.to_dict()
    floors_dict["host_known"] = evidence["host_ms"] is not None
    return {"utilisation": {"mfu": util["mfu"] if peak and flops.known else None, "mbu": util["mbu"] if step_bytes else None, "dtype": dtype,
                            "flops_by_precision": by_precision,
                            "peak_tflops": peak, "copy_gbps": ceilings["copy_gbps"], "bytes_per_step": step_bytes,
                            "bytes_source": "the parameters and buffers of the program's modules on the GPU, each read once",
                            "mfu_lower_bound": not flops.complete, "ceilings_measured_at": ceilings.get("measured_at")},
            "ceilings": {k: ceilings.get(k) for k in ("gpu", "matmul_tflops", "copy_gbps", "graph_kernel_interval_us", "measured_at")},
            "floors": floors_dict}


def _over(busy_ms: float, step_ms: float) -> str:
    """Where the traced steps' GPU work is longer than the untraced step (its fill is then capped at 100%), a sentence
    that says so: the kernels ran slower while traced, so their time bounds the untraced step's from above."""
    if busy_ms <= step_ms * 1.01:
        return ""
    return (f"; the traced kernels' {busy_ms:.3f} ms a step are more than the untraced step: they ran slower while traced, "
            "so the fill is capped at 100%")


def _shares(categories_ms: dict, busy_ms: float, n: int = 3) -> str:
    top = sorted(((c, ms) for c, ms in categories_ms.items() if c != COMMUNICATION), key=lambda kv: -kv[1])[:n]
    return ", ".join(f"{c} {ms / busy_ms:.0%}" for c, ms in top if busy_ms > 0)


def _compute_share(evidence: dict, traced_step_ms: float, exposed_share: float) -> float | None:
    """The compute kernels' share of a traced step, to hold the exposed communication's share against: ``busy_ms``
    itself where it leaves the communication kernels out (``communication_apart``), else ``busy_ms`` less the exposed
    communication it counts; None without GPU work (a CPU trace)."""
    busy = evidence.get("busy_ms")
    if evidence.get("cpu_only") is not False or busy is None:
        return None
    return busy / traced_step_ms if evidence.get("communication_apart") else busy / traced_step_ms - exposed_share


def loop_evidence(loop: dict | None) -> dict:
    """What the untraced steps' whole loop (``analysis.loop.loop_section``) gives a verdict: the mean step (the time
    the program spends a step), the GPU's busy share over those steps (GPM, NVML), the exposed input wait, the host's
    time blocked in synchronising calls and its own time less its waits."""
    if not loop:
        return {}
    busy, inputs, sync = loop.get("busy") or {}, loop.get("input") or {}, loop.get("sync") or {}
    return {"mean_ms": loop.get("mean_ms"), "busy_share": busy.get("busy_share"), "busy_source": busy.get("busy_source"),
            "nvml_util": busy.get("nvml_util"), "input_exposed_share": inputs.get("exposed_share"), "input": inputs or None,
            "sync_blocked_ms": sync.get("blocked_ms_per_step"), "syncs_per_step": sync.get("calls_per_step"),
            "sync_sites": sync.get("sites") or [], "host_own_ms": loop.get("host_own_ms"), "host_mean_ms": loop.get("host_mean_ms")}


def step_verdict(evidence: dict, floors: dict | None, utilisation: dict | None, exposed_comm_ms: float | None = None,
                 traced_step_ms: float | None = None, waiting_ms: float | None = None) -> dict:
    """What limits the program's step, from what the untraced steps did, and the figures it rests on. A verdict never
    contradicts them: a GPU busy for ``GPU_BOUND_FILL`` of the step makes it GPU-bound (never launch-bound), and
    launch-bound needs a host that, less its waits for the GPU and for input, takes longer a step than the GPU is busy.

    The step judged is the **mean** untraced step (``mean_ms``: the wall time a step, what the program spends), falling
    back to the median (``step_ms``). ``evidence``: step_ms (untraced median), mean_ms, busy_ms (the traced steps' GPU
    busy time, kernels and copies once, never scaled; the communication kernels left out where
    ``communication_apart``), busy_share (the GPU's busy share of the untraced steps, GPM or NVML: no profiler),
    input_exposed_share (the input waits no queued GPU work hid, over the wall time), host_own_ms (the host's clock a
    step less its waits for input and in synchronising calls), sync_sites, categories_ms (GPU time per category per
    step), host_ms (the traced steps' issue time less waits; the host's clock where they were inflated), inflation,
    cpu_only and cpu_verdict (a CPU trace's operator verdict).
    ``exposed_comm_ms``: under torchrun, the most exposed communication of a rank per traced step, and
    ``traced_step_ms`` that rank's traced step: its share of the step windows it was counted over; ``waiting_ms`` the
    part of its exposed time spent waiting for a later rank. In traced steps inflated beyond the limit that waiting is
    left out: a rank that its profiler slowed keeps its peers waiting (compiled DDP on two H200s, traced ×1.39: rank 0
    waited 76.5 ms a traced step, where its untraced step grew 25.3 ms over one rank's)."""
    step = evidence.get("mean_ms") or evidence.get("step_ms")
    busy = evidence.get("busy_ms")
    traced_fill = min(busy / step, 1.0) if step and busy is not None else None
    share = evidence.get("busy_share")
    # the untraced busy share counts NCCL's kernels, which wait for a peer as much as they work: under DDP the traced
    # compute kernels' fill (communication apart) is the step's work
    fill = share if share is not None and not evidence.get("communication_apart") else traced_fill
    out = {"kernel_fill": traced_fill, "busy_share": share, "fill": fill, "step_ms": step, "median_ms": evidence.get("step_ms"),
           "busy_ms": busy, "host_ms": evidence.get("host_ms"), "host_own_ms": evidence.get("host_own_ms"), "exposed_comm_ms": exposed_comm_ms}
    if evidence.get("busy_basis"):  # an inflated CPU trace's operator time, carried to the untraced step (traced_report)
        out["busy_basis"] = evidence["busy_basis"]
    note = ""
    if exposed_comm_ms is not None and traced_step_ms:
        counted, what = exposed_comm_ms, "communication that no compute hides"
        if evidence.get("inflated") and waiting_ms:
            counted, what = exposed_comm_ms - waiting_ms, "moving bytes that no compute hides (waiting for a peer left out)"
            note = (f"; of the traced steps' {exposed_comm_ms:.3f} ms of exposed communication, {waiting_ms:.3f} ms is waiting for a peer, "
                    f"left out of the verdict: the traced steps ran ×{evidence.get('inflation') or 0:.2f} the untraced, and a peer slowed by "
                    "its profiler makes waiting (the growth over one rank, --nproc 1,2, bounds what communication costs)")
        comm_share = counted / traced_step_ms  # both over the same step windows
        compute = _compute_share(evidence, traced_step_ms, comm_share)
        if comm_share >= 0.25 and (compute is None or comm_share >= compute):
            out["exposed_comm_share"] = comm_share
            return dict(out, verdict="communication-bound",
                        message=f"communication-bound: {what} fills {comm_share:.0%} of each traced step "
                                f"({counted:.3f} of {traced_step_ms:.3f} ms, the slowest rank's; untraced step {step:.3f} ms)")
    verdict = _near_the_line(_input_verdict(evidence, out, step) or _fill_verdict(evidence, floors, utilisation, out, fill), fill,
                             evidence.get("cpu_only"))
    return dict(verdict, message=verdict["message"] + note) if note else verdict


def _near_the_line(verdict: dict, fill: float | None, cpu_only) -> dict:
    """A verdict drawn from the GPU's busy share where that share lies within ``NEAR_FILL_LINE`` of the line between
    GPU-bound and the rest (``GPU_BOUND_FILL``): said, with the distance (``near_line``), since a second run may fall on
    the other side of it."""
    if cpu_only or fill is None or verdict.get("verdict") in ("unknown", "undetermined", "input-bound", "communication-bound"):
        return verdict
    distance = fill - GPU_BOUND_FILL
    if abs(distance) >= NEAR_FILL_LINE:
        return verdict
    side = "over" if distance >= 0 else "under"
    return dict(verdict, near_line=distance,
                message=verdict["message"] + f" (the GPU's busy share, {fill:.1%}, is {abs(distance) * 100:.1f} points {side} the "
                                             f"{GPU_BOUND_FILL:.0%} this verdict's line is drawn at, nearer than its measure can place it: "
                                             "another run may read the other side)")


def _input_verdict(evidence: dict, out: dict, step: float | None) -> dict | None:
    """Input-bound: the waits for input that no queued GPU work hid take ``INPUT_BOUND`` of the wall time or more.
    With its share, the loader's settings, the workers' own time per batch, and the fix with its predicted gain."""
    from perflab.analysis.loop import INPUT_BOUND

    share = evidence.get("input_exposed_share")
    inputs = evidence.get("input") or {}
    if share is None or share < INPUT_BOUND or not step:
        return None
    exposed = inputs.get("exposed_ms_per_step") or 0.0
    loaders = inputs.get("loaders") or []
    settings = ""
    if loaders:
        lo = loaders[0]
        settings = (f"; its DataLoader: num_workers={lo.get('num_workers')}, pin_memory={lo.get('pin_memory')}, "
                    f"prefetch_factor={lo.get('prefetch_factor')}, persistent_workers={lo.get('persistent_workers')}")
    workers = ""
    if inputs.get("worker_batch_ms") is not None:
        workers = f"; its workers take {inputs['worker_batch_ms']:.3f} ms a batch (median of {inputs.get('worker_batches')}, measured in the workers)"
    fix = inputs.get("fix") or {}
    gain = ""
    if fix.get("predicted_mean_ms"):
        if fix.get("workers_needed"):
            more = (f"raise num_workers from {fix['num_workers']} to at least {fix['workers_needed']} (a batch takes {fix['batch_ms']:.3f} ms to "
                    f"make{' in a worker' if fix['num_workers'] else ', in the main process'})")
        elif fix.get("workers_keep_up"):
            more = (f"not more workers: {fix['num_workers']} workers make a batch in {fix['batch_ms']:.3f} ms, faster than the step takes "
                    "them; the wait is in handing batches over (the workers' queue, unpickling, collation, pin_memory): larger "
                    "batches per transfer, or data kept on the device")
        else:
            more = "feed the step faster (more loader workers, a cheaper transform, data already on the device)"
        gain = (f". Fix: {more}; with no exposed wait the step would take {fix['predicted_mean_ms']:.3f} ms "
                f"(the wall time less the exposed wait: ×{fix['speedup']:.2f} faster)")
    if evidence.get("cpu_only") or evidence.get("busy_share") is None and evidence.get("busy_ms") is None:
        idle = f"({exposed:.3f} ms of the {step:.3f} ms mean step; on the CPU nothing runs while it waits)"
    else:
        idle = (f"with the GPU idle ({exposed:.3f} ms of the {step:.3f} ms mean step; {inputs.get('hidden_ms_per_step', 0.0):.3f} ms more "
                "of waiting was hidden under queued GPU work)")
    return dict(out, verdict="input-bound", input_exposed_share=share,
                message=f"input-bound: the program waits for its input {share:.0%} of its wall time {idle}{settings}{workers}{gain}")


def _sync_text(evidence: dict) -> str:
    sites = evidence.get("sync_sites") or []
    if not sites:
        return ""
    top = sites[0]
    return f"{top['call']} at {top['site']}, {top['per_step']:.3g}× a step"


def _host(evidence: dict, fill: float) -> tuple[float | None, str | None, bool]:
    """The host's time a step, less its waits, and where it comes from: the traced steps' issue time where they ran as
    the untraced did (exact: waits for the GPU and blocked launches left out); else the host's clock over the untraced
    steps less the waits perflab watched (input, synchronising calls); else, with no watch, the host's clock less the
    waits the inflated trace saw, an upper bound that decides nothing while kernels fill half the step or more
    (third value: undetermined)."""
    if evidence.get("host_ms") is not None and not evidence.get("inflated"):
        return evidence["host_ms"], evidence.get("host_source"), False
    own = evidence.get("host_own_ms")
    if own is not None:
        waits = []
        if evidence.get("sync_blocked_ms"):
            waits.append(f"{evidence['sync_blocked_ms']:.3f} ms blocked in synchronising calls")
        if (evidence.get("input") or {}).get("wait_ms_per_step"):
            waits.append(f"{evidence['input']['wait_ms_per_step']:.3f} ms waiting for input")
        if not waits:
            return own, "the host's clock over the untraced steps, in which it waited on nothing perflab watches", False
        clock = f"{evidence['host_mean_ms']:.3f} ms a step, " if evidence.get("host_mean_ms") else ""
        return own, "the host's clock over the untraced steps, " + clock + "less " + " and ".join(waits), False
    if evidence.get("host_ms") is not None:
        return evidence["host_ms"], evidence.get("host_source"), fill >= 0.5
    return None, None, False


def _fill_verdict(evidence: dict, floors: dict | None, utilisation: dict | None, out: dict, fill: float | None) -> dict:
    """step_verdict past communication and input: from the GPU's busy share of the step and the host's own time."""
    step, busy = out["step_ms"], evidence.get("busy_ms")
    if evidence.get("cpu_only"):
        cpu = evidence.get("cpu_verdict") or {}
        if evidence.get("inflated") and cpu.get("verdict") and evidence.get("operator_share") is not None:
            # the traced steps' milliseconds are the profiler's as much as the program's: their shares, with the untraced step
            share = evidence["operator_share"]
            return dict(out, verdict=cpu["verdict"],
                        message=f"{cpu['verdict']}, in traced steps that ran ×{evidence.get('inflation') or 0:.2f} the untraced "
                                f"{step:.3f} ms step: torch's operators ran {share:.0%} of them, the interpreter between them "
                                f"{1 - share:.0%}; the profiler adds time to every operator, so these shares describe it as much as "
                                "the program (the traced accounting's own figures are below)")
        return dict(out, verdict=cpu.get("verdict") or "unknown", message=cpu.get("message") or "no operators traced")
    if fill is None:
        return dict(out, verdict="unknown", message="no GPU work was traced, and the GPU's busy share was not read (no NVML)")
    gpu_ms = fill * step
    untraced = out.get("busy_share") is not None and fill == out["busy_share"]
    traced_fill = f"; the traced kernels fill {out['kernel_fill']:.0%}" if out.get("kernel_fill") is not None else ""
    mfu = (utilisation or {}).get("mfu")
    mfu_text = f", MFU {mfu:.1%}" + (" (a lower bound)" if (utilisation or {}).get("mfu_lower_bound") else "") if mfu is not None else ""
    if untraced:
        gpu_text = f"the GPU busy {gpu_ms:.3f} ms a step ({fill:.0%}: {evidence.get('busy_source')}{traced_fill})"
    else:
        gpu_text = f"kernels that keep the GPU busy {busy:.3f} ms"
    if fill >= GPU_BOUND_FILL:
        shares = _shares(evidence.get("categories_ms") or {}, busy) if busy else ""
        if untraced:
            what = f"the GPU is busy {fill:.0%} of the {step:.3f} ms mean step ({evidence.get('busy_source')}{traced_fill}"
        else:
            apart = ", communication apart" if evidence.get("communication_apart") else ""
            what = f"kernels fill {fill:.0%} of the {step:.3f} ms step ({busy:.3f} ms of GPU work a step{apart}"
        detail = f"; {shares} of GPU time" if shares else ""
        return dict(out, verdict="GPU-bound",
                    message=f"GPU-bound: {what}{detail}{mfu_text}): faster kernels or less work shorten it, fewer launches do not"
                            + ("" if untraced or not busy else _over(busy, step)))
    host, source, undecided = _host(evidence, fill)
    if undecided:
        return dict(out, verdict="undetermined",
                    message=f"kernels fill {fill:.0%} of the {step:.3f} ms step ({busy:.3f} ms of GPU work a step); the traced steps ran "
                            f"×{evidence.get('inflation') or 0:.2f} the "
                            f"untraced, and the host's own clock ({host:.3f} ms a step, its waits included) only bounds its issue time: "
                            "raise --trace-warmup, or trace fewer things")
    if host is not None and host >= gpu_ms and host >= 0.5 * step:
        return dict(out, verdict="launch-bound",
                    message=f"launch-bound: the host takes {host:.3f} ms a step ({source}) against {gpu_text}; the GPU idles "
                            f"{1 - fill:.0%} of the {step:.3f} ms step. Fewer launches (CUDA graphs: torch.compile mode=\"reduce-overhead\"; "
                            "larger fused kernels) or less host work a step shorten it")
    own = evidence.get("host_own_ms")
    sync = _sync_text(evidence)
    sync_idle = (evidence.get("sync_idle") or {}).get("idle_ms_per_step")
    if sync and own is not None and fill <= GPU_BOUND_FILL and own < gpu_ms and (sync_idle is None or sync_idle >= SYNC_BOUND * step):
        if sync_idle is not None:
            # the idle the synchronisation makes, measured: after each call the queue is empty until the host launches again
            bound = "at most " if evidence.get("inflated") else ""
            gain = (f"the GPU then idles {sync_idle:.3f} ms a step until the host launches again (the traced steps"
                    + (f", ×{evidence.get('inflation') or 0:.2f} the untraced: an upper bound" if evidence.get("inflated") else "")
                    + f"). Without the synchronisation the step would take {bound}that much less, about {step - sync_idle:.3f} ms "
                    f"(×{step / (step - sync_idle):.2f} faster)")
        else:
            overlap = max(gpu_ms, own)
            gain = (f"without it the host's own {own:.3f} ms of work a step would overlap {gpu_text}: the step's floor is "
                    f"{overlap:.3f} ms (×{step / overlap:.2f} at most)")
        return dict(out, verdict="synchronisation-bound",
                    message=f"synchronisation-bound: the GPU idles {1 - fill:.0%} of the {step:.3f} ms mean step; the host blocks "
                            f"{evidence.get('sync_blocked_ms') or 0.0:.3f} ms a step in synchronising calls ({sync}), so the GPU's queue "
                            f"drains; {gain}")
    floor_name = (floors or {}).get("binding")
    if floor_name == "launch" and floors.get("launch_ms", 0) >= (busy if busy is not None else gpu_ms) * 0.5:
        return dict(out, verdict="latency-bound small kernels",
                    message=f"latency-bound small kernels: {floors['launch_ms']:.3f} ms of the step is the least the GPU takes to run its "
                            f"kernels one after another; they fill {fill:.0%} of it")
    if host is None:
        return dict(out, verdict="undetermined",
                    message=f"the GPU is busy {fill:.0%} of the {step:.3f} ms step ({gpu_ms:.3f} ms a step); the traced steps ran "
                            f"×{evidence.get('inflation') or 0:.2f} "
                            "the untraced, and no untraced measure of the host's own time was taken, so the host's issue time is not known: "
                            "raise --trace-warmup")
    parts = []
    if evidence.get("host_bound_idle_ms"):
        parts.append(f"in the traced steps the GPU waited {evidence['host_bound_idle_ms']:.3f} ms a step for the host's next launch")
    if sync_idle:
        parts.append(f"{sync_idle:.3f} ms of it after synchronising calls ({sync})" if sync else f"{sync_idle:.3f} ms after synchronising calls")
    where = ("; " + ", ".join(parts)) if parts else ""
    return dict(out, verdict="GPU idle, not launch-bound",
                message=f"the GPU idles {1 - fill:.0%} of the {step:.3f} ms step but the host issues it in {host:.3f} ms, less than the "
                        f"GPU's {gpu_ms:.3f} ms: it is not a slow host but a host that launches late at points (after a "
                        f"synchronisation, a wait for data, communication){where}")


STRAGGLER_RATIO = 2.0  # a rank's exposed input wait this many times the others' median (and 1 ms more) makes it the straggler


def input_straggler(ranks: list[dict], comm_ranks: list[dict] | None = None) -> dict | None:
    """The rank whose waits for input hold the others back, as TraceML's "input straggler" names it, from untraced
    evidence: its exposed input wait a step (``analysis.loop``) is ``INPUT_BOUND`` of its wall time or more and
    ``STRAGGLER_RATIO`` times the other ranks' median, 1 ms more. What it costs them: their waiting for a later rank
    in the collective (the communication table's, traced), where the traces were read. None without such a rank."""
    from perflab.analysis.loop import INPUT_BOUND

    waits = {r["rank"]: r.get("input_exposed_ms") for r in ranks if r.get("input_exposed_ms") is not None}
    if len(waits) < 2:
        return None
    slow = max(waits, key=waits.get)
    others = sorted(w for r, w in waits.items() if r != slow)
    typical = others[len(others) // 2] if len(others) % 2 else (others[len(others) // 2 - 1] + others[len(others) // 2]) / 2
    row = next(r for r in ranks if r["rank"] == slow)
    share = row.get("input_share") or 0.0
    if share < INPUT_BOUND or waits[slow] < STRAGGLER_RATIO * typical + 1.0:
        return None
    waiting = {c["rank"]: c.get("waiting_ms") for c in comm_ranks or [] if c["rank"] != slow and c.get("waiting_ms") is not None}
    cost = ""
    if waiting:
        cost = ("; the other ranks wait for it in the collective: " + ", ".join(f"rank {r} {w:.3f} ms" for r, w in sorted(waiting.items()))
                + " a traced step")
    step = row.get("mean_ms")
    return {"verdict": "input straggler", "straggler_rank": slow, "input_exposed_ms": waits[slow], "others_input_ms": typical,
            "input_share": share, "others_waiting_ms": [{"rank": r, "waiting_ms": w} for r, w in sorted(waiting.items())] or None,
            "message": f"input straggler: rank {slow} waits for its input {waits[slow]:.3f} ms a step with its GPU idle "
                       f"({share:.0%} of its wall time{f', a {step:.3f} ms mean step' if step else ''}), the other ranks "
                       f"{typical:.3f} ms (median){cost}. Feed rank {slow} faster (its DataLoader's workers, its data's "
                       "storage): every rank's step waits for its slowest"}


EXPOSED_SLACK_MS = 1.0  # the spread of two runs' steps: exposed communication may pass the step's growth by this much


def rank_inflation(rank: dict) -> float | None:
    """A rank's traced steps over its untraced one, from its row of the communication table (``traced_step_ms``, the
    windows its communication was counted over, ÷ ``step_ms``): the two figures that table prints side by side."""
    step, traced = rank.get("step_ms"), rank.get("traced_step_ms")
    return traced / step if step and traced else None


def _rank_against_growth(rank: dict, growth: float | None, inflation_limit: float) -> dict:
    """A rank's exposed communication held against the step's growth: ``within_growth`` True or False, or None where
    the growth is not known or the rank's traced steps ran past ``inflation_limit`` × its untraced step. Exposed time counted over inflated steps
    is the profiler's as much as the program's (a rank slowed by its profiler keeps the other waiting), so it is not
    judged against a growth measured without the profiler; ``inflation`` says by how much."""
    inflation = rank_inflation(rank)
    judged = growth is not None and not (inflation is not None and inflation > inflation_limit)
    return {"rank": rank["rank"], "exposed_ms": rank["exposed_ms"], "waiting_ms": rank.get("waiting_ms"), "inflation": inflation,
            "within_growth": bool(rank["exposed_ms"] <= max(growth, 0.0) + EXPOSED_SLACK_MS) if judged else None}


def scaling_section(reports: dict[int, RunReport | dict]) -> dict:  # scaling.json, read as records.run_report.Scaling
    """The program at several rank counts (``perflab run --nproc 1,2``): per count its step (the slowest rank's), the
    work each rank does in a step (FLOPs from its traced operators: a program that splits its batch over the ranks,
    as nanoGPT splits its gradient accumulation, does less per rank), the step the first count's would take at that
    work (``expected_ms`` = first step × work ÷ first work, or the first step when FLOPs are unknown: the same work
    per rank assumed, and said), the growth over it, and the scaling efficiency, expected ÷ measured: the ratio of two
    printed figures. Each rank's exposed communication (its waiting included) is held against the growth: a rank
    cannot lose more to communication than the step grew, beyond the run-to-run spread; a rank whose traced steps were
    inflated is not judged (``_rank_against_growth``). ``reports``: each count's run.json (``records.run_report.load``;
    a dict of its fields is read as one)."""
    reports = {n: r if isinstance(r, RunReport) else RunReport.from_dict(r) for n, r in reports.items()}
    counts = list(reports)  # in the order given: the first is the base (--nproc 2,1 reads over 2)
    out = {"counts": counts, "rows": [], "base": counts[0] if counts else None, "note": None}
    if not counts:
        out["note"] = "no run wrote a report"
        return out

    def step_of(report: RunReport) -> float | None:
        return report.step_ms or report.section("timing").get("median_ms")

    def work_of(report: RunReport) -> float | None:
        flops = report.section("flops")
        return flops.get("flops_per_step") if flops.get("known", True) and flops.get("flops_per_step") else None

    base = reports[counts[0]]
    base_ms, base_work = step_of(base), work_of(base)
    assumed = False
    for n in counts:
        report = reports[n]
        step, work = step_of(report), work_of(report)
        ratio = work / base_work if work and base_work else None
        if ratio is None:
            assumed = True
        expected = base_ms * (ratio if ratio is not None else 1.0) if base_ms else None
        growth = step - expected if step is not None and expected is not None else None
        limit = report.section("traced").get("inflation_limit") or INFLATION_LIMIT
        ranks = [_rank_against_growth(r, growth, limit) for r in (report.section("communication").get("ranks") or [])]
        verdict = report.get("verdict")  # its message (one that is no mapping: as it is)
        out["rows"].append({"nproc": n, "step_ms": step, "ci95_ms": _step_timing(report).get("ci95_ms"), "flops_per_rank_step": work,
                            "work_ratio": ratio, "expected_ms": expected, "growth_ms": growth,
                            "efficiency": expected / step if expected and step else None, "ranks": ranks,
                            "verdict": verdict.get("message") if isinstance(verdict, dict) else verdict})
    notes = ["FLOPs per step unknown for some count: the same work per rank assumed there (weak scaling)"] if assumed else []
    notes += [_superlinear(row, base) for row in out["rows"] if (row.get("efficiency") or 0.0) > 1.0 + SUPERLINEAR_SLACK]
    out["note"] = "; ".join(notes) or None
    return out


SUPERLINEAR_SLACK = 0.02  # an efficiency this far above 1 is said: more ranks cannot do a rank's share faster than one


def _step_timing(report: RunReport) -> dict:
    """The timing (median, CI, its coverage) of the step a count's report gives: under torchrun the slowest rank's
    (``step_ms``: its row in ``ranks``), whose CI is its own, not rank 0's; else the report's own timing."""
    timing = report.section("timing")
    slowest = report.get("slowest_rank")
    row = next((r for r in report.get("ranks") or [] if r.get("rank") == slowest), None) if slowest is not None else None
    if row is None or not report.step_ms:
        return timing
    return {"median_ms": row.get("median_ms"), "ci95_ms": row.get("ci95_ms"), "ci_ms": row.get("ci_ms"), "ci_coverage": row.get("ci_coverage"),
            "steps": timing.get("steps"), "ci_level": timing.get("ci_level")}


def _superlinear(row: dict, base: RunReport) -> str:
    """Why an efficiency above 1 is suspect, in words: the step fell more than the work per rank did, so the first
    count's step it is held against (with its CI and flags) is the first thing to doubt."""
    timing = _step_timing(base)
    ci = timing.get("ci95_ms") or timing.get("ci_ms")
    flags = [f.get("flag") if isinstance(f, dict) else str(f) for f in base.flags or []]
    claim = ci_note(ci_coverage_of(timing), None)  # fewer than five stretches of steps claim less than 95%
    spread = f", {'CI ' + claim if claim else '95% CI'} {ci[0]:.3f}–{ci[1]:.3f}" if ci and None not in ci else ""
    flagged = f", flagged {', '.join(flags)}" if flags else ""
    first = base.step_ms or timing.get("median_ms")
    return (f"efficiency {row['efficiency']:.3f} at {row['nproc']} ranks is above 1: the step fell more than the work per rank; "
            f"the step it is held against ({first:.3f} ms{spread}{flagged}) is the first to doubt")

