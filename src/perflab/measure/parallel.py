"""Data parallelism at the measure floor, a step timed on its ranks; ``runtime/parallel.py`` starts them, ``report/parallel.py`` shows them.

A data-parallel training step, timed on every rank, and its result row.

Each rank (``runtime.parallel.launch``: one process per GPU) builds the case's model with the same seed, so
every rank starts from the same weights, and feeds its own batch (rank 0 the one-GPU case's inputs, the others
inputs drawn with their own seed): the batch is per rank (weak scaling). DDP wraps the model (gradients
all-reduced in buckets during the backward); FSDP (``fully_shard``, each block a unit) shards it before the
optimizer is made. ``--mode compile`` compiles the wrapped model, as a user would.

Timing on every rank as on one GPU (``measure.timing``: CUDA events; wall clock on the CPU), after warm-up,
with one plan for all ranks (the slowest rank's estimate: every rank must run the same number of collectives).
The step time is the slowest rank's median (``median_ms``, ``step_ms``); throughput counts every rank's items.
Rank 0 then times the same case on one device in the same run (``single_gpu_ms``), built beside the ranks' model
and timed in blocks interleaved with the data-parallel step's (every rank waits while rank 0 times a one-device
block), and

    scaling_efficiency = median over rounds of (one-device block ÷ data-parallel block of the same round)

with its 95% CI over rounds (weak scaling: the per-GPU batch is fixed, so perfect scaling keeps the step time and
gives 1.0). Where the one-device model does not fit beside the ranks' (an OOM on rank 0), it is timed alone after
them, ``single_gpu_ms / step_ms``, and the row says so (``single_gpu_timing``). Timed after the data-parallel step,
alone, the efficiency of gpt_large read 0.71 to 1.08 in four launches on two H200s: a slower stretch of the host.

A case compared with another (explain's fix and its base, ``paired``) is timed beside it, both models resident, in
interleaved blocks: timed one after the other, the two read different stretches of the host. On two H200s
(2026-11-26) gpt_large's DDP step read 133 to 212 ms as the base of five launches, and its samples drifted from 173
to 104 ms within one; so one case's median against another's taken later is no speedup a user can defend.

``ranks_agree`` (DDP): the parameters after the timed steps are bit-identical on every rank (each rank's sum and
sum of absolute values in float64, compared exactly); FSDP keeps one copy of each parameter shard, so there is
nothing to compare (None). ``rank_memory``: each rank's peak and its split into parameters, gradients and
optimizer state (the rank's own shards under FSDP) and the rest (activations, DDP's buckets, workspace).
"""

from __future__ import annotations

import contextlib
import gc
import os
import statistics
from dataclasses import replace
from pathlib import Path

import torch

from perflab.analysis.comm import comm_floor, ddp_bytes, fsdp_bytes
from perflab.measure.checks import MIN_TIMED_ITERS, Check, compile_checks, run_checks
from perflab.measure.env import environment
from perflab.measure.harness import MB, base_row, failed_row, memory_peaks, output_is_finite, timing_fields
from perflab.measure.timing import estimate_step_s, plan_timing, time_step
from perflab.runtime.device import synchronize
from perflab.runtime.modes import allow_recompiles, compile_kwargs
from perflab.runtime.parallel import MULTICAST_OFF, RankFailed, ddp_wrap, fsdp_shard, largest_module_list, launch, local_tensor
from perflab.runtime.workload import build, step_context
from perflab.spec import Case, parse_parallel, validate_case
from perflab.workloads.implementations import implementation


def run_parallel_case(case: Case, gpus: list[int] | None = None, profile_dir=None, profile_steps: int = 5, single: bool = True,
                      all_reduce_sizes=None, explain: bool = False, paired=()) -> dict:
    """Measure one data-parallel case (``case.world_size`` ranks; ``gpus``: their CUDA devices) and return its row.

    ``profile_dir``: after the timing, each rank also records ``profile_steps`` steps with torch.profiler (its passes
    marked) and writes ``rank{N}.json`` there (a separate pass: the timing has no profiler in it). ``single``: time
    the one-device case on rank 0 too (scaling efficiency). ``all_reduce_sizes``: the ranks then sweep all-reduces
    of these sizes (``measure.ceilings``' sweep, in this launch: the CPU's gloo has no cached sweep), the row's
    ``all_reduce`` and floor. ``explain``: rank 0 also reports what explain's fixes read: DDP's buckets as it rebuilt
    them and the gradients' bytes in the order they became ready (``ddp_buckets``, ``ready_grad_bytes``), the
    blocks FSDP would shard (``shard_units``) and the device's copy bandwidth at the gradients' size
    (``copy_gbps``). ``paired``: other data-parallel cases of as many ranks, built in this launch beside this one
    (after its own timing, profile and memory, which are of it alone) and timed with it in interleaved blocks
    (``measure.interleave``: a seeded random order per round, the same on every rank), so a slow stretch of a
    shared host falls on both; the row's ``paired``: each one's step over the rounds (the slowest rank's block in
    each) and its ratio to this case's blocks of the same rounds, with a 95% CI (``stats.paired_ratio``);
    ``together``: this case's own blocks in that session."""
    case = validate_case(case)
    if case.device == "cuda":
        gpus = list(gpus) if gpus else list(range(case.world_size))
        if len(gpus) != case.world_size:
            raise ValueError(f"{case.world_size} ranks need {case.world_size} GPUs, got {gpus}")
    else:
        gpus = None
    if profile_dir is not None:
        Path(profile_dir).mkdir(parents=True, exist_ok=True)
        profile_dir = str(Path(profile_dir).resolve())
    try:
        sizes = [int(b) for b in all_reduce_sizes] if all_reduce_sizes else None
        launched = launch(_rank_measure, case.world_size, (case.to_dict(), single, profile_dir, profile_steps, sizes, explain,
                                                           [validate_case(c).to_dict() for c in paired]), device=case.device, gpus=gpus)
    except RankFailed as failed:
        row = failed_row(case, "oom" if failed.oom else "error", f"rank {failed.rank}: {failed.message}", {"device": case.device}, failed.detail)
        row.update(parallel=case.parallel, world_size=case.world_size, gpus=gpus)
        return row
    row = parallel_row(case, launched.results, gpus)
    row["launches"] = launched.launches
    if profile_dir is not None:
        row["rank_traces"] = [r["trace"] for r in launched.results]
    return row


