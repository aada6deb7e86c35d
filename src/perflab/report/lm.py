"""The lm family at the report floor, its rows' tables; ``models/lm.py`` is its model, ``workloads/lm.py`` runs its
steps.

Seed 003's tables for the language-model rows of a sweep, with CIs and failure cells, plus MFU and memory.

Per group of rows that share dtype, attention, mode and batch size:

- (a) step time per workload (median ms with its 95% CI): sizes × sequence lengths;
- (b) the top kernel of each pass (inference forward; the training step's forward and backward) and its share;
- (c) the top non-GEMM kernel of the inference forward: share, time and launches per step;
- (d) the GEMM fraction of inference against training (forward + backward);
- (e) softmax against matmul inside explicit attention, with the FLOP ratio 5 : 4·head_dim beside the time ratio;
- MFU (of the counted FLOPs: torch's counter on the real step) against the measured bf16/fp32 matmul peak of this GPU
  and against the datasheet, and beside it MFU by the formula's FLOPs with the ratio counted ÷ formula; peak memory with its
  breakdown; the profiler's inflation (timings are untraced; (b)–(e) come from a separate profiled pass).

Then seed 003's own figures (``study_figures.yaml``: (a), (b)'s shares, (d), (e)) beside perflab's value of each cell of
the group run as the study ran it (fp32, explicit attention, eager), with one line on what differs; the study's OOM
cells against perflab's measured peaks at 12, 16 and 24 GiB (derived from the peaks, or measured where rows ran with
``max_memory``); plots of forward time, GEMM fraction and softmax ÷ matmul time against sequence length; and
``summary``, the sentences the report opens with, computed from the rows.

Kernel names are the short names of ``analysis.names`` (at most 120 characters, one per kernel); the report
maps each to its full name in a legend. Torch-free.
"""

from __future__ import annotations

from pathlib import Path

from perflab import units
from perflab.analysis.names import KernelNames
from perflab.report import parallel, plots, seeds
from perflab.report.md import FAILED, counts_text, formula_cell, gpu_name, md_table, ok, span

SIZE_ORDER = ("gpt_small", "gpt_medium", "gpt_large", "gpt_xl", "gpt_2.7b")
WORKLOAD_TITLES = {"forward": "inference forward", "train_forward": "training forward (autograd recording)",
                   "forward_backward": "forward + backward", "train_step": "training step (forward, backward, AdamW)"}


def sections(rows: list[dict], plot_dir: Path, names: KernelNames | None = None) -> list[str]:
    """The section's markdown parts; kernel names go through ``names`` (the report's, for its legend)."""

    names = names if names is not None else KernelNames()

    parts = ["## Language models (the GPT size study)",
             "Step times are untraced medians with their 95% CI; the kernel tables come from a separate profiled pass of the same case "
             "(the profiler's inflation is listed last). GEMM fraction = GEMM kernel time ÷ the pass's kernel time. A failed cell says "
             "OOM, ERROR or TIMEOUT; \"not run\" marks a case of the spec without a stored row."]
    parallel_parts = parallel.sections(rows)
    rows = [r for r in rows if not _case(r).get("parallel")]  # several ranks: their own section, after the one-GPU tables
    capped = [r for r in rows if _case(r).get("max_memory")]
    rows = [r for r in rows if not _case(r).get("max_memory")]  # a capped case answers "would it fit", in its own section
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault(_group_key(row), []).append(row)
    seed_key = _seed_group_key(groups)
    for key, group in sorted(groups.items(), key=lambda kv: tuple(str(x) for x in kv[0])):
        dtype, attn, mode, batch, device = key
        heading = f"{dtype}, {attn} attention, {mode}, batch {batch}, {device}"
        parts.append(f"### {heading}")
        sizes = _sizes(group)
        seqs = sorted({_case(r).get("seq_len") for r in group if _case(r).get("seq_len") is not None})
        cells = {(_case(r).get("workload"), r.get("model"), _case(r).get("seq_len")): r for r in group}
        workloads = [w for w in WORKLOAD_TITLES if any(k[0] == w for k in cells)]
        for w in workloads:
            body = [[m] + [_time_cell(cells.get((w, m, s))) for s in seqs] for m in sizes]
            parts += [f"#### (a) Step time (ms): {WORKLOAD_TITLES[w]}", md_table(["Model"] + [f"seq{s}" for s in seqs], body)]
        parts += _kernel_tables(cells, sizes, seqs, md_table, names)
        parts += _attention_tables(cells, sizes, seqs, md_table)
        for w in workloads:
            body = [[m] + [_mfu_cell(cells.get((w, m, s))) for s in seqs] for m in sizes]
            parts += [f"#### MFU: {WORKLOAD_TITLES[w]} (counted FLOPs; of the measured peak; of the datasheet peak)",
                      md_table(["Model"] + [f"seq{s}" for s in seqs], body)]
            body = [[m] + [_measured_cell(cells.get((w, m, s)), formula_cell) for s in seqs] for m in sizes]
            if any(c not in ("–", "not run") for row in body for c in row[1:]):
                parts += [f"#### MFU by the formula's FLOPs: {WORKLOAD_TITLES[w]} (of the measured peak; ×counted ÷ formula)",
                          md_table(["Model"] + [f"seq{s}" for s in seqs], body)]
        for w in [w for w in workloads if w in ("train_step", "forward_backward")]:
            body = [[m] + [_memory_cell(cells.get((w, m, s))) for s in seqs] for m in sizes]
            parts += [f"#### Peak memory (GiB): {WORKLOAD_TITLES[w]} (params + grads + optimizer + rest)",
                      md_table(["Model"] + [f"seq{s}" for s in seqs], body)]
        inflation = [[f"{m} ({w})"] + [_inflation_cell(cells.get((w, m, s))) for s in seqs] for w in workloads for m in sizes]
        if any(c != "–" for row in inflation for c in row[1:]):
            parts += ["#### Profiler inflation (traced step ÷ untraced median)", md_table(["Case"] + [f"seq{s}" for s in seqs], inflation)]
        if "forward" in workloads and seqs:
            series = {}
            for m in sizes:
                points = []
                for s in seqs:
                    r = cells.get(("forward", m, s))
                    if ok(r):
                        ci = r.get("ci95_ms") or [r["median_ms"]] * 2
                        points.append((s, r["median_ms"], ci[0], ci[1]))
                if points:
                    series[m] = points
            if series:
                path = plots.time_vs_length(series, plot_dir / f"lm_forward_time_{_slug(heading)}.png",
                                            f"Forward time vs sequence length ({heading})", "sequence length (tokens)")
                parts.append(f"![forward time vs sequence length]({path.name})")
        parts += _kernel_plot(cells, sizes, seqs, heading, plot_dir, with_seed=key == seed_key)
    parts += seed_sections(rows, capped)
    return parts + parallel_parts


