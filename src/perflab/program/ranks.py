"""Several ranks' traces at the program floor, gathered under torchrun; ``analysis/ranks.py`` merges and accounts them.

``perflab run`` under torchrun: every rank records its own steps; rank 0 merges the ranks' traces and reports the
communication as ``perflab explain --parallel`` does.

At the end of the traced steps every rank, at the same step boundary:

1. finds the program's ``DistributedDataParallel`` modules (through the garbage collector): the gradients' bytes and
   DDP's buckets as it rebuilt them; without one, its FSDP modules (FSDP2's ``fully_shard``, FSDP1's
   ``FullyShardedDataParallel``): the sharding strategy, the units and the parameters' bytes they all-gather and
   reduce-scatter (``fsdp``, set only for such a program);
2. takes the all-reduce bus bandwidth: this GPU's cached sweep for the world size (``perflab ceilings --gpus``), or
   one swept now on the program's own default process group (every rank is at the same boundary, so the collectives
   line up; on the GPU up to 256 MiB, on the CPU gloo's small sizes), kept in the cache for the next run;
3. writes its report (``OUT/rankR/rank.json``: built whole, 1. and 2. among it); rank 0 waits for every rank's (up to ``WAIT_S``), merges the traces
   (``diagnosis.profiling.account_rank_traces``: per rank its communication, exposed communication split into waiting for a
   later rank and transfer, overlap) and adds the communication section and the slowest rank.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from pathlib import Path

from perflab.program.guard import say
from perflab.program.recorder import Rank, RunOptions, instances_alive, rank_dir
from perflab.records.run_report import ABSENT, RANK_FILE, RunReport, RunView, read, save

WAIT_S = 300.0
GPU_SWEEP_SIZES = tuple(2**k for k in range(20, 29, 2))  # 1 MiB .. 256 MiB: beside a model already in memory
CPU_SWEEP_SIZES = (4096, 16384, 262144, 1 << 20)


def ddp_info() -> dict | None:
    """The first DistributedDataParallel module alive: its gradients' bytes (parameters that require grad, in their
    dtype), bucket cap and DDP's rebuilt buckets; None when the program wraps nothing in DDP."""
    from torch.nn.parallel import DistributedDataParallel

    from perflab.measure.parallel import ddp_layout

    with warnings.catch_warnings():  # isinstance on a deprecated alias (torch.distributed.reduce_op) warns
        warnings.simplefilter("ignore")
        found = instances_alive(DistributedDataParallel)
    if not found:
        return None
    ddp = found[0]
    grads = [p.numel() * p.element_size() for p in ddp.module.parameters() if p.requires_grad]
    info = {"modules": len(found), "grad_bytes": int(sum(grads)), "param_bytes": int(sum(p.numel() * p.element_size() for p in ddp.module.parameters())),
            "bucket_cap_mb": getattr(ddp, "bucket_bytes_cap", 25 * 2**20) / 2**20, "gradient_as_bucket_view": bool(getattr(ddp, "gradient_as_bucket_view", False))}
    info.update(ddp_layout(ddp, grads))
    return info


def fsdp_info() -> dict | None:
    """The first outermost FSDP module alive, FSDP2 (``fully_shard``) or FSDP1 (``FullyShardedDataParallel``): its
    layout (``measure.parallel.fsdp_layout``: sharding strategy, units, the parameters' and gradients' bytes, the
    all-gathers' and reduce-scatters' bytes a step); None when the program shards nothing with FSDP."""
    from perflab.measure.parallel import fsdp_layout

    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch before FSDP2
        FSDPModule = None
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:
        FullyShardedDataParallel = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fsdp2 = instances_alive(FSDPModule) if FSDPModule is not None else []
        fsdp1 = instances_alive(FullyShardedDataParallel) if FullyShardedDataParallel is not None else []
    return fsdp_layout(fsdp2, fsdp1)