def parallel_row(case: Case, ranks: list[dict], gpus: list[int] | None) -> dict:
    """The row of a data-parallel case from its ranks' results (plain data; see ``_rank_measure``)."""
    mode, options = parse_parallel(case.parallel)
    world = case.world_size
    env = dict(ranks[0]["env"], world_size=world, gpus=gpus)
    row = base_row(case, env)
    medians = [statistics.median(r["samples_ms"]) for r in ranks]
    slowest = max(range(world), key=lambda i: medians[i])
    first = ranks[0]
    items = first["items_per_step"] * world
    flops = first.get("flops_per_rank")
    timed_iters = first["timed_iters"]
    row.update(
        status="ok", parallel=case.parallel, parallel_mode=mode, parallel_options=options, world_size=world, gpus=gpus,
        backend=first["backend"], tokens=items, items_per_step=items, iters_per_sample=first["block_iters"], timed_iters=timed_iters,
        timed_s=max(r["timed_s"] for r in ranks), params=first["params"], params_m=first["params"] / 1e6,
        gflops_per_batch=(flops * world / 1e9) if flops else 0.0,
        rank_median_ms=medians, rank_samples_ms=[r["samples_ms"] for r in ranks], slowest_rank=slowest,
        rank_spread=max(medians) / min(medians) - 1.0, rank_loss=[r["loss"] for r in ranks],
    )
    timing_fields(row, ranks[slowest]["samples_ms"])
    row["step_ms"] = row["median_ms"]
    row["throughput_per_s"] = case.batch_size * world * 1000.0 / row["median_ms"]
    if flops:
        row["gflops"] = flops / case.batch_size / 1e9
        if "flops_counted" in first:  # no formula: rank 0's step under torch's counter
            row["flops_source"] = "counted"
        else:
            row["flops_source"] = "formula"
            row["flops_analytic"] = flops * world
    else:
        row.update(gflops_per_batch=None, achieved_tflops=None)
    if case.is_reference:
        from perflab.models.reference import source_info

        row["model_source"] = source_info(case.model)
    if case.family_spec.item == "token":
        row["tokens_per_s"] = row["items_per_s"]
    if first.get("beside"):
        row.update(efficiency_fields(case, [r["beside"] for r in ranks]))
    elif first.get("single"):
        row["single_gpu_ms"] = statistics.median(first["single"]["samples_ms"])
        row["single_gpu_samples_ms"] = first["single"]["samples_ms"]
        row["scaling_efficiency"] = row["single_gpu_ms"] / row["step_ms"]
        row["single_gpu_timing"] = "alone, after the ranks (its model did not fit beside theirs)"
    if first.get("together"):
        row["together"], row["paired"] = together_rows(case, [r["together"] for r in ranks])
    else:
        row["paired"] = []
    if first.get("compile"):  # rank 0's compile; a recompile while timed on any rank
        row["compile"] = dict(first["compile"], frames_compiled_while_timed=max(r["compile"]["frames_compiled_while_timed"] for r in ranks))
    row["rank_memory"] = [r["memory"] for r in ranks]
    if case.device == "cpu":
        row["threads_per_rank"] = first.get("threads")  # the host's CPUs shared out among the ranks (runtime.parallel)
    row["multicast_off"] = all(r["multicast_off"] for r in ranks)  # NVLink multicast was off in every rank's process
    if case.device == "cuda":
        row["peak_mem_alloc_mb"] = max(r["memory"]["peak_alloc_mb"] for r in ranks)
        row["peak_mem_reserved_mb"] = max(r["memory"]["peak_reserved_mb"] for r in ranks)
    row["ranks_agree"] = len({tuple(r["checksum"]) for r in ranks}) == 1 if mode == "ddp" else None
    grad_bytes, param_bytes = first["grad_bytes"], first["param_bytes"]
    for key in ("ddp_buckets", "ready_grad_bytes", "shard_units", "copy_gbps"):
        if key in first:
            row[key] = first[key]
    comm = (ddp_bytes(grad_bytes, world, options["bucket_cap_mb"], buckets=first.get("ddp_buckets")) if mode == "ddp"
            else fsdp_bytes(param_bytes, grad_bytes, world, reshard_after_forward=options["reshard"], units=first["fsdp_units"]))
    row.update(grad_bytes=grad_bytes, param_bytes=param_bytes, comm_bus_bytes=comm.bus_bytes, comm_collectives=comm.collectives,
               comm_calls=comm.calls)
    sweep = first.get("all_reduce")
    if sweep:  # the floor: bus bytes at the bus bandwidth measured for messages of this step's size
        row["all_reduce"] = sweep
        message = grad_bytes / max(comm.calls, 1) if mode == "ddp" else param_bytes / max(first["fsdp_units"], 1)  # one collective's payload
        floor = comm_floor(comm, message, sweep)
        row["busbw_gbps"] = floor.busbw_gbps
        row["comm_floor_ms"] = floor.floor_ms
        row["comm_floor_frac"] = row["comm_floor_ms"] / row["step_ms"]
    elif case.device == "cuda":
        row["comm_floor_note"] = f"no all-reduce bandwidth measured for {world} GPUs here: run perflab ceilings --gpus 0,1 first"
    checks = run_checks(requested_batch=case.batch_size, processed_batch=min(r["processed"] for r in ranks), timed_s=row["timed_s"],
                        timed_iters=timed_iters, cv=row["cv"], energy_j=None, energy_unavailable="not measured with --parallel",
                        throttle_reasons=[], other_processes=[], finite=all(r["finite"] is not False for r in ranks), min_time=case.min_time)
    checks += compile_checks(row.get("compile"))
    wide = efficiency_check(row)
    if wide is not None:
        checks.append(wide)
    if row["ranks_agree"] is False:
        checks.append(Check("ranks_disagree", "the ranks' parameters differ after the timed steps: the gradients were not reduced alike"))
    row["flags"] = [c.flag for c in checks]
    row["warnings"] = [c.message for c in checks]
    return row