def _kernel_tables(cells, sizes, seqs, md_table, names: KernelNames) -> list[str]:
    parts = []
    have_profile = any((r.get("profile") or {}).get("passes") for r in cells.values())
    if not have_profile:
        return ["Kernel tables (b)–(e): no profile pass stored (set `harness.profile_steps` in the spec)."]
    for m in sizes:
        body = []
        for s in seqs:
            inf = _pass(cells.get(("forward", m, s)), "forward")
            train = _training_row(cells, m, s)
            body.append([f"seq{s}", _top_cell(inf, names), _top_cell(_pass(train, "forward"), names), _top_cell(_pass(train, "backward"), names)])
        parts += [f"#### (b) {m}: top kernel per pass", md_table(["Seq len", "Inference forward", "Training forward", "Training backward"], body)]
    for m in sizes:
        body = []
        for s in seqs:
            row = cells.get(("forward", m, s))
            p = _pass(row, "forward")
            if isinstance(p, str) or p is None:
                body.append([f"seq{s}", p or "–", "–", "–", "–"])
            elif not p.get("top_non_gemm_kernel"):
                body.append([f"seq{s}", "none (GEMMs only)", "–", "–", "–"])
            else:
                body.append([f"seq{s}", f"`{names(p['top_non_gemm_kernel'])}`", f"{p['top_non_gemm_share']:.1%}",
                             f"{p['top_non_gemm_us'] / 1000:.3f} ms", f"{p['top_non_gemm_instances']:g}"])
        parts += [f"#### (c) {m}: top non-GEMM kernel, inference forward (per step)", md_table(["Seq len", "Kernel", "Time %", "Total", "Inst"], body)]
    for m in sizes:
        body = []
        for s in seqs:
            inf = _pass(cells.get(("forward", m, s)), "forward")
            train = _training_row(cells, m, s)
            body.append([f"seq{s}", _frac_cell(inf), _training_fraction(train)])
        parts += [f"#### (d) {m}: GEMM fraction", md_table(["Seq len", "Inference", "Training (forward + backward)"], body)]
    return parts


def _attention_tables(cells, sizes, seqs, md_table) -> list[str]:
    rows = {(m, s): cells.get(("forward", m, s)) for m in sizes for s in seqs}
    if not any(((r or {}).get("profile") or {}).get("attention") for r in rows.values()):
        return []
    soft, mat, ratio = [], [], []
    for m in sizes:
        a, b, c = [m], [m], [m]
        for s in seqs:
            r = rows[(m, s)]
            att = ((r or {}).get("profile") or {}).get("attention") if ok(r) else None
            if att:
                a.append(f"{att['softmax_ns'] / 1e6:.3f}")
                b.append(f"{att['matmul_ns'] / 1e6:.3f}")
                c.append(f"{att['softmax_to_matmul']:.1%}" if att.get("softmax_to_matmul") is not None else "–")
            else:
                cell = _failed(r) or "–"
                a.append(cell), b.append(cell), c.append(cell)
        soft.append(a), mat.append(b), ratio.append(c)
    flop_ratio = []
    for m in sizes:
        cfg = next(((r or {}).get("model_config") for (mm, _), r in rows.items() if mm == m and r and r.get("model_config")), None)
        if cfg:
            head_dim = cfg["d_model"] // cfg["n_heads"]
            flop_ratio.append([m, str(head_dim), f"5 : {4 * head_dim}", f"{5 / (4 * head_dim):.2%}"])
    headers = ["Model"] + [f"seq{s}" for s in seqs]
    return ["#### (e) Softmax vs matmul inside attention (inference forward, per step)",
            "Softmax time (ms)", md_table(headers, soft), "Matmul time (ms: the GEMMs of attn.scores and attn.final_matmul)", md_table(headers, mat),
            "Softmax / matmul time", md_table(headers, ratio),
            "FLOP ratio softmax : matmul = 5·T² : 4·T²·head_dim (per head), against which the time ratio above stands",
            md_table(["Model", "head_dim", "FLOPs", "FLOP ratio"], flop_ratio)]


def _training_row(cells, m, s):
    for w in ("forward_backward", "train_step"):
        row = cells.get((w, m, s))
        if row is not None:
            return row
    return None


def _pass(row, name):
    """The pass's record, or a failure cell (str), or None."""
    if row is None:
        return None
    failed = _failed(row)
    if failed:
        return failed
    profile = row.get("profile") or {}
    if profile.get("error"):
        return f"profile failed ({profile['error'][:40]})"
    for p in profile.get("passes") or []:
        if p["pass"] == name:
            return p
    return None


def _top_cell(p, names: KernelNames) -> str:
    if p is None or isinstance(p, str):
        return p or "–"
    return f"`{names(p['top_kernel'])}` ({p['top_kernel_share']:.1%})"


def _frac_cell(p) -> str:
    if p is None or isinstance(p, str):
        return p or "–"
    return f"{p['gemm_fraction']:.1%}"


