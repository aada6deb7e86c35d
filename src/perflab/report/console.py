"""Rich tables for the terminal."""

from __future__ import annotations

from typing import Iterable

from rich.markup import escape

from perflab import units
from perflab.report.fit import Column, FittedTable
from perflab.report.md import formula_cell, gflops
from perflab.stats import ci_note, row_ci_note  # noqa: F401  (row_ci_note: report.program's)


def model_label(row: dict) -> str:
    """A row's model, with its token reduction; ``?`` for a stored row that lost its model (the store keeps it optional,
    as it keeps its batch size, dtype and mode, each shown as ``?`` in ``bench_table`` too)."""
    label = str(row.get("model") or "?")
    if row.get("keep_rate"):
        rates = "/".join(f"{r:g}" for r in row["keep_rate"])
        label += f" kr{rates}@{','.join(map(str, row.get('reduction_loc') or []))}"
    return label


def shape_label(row: dict) -> str:
    """The family's shape of a row: ``224px``; ``train_step seq512``; ``decode ctx4096`` (workloads.FamilySpec.shape)."""
    from perflab.workloads import family_of_row

    family = family_of_row(row)
    fields = dict(row.get("case") or {})
    for key in ("input_size", "workload"):  # rows of perflab 0.1 carry these at the top
        fields.setdefault(key, row.get(key))
    return " ".join(str(p) for p in family.shape(fields))


def row_label(row: dict) -> str:
    if row.get("label"):
        return row["label"]
    return f"{model_label(row)} {shape_label(row)} bs{row.get('batch_size')} {row.get('dtype')} {row.get('mode')}"


def _unit(rows: list[dict]) -> str:
    from perflab.workloads import item_of

    return {"img": "img", "token": "tok"}.get(item_of(rows), "item")


def ms_significant(value, like=None) -> str:
    """A time in ms to four significant figures, without an exponent: 152.3, 27.45, 0.8562, 12346; ``like``: with as
    many decimals as that value takes (a CI's ends as its median)."""
    if value is None:
        return "–"
    magnitude = abs(like if like is not None else value)
    decimals = 0 if magnitude >= 1000 else 1 if magnitude >= 100 else 2 if magnitude >= 10 else 3 if magnitude >= 1 else 4
    return f"{value:.{decimals}f}"