def all_reduce_bandwidth(device: str, world: int) -> dict | None:
    """The all-reduce sweep for these ranks: cached, or swept now on the default group; None without a process group."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    from perflab.measure import ceilings

    cached = ceilings.cached_all_reduce(world) if device == "cuda" else None
    need = torch.tensor([0 if cached else 1], device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(need, op=dist.ReduceOp.MAX)  # every rank sweeps, or none does
    if not int(need.item()):
        return dict(cached, source=f"perflab ceilings' all-reduce sweep of {world} GPUs, cached in {ceilings.cache_path()}")
    sizes = GPU_SWEEP_SIZES if device == "cuda" else CPU_SWEEP_SIZES
    index = torch.cuda.current_device() if device == "cuda" else None
    times = ceilings.all_reduce_rank(dist.get_rank(), world, index, list(sizes), iters=10, warmup=3)
    sweep = ceilings.sweep_result(sizes, times, world, None, device)
    if device == "cuda" and dist.get_rank() == 0:
        ceilings.cache_all_reduce(world, sweep)
    where = "the program's NCCL process group" if device == "cuda" else "gloo on the program's process group"
    return dict(sweep, source=f"all-reduces of {_sizes(sizes)} swept by the {world} ranks on {where}, after the traced steps")


def _sizes(sizes) -> str:
    return ", ".join(f"{s / 2**20:g} MiB" if s >= 2**20 else f"{s / 1024:g} KiB" for s in sizes)


def rank_fields(world: int, device: str | None = None) -> dict:
    """This rank's fields of its report, at the end of its traced steps (every rank at the same boundary): its DDP
    layout (``ddp``) and the all-reduce sweep (``all_reduce``), null where there is none, and without DDP its FSDP
    layout (``fsdp``, only where there is one); where they cannot be taken,
    ``communication_note`` says why (the communication section is lost, the rest of the report is not). The builder
    (``program.report.build_run_report``) sets them."""
    fields: dict = {}
    try:
        fields["ddp"] = ddp_info()
        fsdp = fsdp_info() if fields["ddp"] is None else None
        if fsdp is not None:  # set only where there is one: a DDP program's report keeps its fields
            fields["fsdp"] = fsdp
        fields["all_reduce"] = all_reduce_bandwidth(device or _device(), world)
    except Exception as exc:
        fields["communication_note"] = f"no all-reduce floor: {type(exc).__name__}: {exc}"
    return fields


def _device() -> str:
    """The device this rank's steps ran on, by the rule the recorder's clock follows (``Recorder._choose_clock``): CUDA
    where the program has started it, else the CPU (gloo)."""
    import torch

    return "cuda" if torch.cuda.is_available() and torch.cuda.is_initialized() else "cpu"


def gather(report: RunReport, options: RunOptions, rank: Rank, ended_early: bool) -> None:
    """This rank's report (built whole, ``rank_fields`` among it) written; on rank 0 the ranks' reports, as written
    (its own among them), merged into it (after the traced steps): the merge needs every rank's report saved, rank 0's
    own too, so it is a second step after the builder's."""
    out = Path(options.out_dir)
    save(report, rank_dir(out, rank) / RANK_FILE)
    if rank.rank != 0 or ended_early:
        return
    ended: set[int] = set()
    reports = _wait_for_ranks(out, rank.world_size, report.get("run_id"), ended)
    merged = merge(reports, rank.world_size, ended)
    for name, value in merged.items():
        setattr(report, name, value)