def _training_fraction(row) -> str:
    f, b = _pass(row, "forward"), _pass(row, "backward")
    if isinstance(f, str) or f is None or isinstance(b, str) or b is None:
        return (f if isinstance(f, str) else None) or "–"
    total = f["gpu_time_us"] + b["gpu_time_us"]
    return f"{(f['gemm_us'] + b['gemm_us']) / total:.1%}" if total else "–"


def _measured_cell(row, render) -> str:
    """``render(row)`` for a measured row; ``–`` for none, the failure's word for a failed one."""
    if row is None:
        return "–"
    return _failed(row) or render(row)


def _time_cell(row) -> str:
    def render(row):
        ci = row.get("ci95_ms") or [None, None]
        return f"{row['median_ms']:.2f} [{ci[0]:.2f}–{ci[1]:.2f}]" if None not in ci else f"{row['median_ms']:.2f}"

    return _measured_cell(row, render)


def _mfu_cell(row) -> str:
    def render(row):
        if row.get("mfu") is None:
            return f"{row.get('achieved_tflops', 0):.2f} TFLOP/s"
        sheet = f"; {row['mfu_datasheet']:.1%}" if row.get("mfu_datasheet") is not None else ""
        return f"{row['mfu']:.1%}{sheet}"

    return _measured_cell(row, render)


def _memory_cell(row) -> str:
    if row is None:
        return "–"
    failed = _failed(row)
    if failed:
        return failed
    b = row.get("memory_breakdown_mb")
    if not b:
        return "–"
    gib = 1024
    return (f"{row['peak_mem_alloc_mb'] / gib:.1f} ({b['params'] / gib:.1f} + {b['grads'] / gib:.1f} + {b['optimizer'] / gib:.1f} + "
            f"{(b['rest'] + b.get('buffers', 0)) / gib:.1f})")


def _inflation_cell(row) -> str:
    profile = (row or {}).get("profile") or {}
    return f"×{profile['inflation']:.2f}" if profile.get("inflation") else "–"


def _failed(row) -> str | None:
    if row is None:
        return None
    status = row.get("status")
    return FAILED.get(status) if status != "ok" else None


def _case(row: dict) -> dict:
    return row.get("case") or row


def _group_key(row: dict) -> tuple:
    case = _case(row)
    return (case.get("dtype"), case.get("attn"), case.get("mode"), case.get("batch_size"), case.get("device"))


def _sizes(group: list[dict]) -> list[str]:
    present = {r.get("model") for r in group}
    return [m for m in SIZE_ORDER if m in present] + sorted(m for m in present if m not in SIZE_ORDER)


def _slug(text: str) -> str:
    import re

    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_").lower()[:80]


# ---------------------------------------------------------------------------------------------------
# Seed 003's own figures beside perflab's, its OOM cells against measured peaks, plots, and the summary

CAPACITIES_GIB = (12, 16, 24)  # common cards: RTX 3060 / 4060 Ti 16 GB / 4090
TIGHT_GIB = 0.5  # a card also holds the CUDA context (a few hundred MiB) outside the allocator's peak
GIB_MB = 1024.0


def _seed_group_key(groups: dict) -> tuple | None:
    """The group that runs as seed 003 ran: fp32, explicit attention, eager (batch 4 where there are several)."""
    keys = [k for k in groups if k[0] == "fp32" and k[1] == "explicit" and k[2] == "eager"]
    if not keys:
        return None
    return max(keys, key=lambda k: (k[3] == 4, sum(ok(r) for r in groups[k]), str(k)))


def _groups(rows: list[dict]) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        if not _case(row).get("max_memory"):
            groups.setdefault(_group_key(row), []).append(row)
    return groups


def _cells(group: list[dict]) -> dict:
    return {(_case(r).get("workload"), r.get("model"), _case(r).get("seq_len")): r for r in group}


def _gpu_memory_gib(rows: list[dict]) -> float | None:
    for r in rows:
        mem = (r.get("env") or {}).get("gpu_memory_gb")
        if mem:
            return float(mem)
    return None


def _seed_fmt(value, spec: str, suffix: str = "") -> str:
    if value is None:
        return "–"
    return f"{format(value, spec)}{suffix}" if seeds.is_number(value) else str(value)


def _attention(row) -> dict | None:
    return ((row or {}).get("profile") or {}).get("attention") if ok(row) else None


def _training_fraction_value(row) -> float | None:
    f, b = _pass(row, "forward"), _pass(row, "backward")
    if not isinstance(f, dict) or not isinstance(b, dict):
        return None
    total = f["gpu_time_us"] + b["gpu_time_us"]
    return (f["gemm_us"] + b["gemm_us"]) / total if total else None


def _perflab_missing(row) -> str:
    """A perflab cell with no figure: its failure, "not run", or "–" (not a case of the spec)."""
    return (_failed(row) or "–") if row is not None else "–"


def _share_cell(p) -> str:
    return f"{100 * p['top_kernel_share']:.1f}%" if isinstance(p, dict) else (p or "–")


def forward_ratios(cells: dict) -> list[tuple[str, int, float]]:
    """(model, seq, seed ms ÷ perflab median) over the cells where both have a forward time."""
    fig = seeds.seed003()
    out = []
    for m in fig["forward_ms"]:
        for s in fig["seq_lens"]:
            seed, row = seeds.cell("forward_ms", m, s), cells.get(("forward", m, s))
            if seeds.is_number(seed) and ok(row):
                out.append((m, s, seed / row["median_ms"]))
    return out


