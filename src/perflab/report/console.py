"""Rich tables for the terminal."""

from __future__ import annotations

from typing import Iterable

from rich.table import Table

from perflab.report.md import formula_cell


def _fmt(value, spec: str = ".3g", empty: str = "–") -> str:
    if value is None:
        return empty
    return format(value, spec)


def model_label(row: dict) -> str:
    label = row["model"]
    if row.get("keep_rate"):
        rates = "/".join(f"{r:g}" for r in row["keep_rate"])
        label += f" kr{rates}@{','.join(map(str, row['reduction_loc']))}"
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


def bench_table(rows: list[dict], title: str | None = None) -> Table:
    unit = _unit(rows)
    classify_only = unit == "img"
    any_gpu = any(r.get("mfu") is not None for r in rows)
    any_mbu = any(r.get("mbu") is not None for r in rows)
    table = Table(title=title, header_style="bold")
    columns = [
        ("model", "left"), ("size" if classify_only else "shape", "right" if classify_only else "left"), ("bs", "right"),
        ("dtype", "left"), ("mode", "left"), ("ms/batch (95% CI)" if classify_only else "ms/step (95% CI)", "right"),
        (f"ms/{unit}" if classify_only else "ms/sample", "right"), (f"{unit}/s", "right"),
        ("GFLOPs/img" if classify_only else "GFLOPs/sample", "right"),
    ]
    any_formula = any_gpu and any(r.get("flops_analytic") for r in rows)
    if any_gpu:
        columns.append(("MFU (counted)", "right"))
    if any_formula:
        columns.append(("MFU formula (÷)", "right"))
    if any_mbu:
        columns.append(("MBU", "right"))
    columns += [("tokens", "left")] if classify_only else []
    columns += [("peak MiB", "right"), ("W", "right")]
    any_canary = any(row.get("host_canary_us") is not None for row in rows)
    if any_canary:
        columns.append(("host µs", "right"))  # the host canary (measure.canary): the host's speed before the case
    columns.append(("status / flags", "left"))
    for name, justify in columns:
        table.add_column(name, justify=justify)
    on_nodes = any(row.get("node_host") for row in rows)  # rows of a Ray sweep: where each ran
    if on_nodes:
        table.add_column("node", justify="left")
        table.add_column("GPU", justify="left")
    for row in rows:
        ok = row.get("status") == "ok"
        ci = row.get("ci95_ms") or [None, None]
        timing = f"{row['median_ms']:.3f} ({ci[0]:.3f}–{ci[1]:.3f})" if ok else "–"
        status = ", ".join(row.get("flags") or []) if ok else f"[red]{row['status']}[/red]: {row.get('message') or ''}"
        throughput = row.get("items_per_s", row.get("throughput_per_s")) if not classify_only else row.get("throughput_per_s")
        cells = [
            model_label(row), shape_label(row), str(row["batch_size"]), row["dtype"], row["mode"], timing,
            _fmt(row.get("latency_ms_per_sample"), ".4g"), _fmt(throughput, ".1f"), _fmt(row.get("gflops"), ".2f"),
        ]
        if any_gpu:
            cells.append(_fmt(row.get("mfu"), ".1%"))
        if any_formula:
            cells.append(formula_cell(row))
        if any_mbu:
            cells.append(_fmt(row.get("mbu"), ".1%"))
        if classify_only:
            cells.append("→".join(map(str, row["tokens"])) if row.get("tokens") else "–")
        # Reserved memory where the case was timed alone; allocated where cases shared the allocator (interleaved).
        peak = row.get("peak_mem_reserved_mb") if row.get("peak_mem_reserved_mb") is not None else row.get("peak_mem_alloc_mb")
        cells += [_fmt(peak, ".0f"), _fmt(row.get("power_w"), ".0f")]
        if any_canary:
            cells.append(canary_cell(row))
        cells.append(status or "[green]ok[/green]")
        if on_nodes:
            cells += [f"{row.get('node_host') or '–'}:{(row.get('node_id') or '')[:6]}", row.get("gpu_name") or "–"]
        table.add_row(*cells)
    return table


def canary_cell(row: dict) -> str:
    """The row's host canary, µs, with its ratio to its environment's median where one was computed: ``412 (1.29×)``."""
    value = row.get("host_canary_us")
    if value is None:
        return "–"
    ratio = row.get("host_canary_ratio")
    return f"{value:.0f}" + (f" ({ratio:.2f}×)" if ratio is not None else "")


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


def speedup_table(rows: list[dict]) -> Table:
    """Each token-reduction row against its baseline at the same point: throughputs, speedup, verdict."""
    from perflab.report.tables import speedup_rows

    table = Table(title="Top-k vs baseline", header_style="bold")
    pairs = speedup_rows(rows)
    any_paired = any(p.get("paired") for p in pairs)
    columns = ["size", "bs", "dtype", "mode", "baseline img/s", "top-k img/s", "speedup"]
    columns += ["paired 95% CI"] if any_paired else []
    columns += ["GFLOPs/img", "verdict"]
    for col in columns:
        table.add_column(col, justify="left" if col in ("dtype", "mode", "verdict") else "right")
    for p in pairs:
        if p["speedup"] is None:
            table.add_row(str(p["input_size"]), str(p["batch_size"]), p["dtype"], p["mode"], "–", "–", "–", *(["–"] if any_paired else []), "–",
                          f"{p['baseline_status']}/{p['variant_status']}")
            continue
        verdict = ("faster" if p["faster"] else "slower") + ("" if p["significant"] else " (within noise)")
        if p.get("host_dependent"):
            verdict += " (host-dependent)"
        ci = p.get("speedup_ci95")
        cells = [str(p["input_size"]), str(p["batch_size"]), p["dtype"], p["mode"], f"{p['baseline_tp']:.1f}", f"{p['variant_tp']:.1f}",
                 f"{p['speedup']:.2f}×"]
        if any_paired:
            cells.append(f"{ci[0]:.3f}–{ci[1]:.3f}" if ci else "unpaired")
        table.add_row(*cells, f"{p['baseline_gflops']:.2f} → {p['variant_gflops']:.2f}", verdict)
    if any_paired:
        table.caption = ("speedup: median of baseline ÷ top-k over blocks timed next to each other (interleaved), with its 95% CI; "
                         "img/s: each case's median")
    dependent = [p for p in pairs if p.get("host_dependent")]
    if dependent:
        table.caption = (table.caption + ". " if table.caption else "") + "host-dependent: " + "; ".join(
            f"bs{p['batch_size']} {p['mode']}: {p['host_dependent']}" for p in dependent)
    return table


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
