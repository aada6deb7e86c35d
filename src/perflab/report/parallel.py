"""Data parallelism at the report floor, the rows shown; ``runtime/parallel.py`` starts the ranks, ``measure/parallel.py`` times them.

Data-parallel rows and rank accounts: one row builder per table, rendered to the console and to markdown.

Scaling efficiency is weak scaling: the batch per GPU is fixed, so one GPU's step ÷ the ranks' step is 1.0 when the
ranks' step takes as long as one GPU's step of the same per-GPU batch (measured in the same run on rank 0's GPU, in
blocks interleaved with the ranks' step: the median ratio of blocks of the same round, with its 95% CI).
"""

from __future__ import annotations

from rich.table import Table

from perflab import units
from perflab.report.fit import plain_table
from perflab.report.md import FAILED, md_table, num, ok, with_ci

MB = 2**20


def scaling_rows(rows: list[dict]) -> list[dict]:
    """One entry per data-parallel row: its step against one GPU, its ranks, its communication."""
    out = []
    for row in rows:
        case = row.get("case") or {}
        if not case.get("parallel"):
            continue
        measured = ok(row)
        memory = row.get("rank_memory") or []
        out.append({
            "model": row.get("model"), "seq_len": case.get("seq_len"), "dtype": case.get("dtype"), "mode": case.get("mode"),
            "parallel": case.get("parallel"), "world_size": case.get("world_size"), "status": row.get("status"),
            "step_ms": row.get("step_ms") if measured else None, "ci_ms": row.get("ci95_ms") if measured else None,
            "ci_coverage": row.get("ci_coverage") if measured else None, "ci95_ms": row.get("ci95_ms") if measured else None,
            "single_gpu_ms": row.get("single_gpu_ms"), "step_ms_beside_single": row.get("step_ms_beside_single"), "scaling_efficiency": row.get("scaling_efficiency"),
            "scaling_efficiency_ci95": row.get("scaling_efficiency_ci95"), "slowest_rank": row.get("slowest_rank"), "rank_spread": row.get("rank_spread"),
            "comm_mib": row["comm_bus_bytes"] / MB if row.get("comm_bus_bytes") is not None else None,
            "comm_floor_ms": row.get("comm_floor_ms"), "comm_floor_frac": row.get("comm_floor_frac"),
            "peak_gib_per_rank": max((m.get("peak_alloc_mb") or 0) for m in memory) / 1024 if memory and memory[0].get("peak_alloc_mb") is not None else None,
            "ranks_agree": row.get("ranks_agree"), "launches": row.get("launches"),
        })
    return out


SCALING_HEADERS = ["Model", "seq", "dtype", "mode", "parallel", "ranks", "step (ms)", "step beside 1 GPU (ms)", "1 GPU (ms)", "scaling eff.", "slowest rank",
                   "rank spread", "bus MiB/step", "comm floor (ms)", "floor ÷ step", "peak GiB/rank", "ranks agree"]


def one_device(rows: list[dict]) -> str:
    """What one rank runs on, for headers and titles: ``1 GPU``; on the CPU ``1 process`` (a rank is a process there)."""
    return "1 process" if rows and all((r.get("device") or (r.get("case") or {}).get("device")) == "cpu" for r in rows) else "1 GPU"


def scaling_headers(rows: list[dict]) -> list[str]:
    """SCALING_HEADERS, named for the device the rows ran on (no GPU columns for CPU ranks)."""
    one = one_device(rows)
    return [h.replace("1 GPU", one) for h in SCALING_HEADERS]