def bench_table(rows: list[dict], title: str | None = None) -> FittedTable:
    unit = _unit(rows)
    classify_only = unit == "img"
    any_gpu = any(r.get("mfu") is not None for r in rows)
    any_mbu = any(r.get("mbu") is not None for r in rows)
    any_formula = any_gpu and any(r.get("flops_analytic") for r in rows)
    any_canary = any(row.get("host_canary_us") is not None for row in rows)
    on_nodes = any(row.get("node_host") for row in rows)  # rows of a Ray sweep: where each ran
    full_ci = not any(row_ci_note(r) for r in rows if r.get("status") == "ok")

    def cells(fn):
        return [fn(row) for row in rows]

    def ok(row):
        return row.get("status") == "ok"

    def timing(row):
        ci = row.get("ci95_ms") or [None, None]
        if not ok(row):
            return "–"
        note = row_ci_note(row)
        median = row["median_ms"]
        return f"{ms_significant(median)} ({ms_significant(ci[0], median)}–{ms_significant(ci[1], median)})" + (f" {note}" if note else "")

    def throughput(row):
        return row.get("items_per_s", row.get("throughput_per_s")) if not classify_only else row.get("throughput_per_s")

    def peak(row):  # reserved where the case was timed alone; allocated where cases shared the allocator (interleaved)
        return row.get("peak_mem_reserved_mb") if row.get("peak_mem_reserved_mb") is not None else row.get("peak_mem_alloc_mb")

    ok_rows = [r for r in rows if ok(r)]
    # flags every row carries are said once, under the table (as the markdown report does)
    common = set.intersection(*(set(r.get("flags") or []) for r in ok_rows)) if len(ok_rows) > 1 else set()

    def status(row):
        if not ok(row):
            return f"[red]{row['status']}[/red]: {escape(row.get('message') or '')}"
        return ", ".join(f for f in row.get("flags") or [] if f not in common) or ("–" if common else "[green]ok[/green]")

    from perflab.report.versions import version_cell, version_header

    version = version_header(rows)  # rows of ab or track: which revision or interpreter each is
    columns = ([Column(version, cells(lambda r: escape(version_cell(r.get("version")))), key=True, caption_as=f"{version} {{}}")]
               if version else []) + [
        Column("model", cells(lambda r: escape(model_label(r))), key=True, short=True, caption_as="{}"),
        Column("size" if classify_only else "shape", cells(lambda r: escape(shape_label(r))), "right" if classify_only else "left", key=True, caption_as="{}"),
        Column("bs", cells(lambda r: str(r.get("batch_size") or "?")), "right", key=True, caption_as="bs {}"),
        Column("dtype", cells(lambda r: escape(str(r.get("dtype") or "?"))), key=True, caption_as="{}"),
        Column("mode", cells(lambda r: escape(str(r.get("mode") or "?"))), key=True, caption_as="{}"),
        Column(("ms/batch" if classify_only else "ms/step") + (" (95% CI)" if full_ci else " (CI)"), cells(timing), "right"),
        Column(f"ms/{unit}" if classify_only else "ms/sample", cells(lambda r: ms_significant(r.get("latency_ms_per_sample"))), "right", drop=2),
        Column(f"{unit}/s", cells(lambda r: units.num(throughput(r), ".1f", keep_nan=True)), "right"),
        Column("GFLOPs/img" if classify_only else "GFLOPs/sample", cells(lambda r: gflops(r.get("gflops"))), "right", drop=5),
    ]
    if any_gpu:
        columns.append(Column("MFU (counted)", cells(lambda r: units.num(r.get("mfu"), ".1%", keep_nan=True)), "right"))
    if any_formula:
        columns.append(Column("MFU formula (÷)", cells(formula_cell), "right", drop=4))
    if any_mbu:
        columns.append(Column("MBU", cells(lambda r: units.num(r.get("mbu"), ".1%", keep_nan=True)), "right"))
    if classify_only:
        columns.append(Column("tokens", cells(lambda r: "→".join(map(str, r["tokens"])) if r.get("tokens") else "–"), key=True, drop=3,
                              caption_as="{} tokens"))
    columns += [Column("peak MiB", cells(lambda r: units.num(peak(r), ".0f", keep_nan=True)), "right", drop=6),
                Column("W", cells(lambda r: units.num(r.get("power_w"), ".0f", keep_nan=True)), "right", drop=7)]
    if any_canary:  # the host canary (measure.canary): the host's speed before the case
        columns.append(Column("host µs", cells(canary_cell), "right", drop=1))
    columns.append(Column("status / flags", cells(status), wrap=True))
    if on_nodes:
        columns += [Column("node", cells(lambda r: escape(f"{r.get('node_host') or '–'}:{(r.get('node_id') or '')[:6]}")), key=True),
                    Column("GPU", cells(lambda r: escape(r.get("gpu_name") or "–")), key=True)]
    caption = [f"flags on every row: {', '.join(f for f in ok_rows[0]['flags'] if f in common)}"] if common else []
    caption += [HOST_CAPTION] if any_canary else []
    return FittedTable(columns, title=title, caption=caption + ([] if full_ci else [CI_CAPTION]))


HOST_CAPTION = ("host µs: the host's speed around the case, a fixed CPU micro-workload (Python and tiny torch ops) timed before and "
                "after the timed loop, µs a run (lower: a faster host), and its ratio to the median of its environment's rows")


CI_CAPTION = ("CI: 95% from 5 or more units (processes, or stretches of the run); from fewer, the coverage they guarantee "
              "(4 units: ≥87.5%, 3: ≥75%; min–max of n samples: 1 − 2^(1−n), 50% for 2)")


def canary_cell(row: dict) -> str:
    """The row's host canary, µs, with its ratio to its environment's median where one was computed: ``412 (1.29×)``."""
    value = row.get("host_canary_us")
    if value is None:
        return "–"
    ratio = row.get("host_canary_ratio")
    return f"{value:.0f}" + (f" ({ratio:.2f}×)" if ratio is not None else "")