def efficiency_fields(case: Case, ranks: list[dict]) -> dict:
    """The one-device case against the data-parallel step, from their interleaved blocks: rank 0's one-device blocks,
    the slowest rank's data-parallel block of each round; the efficiency the median of their ratio per round."""
    from perflab.stats import paired_ratio

    session = f"{case.id}:one-device"
    rounds = ranks[0]["dp_rounds"]
    dp = [max(r["dp_samples_ms"][b] for r in ranks) for b in range(len(rounds))]
    one = ranks[0]["one_samples_ms"]
    ratio = paired_ratio({"samples_ms": dp, "sample_rounds": rounds, "session": session},  # one-device ms ÷ data-parallel ms
                         {"samples_ms": one, "sample_rounds": ranks[0]["one_rounds"], "session": session})
    if ratio is None:  # no round held a block of each: the medians' ratio, without a CI
        ratio = {"ratio": statistics.median(one) / statistics.median(dp), "ci95": None, "pairs": 0}
    return {"single_gpu_ms": statistics.median(one), "single_gpu_samples_ms": one, "step_ms_beside_single": statistics.median(dp),
            "scaling_efficiency": ratio["ratio"], "scaling_efficiency_ci95": ratio["ci95"], "scaling_efficiency_pairs": ratio["pairs"],
            "scaling_efficiency_ci_coverage": ratio.get("coverage"), "scaling_efficiency_ci_range_of": ratio.get("range_of"),
            "single_gpu_timing": "interleaved with the ranks' step, in blocks of the same rounds",
            "beside_single": {"one_samples_ms": one, "one_rounds": ranks[0]["one_rounds"], "dp_samples_ms": dp, "dp_rounds": rounds}}


EFFICIENCY_CI_RATIO = 2.0  # a scaling-efficiency CI whose ends differ by more than this factor says little
WIDE_EFFICIENCY_FLAG = "efficiency_uncertain"