def seed_sections(rows: list[dict], capped: list[dict] | None = None) -> list[str]:
    """Seed 003's tables (a), (b)'s shares, (d) and (e), each beside perflab's value of the same cell with one line
    on what differs, then the study's OOM cells against perflab's measured peaks at 12, 16 and 24 GiB."""

    groups = _groups(rows)
    key = _seed_group_key(groups)
    fig = seeds.seed003()
    title = "### The GPT size study's figures beside perflab's"
    if key is None:
        return [title, "No group of stored rows runs as the study ran (fp32, explicit attention, eager), so there is nothing to put beside "
                       "the study's figures (src/perflab/report/study_figures.yaml)."]
    group = groups[key]
    cells, gpu = _cells(group), gpu_name(group)
    dtype, attn, mode, batch, device = key
    seqs, models = fig["seq_lens"], list(fig["forward_ms"])
    seq_cols = lambda m, s: [m, f"seq{s}"]  # noqa: E731
    parts = [f"{title} ({dtype}, {attn} attention, {mode}, batch {batch}, {gpu})",
             f"The study's figures are copied from its write-up into `src/perflab/report/study_figures.yaml` (its source and what it "
             f"measured are in the file's header): NVTX ranges under nsys, tables (b) and (e) from one iteration (the 6th), at a batch size "
             f"and on a GPU the study does not state. perflab's are this report's rows ({gpu}, batch {batch}): untraced medians for times, "
             f"a separate torch.profiler pass for kernel shares. \"not run\" marks a case of the spec without a stored row."]

    body = []
    for m in models:
        for s in seqs:
            seed, row = seeds.cell("forward_ms", m, s), cells.get(("forward", m, s))
            ratio = f"{seed / row['median_ms']:.1f}×" if seeds.is_number(seed) and ok(row) else "–"
            body.append(seq_cols(m, s) + [_seed_fmt(seed, ".2f"), _time_cell(row) if row is not None else "–", ratio])
    ratios = [r for _, _, r in forward_ratios(cells)]
    differs = ("What differs: the study's times are NVTX ranges under the profiler, at its batch size on its GPU; perflab's are "
               f"untraced medians at batch {batch} on {gpu}")
    differs += (f". Over the {len(ratios)} cells both measured the study's time is {span(ratios, '.1f', '×')} perflab's."
                if ratios else "; no cell has both yet.")
    parts += ["#### (a) Forward time (ms): study vs perflab",
              md_table(["Model", "Seq len", "Study (nsys range)", "perflab (median [95% CI])", "Study ÷ perflab"], body), differs]

    body, seed_shares, perflab_shares = [], [], []
    for m in models:
        for s in seqs:
            train = _training_row(cells, m, s)
            passes = (_pass(cells.get(("forward", m, s)), "forward"), _pass(train, "forward"), _pass(train, "backward"))
            line = seq_cols(m, s)
            for i, p in enumerate(passes):
                seed = seeds.cell("top_kernel_share_pct", m, s, i)
                line += [_seed_fmt(seed, ".1f", "%"), _share_cell(p) if p is not None else _perflab_missing(cells.get(("forward", m, s)) if i == 0 else train)]
                if seeds.is_number(seed) and isinstance(p, dict):
                    seed_shares.append(seed), perflab_shares.append(100 * p["top_kernel_share"])
            body.append(line)
    differs = ("What differs: both are the top kernel's share of its pass's kernel time (training = the forward and backward of a "
               "forward + backward step); the study's from iteration 6 under nsys on its GPU, perflab's from its profile pass on "
               f"{gpu}, whose cuBLAS picks other fp32 GEMM kernels (names in table (b) above)")
    differs += (f": over {len(seed_shares)} cells the study's shares are {span(seed_shares, '.1f', '%')}, perflab's "
                f"{span(perflab_shares, '.1f', '%')}." if seed_shares else ".")
    headers = ["Model", "Seq len"] + [f"{p.capitalize()}: {who}" for p in seeds.PASSES_B for who in ("study", "perflab")]
    parts += ["#### (b) Top kernel's share of each pass: study vs perflab", md_table(headers, body), differs]

    body, deltas = [], {"inference": [], "training": []}
    for m in models:
        for s in seqs:
            row, train = cells.get(("forward", m, s)), _training_row(cells, m, s)
            inf = _pass(row, "forward")
            ours = (("inference", 100 * inf["gemm_fraction"] if isinstance(inf, dict) else None, _frac_cell(inf) if row is not None else "–"),
                    ("training", units.to_percent(_training_fraction_value(train)), _training_fraction(train) if train is not None else "–"))
            line = seq_cols(m, s)
            for i, (kind, value, otherwise) in enumerate(ours):
                seed = seeds.cell("gemm_fraction_pct", m, s, i)
                line += [_seed_fmt(seed, ".1f", "%"), f"{value:.1f}%" if value is not None else otherwise]
                if seeds.is_number(seed) and value is not None:
                    deltas[kind].append(value - seed)
            body.append(line)
    differs = ("What differs: the same definition (GEMM kernel time ÷ the pass's kernel time), the study's under nsys on its GPU, "
               f"perflab's from its profile pass on {gpu}")
    said = [f"{kind} {sum(d) / len(d):+.1f} points on average over {len(d)} cells (from {min(d):+.1f} to {max(d):+.1f})"
            for kind, d in deltas.items() if d]
    differs += (": perflab − study, " + "; ".join(said) + "." if said else ".")
    parts += ["#### (d) GEMM fraction: study vs perflab",
              md_table(["Model", "Seq len", "Inference: study", "Inference: perflab", "Training: study", "Training: perflab"], body), differs]

    body, seed_ratio, perflab_ratio = [], [], []
    for m in models:
        for s in seqs:
            row = cells.get(("forward", m, s))
            att = _attention(row)
            otherwise = "no profile" if ok(row) else _perflab_missing(row)
            ours = ((att["softmax_ns"] / 1e6, att["matmul_ns"] / 1e6, units.to_percent(att.get("softmax_to_matmul"))) if att else (None, None, None))
            line = seq_cols(m, s)
            for table, value, spec, suffix in zip(("softmax_ms", "matmul_ms", "softmax_to_matmul_pct"), ours, (".3f", ".3f", ".1f"), ("", "", "%")):
                seed = seeds.cell(table, m, s)
                line += [_seed_fmt(seed, ".1f" if suffix else ".2f", suffix), format(value, spec) + suffix if value is not None else otherwise]
                if suffix and seeds.is_number(seed) and value is not None:
                    seed_ratio.append(seed), perflab_ratio.append(value)
            body.append(line)
    differs = ("What differs: the study's softmax and matmul times are NVTX range durations of iteration 6 under nsys (not kernel "
               "time); perflab's are the GPU kernel time launched inside the attn.softmax and the two attention-matmul ranges per step")
    differs += (f": over {len(seed_ratio)} cells the study's ratio is {span(seed_ratio, '.1f', '%')}, perflab's "
                f"{span(perflab_ratio, '.1f', '%')}, against a FLOP ratio of 5 : 4·head_dim (1.95% at head_dim 64)." if seed_ratio else ".")
    headers = ["Model", "Seq len", "Softmax ms: study", "Softmax ms: perflab", "Matmul ms: study", "Matmul ms: perflab",
               "Ratio: study", "Ratio: perflab"]
    parts += ["#### (e) Softmax vs matmul inside attention: study vs perflab", md_table(headers, body), differs]
    parts += oom_section(cells, group, capped or [])
    return parts


