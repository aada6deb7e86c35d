"""``perflab explain --parallel`` at the report floor, its result's rows; ``diagnosis/explain_parallel.py`` measures it.

``perflab explain --parallel``'s result (``explain_parallel.ParallelExplanation``): its rows, built once, for the
console and for markdown. Torch-free."""

from __future__ import annotations

from perflab.report.explain_rows import compile_line, fix_model_lines
from perflab.report.md import md_table, num, with_ci
from perflab.stats import ci_note

MIB = 2**20

COLLECTIVE_HEADER = ["collective", "payload MiB", "bus factor", "bus MiB per rank", "calls", "mean message MiB"]
RANK_HEADER = ["rank", "step ms (untraced)", "comm ms", "exposed ms", "of it waiting ms", "overlapped ms", "overlap", "comm ÷ floor",
               "passes ms"]
FIX_HEADER = ["#", "fix", "parallel after", "mode", "base beside it ms", "predicted ms", "measured ms", "error", "throughput vs base (95% CI)",
              "compute ms pred / meas", "exposed ms pred / meas"]
RANK_TITLE = ("Per rank, per profiled step: communication (comm), the part no compute hides (exposed; of it, waiting: spinning in a "
              "collective for a later rank to arrive) and the part hidden (overlapped); comm ÷ floor = the rank's measured communication "
              "over the floor")
FIX_TITLE = ("Communication fixes: each measured in a launch of its own, the base built again beside it and the two timed in "
             "interleaved blocks (each one's step: the median of its blocks, a block the slowest rank's; the throughput ratio over "
             "blocks of the same round, with its 95% CI); each profiled too (the slowest rank's exposed communication, as its share "
             "of the traced step applied to the untraced one); predicted (model below) from the base's profile, anchored at the base "
             "beside it; compute = step − exposed")


def pair(predicted, measured) -> str:
    return f"{num(predicted, '.3f')} / {num(measured, '.3f')}"


def _mib(nbytes) -> str:
    return num(nbytes / MIB if nbytes is not None else None, ".3f")


def bucket_text(buckets: list, listed: int = 8) -> str:
    """DDP's buckets in the order it all-reduces them, in MiB: every one where there are few, else their count, the
    first and the last (the last holds the first layers' gradients, which no compute hides) and the range of the rest;
    the JSON keeps them all."""
    if len(buckets) <= listed:
        return ", ".join(_mib(b) for b in buckets) + " MiB"
    middle = buckets[1:-1]
    return (f"{len(buckets)} buckets, the first {_mib(buckets[0])} MiB, then {_mib(min(middle))}–{_mib(max(middle))} MiB, "
            f"the last {_mib(buckets[-1])} MiB")


def where(e) -> str:
    if e.case.device != "cpu":
        return f"{e.case.world_size} GPUs, NCCL"
    threads = e.row.get("threads_per_rank")
    return f"{e.case.world_size} CPU ranks, gloo" + (f", {threads} thread{'s' if threads != 1 else ''} each" if threads else "")


def summary_lines(e) -> list[str]:
    """The step against one device, the bytes and the floor, in words."""
    c, row = e.communication, e.row
    threads = e.row.get("threads_per_rank")
    one = ("one CPU process" + (" of as many threads" if threads else "")) if e.case.device == "cpu" else "one GPU"
    ci = c.get("scaling_efficiency_ci95")
    note = ci_note(row.get("scaling_efficiency_ci_coverage"), row.get("scaling_efficiency_ci_range_of"))
    label = f"CI ({note})" if note else "95% CI"
    paired = (f" ({label} {ci[0]:.3f}–{ci[1]:.3f}, from blocks interleaved with the ranks' step)" if ci else " (timed alone, after the ranks)")
    # the efficiency is read from the blocks timed together, not from the slowest rank's own median above: the figures
    # it is the ratio of are printed beside it (the ranks' step in the one-device case's rounds, and that case's)
    beside = c.get("step_beside_single_ms")
    of = (f" = the median over the rounds of {one}'s block ÷ the ranks' slowest block, which ran {c['single_ms']:.3f} ms and "
          f"{beside:.3f} ms (medians) in the same rounds") if beside else ""
    scaling = (f"; the same case on {one} {c['single_ms']:.3f} ms, scaling efficiency {c['scaling_efficiency']:.3f}{paired}{of} (weak "
               "scaling: the batch is per rank)") if c.get("single_ms") else ""
    buckets = f" DDP's buckets as it rebuilt them: {bucket_text(c['buckets'])}." if c.get("buckets") else ""
    return [f"Step: the slowest rank's (rank {c['slowest_rank']}) untraced median **{row['median_ms']:.3f} ms** on {where(e)}{scaling}.",
            f"Bytes per step: {c['bus_bytes'] / MIB:.3f} MiB on the bus per rank ({c['mode']}, {c['calls']} collective call{'s' if c['calls'] != 1 else ''}; {c['dtype_note']})."
            + buckets,
            f"Bus bandwidth used: **{c['busbw_gbps']:.3f} GB/s** (busbw at the swept size {c['busbw_size_bytes'] / MIB:g} MiB, nearest the "
            f"mean message of {c['message_bytes'] / MIB:.3f} MiB), from {c['busbw_source']}; per-call latency {c['latency_us']:.1f} µs "
            "(the sweep's two smallest sizes).",
            f"Communication floor = bus bytes ÷ busbw = **{c['floor_ms']:.3f} ms** per step ({c['floor_fraction']:.1%} of the step); with each "
            f"call's latency {c['modelled_ms']:.3f} ms." + (f" {c['not_in_floor']}." if c.get("not_in_floor") else "")]