def efficiency_check(row: dict):
    """``efficiency_uncertain`` where the scaling efficiency's CI spans more than a factor ``EFFICIENCY_CI_RATIO`` (0.032–0.960
    read as 0.167, on a host whose ranks fought for its cores): the efficiency is then no figure to act on. The advice is
    more pairs (``--repeats``), not longer blocks: on two H100s gpt_large's DDP efficiency read 0.746–0.886 with 20 pairs
    of one step, 0.699–0.842 with 20 pairs of two (``--min-time 2``), and 0.777–0.810 with 80 pairs (``--repeats 80``;
    docs/performance/robustness.md): the step's noise is the host's, step to step, and longer blocks of few pairs
    average little of it."""
    ci = row.get("scaling_efficiency_ci95")
    if not ci or not ci[0] or ci[1] / ci[0] <= EFFICIENCY_CI_RATIO:
        return None
    return Check(WIDE_EFFICIENCY_FLAG, f"scaling efficiency {row['scaling_efficiency']:.3f} has a CI of {ci[0]:.3f}–{ci[1]:.3f}, a factor "
                                       f"{ci[1] / ci[0]:.1f} wide: the one-device and data-parallel blocks moved apart (a busy host, "
                                       f"too few pairs); time more pairs (--repeats, {row.get('scaling_efficiency_pairs') or 'some'} now) "
                                       "or on a quieter host before reading it")


def together_rows(case: Case, ranks: list[dict]) -> tuple[dict, list[dict]]:
    """The interleaved session's rows: this case's (``together``) and each paired case's, with its ratio to this one.

    A block's time is the slowest rank's (the ranks ran the same blocks, in the same rounds); a case's step is the
    median of its blocks; a paired case's ``ratio`` is the median over rounds of its block ÷ this case's block of
    the same round, with the 95% CI over rounds (``stats.paired_ratio``): above 1, this case is faster."""
    from perflab.stats import paired_ratio

    world = len(ranks)
    session = f"{case.id}:together"
    rows = []
    for i in range(len(ranks[0]["samples_ms"])):
        blocks = [max(r["samples_ms"][i][b] for r in ranks) for b in range(len(ranks[0]["samples_ms"][i]))]
        step = statistics.median(blocks)
        items = ranks[0]["items_per_step"][i] * world
        rows.append({"status": "ok", "median_ms": step, "rank_median_ms": [statistics.median(r["samples_ms"][i]) for r in ranks],
                     "samples_ms": blocks, "sample_rounds": list(ranks[0]["rounds"][i]), "session": session,
                     "items_per_step": items, "items_per_s": items * 1000.0 / step})
    together, paired = rows[0], rows[1:]
    for other in paired:
        ratio = paired_ratio(together, other)
        if ratio is not None:
            other.update(ratio=ratio["ratio"], ratio_ci95=ratio["ci95"], ratio_pairs=ratio["pairs"])
    return together, paired


# ---------------------------------------------------------------------------------------------------
# One rank (runs in the spawned process)


def _floor_sweep(rank: int, world_size: int, device: str, device_index, where) -> dict | None:
    """The all-reduce sweep a data-parallel row's floor reads, on rank 0 (None on the others): ``perflab ceilings
    --gpus``' cached sweep for this many ranks, or where there is none, one the ranks measure now, before building the
    model, which rank 0 caches for later cases. Rank 0 reads the cache
    once and decides for all, so every rank takes part in the measurement or none."""
    import torch.distributed as dist

    from perflab.measure.ceilings import ALL_REDUCE_SIZES, all_reduce_rank, cache_all_reduce, cached_all_reduce, sweep_result

    cached = cached_all_reduce(world_size) if rank == 0 else None
    need = torch.tensor([int(rank == 0 and cached is None)], dtype=torch.int64, device=where)
    dist.all_reduce(need, op=dist.ReduceOp.MAX)
    if not int(need.item()):
        return dict(cached, source="perflab ceilings' cache") if rank == 0 else None
    times = all_reduce_rank(rank, world_size, device_index, list(ALL_REDUCE_SIZES), iters=10, warmup=2)
    _free(device)
    if rank != 0:
        return None
    sweep = dict(sweep_result(list(ALL_REDUCE_SIZES), times, world_size, None, device), source="measured in this run (no cached sweep), and cached")
    try:
        cache_all_reduce(world_size, sweep)
    except OSError as exc:  # an unwritable cache directory: this row keeps its floor, the next case measures again
        sweep["source"] = f"measured in this run (no cached sweep; not cached: {exc.strerror or exc})"
    return sweep


