"""The decode family at the report floor, its rows' tables; ``workloads/decode.py`` runs its steps.

Seed 004's tables for the decode rows of a sweep: eager against each compiled mode (ms per decode step),
tokens/s, memory-bandwidth utilisation (MBU: the bytes a step must move ÷ its time ÷ the GPU's measured copy
bandwidth; and ÷ the datasheet bandwidth) with a plot of MBU against batch size, the ncu DRAM throughput of
each mode's top kernels where a sweep stored them, and generation latencies (time to first token, time per
output token); seed 004's eager-vs-compiled times (``study_figures.yaml``) beside every mode measured, with a plot of
each mode's time ÷ eager's; and ``summary``, the sentences the report opens with, computed from the rows. Kernel names are the short names of ``analysis.names`` (the report's legend gives the full ones).
Torch-free."""

from __future__ import annotations

from pathlib import Path

from perflab import units
from perflab.analysis.names import KernelNames
from perflab.report import plots, seeds
from perflab.report.md import FAILED, counts_text, gpu_name, md_table, ok, span

MODE_ORDER = ("eager", "compile", "compile:reduce-overhead", "compile:max-autotune", "compile:max-autotune-gemm", "cudagraph")


def _cache_line(group: list[dict]) -> str | None:
    """The KV cache's length the rows ran with (``cache_len``): the positions needed, rounded up to a multiple of 8;
    rows stored by a perflab that did not round ran an odd length (context + 1), which sends cuBLAS to slow kernels."""
    lengths = sorted({r["cache_len"] for r in group if isinstance(r.get("cache_len"), int)})
    if not lengths:
        return None
    odd = [n for n in lengths if n % 8]
    text = f"KV cache: {' / '.join(str(n) for n in lengths)} positions per sequence."
    if odd:
        text += (f" {'All' if len(odd) == len(lengths) else 'Some'} of these rows ran a cache of {', '.join(map(str, odd))} positions, "
                 "not a multiple of 8: an unaligned length that can send the attention's matmuls to cuBLAS's slow fallback kernels "
                 "(on an H100, llama3_8b at context 4096 and batch 64 ran 3.2x slower compiled); perflab pads the cache to a multiple "
                 "of 8 when it runs a case: run these again to time that.")
    return text