def collective_rows(e) -> list[list[str]]:
    return [[r["collective"], _mib(r["payload_bytes"]), r["bus_factor"], _mib(r["bus_bytes"]), str(r["calls"]), _mib(r["message_bytes"])]
            for r in e.communication["collectives"]]


def rank_rows(e) -> list[list[str]]:
    passes = {p["rank"]: p["ms"] for p in e.profile.get("rank_passes") or []}
    out = []
    for r in e.communication["ranks"]:
        ms = ", ".join(f"{name} {v:.3f}" for name, v in passes.get(r["rank"], {}).items())
        out.append([str(r["rank"]) + (" (slowest)" if r["rank"] == e.communication["slowest_rank"] else ""), f"{r['step_ms']:.3f}",
                    f"{r['comm_ms']:.3f}", f"{r['exposed_ms']:.3f}", num(r.get("waiting_ms"), ".3f"), f"{r['overlapped_ms']:.3f}",
                    num(r["overlap_fraction"], ".1%"),
                    num(r["measured_over_floor"], ".2f") + "×", ms or "–"])
    return out


def rank_note(e) -> list[str]:
    lines = []
    if e.profile.get("note"):
        lines.append(f"Note: {e.profile['note']}.")
    waits = e.profile.get("waits_per_step") or []
    if waits:
        lines.append("Who waits: " + "; ".join(f"step {w['step']}: rank {w['waited_for']} last to arrive" for w in waits) + ".")
    return lines


def fix_rows(e) -> list[list[str]]:
    rows = [["", "base (as profiled)", e.case.parallel, e.case.mode, "–", "–", f"{e.row['median_ms']:.3f}", "–", "–",
             f"– / {e.step.compute_ms:.3f}" if e.step and e.step.compute_ms is not None else "–",
             f"– / {e.step.exposed_ms:.3f}" if e.step and e.step.exposed_ms is not None else "–"]]
    for i, fx in enumerate(e.fix_results, 1):
        p = fx.prediction
        base = num(fx.base_row.get("median_ms"), ".3f")
        if fx.measured_ms is None:
            rows.append([str(i), f"`{fx.name}`", fx.parallel, fx.mode, base, num(p.ms, ".3f"),
                         f"{fx.measured.get('status')}: {fx.measured.get('message')}"] + ["–"] * 4)
            continue
        rows.append([str(i), f"`{fx.name}`", fx.parallel, fx.mode, base, num(p.ms, ".3f"), f"{fx.measured_ms:.3f}", num(fx.error, "+.1%"),
                     with_ci(fx.throughput_gain, fx.throughput_gain_ci95, ".2f", "×"), pair(p.compute_ms, fx.measured_compute_ms),
                     pair(p.exposed_ms, fx.measured_exposed_ms)])
    return rows


def compile_lines(e) -> list[str]:
    """What compiling did, for the base and each fix that compiled (rank 0's; DDPOptimizer compiles a DDP model's graph
    in pieces, split at its buckets)."""
    named = [("base", e.row)] + [(f"`{fx.name}`", fx.measured) for fx in e.fix_results]
    return [compile_line(f"{name} (rank 0)", row["compile"], " (DDPOptimizer splits a DDP model's graph at its buckets)")
            for name, row in named if row and row.get("compile")]


def parallel_markdown(e, device: str = "") -> str:
    out = [f"### {e.case.label()} ({device or where(e)})", "", " ".join(summary_lines(e)), ""]
    out += [md_table(COLLECTIVE_HEADER, collective_rows(e)), ""]
    out += [f"{RANK_TITLE}:", "", md_table(RANK_HEADER, rank_rows(e)), ""] + rank_note(e) + [""]
    if e.fix_results:
        out += [f"{FIX_TITLE}:", "", md_table(FIX_HEADER, fix_rows(e)), ""] + fix_model_lines(e) + [""]
    compiled = compile_lines(e)
    return "\n".join(out + (compiled + [""] if compiled else []))


def render_parallel(console, e, table, plain) -> None:
    """The console's rendering: ``table(console, title, header, rows)`` and ``plain(markdown line)`` from explain_console;
    the sentences wrap to the width, as the tables fit it."""
    console.rule(f"{e.case.label()} ({where(e)})")
    for line in summary_lines(e):
        console.print(plain(line))
    table(console, "Communication per step (analysis.comm: nccl-tests' bus bytes)", COLLECTIVE_HEADER, collective_rows(e))
    table(console, RANK_TITLE, RANK_HEADER, rank_rows(e))
    for line in rank_note(e):
        console.print(line, markup=False)
    if e.fix_results:
        table(console, FIX_TITLE, FIX_HEADER, fix_rows(e))
        for line in fix_model_lines(e):
            console.print("  " + plain(line))
    for line in compile_lines(e):
        console.print(plain(line))
