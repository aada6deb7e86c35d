"""Seed 003's tables for the language-model rows of a sweep, with CIs and failure cells, plus MFU and memory.

Per group of rows that share dtype, attention, mode and batch size:

- (a) step time per workload (median ms with its 95% CI): sizes × sequence lengths;
- (b) the top kernel of each pass (inference forward; the training step's forward and backward) and its share;
- (c) the top non-GEMM kernel of the inference forward: share, time and launches per step;
- (d) the GEMM fraction of inference against training (forward + backward);
- (e) softmax against matmul inside explicit attention, with the FLOP ratio 5 : 4·head_dim beside the time ratio;
- MFU against the measured bf16/fp32 matmul peak of this GPU and against the datasheet; peak memory with its
  breakdown; the profiler's inflation (timings are untraced; (b)–(e) come from a separate profiled pass).

Kernel names are the short names of ``analysis.names`` (at most 120 characters, one per kernel); the report
maps each to its full name in a legend. Torch-free.
"""

from __future__ import annotations

from pathlib import Path

from perflab.analysis.names import KernelNames
from perflab.report import plots

SIZE_ORDER = ("gpt_small", "gpt_medium", "gpt_large", "gpt_xl", "gpt_2.7b")
WORKLOAD_TITLES = {"forward": "inference forward", "train_forward": "training forward (autograd recording)",
                   "forward_backward": "forward + backward", "train_step": "training step (forward, backward, AdamW)"}
FAILED = {"oom": "OOM", "error": "ERROR", "timeout": "TIMEOUT", "invalid": "INVALID", "missing": "not run"}


def sections(rows: list[dict], plot_dir: Path, names: KernelNames | None = None) -> list[str]:
    """The section's markdown parts; kernel names go through ``names`` (the report's, for its legend)."""
    from perflab.report.markdown import md_table

    names = names if names is not None else KernelNames()

    parts = ["## Language models (seed 003)",
             "Step times are untraced medians with their 95% CI; the kernel tables come from a separate profiled pass of the same case "
             "(the profiler's inflation is listed last). GEMM fraction = GEMM kernel time ÷ the pass's kernel time. A failed cell says "
             "OOM, ERROR or TIMEOUT; \"not run\" marks a case of the spec without a stored row."]
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault(_group_key(row), []).append(row)
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
            parts += [f"#### MFU: {WORKLOAD_TITLES[w]} (measured peak; datasheet peak)",
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
                    if r and r.get("status") == "ok":
                        ci = r.get("ci95_ms") or [r["median_ms"]] * 2
                        points.append((s, r["median_ms"], ci[0], ci[1]))
                if points:
                    series[m] = points
            if series:
                path = plots.time_vs_length(series, plot_dir / f"lm_forward_time_{_slug(heading)}.png",
                                            f"Forward time vs sequence length ({heading})", "sequence length (tokens)")
                parts.append(f"![forward time vs sequence length]({path.name})")
    return parts


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
            att = ((r or {}).get("profile") or {}).get("attention") if r and r.get("status") == "ok" else None
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


def _time_cell(row) -> str:
    if row is None:
        return "–"
    failed = _failed(row)
    if failed:
        return failed
    ci = row.get("ci95_ms") or [None, None]
    return f"{row['median_ms']:.2f} [{ci[0]:.2f}–{ci[1]:.2f}]" if None not in ci else f"{row['median_ms']:.2f}"


def _mfu_cell(row) -> str:
    if row is None:
        return "–"
    failed = _failed(row)
    if failed:
        return failed
    if row.get("mfu") is None:
        return f"{row.get('achieved_tflops', 0):.2f} TFLOP/s"
    sheet = f"; {row['mfu_datasheet']:.1%}" if row.get("mfu_datasheet") is not None else ""
    return f"{row['mfu']:.1%}{sheet}"


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