def _wait_for_ranks(out: Path, world: int, run_id: str | None = None, ended: set[int] | None = None) -> dict[int, RunReport]:
    """Every rank's report of this run (``run_id``: a rank.json an earlier run left in the same OUT is not this run's,
    and is waited past), up to ``WAIT_S``; not past a rank whose process has ended without it (its ``rank.pid`` names
    a process of this run that no longer runs: it exited before its traced steps' end), which goes into ``ended``."""
    deadline = time.monotonic() + WAIT_S
    found: dict[int, RunReport] = {}
    ended = ended if ended is not None else set()
    while True:
        for r in range(world):
            if r in found or r in ended:
                continue
            folder = rank_dir(out, Rank(r, world))
            gone = _rank_ended(folder, run_id)  # before the report is read: a rank that wrote it and then ended is found
            report = _rank_report(folder / RANK_FILE, run_id)
            if report is not None:
                found[r] = report
            elif gone:
                ended.add(r)
        if len(found) + len(ended) == world or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def _rank_report(path: Path, run_id: str | None) -> RunReport | None:
    """A rank's whole report of this run, or None: none yet, one being written, an earlier run's, or the timed steps a
    rank keeps while its traced steps run (partial, with no end of the program in it)."""
    if not path.exists():
        return None
    report = read(path)
    if report is None or (run_id is not None and report.run_id != run_id) or (report.partial and report.exit_code is ABSENT):
        return None
    return report


PID_FILE = "rank.pid"  # a rank's process and run, written as its recording starts (``write_rank_pid``)