def _rank_measure(rank: int, world_size: int, device_index: int | None, case_dict: dict, single: bool, profile_dir, profile_steps: int,
                  all_reduce_sizes=None, explain: bool = False, paired=()) -> dict:
    import torch.distributed as dist

    case = Case.from_dict(case_dict)
    mode, options = parse_parallel(case.parallel)
    device = case.device
    where = torch.device("cuda", device_index) if device == "cuda" else torch.device("cpu")
    floor_sweep = _floor_sweep(rank, world_size, device, device_index, where) if device == "cuda" and not all_reduce_sizes else None
    built, plain, params, layout = _built_on_rank(case, rank, device, device_index)
    param_bytes = sum(p.numel() * p.element_size() for p in params)  # numel of a DTensor is the whole parameter's
    grad_sizes = [p.numel() * p.element_size() for p in params if p.requires_grad]  # in the dtype the gradients have: the parameters'
    grad_bytes = sum(grad_sizes)
    accumulate = options.get("no_sync", 1)
    result = {"rank": rank, "backend": dist.get_backend(), "param_bytes": param_bytes, "grad_bytes": grad_bytes, "fsdp_units": layout["fsdp_units"],
              "multicast_off": all(os.environ.get(k) == v for k, v in MULTICAST_OFF.items()), "threads": torch.get_num_threads()}
    analytic = implementation(plain).analytic(plain)
    with step_context(plain, built):
        step = _step(built, case.mode, accumulate)
        result.update(_time(case, built, step, device, where, rank))
        result["checksum"] = _checksum(built.model) if mode == "ddp" else None
        if not analytic.get("flops_analytic"):
            # a model without a formula (your own): one more step on every rank (they all take part in its collectives),
            # eager whatever the mode (a compiled step runs no aten ops to count; the one-GPU harness counts so too),
            # under torch's FLOP counter, after the timing and the checksum
            from perflab.measure.flops import count_flops

            result["flops_counted"] = count_flops(step if case.mode == "eager" else _step(built, "eager", accumulate))
        if profile_dir is not None:
            result["trace"] = _profile(step, built, device, Path(profile_dir) / f"rank{rank}.json", profile_steps)
        if explain and rank == 0:
            result["shard_units"] = layout["shard_units"]
            if mode == "ddp":
                result.update(ddp_layout(built.model, grad_sizes))
    if all_reduce_sizes:  # every rank takes part; rank 0 keeps the slowest rank's times
        from perflab.measure.ceilings import all_reduce_rank, sweep_result

        synchronize(device)
        times = all_reduce_rank(rank, world_size, device_index, all_reduce_sizes, iters=10, warmup=2)
        if rank == 0:
            result["all_reduce"] = dict(sweep_result(all_reduce_sizes, times, world_size, None, device), source="measured in this run")
    result["items_per_step"] = built.items_per_step * accumulate
    result["params"] = sum(p.numel() for p in params)
    result["flops_per_rank"] = analytic["flops_analytic"] * accumulate if analytic.get("flops_analytic") else result.get("flops_counted")
    if rank == 0:
        result["env"] = environment(device)
        if device == "cuda" and "all_reduce" not in result:
            result["all_reduce"] = floor_sweep
    if paired:
        result["together"] = _time_together(case, plain, built, step, [Case.from_dict(other) for other in paired], rank, device,
                                            device_index, where)
    if single:
        peak = result["memory"].get("peak_alloc_mb")
        result["beside"] = _time_beside_one_device(case, plain, built, step, accumulate, rank, device, where,
                                                   need_bytes=int(peak * 2**20) if peak else 0)
    del built, step, params
    _free(device)
    if explain and rank == 0:
        from perflab.measure.ceilings import copy_gbps

        result["copy_gbps"] = copy_gbps(min(grad_bytes, 256 * MB), device=where)
    dist.barrier()
    if rank == 0 and single and result["beside"] is None:
        built = build(plain)
        with step_context(plain, built):
            one = _step(built, case.mode, accumulate)
            result["single"] = _time(plain, built, one, device, where, rank=0, collective=False)
        result["single"] = {"samples_ms": result["single"]["samples_ms"]}
    return result


def _built_on_rank(case: Case, rank: int, device: str, device_index: int | None):
    """The case's model on this rank with its own inputs, sharded (FSDP) or wrapped (DDP); its parameters (before DDP
    wraps them), and the units FSDP made (``fsdp_units``) or would make (``shard_units``: each block, and the root)."""
    mode, options = parse_parallel(case.parallel)
    plain = replace(case, parallel=None, world_size=1)
    built = build(plain, **({"shard": fsdp_shard(options["reshard"])} if mode == "fsdp" else {}))
    _own_inputs(built, case, rank)
    params = list(built.model.parameters())
    blocks = largest_module_list(built.model)
    layout = {"fsdp_units": sum(1 for m in built.model.modules() if type(m).__name__.startswith("FSDP")) if mode == "fsdp" else 1,
              "shard_units": (len(blocks) if blocks is not None else 0) + 1}
    if mode == "ddp":
        built.model = ddp_wrap(built.model, case.device, device_index, options["bucket_cap_mb"], options["grad_view"])
    return built, plain, params, layout