def warning_lines(rows: list[dict]) -> list[str]:
    """The warnings of a run's rows, each said once (rich markup). A failed row: its line. Then one line for what the
    rows share and what a busy host causes: each flag on every row, or on the rows named (their short labels), with its
    message where the rows' are alike, else its summary (``measure.checks.FLAG_SUMMARIES``). Then one line per row
    for each other warning, with its numbers. A warning of no flag (past the row's flags: a process of ``--processes``
    that failed) is said once where every row has it, else on its rows' lines. Expected absences (no power meter on a
    CPU) are no warnings."""
    from perflab.host_flags import HOST_CONTENTION_FLAG
    from perflab.measure.checks import BUSY_BIMODAL, FLAG_SUMMARIES, NOISE_FLAGS

    lines = [f"[red]{r['status']}[/red]: {escape(row_label(r))}: {escape(str(r.get('message')))}" for r in rows if r.get("status") != "ok"]
    ok = [r for r in rows if r.get("status") == "ok"]
    hits: dict[str, list[tuple[dict, str]]] = {}
    unflagged: dict[str, list[dict]] = {}  # a warning with no flag of its own, by message
    for row in ok:
        flags, warnings = row.get("flags") or [], row.get("warnings") or []
        for flag, message in zip(flags, warnings):
            hits.setdefault(flag, []).append((row, message))
        for message in warnings[len(flags):]:
            unflagged.setdefault(message, []).append(row)
        if row.get("pin_warning"):
            hits.setdefault("pinning", []).append((row, row["pin_warning"]))
    if not hits and not unflagged:
        return lines
    if len(ok) == 1:
        return lines + [f"[yellow]warning[/yellow]: {escape(row_label(ok[0]))}: "
                        + " | ".join([f"{flag}: {escape(h[0][1])}" for flag, h in hits.items()] + [escape(m) for m in unflagged])]
    labels = table_names(rows)
    shared, own = [], []
    for flag, found in hits.items():
        # two modes on rows whose timing thread waited for a CPU: the slow mode may be the other work's, a busy host's
        # doing as high_cv is, said once with it (not on each row's line as the step's own)
        busy_modes = flag == "bimodal" and all(HOST_CONTENTION_FLAG in (r.get("flags") or []) for r, _ in found)
        if len(found) == len(ok) or flag in NOISE_FLAGS or busy_modes:
            messages = {m for _, m in found}
            text = BUSY_BIMODAL if busy_modes else messages.pop() if len(messages) == 1 else FLAG_SUMMARIES.get(flag, found[0][1])
            who = "every row" if len(found) == len(ok) else ", ".join(labels[row_label(r)] for r, _ in found)
            shared.append(escape(f"{flag} ({who}): {text}"))
        else:
            own += [f"[yellow]warning[/yellow]: {escape(row_label(r))}: {escape(m)}" for r, m in found]
    for message, found in unflagged.items():
        if len(found) == len(ok):
            shared.append(escape(f"every row: {message}"))
        else:
            own += [f"[yellow]warning[/yellow]: {escape(row_label(r))}: {escape(message)}" for r in found]
    return lines + ([f"[yellow]warning[/yellow]: {' | '.join(shared)}"] if shared else []) + own


def table_names(rows: list[dict]) -> dict[str, str]:
    """Each row's name as the table shows it: the words of its label (model, shape, ``bs8``, dtype, mode) that not
    every row shares, in order (``deit_tiny_patch16_224 bs8``); its whole label where that would not tell it apart."""
    words = {label: label.split(" ") for label in dict.fromkeys(row_label(r) for r in rows)}
    shared = set.intersection(*(set(w) for w in words.values())) if words else set()
    names = {label: " ".join(w for w in ws if w not in shared) or label for label, ws in words.items()}
    if len(set(names.values())) < len(names):
        return {label: label for label in names}
    return names