def sections(rows: list[dict], plot_dir: Path, names: KernelNames | None = None) -> list[str]:
    """The section's markdown parts; kernel names go through ``names`` (the report's, for its legend)."""

    names = names if names is not None else KernelNames()

    parts = ["## Decode (the Llama decode testbench)",
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
        if cache := _cache_line(group):
            parts.append(cache)
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
            body = [[m, str(b), f"`{names(k.get('full_name') or k['name'])}`", k.get("library") or "–", units.percent(k.get("dram_pct")), units.gbps(k.get("dram_gbps")),
                     units.percent(100 * k["time_share"] if k.get("time_share") is not None else None)]
                    for m, b, k in sorted(ncu, key=lambda x: (MODE_ORDER.index(x[0]) if x[0] in MODE_ORDER else 9, x[1], -(x[2].get("time_share") or 0)))]
            parts += ["#### ncu: DRAM throughput of the top kernels per mode", md_table(["Mode", "Batch", "Kernel", "Library", "DRAM %", "Achieved GB/s", "Share of GPU time"], body)]
    if mbu_panels:
        path = plots.metric_vs_batch(mbu_panels, plot_dir / "decode_mbu_vs_batch.png", "MBU against batch size", "MBU (% of measured copy bandwidth)")
        parts.append(f"![MBU vs batch size]({path.name})")
    parts += seed_section(rows, plot_dir)
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
    return units.ms_ci(row["median_ms"], row.get("ci95_ms"))


def _ratio(eager, other) -> str:
    if not (ok(eager) and ok(other)):
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


# ---------------------------------------------------------------------------------------------------
# Seed 004's finding beside perflab's modes, and the summary


def _decode_cells(rows: list[dict]) -> dict[tuple, dict]:
    """(testbench?, context, batch, mode) → row, for the decode-step rows (the testbench timed one decode step)."""
    out = {}
    for r in rows:
        c = r.get("case") or r
        if c.get("workload") == "decode":
            out[(bool(c.get("layers_only")) and c.get("layers") == 1, r.get("model"), c.get("context_len"), c.get("batch_size"), c.get("mode"))] = r
    return out


def compiled_vs_eager(rows: list[dict], testbench_only: bool = False) -> list[tuple[tuple, str, float]]:
    """(cell key without mode, mode, mode's ms ÷ eager's ms) for every stored pair of an ok eager row and an ok row of another mode."""
    cells = _decode_cells(rows)
    out = []
    for (bench, model, ctx, batch, mode), row in sorted(cells.items(), key=lambda kv: (not kv[0][0], str(kv[0][1]), kv[0][2] or 0, kv[0][3] or 0,
                                                                                      _mode_index(kv[0][4]))):
        eager = cells.get((bench, model, ctx, batch, "eager"))
        if mode != "eager" and ok(row) and ok(eager) and (bench or not testbench_only):
            out.append(((bench, model, ctx, batch), mode, row["median_ms"] / eager["median_ms"]))
    return out


def _mode_index(mode) -> int:
    return MODE_ORDER.index(mode) if mode in MODE_ORDER else len(MODE_ORDER)


def seed_section(rows: list[dict], plot_dir: Path) -> list[str]:
    """Seed 004's eager and compiled times (study_figures.yaml) beside perflab's one-layer testbench in every mode, the
    ncu DRAM figures of both, and a plot of step time per mode."""

    fig = seeds.seed004()
    gpu = gpu_name(rows)
    parts = ["### The Llama decode testbench's eager-vs-compiled finding beside perflab's modes",
             f"The testbench's figures are copied from its write-up into `src/perflab/report/study_figures.yaml`: {fig['measured']}, on two "
             f"GPUs; \"compiled\" is {fig['compiled_mode']}. perflab's are this report's decode-step rows on {gpu}: untraced medians of "
             f"one decode step, every mode measured."]
    body = [["the testbench", f"{s['gpu']}, one layer", f"{s['eager']:.2f}", f"{s['compiled']:.2f} (compiled)", f"{s['compiled'] / s['eager']:.2f}",
             "eager" if s["compiled"] > s["eager"] else "compiled"] for s in fig["eager_vs_compiled_ms"]]
    cells = _decode_cells(rows)
    for (bench, model, ctx, batch), mode, ratio in compiled_vs_eager(rows, testbench_only=True):
        eager, row = cells[(bench, model, ctx, batch, "eager")], cells[(bench, model, ctx, batch, mode)]
        body.append([f"perflab ({gpu})", f"one layer, context {ctx}, batch {batch}", f"{eager['median_ms']:.3f}",
                     f"{row['median_ms']:.3f} ({mode})", f"{ratio:.2f}", "eager" if ratio > 1 else mode])
    parts += ["#### One decode step of one layer: eager against compiled (ms)",
              md_table(["Source", "Setup", "Eager", "Compiled (mode)", "Compiled ÷ eager", "Faster"], body)]
    every = compiled_vs_eager(rows)
    slower = [(k, m, r) for k, m, r in every if r > 1]
    seed_ratios = [s["compiled"] / s["eager"] for s in fig["eager_vs_compiled_ms"]]
    line = (f"What differs: the testbench timed one NVTX range under nsys after 20 warmup runs ({'; '.join(s['gpu'] for s in fig['eager_vs_compiled_ms'])}, "
            f"PyTorch 2.8, a layer without RoPE or GQA), and found compiled {span(seed_ratios)}× eager's time; perflab times the "
            f"median of many untraced steps (torch {_torch(rows)}) of a Llama-3-8B layer with RoPE and GQA")
    if every:
        ratios = [r for _, _, r in every]
        line += (f": over all {len(every)} decode cells with an eager pair (one layer and the full model, every context, batch and "
                 f"mode) the mode takes {span(ratios)}× eager's time, slower than eager in {len(slower)}.")
    else:
        line += "; no decode cell has an eager pair yet."
    parts.append(line)
    triton, cublas = fig["ncu_dram_pct"]["triton_gemm"], fig["ncu_dram_pct"]["cublas_gemm"]
    measured: dict[str, list[float]] = {}
    for r in rows:
        for k in ((r.get("ncu") or {}).get("kernels") or []):
            if k.get("roofline") == "memory-bound" and k.get("dram_pct") is not None and k.get("library"):
                measured.setdefault(k["library"], []).append(k["dram_pct"])
    if measured:
        ours = "; ".join(f"{lib} {span(v, '.1f')}% over {len(v)}" for lib, v in sorted(measured.items()))
        parts.append(f"ncu, DRAM throughput of the memory-bound top kernels: the testbench's Triton GEMMs {triton[0]}–{triton[1]}% against "
                     f"~{cublas}% for cuBLAS (RTX 4090); perflab's ({gpu}, the ncu pass's top kernels of every mode): {ours} kernels.")
    panels: dict[str, dict] = {}
    for (bench, model, ctx, batch), mode, ratio in every:
        title = f"perflab: {model}{' one layer' if bench else ''}, context {ctx}"
        panels.setdefault(title, {}).setdefault(mode, []).append((f"bs{batch}", ratio))
    if panels:
        panels = {t: dict(sorted(p.items(), key=lambda kv: _mode_index(kv[0]))) for t, p in sorted(panels.items())}
        panels["the testbench: one layer, one nsys range"] = {"compiled (testbench)": [(s["gpu"], s["compiled"] / s["eager"]) for s in fig["eager_vs_compiled_ms"]]}
        colors = {m: f"C{i + 1}" for i, m in enumerate(MODE_ORDER[1:])} | {"compiled (testbench)": "C7"}
        path = plots.grouped_bars(panels, plot_dir / "decode_eager_vs_compiled.png",
                                  f"Decode step time of each mode ÷ eager's (below 1: faster than eager; perflab on {gpu})",
                                  "mode's time ÷ eager's time", hline=1.0, colors=colors)
        parts.append(f"![each mode's decode step time against eager's]({path.name})")
    return parts


def _torch(rows: list[dict]) -> str:
    return next(((r.get("env") or {}).get("torch") for r in rows if (r.get("env") or {}).get("torch")), "?")


def summary(rows: list[dict]) -> list[str]:
    """A few sentences with the study's numbers, each computed from the rows (the report opens with them)."""
    stored = [r for r in rows if r.get("status") != "missing"]
    missing = len(rows) - len(stored)
    gpu = gpu_name(stored)
    out = [f"Decode: {len(stored)} of {len(rows)} cases stored, on {gpu} ({counts_text(stored)})"
           + (f"; {missing} not run." if missing else ".")]
    cells = _decode_cells(rows)
    for bench in (False, True):
        keys = sorted({(m, c, b) for (bb, m, c, b, _), r in cells.items() if bb == bench and ok(r)}, key=lambda k: (k[1] or 0, k[2] or 0, str(k[0])))
        if not keys:
            continue
        model, ctx, batch = keys[0]
        modes = {mode: cells[(bench, model, ctx, batch, mode)] for mode in MODE_ORDER if ok(cells.get((bench, model, ctx, batch, mode)))}
        best_mode, best = min(modes.items(), key=lambda kv: kv[1]["median_ms"])
        what = f"{model}{' one layer (as the Llama decode testbench)' if bench else ''}, context {ctx}, batch {batch}"
        sentence = f"{what}: fastest {best_mode} {best['median_ms']:.3f} ms per step"
        if best.get("mbu") is not None:
            sentence += f" ({100 * best['mbu']:.1f}% MBU)"
        if "eager" in modes and best_mode != "eager":
            sentence += f", {modes['eager']['median_ms'] / best['median_ms']:.2f}× faster than eager ({modes['eager']['median_ms']:.3f} ms)"
        if "compile" in modes and "eager" in modes:
            sentence += f"; plain compile {modes['eager']['median_ms'] / modes['compile']['median_ms']:.2f}× faster than eager"
        out.append(sentence + ".")
    fast = {}
    for (bench, model, ctx, batch, mode), r in cells.items():
        if not bench and ok(r) and r.get("mbu") is not None:
            fast.setdefault((model, ctx), {}).setdefault(batch, []).append(r)
    for (model, ctx), by_batch in sorted(fast.items(), key=lambda kv: (str(kv[0][0]), kv[0][1] or 0)):
        if len(by_batch) > 1:
            lo, hi = min(by_batch), max(by_batch)
            a, b = (min(by_batch[x], key=lambda r: r["median_ms"]) for x in (lo, hi))
            out.append(f"MBU of the fastest mode, {model} context {ctx}: {100 * a['mbu']:.1f}% at batch {lo} ({a['mode']}), "
                       f"{100 * b['mbu']:.1f}% at batch {hi} ({b['mode']}).")
            break
    every = compiled_vs_eager(rows)
    fig = seeds.seed004()
    seed = "; ".join(f"{s['gpu']} {s['compiled']:.2f} against {s['eager']:.2f} ms" for s in fig["eager_vs_compiled_ms"])
    if every:
        slower = sum(r > 1 for _, _, r in every)
        out.append(f"The Llama decode testbench found compiled slower than eager ({seed}); here {len(every) - slower} of {len(every)} (cell, mode) pairs "
                   f"run faster than eager, the mode taking {span([r for _, _, r in every])}× eager's time.")
    return out
