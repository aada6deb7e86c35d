"""Rich tables for the terminal."""

from __future__ import annotations

from rich.table import Table


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


def bench_table(rows: list[dict], title: str | None = None) -> Table:
    table = Table(title=title, header_style="bold")
    for name, justify in [
        ("model", "left"), ("size", "right"), ("bs", "right"), ("dtype", "left"), ("mode", "left"),
        ("ms/batch (95% CI)", "right"), ("ms/img", "right"), ("img/s", "right"), ("GFLOPs/img", "right"),
        ("tokens", "left"), ("peak MiB", "right"), ("W", "right"), ("status / flags", "left"),
    ]:
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
        table.add_row(
            model_label(row),
            str(row["input_size"]),
            str(row["batch_size"]),
            row["dtype"],
            row["mode"],
            timing,
            _fmt(row.get("latency_ms_per_sample"), ".4g"),
            _fmt(row.get("throughput_per_s"), ".1f"),
            _fmt(row.get("gflops"), ".2f"),
            "→".join(map(str, row["tokens"])) if row.get("tokens") else "–",
            _fmt(row.get("peak_mem_reserved_mb"), ".0f"),
            _fmt(row.get("power_w"), ".0f"),
            status or "[green]ok[/green]",
            *([f"{row.get('node_host') or '–'}:{(row.get('node_id') or '')[:6]}", row.get("gpu_name") or "–"] if on_nodes else []),
        )
    return table


def speedup_table(rows: list[dict]) -> Table:
    """Each token-reduction row against its baseline at the same point: throughputs, speedup, verdict."""
    from perflab.report.tables import speedup_rows

    table = Table(title="Top-k vs baseline", header_style="bold")
    for col in ("size", "bs", "dtype", "mode", "baseline img/s", "top-k img/s", "speedup", "GFLOPs/img", "verdict"):
        table.add_column(col, justify="left" if col in ("dtype", "mode", "verdict") else "right")
    for p in speedup_rows(rows):
        if p["speedup"] is None:
            table.add_row(str(p["input_size"]), str(p["batch_size"]), p["dtype"], p["mode"], "–", "–", "–", "–", f"{p['baseline_status']}/{p['variant_status']}")
            continue
        verdict = ("faster" if p["faster"] else "slower") + ("" if p["significant"] else " (within noise)")
        table.add_row(
            str(p["input_size"]), str(p["batch_size"]), p["dtype"], p["mode"], f"{p['baseline_tp']:.1f}", f"{p['variant_tp']:.1f}",
            f"{p['speedup']:.2f}×", f"{p['baseline_gflops']:.2f} → {p['variant_gflops']:.2f}", verdict,
        )
    return table
