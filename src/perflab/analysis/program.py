"""A user's program's report (``perflab run``): its timed steps, its traced steps accounted, its FLOPs from its
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

from perflab.analysis.floors import compute_floors
from perflab.analysis.launch import host_issue_ms
from perflab.analysis.op_flops import count_op_flops
from perflab.analysis.trace_report import analyze_trace

COMPILED_REGION = re.compile(r"^Torch-Compiled Region|^CompiledFunction(Backward)?$|^## Call CompiledFxGraph|^CompiledFxGraph")
DYNAMO_OVERHEAD = re.compile(r"^TorchDynamo Cache Lookup$|^Pregraph bytecode$|^AOTDispatcher Runtime Wrapper")


def compiled_split(trace) -> dict | None:
    """Work launched inside compiled regions and outside them, in the traced step windows: {"compiled_ns",
    "eager_ns", "compiled_share"}; None when the trace has no compiled region (nothing compiled ran)."""
    ops = trace.ops
    if ops is None or not len(ops):
        return None
    names = ops["name"].astype(str)
    marked = names.str.match(COMPILED_REGION.pattern).to_numpy()
    if not marked.any():
        return None
    work = trace.kernels
    dur = work["dur_ns"].to_numpy()
    if trace.cpu_only:  # the work is the top-level operators: a compiled region is one of them
        inside = work["name"].astype(str).str.match(COMPILED_REGION.pattern).to_numpy()
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
            pos = np.searchsorted(starts, launch[mine], side="right") - 1
            ok = pos >= 0
            ok[ok] = ends[pos[ok]] >= launch[mine][ok]
            inside[mine[ok]] = True
        overhead = np.zeros(len(work), dtype=bool)
    comm = work["category"].astype(str).eq("communication").to_numpy()
    compiled = int(dur[inside & ~comm].sum())
    eager = int(dur[~inside & ~overhead & ~comm].sum())
    total = compiled + eager
    return {"compiled_ns": compiled, "eager_ns": eager, "dynamo_overhead_ns": int(dur[overhead].sum()), "communication_ns": int(dur[comm].sum()),
            "compiled_share": compiled / total if total else None, "eager_share": eager / total if total else None,
            "eager_top": _top_names(work[~inside & ~overhead & ~comm], 3)}


def _top_names(work, n: int) -> list[dict]:
    if not len(work):
        return []
    grouped = work.groupby(work["name"].astype(str))["dur_ns"].sum().sort_values(ascending=False).head(n)
    return [{"name": name, "ns": int(ns)} for name, ns in grouped.items()]


def program_report(*, timing: dict, trace, recorded: dict, ceilings: dict | None = None, model_bytes: dict | None = None,
                   tf32: bool = False, top: int = 10) -> dict:
    """The report of one rank's run. ``timing``: the timed steps' summary (median_ms, ci95, ...); ``trace``: the traced
    steps' Trace (read with its operators), or None; ``ceilings``: the GPU's measured peaks (``perflab ceilings``), or
    None (the CPU); ``model_bytes``: the modules' parameter and buffer bytes on the device."""
    report = {"timing": timing, "device": recorded.get("device"), "traced": None, "accounting": None, "flops": None, "utilisation": None,
              "floors": None, "verdict": None, "compiled": None}
    if trace is None:
        return report
    analysed = analyze_trace(trace, top=top)
    summary = analysed.to_dict()
    steps = analysed.accounting.steps
    n_steps = max(int(summary["steps"] or 0), 1)
    traced_ms = float(np.median(steps["wall_ns"])) / 1e6 if len(steps) else None
    window = (int(trace.steps["start_ns"].min()), int(steps["end_ns"].max())) if len(trace.steps) else None
    flops = count_op_flops(trace.ops, window=window, steps=n_steps, kernels=trace.kernels)
    median = timing.get("median_ms")
    report["traced"] = {"steps": n_steps, "step_ms": traced_ms, "inflation": traced_ms / median if traced_ms and median else None,
                        "trace_path": trace.meta.get("path"), "cpu_only": trace.cpu_only}
    report["accounting"] = {k: summary[k] for k in ("wall_us", "gpu_busy_us", "idle_us", "idle_by_cause_us", "accounting_ns", "kernels",
                                                    "kernels_per_step", "top_kernels", "categories_us", "step_accounting", "launch")}
    report["flops"] = flops.to_dict()
    report["compiled"] = compiled_split(trace)
    report["verdict"] = summary["launch"]["message"]
    if ceilings and median:
        report.update(_floors(ceilings, flops, model_bytes, median, traced_ms, trace, steps, summary, tf32))
    return report