def _time_beside_one_device(case: Case, plain: Case, built, step, accumulate: int, rank: int, device: str, where: torch.device,
                            need_bytes: int = 0) -> dict | None:
    """The data-parallel step (``built``, warm) and the same case on rank 0's device alone, built there beside it, timed
    in interleaved blocks: per round each times one block, in a seeded random order every rank draws alike; all ranks
    meet at a barrier before each block, and while rank 0 times a one-device block the others wait at the next one.
    Every rank returns its data-parallel blocks and their rounds, rank 0 its one-device blocks too; None on every rank
    where the one-device model would not fit on rank 0 (then it is timed alone, after the ranks' model is freed): less
    free device memory than ``need_bytes`` (the rank's own peak, about what the one-device step holds: a model of the
    same size, its gradients, optimizer state and activations) plus a tenth, or an OOM while building and warming it."""
    import torch.distributed as dist

    from perflab.measure.timing import TimingPlan

    one = one_step = None
    fits = 1
    if rank == 0 and device == "cuda" and _free_bytes(where) < 1.1 * need_bytes:
        fits = 0
    elif rank == 0:
        try:
            one = build(plain)
            with step_context(plain, one):
                one_step = _step(one, case.mode, accumulate)
                for _ in range(case.warmup + 1):
                    one_step()
            synchronize(device)
        except torch.OutOfMemoryError:
            one = one_step = None
            fits = 0
            _free(device)
    flag = torch.tensor([fits], dtype=torch.int64, device=where)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    if not int(flag.item()):
        return None
    estimates = [_estimate(plain, built, step, device), _estimate(plain, one, one_step, device) if rank == 0 else 0.0]
    schedule = _interleaved_schedule(case, estimates, where, seed=case.seed + 1)
    out = {"dp_samples_ms": [], "dp_rounds": [], "one_samples_ms": [], "one_rounds": []}
    gc.collect()
    for r, this_round in enumerate(schedule):
        for i, n in this_round:
            dist.barrier()
            if i == 0:
                with step_context(plain, built):
                    out["dp_samples_ms"].append(float(time_step(step, TimingPlan(1, n), device).samples_ms[0]))
                out["dp_rounds"].append(r)
            elif rank == 0:
                with step_context(plain, one):
                    out["one_samples_ms"].append(float(time_step(one_step, TimingPlan(1, n), device).samples_ms[0]))
                out["one_rounds"].append(r)
    dist.barrier()
    del one, one_step
    return out


def _estimate(plain: Case, built, step, device: str) -> float:
    """Seconds per step of a warm ``step``, in its own grad mode and precision."""
    with step_context(plain, built):
        return estimate_step_s(step, device)


def _slowest(seconds: list[float], where: torch.device) -> list[float]:
    """Each value's maximum over the ranks: one timing plan for all (every rank must run the same collectives)."""
    import torch.distributed as dist

    values = torch.tensor(seconds, dtype=torch.float64, device=where)
    dist.all_reduce(values, op=dist.ReduceOp.MAX)
    return values.tolist()


def _interleaved_schedule(case: Case, estimates: list[float], where: torch.device, seed: int) -> list[list[tuple[int, int]]]:
    """Per round, the (member, steps) blocks of members timed together: each member's plan from the slowest rank's
    estimate (``estimates``: this rank's seconds per step of each, 0 for one it does not run), in a seeded random order
    that every rank draws alike, a member with fewer blocks spread over the rounds (``measure.interleave``)."""
    from perflab.measure.interleave import block_schedule, interleaved_order

    plans = [plan_timing(s, case.repeats, case.min_time, MIN_TIMED_ITERS, case.iters) for s in _slowest(estimates, where)]
    order = interleaved_order([0] * len(plans), max(p.n_blocks for p in plans), seed=seed)
    return block_schedule(order, [p.n_blocks for p in plans], [p.block_sizes for p in plans])


def _free_bytes(where: torch.device) -> int:
    """What a new model could take on this device: the driver's free memory and the allocator's cached, unused blocks."""
    return torch.cuda.mem_get_info(where)[0] + torch.cuda.memory_reserved(where) - torch.cuda.memory_allocated(where)


def _time_together(case: Case, plain: Case, built, step, others: list[Case], rank: int, device: str, device_index: int | None,
                   where: torch.device) -> dict:
    """``case`` (built, warm) and ``others`` (built here, beside it) timed in interleaved blocks: per round each times
    one block, in a seeded random order that every rank draws alike (every rank must run the same collectives in the
    same order). The plans are each case's own (``plan_timing`` on the slowest rank's estimate), spread over the
    rounds of the longest. Per case: its blocks' ms per step and their rounds, and its items per step."""
    import torch.distributed as dist

    from perflab.measure.interleave import time_interleaved

    members = [(plain, built, step, parse_parallel(case.parallel)[1].get("no_sync", 1))]
    for other in others:
        other_built, other_plain, _, _ = _built_on_rank(other, rank, device, device_index)
        accumulate = parse_parallel(other.parallel)[1].get("no_sync", 1)
        with step_context(other_plain, other_built):
            other_step = _step(other_built, other.mode, accumulate)
            for _ in range(other.warmup + 1):
                other_step()
        members.append((other_plain, other_built, other_step, accumulate))
    schedule = _interleaved_schedule(case, [_estimate(m[0], m[1], m[2], device) for m in members], where, seed=case.seed)
    gc.collect()
    dist.barrier()
    session = time_interleaved([m[2] for m in members], schedule, enter=lambda i: step_context(members[i][0], members[i][1]), device=device)
    out = {"samples_ms": [[b.ms_per_step for b in blocks] for blocks in session.blocks],
           "rounds": [[b.round for b in blocks] for blocks in session.blocks],
           "items_per_step": [m[1].items_per_step * m[3] for m in members]}
    del members
    return out