def _peak_gib(row) -> tuple[str, float | None]:
    """("ok", GiB) from an ok row's peak_mem_alloc_mb; ("oom", None) for an OOM on the full GPU; (cell text, None) otherwise."""
    if row is None:
        return "–", None
    if row.get("status") == "ok" and row.get("peak_mem_alloc_mb") is not None:
        return "ok", row["peak_mem_alloc_mb"] / GIB_MB
    if row.get("status") == "oom":
        return "oom", None
    return _failed(row) or "–", None


def fit_at_capacity(row, capacity_gib: float) -> str | None:
    """"OOM", "fits", "fits (tight)" at a capacity from the row's measured peak; None without one. An OOM on the
    full GPU is an OOM at every smaller capacity."""
    status, peak = _peak_gib(row)
    if status == "oom":
        return "OOM"
    if peak is None:
        return None
    if peak > capacity_gib:
        return "OOM"
    return "fits (tight)" if capacity_gib - peak < TIGHT_GIB else "fits"


def oom_pattern(cells: dict, inference_workload: str = "forward") -> dict[int, dict]:
    """Per capacity: {"match": [...], "mismatch": [...], "unknown": [...]} of (model, seq, "inference"|"training"),
    the study's OOM mark (tables (a) and (d)) against the prediction from perflab's peak of the same cell
    (inference: the ``inference_workload`` row; training: forward + backward)."""
    fig = seeds.seed003()
    out = {}
    for cap in CAPACITIES_GIB:
        result = {"match": [], "mismatch": [], "unknown": []}
        for m in fig["forward_ms"]:
            for s in fig["seq_lens"]:
                marks = seeds.seed_oom(m, s)
                for kind, row in (("inference", cells.get((inference_workload, m, s))), ("training", _training_row(cells, m, s))):
                    if marks[kind] is None:
                        continue
                    pred = fit_at_capacity(row, cap)
                    if pred is None:
                        result["unknown"].append((m, s, kind))
                    else:
                        result["match" if (pred == "OOM") == marks[kind] else "mismatch"].append((m, s, kind))
        out[cap] = result
    return out


def oom_section(cells: dict, group: list[dict], capped: list[dict]) -> list[str]:

    fig = seeds.seed003()
    gpu, full = gpu_name(group), _gpu_memory_gib(group)
    body = []
    for m in fig["forward_ms"]:
        for s in fig["seq_lens"]:
            marks = seeds.seed_oom(m, s)
            if not (marks["inference"] or marks["training"]):
                continue
            fwd, train = cells.get(("forward", m, s)), _training_row(cells, m, s)
            seed_cell = " / ".join("OOM" if marks[k] else ("–" if marks[k] is None else "ran") for k in ("inference", "training"))
            line = [m, f"seq{s}", seed_cell, _peak_cell(fwd), _peak_cell(train)]
            for cap in CAPACITIES_GIB:
                preds = []
                for kind, row in (("inference", fwd), ("training", train)):
                    pred = fit_at_capacity(row, cap)
                    mark = "" if pred is None or marks[kind] is None else (" ✓" if (pred == "OOM") == marks[kind] else " ✗")
                    preds.append((pred or "?") + mark)
                line.append(" / ".join(preds))
            body.append(line)
    pattern = oom_pattern(cells)
    n_seed_oom = sum(1 for m in fig["forward_ms"] for s in fig["seq_lens"] for v in seeds.seed_oom(m, s).values() if v)
    ran = [(m, s, k) for m in fig["forward_ms"] for s in fig["seq_lens"] for k, v in seeds.seed_oom(m, s).items()
           if v and ok(cells.get(("forward", m, s)) if k == "inference" else _training_row(cells, m, s))]
    full_text = f", {full:.0f} GB" if full else ""
    parts = ["#### The GPT size study's OOM cells against perflab's measured memory",
             f"The study printed OOM for {n_seed_oom} (model, sequence length, inference or training) cells; perflab ran {len(ran)} of them "
             f"to completion on {gpu}{full_text}. Which card would OOM where the study did? The capacity columns are **derived from "
             f"measured peaks, not run capped**: each cell's stored `peak_mem_alloc_mb` (the allocator's peak; uncapped rows of this "
             f"report) against 12, 16 and 24 GiB; \"tight\" is within {TIGHT_GIB} GiB of the capacity, which a real card's CUDA context "
             f"may take; \"?\" has no perflab peak. ✓: as the study (OOM where it printed OOM, fits where it ran); ✗: not as the study. "
             f"Each cell reads inference / training (forward + backward).",
             md_table(["Model", "Seq len", "Study: inference / training", "perflab forward: peak GiB",
                       "perflab fwd + bwd: peak GiB"] + [f"{c} GiB" for c in CAPACITIES_GIB], body)]
    body = []
    for cap in CAPACITIES_GIB:
        p = pattern[cap]
        known = len(p["match"]) + len(p["mismatch"])
        body.append([f"{cap} GiB", f"{len(p['match'])} of {known}", str(len(p["mismatch"])), str(len(p["unknown"]))])
    parts += ["Every cell the study has a mark for (OOM or a figure), per capacity:",
              md_table(["Capacity", "Cells as the study", "Cells not as the study", "Cells without a perflab peak"], body)]
    parts.append(_oom_verdict(pattern, cells))
    parts += capped_section(cells, capped)
    return parts