def write_rank_pid(folder: Path, run_id: str) -> None:
    """This rank's process id and run id, so that rank 0 does not wait for the report of a rank that has ended."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / PID_FILE).write_text(json.dumps({"pid": os.getpid(), "run_id": run_id}))


def _rank_ended(folder: Path, run_id: str | None) -> bool:
    """The rank's process (its ``rank.pid``, of this run) no longer runs: gone, or a zombie its launcher has not reaped."""
    try:
        data = json.loads((folder / PID_FILE).read_text())
        pid = int(data["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if run_id is not None and data.get("run_id") != run_id:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, another user's
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def _rank_loop(report: RunReport) -> dict:
    """A rank's whole loop, for the ranks' table: its mean step and its exposed wait for input a step (``analysis.loop``)."""
    loop = RunView.of(report).loop
    return {"mean_ms": loop.mean_ms, "input_exposed_ms": loop.input.exposed_ms_per_step, "input_share": loop.input.exposed_share}


def merge(reports: dict[int, RunReport], world: int, ended: set[int] | frozenset = frozenset()) -> dict:
    """The ranks' reports merged, as rank 0's report's fields: each rank's step and flags, the slowest rank, and from
    their traces the communication section (DDP's all-reduces or FSDP's all-gathers and reduce-scatters against
    their floor; and rank 0's verdict held against the most exposed communication).
    ``reports``: rank → its report as written, rank 0's own among them (it is written before the others are read)."""
    from perflab.analysis.comm import communication_section
    from perflab.analysis.program import input_straggler
    from perflab.diagnosis.profiling import account_rank_traces

    own = reports[0]
    missing = sorted(set(range(world)) - set(reports))
    views = {r: RunView.of(rep) for r, rep in reports.items()}
    medians = {r: view.timing.median_ms for r, view in views.items()}
    merged: dict = {"ranks": [{"rank": r, "median_ms": medians[r], "ci_ms": views[r].timing.ci95_ms, "ci_coverage": views[r].timing.ci_coverage,
                               "ci95_ms": views[r].timing.ci95_ms, "steps_seen": views[r].recorded.steps_seen,
                               "flags": [f.flag for f in views[r].flags], **_rank_loop(reports[r])}
                              for r in sorted(reports)]}
    known = {r: m for r, m in medians.items() if m}
    slowest = max(known, key=known.get) if known else None
    step_ms = known[slowest] if known else None
    merged.update(slowest_rank=slowest, step_ms=step_ms)
    if missing:
        merged["ranks_missing"] = missing
        gone, late = [r for r in missing if r in ended], [r for r in missing if r not in ended]
        if gone:
            say(f"perflab: rank(s) {gone} ended (the process exited) before the report of the traced steps; merging the "
                f"{len(reports)} that wrote one")
        if late:
            say(f"perflab: rank(s) {late} wrote no report within {WAIT_S:.0f} s; merging the {len(reports)} that did")
    paths = [views[r].recorded.trace_path for r in sorted(reports)]
    steps = views[0].traced.steps or 1
    if not (all(paths) and len(paths) == world):
        merged["communication_note"] = "not every rank wrote a trace: no merged accounting"
        return merged
    accounts = account_rank_traces(paths, own.device or "cpu", steps)
    ddp, fsdp = own.section("ddp"), own.section("fsdp")
    if not ddp and fsdp:
        comm = fsdp_communication(fsdp, world, own.get("all_reduce"), accounts, steps, known, step_ms)
    else:
        comm = communication_section(mode="ddp" if ddp else None, world_size=world, grad_bytes=ddp.get("grad_bytes"),
                                     param_bytes=ddp.get("param_bytes"), sweep=own.get("all_reduce"), accounts=accounts.get("accounts") or [],
                                     steps=accounts.get("steps") or steps, rank_step_ms=known, step_ms=step_ms, note=accounts.get("note"),
                                     bucket_cap_mb=ddp.get("bucket_cap_mb"), buckets=ddp.get("ddp_buckets"))
    merged["communication"] = comm
    straggler = input_straggler(merged["ranks"], comm["ranks"])
    if straggler is not None:  # one rank's input holds every rank back: said before what the step does
        merged["verdict"] = straggler
        return merged
    evidence = own.get("verdict_evidence")
    if evidence and comm["ranks"]:
        from perflab.analysis.program import INFLATION_LIMIT, rank_inflation, step_verdict

        most = max(comm["ranks"], key=lambda r: r["exposed_ms"] / r["traced_step_ms"] if r["traced_step_ms"] else 0.0)
        # a peer's inflated traced steps make this rank wait as its own do: the most inflated rank speaks for all, by
        # the figures the communication table prints beside the verdict (as the scaling table judges the ranks)
        inflations = [x for x in map(rank_inflation, comm["ranks"]) if x is not None]
        limit = views[0].traced.inflation_limit or INFLATION_LIMIT
        if inflations:
            evidence = dict(evidence, inflated=bool(evidence.get("inflated") or max(inflations) > limit), inflation=max(inflations))
        evidence = dict(evidence, step_ms=step_ms or evidence.get("step_ms"))
        merged["verdict"] = step_verdict(evidence, own.get("floors"), own.get("utilisation"), exposed_comm_ms=most["exposed_ms"],
                                         traced_step_ms=most["traced_step_ms"], waiting_ms=most.get("waiting_ms"))
    return merged


def fsdp_communication(fsdp: dict, world: int, sweep: dict | None, accounts: dict, steps: int, rank_step_ms: dict, step_ms: float | None) -> dict:
    """The communication section of an FSDP program (``analysis.comm.communication_section``, explain's FSDP floor):
    the parameters' all-gathers (twice a step where the units reshard after the forward) and the gradients'
    reduce-scatters, (N−1)/N of each on the bus, one call per unit each. FSDP1's NO_SHARD all-reduces the gradients
    as DDP does: its measured communication is given without a floor."""
    from perflab.analysis.comm import communication_section

    common = dict(world_size=world, grad_bytes=fsdp.get("grad_bytes"), param_bytes=fsdp.get("param_bytes"), sweep=sweep,
                  accounts=accounts.get("accounts") or [], steps=accounts.get("steps") or steps, rank_step_ms=rank_step_ms, step_ms=step_ms,
                  note=accounts.get("note"))
    if fsdp.get("sharding_strategy") == "NO_SHARD" or not fsdp.get("units"):
        section = communication_section(mode=None, **common)
        section["floor_note"] = (f"FSDP ({fsdp.get('sharding_strategy')}, {fsdp.get('units') or 0} unit(s) holding parameters): no all-gather "
                                 "or reduce-scatter floor for it; the measured communication without a floor")
        return section
    return communication_section(mode="fsdp", fsdp_units=fsdp["units"], reshard=bool(fsdp.get("reshard_after_forward")), **common)