def exempt_line(rows: Iterable[dict], limit: int = 6) -> str | None:
    """One sentence on the rows the host flags were not applied to, and why; None when there are none."""
    from perflab.measure.canary import EXEMPT_KEY, HOST_BOUND_THRESHOLD, HOST_CONTENTION_FLAG, HOST_DRIFT_FLAG

    exempt = [r for r in rows if EXEMPT_KEY in r]
    if not exempt:
        return None
    names = [row_label(r) for r in exempt]
    shown = ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")
    waived = [f"{row_label(r)}: {', '.join(r[EXEMPT_KEY])}" for r in exempt if r[EXEMPT_KEY]]
    return (f"Host flags ({HOST_DRIFT_FLAG}, {HOST_CONTENTION_FLAG}) are not applied to {len(exempt)} GPU-bound row(s), whose host "
            f"issue time is under {HOST_BOUND_THRESHOLD:.0%} of the step time (a host up to {1 / HOST_BOUND_THRESHOLD:.0f}× slower "
            f"cannot lengthen them): {shown}" + (f"; waived: {'; '.join(waived)}." if waived else "."))


def _compared_value(field: str, row: dict) -> str:
    return escape({"model": model_label, "batch size": lambda r: f"bs {r['batch_size']}", "dtype": lambda r: r["dtype"],
            "mode": lambda r: r["mode"]}[field](row))


def comparison_tables(rows: list[dict], fields: dict | None = None, title: str | None = None) -> list[FittedTable]:
    """One table per compared field (``report.tables.comparisons``: rows alike but for a model, a batch size, a
    dtype or a mode): each variant against its baseline at the same point, with the paired speedup and its CI."""
    from perflab.report.tables import comparisons

    return [comparison_table(pairs, field, title) for field, pairs in comparisons(rows, fields).items()]


def speedup_table(rows: list[dict]) -> FittedTable | None:
    """The demo's: each token-reduction model against its baseline at the same point."""
    from perflab.report.tables import COMPARED

    tables = comparison_tables(rows, {"model": COMPARED["model"]}, title="Top-k vs baseline")
    return tables[0] if tables else None


def comparison_table(pairs: list[dict], field: str, title: str | None = None) -> FittedTable:
    unit = _unit([r for p in pairs for r in p["rows"]])
    any_paired = any(p.get("paired") for p in pairs)
    full_ci = not any(ci_note(p.get("speedup_ci_coverage"), p.get("speedup_ci_range_of")) for p in pairs if p.get("paired"))

    def cells(fn):
        return [fn(p) for p in pairs]

    def point(name, header, fn, caption_as="{}", justify="left"):  # a field both sides share (the compared one: baseline, variant)
        return [] if name == field else [Column(header, cells(lambda p: escape(fn(p["rows"][1]))), justify, key=True, short=name == "model",
                                                caption_as=caption_as)]

    def verdict(p):
        if p["speedup"] is None:
            return f"{p['baseline_status']}/{p['variant_status']}"
        text = ("faster" if p["faster"] else "slower") + ("" if p["significant"] else " (within noise)")
        return text + (" (host-dependent)" if p.get("host_dependent") else "")

    def speedup(p):
        return f"{p['speedup']:.2f}×" if p["speedup"] is not None else "–"

    def ci(p):
        c = p.get("speedup_ci95")
        if not c:
            return "unpaired" if p["speedup"] is not None else "–"
        note = ci_note(p.get("speedup_ci_coverage"), p.get("speedup_ci_range_of"))
        return f"{c[0]:.3f}–{c[1]:.3f}" + (f" {note}" if note else "")

    def gflops_cell(p):
        b, v = p.get("baseline_gflops"), p.get("variant_gflops")
        return "–" if b is None or v is None else (gflops(b) if gflops(b) == gflops(v) else f"{gflops(b)} → {gflops(v)}")

    columns = [Column("baseline", cells(lambda p: _compared_value(field, p["rows"][0])), key=True, short=True),
               Column("variant", cells(lambda p: _compared_value(field, p["rows"][1])), key=True, short=True)]
    columns += (point("model", "model", model_label) + point("shape", "size" if unit == "img" else "shape", shape_label)
                + point("batch size", "bs", lambda r: str(r["batch_size"]), "bs {}", "right") + point("dtype", "dtype", lambda r: r["dtype"])
                + point("mode", "mode", lambda r: r["mode"]))
    # Narrow, the throughputs go first (the speedup is their ratio), then the CI (the verdict says whether it holds 1),
    # and the FLOPs last: what a reduction of tokens or a batch size changes in the work is this table's other question.
    columns += [Column(f"baseline {unit}/s", cells(lambda p: units.num(p["baseline_items_per_s"], ".1f", keep_nan=True)), "right", drop=1),
                Column(f"variant {unit}/s", cells(lambda p: units.num(p["variant_items_per_s"], ".1f", keep_nan=True)), "right", drop=2),
                Column("speedup", cells(speedup), "right")]
    if any_paired:
        columns.append(Column("paired 95% CI" if full_ci else "paired CI", cells(ci), "right", wrap=True, drop=3))
    columns += [Column(f"GFLOPs/{unit}" if unit == "img" else "GFLOPs/sample", cells(gflops_cell), "right", wrap=True, drop=4),
                Column("verdict", cells(verdict), wrap=True)]
    caption = []
    if any_paired:
        caption.append(f"speedup: the variant's {unit}/s ÷ the baseline's, the median over blocks timed next to each other "
                       f"(interleaved), with its {'95% ' if full_ci else ''}CI; {unit}/s: each case's median")
    if not full_ci:
        caption.append(CI_CAPTION.replace("n samples", "n pairs"))  # the pairs' CI: said again, each table read alone
    if any(p.get("host_dependent") for p in pairs):
        caption.append("host-dependent: one side's step is limited by the host and the other's by the GPU (or sits at the "
                       "boundary), so the speedup moves with the host's speed")
    return FittedTable(columns, title=title or f"Paired comparison: {field}", caption=caption)