KIND_WORKLOAD = {"inference": "forward", "training": "forward_backward"}


def _capped_cells(capped: list[dict], dtype) -> dict:
    """(workload, model, seq, capacity GiB) -> the capped row (a "missing" row: a case of the spec not run yet)."""
    return {(_case(r).get("workload"), r.get("model"), _case(r).get("seq_len"), _case(r)["max_memory"] / 2 ** 30): r
            for r in capped if _case(r).get("dtype") == dtype}


def _run_mark(row) -> str | None:
    """"OOM" or "ran" from a capped row; None where it has neither (not run, an error, a timeout)."""
    status = row.get("status") if row else None
    return "OOM" if status == "oom" else "ran" if status == "ok" else None


def why_differ(cap: float, run: str, uncapped: dict | None, capped: dict) -> str:
    """One short line: why the capped run's OOM-or-ran differs from the verdict derived from the uncapped peak."""
    alloc = _peak_gib(uncapped)[1] if uncapped else None
    reserved = (uncapped or {}).get("peak_mem_reserved_mb")
    reserved = reserved / GIB_MB if reserved is not None else None
    if run == "OOM" and alloc is not None:
        if reserved is not None and reserved > cap:
            return f"{cap:g}: cap bounds reserved memory, {reserved:.2f} GiB uncapped (peak {alloc:.2f})"
        return f"{cap:g}: OOM at a {alloc:.2f} GiB peak: fragmentation under the cap"
    if run == "ran":
        peak = capped.get("peak_mem_alloc_mb")
        if peak is not None and alloc is not None:
            return f"{cap:g}: ran, peak {peak / GIB_MB:.2f} GiB capped vs {alloc:.2f} uncapped"
        return f"{cap:g}: ran; the full GPU's row is an OOM"
    return f"{cap:g}: no uncapped peak"


def capped_tally(cells: dict, capped: list[dict]):
    """Seed 003's cells run under ``--max-memory``: ``(caps, body, matched, agree)``, the section's table rows,
    per capacity [cells as the study, cells run], and [(cell, capacity) pairs where the run and the verdict derived
    from the uncapped peak agree, pairs with both]; None when no capped row is of these cells' dtype."""
    if not capped:
        return None
    fig = seeds.seed003()
    group_dtype = next((_case(r).get("dtype") for r in cells.values()), None)
    runs = _capped_cells(capped, group_dtype)
    if not runs:
        return None
    caps = sorted({k[3] for k in runs})
    body, matched, agree = [], {c: [0, 0] for c in caps}, [0, 0]
    for m in fig["forward_ms"]:
        for s in fig["seq_lens"]:
            for kind, mark in seeds.seed_oom(m, s).items():
                workload = KIND_WORKLOAD[kind]
                if mark is None or not any((workload, m, s, c) in runs for c in caps):
                    continue
                uncapped = cells.get((workload, m, s)) if kind == "inference" else _training_row(cells, m, s)
                line, as_run, as_derived, why = [m, f"seq{s}", kind, "OOM" if mark else "ran"], [], [], []
                for cap in caps:
                    row = runs.get((workload, m, s, cap))
                    run = _run_mark(row)
                    derived = fit_at_capacity(uncapped, cap) if uncapped else None
                    d_mark = None if derived is None else ("OOM" if derived == "OOM" else "ran")
                    if run is not None:
                        matched[cap][0] += run == ("OOM" if mark else "ran")
                        matched[cap][1] += 1
                        as_run += [f"{cap:g}"] if run == ("OOM" if mark else "ran") else []
                    as_derived += [f"{cap:g}"] if d_mark == ("OOM" if mark else "ran") else []
                    if run is not None and d_mark is not None:
                        agree[0] += run == d_mark
                        agree[1] += 1
                        if run != d_mark:
                            why.append(why_differ(cap, run, uncapped, row))
                    if row is None:  # not a case of the spec
                        line.append("–")
                        continue
                    run_text = (_failed(row) or "not run") if run is None else run + (" ✓" if run == ("OOM" if mark else "ran") else " ✗")
                    line.append(f"{run_text} / {derived or '?'}")
                any_run = any(_run_mark(runs.get((workload, m, s, c))) for c in caps)
                line += [(", ".join(as_run) or "none") if any_run else "–", ", ".join(as_derived) or "none", "; ".join(why) or "–"]
                body.append(line)
    return (caps, body, matched, agree) if body else None


def _capped_counts(caps, matched: dict) -> list[str]:
    """Per capacity run, "12 GiB 32 of 40": the cells run capped that gave the study's mark, of those run."""
    return [f"{c:g} GiB {matched[c][0]} of {matched[c][1]}" for c in caps if matched[c][1]]


def capped_section(cells: dict, capped: list[dict]) -> list[str]:
    """Seed 003's cells run under ``--max-memory`` at each capacity: per cell, the run's OOM-or-ran against the study's
    mark and beside the verdict derived from the uncapped peak, the capacities that reproduce the study (run; derived),
    and where run and derived disagree, why, in one line."""
    tally = capped_tally(cells, capped)
    if tally is None:
        return []
    caps, body, matched, agree = tally
    verdict = _capped_counts(caps, matched)
    exact = [f"{c:g} GiB" for c in caps if matched[c][1] and matched[c][0] == matched[c][1]]
    text = ("Run capped, cells as the study per capacity: " + ", ".join(verdict) + "; "
            + (f"{' and '.join(exact)} reproduce{'s' if len(exact) == 1 else ''} the study's pattern on every cell run." if exact
               else "no capacity reproduces the study's pattern on every cell run.")) if verdict else "No capped case has run yet."
    if agree[1]:
        text += f" The capped runs agree with the verdict derived from the uncapped peaks in {agree[0]} of {agree[1]} (cell, capacity) pairs."
    return ["#### The GPT size study's OOM cells run capped (`--max-memory`)",
            "The same cells, run under `--max-memory` (the allocator may reserve at most the cap: "
            "`torch.cuda.set_per_process_memory_fraction`), measured rather than derived. Each capacity's cell reads "
            "run / derived: the capped run's OOM or ran (✓ as the study, ✗ not), then the verdict derived from the uncapped "
            "peak above. \"Why\" gives, where run and derived disagree, the reason in one line (capacity first).",
            md_table(["Model", "Seq len", "Cell", "Study"] + [f"{c:g} GiB: run / derived" for c in caps]
                     + ["As the study (run)", "As the study (derived)", "Why run ≠ derived"], body),
            text]