def _free(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def _own_inputs(built, case: Case, rank: int) -> None:
    """Rank 0 keeps the one-device case's batch; every other rank draws its own (in place: the step holds the tensors)."""
    if rank == 0:
        return
    generator = torch.Generator().manual_seed(case.seed * 1_000_003 + rank)
    for key in ("inputs", "targets"):
        tensor = built.extra[key]
        tensor.copy_(torch.randint(0, built.extra["vocab_size"], tuple(tensor.shape), generator=generator))


def _step(built, mode: str, accumulate: int):
    """The step in ``mode`` (eager, or compile of the wrapped model); with ``accumulate`` > 1, the micro-batches before
    the last run their backward under DDP's no_sync (no all-reduce), the last one reduces and steps the optimizer
    (on one device, the same micro-batches, so the single-device time is of the same work)."""
    model = built.model
    if mode == "compile":
        allow_recompiles()
        model = torch.compile(built.model, dynamic=False, **compile_kwargs(""))
    full = built.make_step(model)
    if accumulate == 1:
        return full
    micro = built.make_step(model, micro=True)

    no_sync = getattr(built.model, "no_sync", contextlib.nullcontext)  # one device: plain accumulation, the same work

    def step():
        for _ in range(accumulate - 1):
            with no_sync():
                micro()
        return full()

    return step


def _time(case: Case, built, step, device: str, where: torch.device, rank: int, collective: bool = True) -> dict:
    import torch.distributed as dist

    compiled = case.mode == "compile"
    if compiled:
        from perflab.runtime.modes import compile_counters, compile_stats

        before = compile_counters()
    out = step()
    for _ in range(case.warmup):
        out = step()
    synchronize(device)
    warm = compile_counters() if compiled else None
    processed = built.batch_of(out)
    finite = output_is_finite(out)
    loss = float(out[0].detach()) if isinstance(out, tuple) and torch.is_tensor(out[0]) else None
    del out
    step_s = estimate_step_s(step, device)
    if collective:  # one plan for all ranks: the slowest rank's estimate
        (step_s,) = _slowest([step_s], where)
    plan = plan_timing(step_s, case.repeats, case.min_time, MIN_TIMED_ITERS, case.iters)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    gc.collect()
    if collective:
        dist.barrier()
    timing = time_step(step, plan, device)
    peak = memory_peaks(device)
    result = {"samples_ms": [float(v) for v in timing.samples_ms], "timed_s": timing.timed_s, "block_iters": plan.block_iters,
              "timed_iters": plan.total_iters, "processed": processed, "finite": finite, "loss": loss,
              "memory": rank_memory(built, peak["alloc"], peak["reserved"])}
    if compiled:  # what compiling did in the first call and the warm-up, and any frame compiled again while timed
        result["compile"] = dict(compile_stats(before, warm), frames_compiled_while_timed=compile_stats(warm, compile_counters())["frames"])
    return result


def rank_memory(built, peak_alloc: int | None, peak_reserved: int | None) -> dict:
    """This rank's peak and its split (MiB): its own parameters, gradients and optimizer state (local shards under FSDP)."""
    model = built.model.module if hasattr(built.model, "no_sync") and hasattr(built.model, "module") else built.model
    params = sum(local_tensor(p).numel() * p.element_size() for p in model.parameters())
    grads = sum(local_tensor(p).numel() * p.element_size() for p in model.parameters() if p.requires_grad) if built.has_backward else 0
    optimizer = 0
    if built.optimizer is not None:
        for state in built.optimizer.state.values():
            optimizer += sum(local_tensor(t).numel() * t.element_size() for t in state.values() if torch.is_tensor(t) and t.dim() > 0)
    out = {"params_mb": params / MB, "grads_mb": grads / MB, "optimizer_mb": optimizer / MB,
           "peak_alloc_mb": peak_alloc / MB if peak_alloc is not None else None,
           "peak_reserved_mb": peak_reserved / MB if peak_reserved is not None else None}
    out["rest_mb"] = (peak_alloc - params - grads - optimizer) / MB if peak_alloc is not None else None
    return out


def _checksum(model) -> list[float]:
    """Sum and sum of absolute values of every parameter, float64: equal on all ranks iff (almost surely) the parameters are."""
    total = torch.zeros((), dtype=torch.float64)
    absolute = torch.zeros((), dtype=torch.float64)
    with torch.no_grad():
        for p in model.parameters():
            t = local_tensor(p).detach().double()
            total += t.sum().cpu()
            absolute += t.abs().sum().cpu()
    return [float(total), float(absolute)]


def _profile(step, built, device: str, path: Path, steps: int) -> str:
    """``steps`` steps under perflab's tracer (CPU ops, and CUDA kernels on a GPU) after one thrown away, each in its
    ``ProfilerStep#n`` window, their passes marked (forward, backward, optimizer ranges), written as this rank's
    Kineto trace."""
    from perflab.trace.capture import Tracer

    tracer = Tracer(path, device, steps=steps, warmup=1, record_shapes=False)
    synchronize(device)
    built.set_annotate(model_ranges=False, passes=True)
    try:
        tracer.start()
        for _ in range(tracer.warmup + steps):
            step()
            synchronize(device)
            tracer.step()
    finally:
        tracer.stop()
        built.set_annotate(model_ranges=False, passes=False)
    return str(path)


def ddp_layout(model, grad_sizes: list[int]) -> dict:
    """DDP's buckets as it rebuilt them after the first steps (bytes, in the order they are reduced), and the gradients'
    bytes in the order they became ready (the rebuilt buckets' parameter order); {} where this DDP does not say."""
    try:
        data = model._get_ddp_logging_data()
        buckets = [int(b) for b in str(data["rebuilt_bucket_sizes"]).split(",") if b.strip()]
        order = [int(i) for part in str(data["rebuilt_per_bucket_param_indices"]).split(",") for i in part.split()]
    except (AttributeError, KeyError, ValueError):
        return {}
    if not buckets or sorted(order) != list(range(len(grad_sizes))):
        return {}
    return {"ddp_buckets": buckets, "ready_grad_bytes": [grad_sizes[i] for i in order]}




# FSDP1's sharding strategies that free the gathered parameters after the forward (so the backward gathers them again)
RESHARDS_AFTER_FORWARD = {"FULL_SHARD": True, "HYBRID_SHARD": True, "SHARD_GRAD_OP": False, "_HYBRID_SHARD_ZERO2": False}


def _outermost(found: list) -> list:
    """The modules of ``found`` that no other of them holds (the outermost FSDP wrappers)."""
    inner = {id(sub) for m in found for sub in list(m.modules())[1:]}
    return [m for m in found if id(m) not in inner]


def fsdp_layout(fsdp2: list, fsdp1: list) -> dict | None:
    """The FSDP layout of the first outermost FSDP module among ``fsdp2`` (``fully_shard``'s ``FSDPModule``s), else
    among ``fsdp1`` (``FullyShardedDataParallel`` instances), as explain's FSDP rows have it: the parameters' and
    gradients' bytes (whole, in their dtype: a DTensor's numel is the whole parameter's), the units that hold
    parameters (each one all-gather per gather and one reduce-scatter a step) and each one's bytes, whether the units
    reshard after the forward (then the backward gathers again: the step's all-gathers are twice the parameters, as
    explain's ``analysis.comm.fsdp_bytes`` counts them, a root's own parameters too, which FSDP keeps gathered) and the
    sharding strategy; for FSDP1 each unit's flat parameter padded to the world size, as its all-gather moves it.
    None without one."""
    roots2, roots1 = _outermost(fsdp2), _outermost(fsdp1)
    roots = roots2 or roots1
    if not roots:
        return None
    root = roots[0]
    info: dict = {"modules": len(roots)}
    if roots2:
        ids = {id(m) for m in fsdp2}
        groups = [g for g in (getattr(m._get_fsdp_state(), "_fsdp_param_group", None) for m in root.modules() if id(m) in ids) if g is not None]
        units = [sum(fp.sharded_param.numel() * fp.sharded_param.element_size() for fp in g.fsdp_params) for g in groups]
        # after its first forward each group says whether it reshards (FSDP2 leaves the root's gathered by default)
        reshard = any(g.post_forward_mesh_info is not None for g in groups)
        params = list(root.parameters())
        info.update(api="fully_shard", sharding_strategy="FULL_SHARD" if reshard else "SHARD_GRAD_OP",
                    world_size=groups[0].mesh_info.shard_mesh_size if groups else None,
                    param_bytes=int(sum(p.numel() * p.element_size() for p in params)),
                    grad_bytes=int(sum(p.numel() * p.element_size() for p in params if p.requires_grad)))
    else:
        ids = {id(m) for m in fsdp1}
        wrappers = [m for m in root.modules() if id(m) in ids and getattr(m, "_handle", None) is not None]
        flat = [m._handle.flat_param for m in wrappers]
        strategy = root.sharding_strategy.name
        # FSDP1 keeps the root's flat parameter gathered after the forward (the backward starts with it): only the
        # units inside it are gathered again
        reshard = RESHARDS_AFTER_FORWARD.get(strategy, False) and any(m is not root for m in wrappers)
        units = [f._unpadded_unsharded_size.numel() * f.element_size() for f in flat]
        info.update(api="FullyShardedDataParallel", sharding_strategy=strategy, world_size=root.world_size, param_bytes=int(sum(units)),
                    grad_bytes=int(sum(u for u, f in zip(units, flat) if f.requires_grad)),
                    flat_param_bytes=[int(f._padded_unsharded_size.numel() * f.element_size()) for f in flat])
    gathers = 2 if reshard else 1
    info.update(units=len(units), unit_param_bytes=[int(u) for u in units], reshard_after_forward=reshard,
                all_gather_bytes=gathers * info["param_bytes"], reduce_scatter_bytes=info["grad_bytes"])
    return info