def _scaling_cells(r: dict) -> list[str]:
    if r["status"] != "ok":
        return [r["model"], str(r["seq_len"]), r["dtype"], r["mode"], r["parallel"], str(r["world_size"]), FAILED.get(r["status"], str(r["status"]).upper())] + ["–"] * 10
    agree = {True: "yes", False: "NO", None: "– (sharded)"}[r["ranks_agree"]]
    return [r["model"], str(r["seq_len"]), r["dtype"], r["mode"], r["parallel"], str(r["world_size"]), num(r["step_ms"], ".2f"),
            num(r["step_ms_beside_single"], ".2f"), num(r["single_gpu_ms"], ".2f"), with_ci(r["scaling_efficiency"], r.get("scaling_efficiency_ci95"), ".3f"), str(r["slowest_rank"]), num(r["rank_spread"], ".1%"),
            num(r["comm_mib"], ".1f"), num(r["comm_floor_ms"], ".2f"), num(r["comm_floor_frac"], ".1%"), num(r["peak_gib_per_rank"], ".2f"), agree]


def sections(rows: list[dict]) -> list[str]:
    """The lm report's data-parallel section (empty without data-parallel rows)."""
    table = scaling_rows(rows)
    if not table:
        return []
    return ["## Training on several GPUs",
            "Step = the slowest rank's median (CUDA events on every rank), timed alone; then the same case on one GPU is built on "
            "rank 0's GPU beside the ranks' model and the two are timed in interleaved blocks: step beside 1 GPU and 1 GPU are "
            "the medians of those blocks, and scaling efficiency = 1 GPU ÷ step over blocks of the same round (95% CI) (weak "
            "scaling: the batch is per GPU, so 1.0 is perfect). Read the efficiency against the two blocks' columns, not "
            "against the step timed alone, which ran in another stretch of time (on a shared host the step moves between "
            "them). Bus MiB/step: what each "
            "rank must send for the gradients (DDP: ring all-reduce, 2(N−1)/N × gradient bytes; FSDP: all-gathers and a "
            "reduce-scatter, (N−1)/N each); the floor divides it by the all-reduce bus bandwidth measured on these GPUs at the "
            "step's message size (`perflab ceilings --gpus`' sweep, or the ranks' own before the case where none was cached); "
            "floor ÷ step: the share of the step that communication would take at that bandwidth if none of it overlapped.",
            md_table(scaling_headers(rows), [_scaling_cells(r) for r in table])]


def scaling_table(rows: list[dict]) -> Table:
    parallel = [r for r in rows if (r.get("case") or {}).get("parallel")]
    return plain_table(f"Data parallel: slowest rank's step against {one_device(parallel).replace('1 ', 'one ')}",
                       [(header, "left" if header in ("Model", "dtype", "mode", "parallel") else "right") for header in scaling_headers(parallel)],
                       [_scaling_cells(r) for r in scaling_rows(rows)])


ACCOUNT_HEADERS = ["rank", "window (ms)", "compute only", "comm overlapped", "comm exposed", "idle", "overlap"]


def account_cells(account: dict) -> list[str]:
    """One rank's exact split (ms; the four columns sum to the window)."""
    return [str(account["rank"]), *(units.ns_ms(account[key], 3) for key in ("window_ns", "compute_only_ns", "comm_overlapped_ns", "comm_exposed_ns", "idle_ns")),
            num(account["overlap_fraction"], ".1%")]


def render_rank_accounts(console, result: dict) -> None:
    """``api.profile_parallel``'s result: the step against one GPU, each rank's exact split, who waited for whom."""
    row = result["row"]
    if row.get("status") != "ok":
        console.print(f"{row.get('status')}: {row.get('message')}", markup=False)
        return
    console.print(scaling_table([row]))
    console.print("traces: " + ", ".join(result["trace_paths"]), markup=False, soft_wrap=True)
    if result["note"]:
        console.print(f"note: {result['note']}", markup=False)
    if result["accounts"]:
        console.print(plain_table("Per rank over the profiled steps (ms): compute only + comm overlapped + comm exposed + idle = window",
                                  [(header, "right") for header in ACCOUNT_HEADERS], [account_cells(a) for a in result["accounts"]]))
    for step in result["waits_per_step"]:
        waited = ", ".join(f"rank {r} {ns / 1e3:.1f} µs" for r, ns in sorted(step["waited_ns"].items()) if ns)
        console.print(f"step {step['step']}: {step['collectives']} collectives; waited for rank {step['waited_for']}"
                      + (f" ({waited})" if waited else ""), markup=False)