def _peak_cell(row) -> str:
    status, peak = _peak_gib(row)
    if status == "ok":
        return f"{peak:.2f}"
    return "OOM" if status == "oom" else status


def _cells_text(cells: list[tuple]) -> str:
    return ", ".join(f"{m} seq{s} {k}" for m, s, k in cells)


def _oom_verdict(pattern: dict, cells: dict) -> str:
    best = max(CAPACITIES_GIB, key=lambda c: (len(pattern[c]["match"]) - len(pattern[c]["mismatch"]), -c))
    known = {c: len(pattern[c]["match"]) + len(pattern[c]["mismatch"]) for c in CAPACITIES_GIB}
    if not known[best]:
        return "No cell of the study has a perflab peak yet, so no capacity can be tested against its pattern."
    exact = [c for c in CAPACITIES_GIB if not pattern[c]["mismatch"]]
    unknown = len(pattern[best]["unknown"])
    rest = f"; {unknown} of the study's cells have no perflab peak yet" if unknown else ""
    if exact:
        text = (f"Derived from measured peaks: {' and '.join(f'{c} GiB' for c in exact)} reproduce{'s' if len(exact) == 1 else ''} "
                f"the study's pattern on all {known[exact[0]]} cells perflab measured{rest}.")
    else:
        score = lambda c: len(pattern[c]["match"]) - len(pattern[c]["mismatch"])  # noqa: E731
        closest = [c for c in CAPACITIES_GIB if score(c) == score(best)]
        text = (f"Derived from measured peaks: no capacity reproduces the study's pattern; {' and '.join(f'{c} GiB' for c in closest)} "
                f"come{'s' if len(closest) == 1 else ''} closest, {len(pattern[best]['match'])} of {known[best]} cells{rest}.")
    for cap in CAPACITIES_GIB:
        if pattern[cap]["mismatch"]:
            text += f" Not as the study at {cap} GiB: {_cells_text(pattern[cap]['mismatch'])}."
    alt = oom_pattern(cells, inference_workload="train_forward")
    alt_text = ", ".join(f"{c} GiB {len(alt[c]['match'])} of {len(alt[c]['match']) + len(alt[c]['mismatch'])}" for c in CAPACITIES_GIB)
    return (text + f" If the study's forward kept autograd on (no `torch.no_grad`; perflab's `train_forward` peak in place of "
            f"`forward`'s), the cells as the study would be: {alt_text}.")


def _kernel_plot(cells, sizes, seqs, heading: str, plot_dir: Path, with_seed: bool) -> list[str]:
    """GEMM fraction (inference; training) and softmax ÷ matmul time against sequence length per model, from the rows'
    profile data; in the study's group its figures too, dotted."""
    inference, training, ratio, styles = {}, {}, {}, {}
    for i, m in enumerate(sizes):
        color = f"C{i % 10}"
        inf = [(s, 100 * p["gemm_fraction"]) for s in seqs if isinstance(p := _pass(cells.get(("forward", m, s)), "forward"), dict)]
        train = [(s, 100 * v) for s in seqs if (v := _training_fraction_value(_training_row(cells, m, s))) is not None]
        att = [(s, 100 * a["softmax_to_matmul"]) for s in seqs
               if (a := _attention(cells.get(("forward", m, s)))) and a.get("softmax_to_matmul") is not None]
        for series, points in ((inference, inf), (training, train), (ratio, att)):
            if points:
                series[m] = points
        styles[m] = {"color": color}
        if with_seed:
            label = f"study {m}"
            styles[label] = {"color": color, "ls": ":", "marker": "x"}
            for series, table, index in ((inference, "gemm_fraction_pct", 0), (training, "gemm_fraction_pct", 1),
                                         (ratio, "softmax_to_matmul_pct", None)):
                points = [(s, v) for s in seqs if seeds.is_number(v := seeds.cell(table, m, s, index))]
                if points and m in series:
                    series[label] = points
    if not (inference or training or ratio):
        return []
    panels = {"GEMM fraction, inference forward": ("GEMM time / kernel time (%)", inference, styles),
              "GEMM fraction, training (fwd + bwd)": ("GEMM time / kernel time (%)", training, styles),
              "softmax / matmul time in attention": ("softmax time / matmul time (%)", ratio, styles)}
    panels = {k: v for k, v in panels.items() if v[1]}
    seed_note = "; the GPT size study dotted" if with_seed else ""
    path = plots.panels_vs_length(panels, plot_dir / f"lm_kernels_{_slug(heading)}.png", f"Kernel mix vs sequence length ({heading}{seed_note})")
    return [f"![GEMM fraction and softmax/matmul time vs sequence length]({path.name})"]