def catalog_tables(catalog: dict) -> list[FittedTable]:
    """``api.model_catalog``'s answer: the built-in models with their family and dimensions, the families, the
    variants, and the forms of a reference to your own model."""
    from rich.markup import escape

    models = [(name, f["name"], dims) for f in catalog["families"] for name, dims in f["models"].items()]
    families = [{k: escape(v) if isinstance(v, str) else v for k, v in f.items()} for f in catalog["families"]]
    forms = [{k: escape(v) for k, v in f.items()} for f in catalog["variants"] + catalog["references"]]
    return [
        FittedTable([Column("model", [m[0] for m in models]), Column("family", [m[1] for m in models]),
                     Column("dimensions", [m[2] for m in models], wrap=True)], title="Built-in models"),
        FittedTable([Column("family", [f["name"] for f in families]), Column("workloads", [", ".join(f["workloads"]) for f in families], wrap=True),
                     Column("per", [f["item"] for f in families]), Column("a step runs", [f["describe"] for f in families], wrap=True)],
                    title="Workload families"),
        FittedTable([Column("--model", [f["form"] for f in forms]), Column("what it is", [f["means"] for f in forms], wrap=True)],
                    title="Variants and your own models", caption=[catalog["note"]]),
    ]


def ceilings_lines(result: dict) -> list[str]:
    """``api.ceilings``'s result as lines: the one-GPU ceilings, then the all-reduce sweep (nccl-tests' algbw and busbw)."""
    c = result["ceilings"]
    lines = [f"GPU: {c['gpu']} (measured {c.get('measured_at', '?')})"]
    lines += [f"matmul {dtype}: {tflops:.1f} TFLOP/s" for dtype, tflops in c["matmul_tflops"].items()]
    lines += [f"copy: {c['copy_gbps']:.0f} GB/s", f"graph kernel interval: {c['graph_kernel_interval_us']:.2f} µs",
              f"eager launch: {c['eager_launch_us']:.2f} µs"]
    sweep = result.get("all_reduce")
    if sweep:
        lines.append(f"all-reduce over GPUs {','.join(map(str, sweep['gpus']))} (fp32 sum; busbw = algbw × 2(N−1)/N):")
        lines += [f"  {r['bytes'] / 2**20:8.0f} MiB  {r['time_us']:10.1f} µs  algbw {r['algbw_gbps']:7.1f} GB/s  busbw {r['busbw_gbps']:7.1f} GB/s"
                  for r in sweep["sizes"]]
    return lines