def _floors(ceilings: dict, flops, model_bytes: dict | None, median_ms: float, traced_ms: float | None, trace, steps, summary, tf32: bool) -> dict:
    dtype = flops.dtype if flops.known else None  # no FLOPs seen: no dtype to hold them against
    if dtype == "fp32" and tf32:
        dtype = "tf32"
    peak = (ceilings.get("matmul_tflops") or {}).get(dtype) if dtype else None
    step_bytes = (model_bytes or {}).get("param_bytes", 0) + (model_bytes or {}).get("buffer_bytes", 0)
    scale = median_ms / traced_ms if traced_ms else 1.0
    kernels_per_step = float(summary["kernels_per_step"] or 0.0)
    busy_ms = float(np.median(steps["busy_ns"])) / 1e6 if len(steps) else None
    floors = compute_floors(measured_ms=median_ms, flops_per_step=flops.per_step if peak else 0.0, matmul_tflops=peak or 1.0,
                            bytes_per_step=step_bytes, copy_gbps=ceilings["copy_gbps"], kernels_per_step=kernels_per_step,
                            kernel_interval_us=ceilings["graph_kernel_interval_us"], host_issue_ms=host_issue_ms(trace, without_waits=True) * scale,
                            gpu_busy_ms=busy_ms * scale if busy_ms is not None else None)
    util = floors.utilisation()["measured"]
    verdict = floors.verdict
    if floors.kernels_set_the_step:
        verdict = "kernel-bound: the host floor binds, but the GPU is busy longer than the host takes to issue the step"
    binding = floors.by_name[floors.binding]
    why = (f"the {floors.binding} floor, {binding:.3f} ms of the {median_ms:.3f} ms step, is the largest"
           + ("" if flops.known else "; the compute floor is unknown (the FLOPs were not seen)"))
    traced = f"under the profiler (steps ×{traced_ms / median_ms:.2f} as long): {summary['launch']['message']}" if traced_ms else summary["launch"]["message"]
    return {"utilisation": {"mfu": util["mfu"] if peak and flops.known else None, "mbu": util["mbu"] if step_bytes else None, "dtype": dtype,
                            "peak_tflops": peak, "copy_gbps": ceilings["copy_gbps"], "bytes_per_step": step_bytes,
                            "bytes_source": "the parameters and buffers of the program's modules on the GPU, each read once",
                            "mfu_lower_bound": not flops.complete, "ceilings_measured_at": ceilings.get("measured_at")},
            "ceilings": {k: ceilings.get(k) for k in ("gpu", "matmul_tflops", "copy_gbps", "graph_kernel_interval_us", "measured_at")},
            "floors": floors.to_dict(), "verdict": f"{verdict}: {why}", "traced_verdict": traced}


def communication_section(*, ddp: dict | None, sweep: dict | None, merged: dict, world_size: int, steps: int,
                          rank_median_ms: dict, step_ms: float | None) -> dict:
    """The ranks' communication against its floor, as ``explain --parallel`` gives it: the bytes a DDP step all-reduces
    (2(N−1)/N × the gradients' bytes, in DDP's buckets), the bus bandwidth at a bucket's size from the sweep, the floor
    (bus bytes ÷ busbw), and per rank its measured, exposed (waiting for a later rank + transfer) and overlapped
    communication per step, the overlap fraction and measured ÷ floor."""
    from perflab.analysis.comm import busbw_at, call_latency_us, ddp_bytes, rank_comm_rows, swept_size

    section = {"world_size": world_size, "steps_profiled": steps, "note": merged.get("note"), "floor_ms": None, "ranks": []}
    floor = None
    if ddp and sweep and sweep.get("sizes"):
        comm = ddp_bytes(ddp["grad_bytes"], world_size, ddp["bucket_cap_mb"], buckets=ddp.get("ddp_buckets"))
        message = ddp["grad_bytes"] / max(comm.calls, 1)
        busbw = busbw_at(sweep, message)
        floor = comm.floor_ms(busbw)
        section.update(mode="ddp", grad_bytes=ddp["grad_bytes"], bus_bytes=comm.bus_bytes, calls=comm.calls, buckets=ddp.get("ddp_buckets"),
                       message_bytes=message, busbw_gbps=busbw, busbw_size_bytes=swept_size(sweep, message)["bytes"],
                       busbw_source=sweep.get("source"), latency_us=call_latency_us(sweep), floor_ms=floor,
                       floor_fraction=floor / step_ms if step_ms else None)
    elif not ddp:
        section["floor_note"] = "no DistributedDataParallel module found: the measured communication without a floor"
    section["ranks"] = rank_comm_rows(merged.get("accounts") or [], steps, rank_median_ms, floor)
    return section