def summary(rows: list[dict]) -> list[str]:
    """A few sentences with the study's numbers, each computed from the rows (the report opens with them)."""
    uncapped = [r for r in rows if not _case(r).get("max_memory")]
    groups = _groups(uncapped)
    stored = [r for r in uncapped if r.get("status") != "missing"]
    gpu = gpu_name(stored)
    missing = len(uncapped) - len(stored)
    said = counts_text(stored)
    capped = [r for r in rows if _case(r).get("max_memory")]
    capped_run = [r for r in capped if r.get("status") != "missing"]
    capped_text = (f"; {len(capped_run)} of {len(capped)} cases capped with `--max-memory` stored"
                   + (f" ({counts_text(capped_run)})" if capped_run else "")) if capped else ""
    out = [f"Language models: {len(stored)} of {len(uncapped)} cases stored, on {gpu} ({said})"
           + (f"; {missing} not run" if missing else "") + capped_text + "."]
    key = _seed_group_key(groups) or max(groups, key=lambda k: sum(ok(r) for r in groups[k]), default=None)
    if key is None:
        return out
    cells = _cells(groups[key])
    dtype, attn, mode, batch, _ = key
    seqs = sorted({s for (_, _, s) in cells if s is not None})
    growth = []
    for m in _sizes(groups[key]):
        ends = [cells.get(("forward", m, s)) for s in (seqs[0], seqs[-1])] if seqs else []
        if len(seqs) > 1 and all(ok(r) for r in ends):
            a, b = ends[0]["median_ms"], ends[1]["median_ms"]
            growth.append(f"{m} {a:.2f} → {b:.2f} ms (×{b / a:.1f})")
    if growth:
        out.append(f"Inference forward ({dtype}, {attn} attention, {mode}, batch {batch}) from seq {seqs[0]} to seq {seqs[-1]} "
                   f"(×{seqs[-1] / seqs[0]:g} tokens): " + ", ".join(growth) + ".")
    inf = [100 * p["gemm_fraction"] for (w, _, _), r in cells.items() if w == "forward" and isinstance(p := _pass(r, "forward"), dict)]
    train = [100 * v for (w, m, s), r in cells.items() if w == "forward_backward" and (v := _training_fraction_value(r)) is not None]
    if inf or train:
        text = []
        if inf:
            text.append(f"{span(inf, '.1f', '%')} of the inference forward's kernel time")
        if train:
            text.append(f"{span(train, '.1f', '%')} of training's (forward + backward)")
        sentence = "GEMM kernels take " + " and ".join(text)
        longest = max((s for (w, _, s), r in cells.items() if w == "forward" and _attention(r)), default=None)
        if longest is not None:
            ratios = [(m, 100 * a["softmax_to_matmul"]) for (w, m, s), r in sorted(cells.items(), key=lambda kv: SIZE_ORDER.index(kv[0][1])
                                                                                    if kv[0][1] in SIZE_ORDER else 9)
                      if w == "forward" and s == longest and (a := _attention(r)) and a.get("softmax_to_matmul") is not None]
            if ratios:
                sentence += (f"; at seq {longest} softmax takes " + ", ".join(f"{v:.1f}% ({m})" for m, v in ratios)
                             + " of the attention matmuls' time, for 5 : 4·head_dim of their FLOPs (1.95% at head_dim 64)")
        out.append(sentence + ".")
    with_mfu = [r for r in stored if ok(r) and r.get("mfu") is not None]
    if with_mfu:
        best = max(with_mfu, key=lambda r: r["mfu"])
        c = _case(best)
        out.append(f"Best MFU: {100 * best['mfu']:.1f}% of the measured {c.get('dtype')} matmul peak, by counted FLOPs ({best.get('model')} "
                   f"{c.get('workload')}, seq {c.get('seq_len')}, {c.get('dtype')}, {c.get('attn')} attention, {c.get('mode')}).")
    fast = _dtype_speedups(groups, key)
    if fast:
        other, values = fast
        out.append(f"{other[0]} with {other[1]} attention runs the inference forward {span(values, '.1f', '×')} as fast as "
                   f"{dtype} with {attn} attention over the {len(values)} cells both ran.")
    if key == _seed_group_key(groups):
        ratios = [r for _, _, r in forward_ratios(cells)]
        pattern = oom_pattern(cells)
        fig = seeds.seed003()
        oom_cells = [(m, s, k) for m in fig["forward_ms"] for s in fig["seq_lens"] for k, v in seeds.seed_oom(m, s).items() if v]
        ran = [c for c in oom_cells if ok(cells.get(("forward", c[0], c[1])) if c[2] == "inference" else _training_row(cells, c[0], c[1]))]
        sentence = "Against the GPT size study: "
        if ratios:
            sentence += (f"its nsys-range forward times are {span(ratios, '.1f', '×')} perflab's untraced medians over the "
                         f"{len(ratios)} cells both measured; ")
        sentence += f"of its {len(oom_cells)} OOM cells perflab ran {len(ran)} to completion on {gpu}"
        known = {len(pattern[c]["match"]) + len(pattern[c]["mismatch"]) for c in CAPACITIES_GIB}
        if known != {0}:
            sentence += (f"; from the measured peaks (derived, not run capped) a {', '.join(str(c) for c in CAPACITIES_GIB[:-1])} or "
                         f"{CAPACITIES_GIB[-1]} GiB card matches the study's OOM-or-ran mark in "
                         f"{', '.join(str(len(pattern[c]['match'])) for c in CAPACITIES_GIB[:-1])} and {len(pattern[CAPACITIES_GIB[-1]]['match'])} "
                         f"of the {max(known)} cells perflab measured")
        tally = capped_tally(cells, [r for r in rows if _case(r).get("max_memory")])
        if tally is not None:
            caps, _, matched, agree = tally
            sentence += ("; run capped (`--max-memory`), " + ", ".join(_capped_counts(caps, matched))
                         + (f", agreeing with the derived verdict in {agree[0]} of {agree[1]} (cell, capacity) pairs" if agree[1] else ""))
        out.append(sentence + ".")
    return out


def _dtype_speedups(groups: dict, key: tuple):
    """The other (dtype, attention) group with the same mode and batch: its forward speedup over ``key``'s per shared cell."""
    base = _cells(groups[key])
    for other, group in sorted(groups.items(), key=lambda kv: str(kv[0])):
        if other == key or other[2:] != key[2:]:
            continue
        cells = _cells(group)
        values = [base[k]["median_ms"] / r["median_ms"] for k, r in cells.items() if k[0] == "forward" and ok(r) and ok(base.get(k))]
        if values:
            return other, values
    return None
