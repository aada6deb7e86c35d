"""Seed 004's tables for the decode rows of a sweep: eager against each compiled mode (ms per decode step),
tokens/s, memory-bandwidth utilisation (MBU: the bytes a step must move ÷ its time ÷ the GPU's measured copy
bandwidth; and ÷ the datasheet bandwidth) with a plot of MBU against batch size, the ncu DRAM throughput of
each mode's top kernels where a sweep stored them, and generation latencies (time to first token, time per
output token). Kernel names are the short names of ``analysis.names`` (the report's legend gives the full ones).
Torch-free."""

from __future__ import annotations

from pathlib import Path

from perflab.analysis.names import KernelNames
from perflab.report import plots
from perflab.report.lm import FAILED

MODE_ORDER = ("eager", "compile", "compile:reduce-overhead", "compile:max-autotune", "cudagraph")


def sections(rows: list[dict], plot_dir: Path, names: KernelNames | None = None) -> list[str]:
    """The section's markdown parts; kernel names go through ``names`` (the report's, for its legend)."""
    from perflab.report.markdown import md_table

    names = names if names is not None else KernelNames()

    parts = ["## Decode (seed 004)",
             "Decode: one new token per sequence against a KV cache holding the context. Times are untraced medians with their 95% CI. "
             "Bytes per step = every weight read once (the embedding table only for the batch's rows) + the KV cache read at that "
             "context + the new token's K and V written. MBU = bytes per step ÷ step time ÷ the copy bandwidth measured on this GPU "
             "(datasheet bandwidth after the semicolon)."]
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        case = row.get("case") or row
        key = (row.get("model"), _layers(case), case.get("workload"), case.get("dtype"), case.get("context_len"), case.get("prompt_len"),
               case.get("new_tokens"), case.get("device"))
        groups.setdefault(key, []).append(row)
    mbu_panels = {}
    for key, group in sorted(groups.items(), key=lambda kv: tuple(str(x) for x in kv[0])):
        model, layers, workload, dtype, ctx, prompt, new, device = key
        shape = {"decode": f"context {ctx}", "prefill": f"prompt {prompt}", "generate": f"prompt {prompt} + {new} new tokens"}.get(workload, "")
        heading = f"{model}{layers}: {workload}, {shape}, {dtype}, {device}"
        parts.append(f"### {heading}")
        modes = [m for m in MODE_ORDER if any((r.get("case") or r).get("mode") == m for r in group)]
        batches = sorted({(r.get("case") or r).get("batch_size") for r in group})
        cells = {((r.get("case") or r).get("mode"), (r.get("case") or r).get("batch_size")): r for r in group}
        headers = ["Batch"] + modes
        parts += ["#### Step time (ms) per mode", md_table(headers, [[str(b)] + [_ms(cells.get((m, b))) for m in modes] for b in batches])]
        if "eager" in modes and len(modes) > 1:
            body = [[str(b)] + [_ratio(cells.get(("eager", b)), cells.get((m, b))) for m in modes if m != "eager"] for b in batches]
            parts += ["#### Eager ÷ mode (> 1: the mode is faster than eager)", md_table(["Batch"] + [m for m in modes if m != "eager"], body)]
        parts += ["#### Tokens/s", md_table(headers, [[str(b)] + [_num(cells.get((m, b)), "tokens_per_s", ".1f") for m in modes] for b in batches])]
        if any(r.get("mbu") is not None for r in group):
            parts += ["#### MBU (measured copy bandwidth; datasheet)", md_table(headers, [[str(b)] + [_mbu(cells.get((m, b))) for m in modes] for b in batches])]
            mbu_panels[heading] = {m: [(b, 100 * cells[(m, b)]["mbu"]) for b in batches
                                      if cells.get((m, b)) and cells[(m, b)].get("mbu") is not None] for m in modes}
        if workload == "generate":
            body = [[str(b), m, _num(cells.get((m, b)), "ttft_ms", ".2f"), _num(cells.get((m, b)), "tpot_ms", ".3f"),
                     _num(cells.get((m, b)), "tpot_p90_ms", ".3f")] for b in batches for m in modes]
            parts += ["#### Generation latency (ms)", md_table(["Batch", "Mode", "Time to first token", "Per output token (mean)", "p90"], body)]
        ncu = [(m, b, k) for (m, b), r in cells.items() for k in ((r.get("ncu") or {}).get("kernels") or [])]
        if ncu:
            body = [[m, str(b), f"`{names(k.get('full_name') or k['name'])}`", k.get("library") or "–", _pct(k.get("dram_pct")), _gbps(k.get("dram_gbps")),
                     _pct(100 * k["time_share"] if k.get("time_share") is not None else None)]
                    for m, b, k in sorted(ncu, key=lambda x: (MODE_ORDER.index(x[0]) if x[0] in MODE_ORDER else 9, x[1], -(x[2].get("time_share") or 0)))]
            parts += ["#### ncu: DRAM throughput of the top kernels per mode", md_table(["Mode", "Batch", "Kernel", "Library", "DRAM %", "Achieved GB/s", "Share of GPU time"], body)]
    if mbu_panels:
        path = plots.metric_vs_batch(mbu_panels, plot_dir / "decode_mbu_vs_batch.png", "MBU against batch size", "MBU (% of measured copy bandwidth)")
        parts.append(f"![MBU vs batch size]({path.name})")
    return parts


def _layers(case: dict) -> str:
    if case.get("layers_only"):
        return f" (layers only, {case.get('layers') or 'all'} layer(s))"
    if case.get("layers") is not None:
        return f" ({case['layers']} layers)"
    return ""


def _ms(row) -> str:
    if row is None:
        return "–"
    if row.get("status") != "ok":
        return FAILED.get(row.get("status"), row.get("status"))
    ci = row.get("ci95_ms") or [None, None]
    return f"{row['median_ms']:.3f} [{ci[0]:.3f}–{ci[1]:.3f}]" if None not in ci else f"{row['median_ms']:.3f}"


def _ratio(eager, other) -> str:
    if not eager or not other or eager.get("status") != "ok" or other.get("status") != "ok":
        return "–"
    return f"{eager['median_ms'] / other['median_ms']:.2f}×"


def _num(row, key: str, spec: str) -> str:
    if row is None:
        return "–"
    if row.get("status") != "ok":
        return FAILED.get(row.get("status"), row.get("status"))
    value = row.get(key)
    return "–" if value is None else format(value, spec)


def _mbu(row) -> str:
    if row is None:
        return "–"
    if row.get("status") != "ok":
        return FAILED.get(row.get("status"), row.get("status"))
    if row.get("mbu") is None:
        return "–"
    sheet = f"; {row['mbu_datasheet']:.1%}" if row.get("mbu_datasheet") is not None else ""
    return f"{row['mbu']:.1%}{sheet}"


def _pct(value) -> str:
    return "–" if value is None else f"{value:.1f}%"


def _gbps(value) -> str:
    return "–" if value is None else f"{value:.0f}"
