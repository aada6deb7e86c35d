"""PNG plots for reports (matplotlib, Agg backend: no display needed).

Each function takes plain numbers (series label → points) and a path, writes one PNG and returns the
path. Error bars are the 95% CIs of the medians the harness reports.
"""

from __future__ import annotations

import io

import math
from pathlib import Path
from typing import Sequence

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

DPI = 80  # small files: a sweep report of ~20 plots stays a few hundred KB


def throughput_vs_batch(series: dict, path: Path, title: str, styles: dict | None = None) -> Path:
    """series: label → [(batch size, img/s, low, high)]."""
    return _vs_batch(series, path, title, styles, "throughput (img/s, 95% CI)")


def latency_vs_batch(series: dict, path: Path, title: str, styles: dict | None = None) -> Path:
    """series: label → [(batch size, ms per batch, CI low, CI high)], on a log axis."""
    return _vs_batch(series, path, title, styles, "latency (ms per batch, median, 95% CI)", log=True)


def _vs_batch(series: dict, path: Path, title: str, styles: dict | None, ylabel: str, log: bool = False) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, points in series.items():
        _errorbar_line(ax, points, label, (styles or {}).get(label))
    _batch_axis(ax, series)
    if log:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("batch size")
    ax.set_ylabel(ylabel)
    _finish(ax, title)
    return _save(fig, path)


def speedup_vs_tokens(panels: dict, path: Path, title: str, variant_label: str = "variant") -> Path:
    """panels: panel title → {series label → [(tokens, speedup, CI low, CI high)]}; a line at 1× marks parity."""
    n = max(1, len(panels))
    cols = min(2, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 3.8 * rows), squeeze=False)
    for ax, (panel, series) in zip(axes.flat, panels.items()):
        ax.axhline(1.0, color="0.4", lw=1, ls="--")
        for label, points in series.items():
            _errorbar_line(ax, points, label)
        ax.set_xlabel("tokens (input sequence length)")
        ax.set_ylabel(f"speedup of {variant_label} (×)")
        _finish(ax, panel)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=11)
    return _save(fig, path)


def breakeven_plot(tokens_b: Sequence[float], ms_b: Sequence[tuple], tokens_v: Sequence[float], ms_v: Sequence[tuple],
                   fit_b, fit_v, result, path: Path, title: str, labels=("baseline", "variant")) -> Path:
    """Measured points (median with CI) and fitted quadratics; the crossover and its CI marked.

    ms_*: [(median, CI low, CI high)]; fit_*: callables n → ms; result: a BreakevenResult.
    """
    import numpy as np

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    lo, hi = result.tokens_lo, result.tokens_hi
    grid = np.linspace(lo, hi, 200)
    for tokens, ms, fit, label, color in ((tokens_b, ms_b, fit_b, labels[0], "C0"), (tokens_v, ms_v, fit_v, labels[1], "C1")):
        med = [m[0] for m in ms]
        # a CI across processes or stretches is centred on its units' mean, so the median can fall outside it: no bar then
        yerr = [[max(m[0] - m[1], 0.0) for m in ms], [max(m[2] - m[0], 0.0) for m in ms]]
        ax.errorbar(tokens, med, yerr=yerr, fmt="o", color=color, capsize=3, label=f"{label} (measured)")
        ax.plot(grid, fit(grid), color=color, lw=1.5, label=f"{label} fit a+bn+cn²")
    for b_lo, b_hi, _ in result.measured_crossings[:1]:
        ax.axvspan(b_lo, b_hi, color="C2", alpha=0.15, label=f"measured sign change: {b_lo:.0f}–{b_hi:.0f} tokens")
    if result.crossover_tokens is not None:
        n = result.crossover_tokens
        fit = "fit crossover" + ("" if result.fit_agrees_with_measurements else " (disagrees with the measurements)")
        ax.axvline(n, color="C3", lw=1.5, label=f"{fit} ≈ {n:.0f} tokens ({result.crossover_input_size:.0f} px)")
        c_lo, c_hi = result.crossover_ci
        if not (math.isinf(c_lo) and math.isinf(c_hi)):
            ax.axvspan(max(c_lo, lo), min(c_hi, hi), color="C3", alpha=0.15, label=f"{result.level:.0%} CI")
    else:
        ax.text(0.02, 0.95, "no crossover in range", transform=ax.transAxes, va="top")
    ax.set_xlabel("tokens (input sequence length)")
    ax.set_ylabel("latency (ms per batch)")
    top = ax.secondary_xaxis("top", functions=(_tokens_to_px(result.patch_size), _px_to_tokens(result.patch_size)))
    top.set_xlabel("input size (px)")
    _finish(ax, title)
    return _save(fig, path)


def _tokens_to_px(patch):
    import numpy as np

    return lambda n: patch * np.sqrt(np.maximum(np.asarray(n, dtype=float) - 1.0, 0.0))


def _px_to_tokens(patch):
    import numpy as np

    return lambda s: (np.asarray(s, dtype=float) / patch) ** 2 + 1.0


def series_styles(labels_by_group: dict) -> dict:
    """One colour per group (e.g. input size), solid for the first member (baseline), dashed for the next."""
    styles = {}
    for i, (_, labels) in enumerate(labels_by_group.items()):
        for j, label in enumerate(labels):
            styles[label] = {"color": f"C{i % 10}", "ls": ("-", "--", ":", "-.")[j % 4], "marker": ("o", "s", "^", "D")[j % 4]}
    return styles


def _batch_axis(ax, series: dict) -> None:
    sizes = sorted({p[0] for points in series.values() for p in points})
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes)
    ax.set_xticklabels([str(s) for s in sizes])
    ax.minorticks_off()


def _errorbar_line(ax, points, label, style: dict | None = None) -> None:
    points = sorted(p for p in points if p[1] is not None)
    if not points:
        return
    x = [p[0] for p in points]
    y = [p[1] for p in points]
    low = [max(p[1] - p[2], 0.0) if p[2] is not None else 0.0 for p in points]  # (a CI need not hold the median: no bar)
    high = [max(p[3] - p[1], 0.0) if p[3] is not None else 0.0 for p in points]
    style = dict({"marker": "o"}, **(style or {}))
    ax.errorbar(x, y, yerr=[low, high], ms=4, capsize=3, lw=1.3, label=label, **style)


def _finish(ax, title: str) -> None:
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="best")


def _save(fig, path: Path) -> Path:
    """Write a small PNG: line plots need few colours, so a 64-colour palette keeps each file small (measured: 20 plots, 256 KB in all)."""
    from PIL import Image  # matplotlib's own dependency

    path = Path(path)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=DPI, format="png")
    plt.close(fig)
    buffer.seek(0)
    Image.open(buffer).convert("RGB").quantize(colors=64).save(path, "PNG", optimize=True)
    return path


def time_vs_length(series: dict, path: Path, title: str, xlabel: str, ylabel: str = "step time (ms, median, 95% CI)") -> Path:
    """series: label → [(length, ms, CI low, CI high)], on log-log axes (a quadratic term shows as a steeper slope)."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, points in series.items():
        _errorbar_line(ax, points, label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    _finish(ax, title)
    return _save(fig, path)


def metric_vs_batch(panels: dict, path: Path, title: str, ylabel: str) -> Path:
    """panels: panel title → {series label → [(batch size, value)]}, one panel per group, log-2 batch axis."""
    n = max(1, len(panels))
    cols = min(2, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 3.8 * rows), squeeze=False)
    for ax, (panel, series) in zip(axes.flat, panels.items()):
        for label, points in series.items():
            if points:
                xs, ys = zip(*sorted(points))
                ax.plot(xs, ys, marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_xlabel("batch size")
        ax.set_ylabel(ylabel)
        _finish(ax, panel)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.suptitle(title)
    return _save(fig, path)


def panels_vs_length(panels: dict, path: Path, title: str, xlabel: str = "sequence length (tokens)") -> Path:
    """panels: panel title → (y label, {series label → [(length, value)]}, {series label → style} or None), side by
    side on a log-2 length axis; a style may set ``color``, ``ls`` and ``marker`` (e.g. the seed's dotted)."""
    n = max(1, len(panels))
    fig, axes = plt.subplots(1, n, figsize=(5.6 * n, 3.9), squeeze=False)
    for ax, (panel, (ylabel, series, styles)) in zip(axes.flat, panels.items()):
        for label, points in series.items():
            points = sorted(p for p in points if p[1] is not None)
            if points:
                xs, ys = zip(*points)
                ax.plot(xs, ys, label=label, lw=1.3, ms=4, **dict({"marker": "o"}, **((styles or {}).get(label) or {})))
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.minorticks_off()
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        _finish(ax, panel)
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def grouped_bars(panels: dict, path: Path, title: str, ylabel: str, log: bool = False, hline: float | None = None,
                 colors: dict | None = None) -> Path:
    """panels: panel title → {series label (a bar colour) → [(category, value)]}: per category one bar per series,
    side by side (e.g. categories = batch sizes, series = modes); ``hline`` draws a reference line (e.g. 1 for parity),
    ``colors`` keeps a series' colour the same across panels."""
    n = max(1, len(panels))
    cols = min(2, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 3.8 * rows), squeeze=False)
    for ax, (panel, series) in zip(axes.flat, panels.items()):
        categories = []
        for points in series.values():
            for c, _ in points:
                if c not in categories:
                    categories.append(c)
        width = 0.8 / max(1, len(series))
        for i, (label, points) in enumerate(series.items()):
            values = dict(points)
            xs = [j + (i - (len(series) - 1) / 2) * width for j, c in enumerate(categories) if values.get(c) is not None]
            ys = [values[c] for c in categories if values.get(c) is not None]
            ax.bar(xs, ys, width=width, label=label, color=(colors or {}).get(label, f"C{i % 10}"))
        if hline is not None:
            ax.axhline(hline, color="0.3", lw=1, ls="--")
        ax.set_xticks(range(len(categories)))
        ax.set_xticklabels([str(c) for c in categories])
        if log:
            ax.set_yscale("log")
        ax.set_ylabel(ylabel)
        _finish(ax, panel)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=11)
    return _save(fig, path)


def over_revisions(names: Sequence[str], points: list, changes: Sequence[int], path: Path, title: str) -> Path:
    """One case over revisions: ``points`` (revision index, ms, CI low, CI high) on a categorical axis of ``names``,
    oldest first; the revisions at the ``changes`` indices (change points) ringed in red."""
    fig, ax = plt.subplots(figsize=(max(5.0, 0.9 * len(names) + 2.5), 3.8))
    _errorbar_line(ax, points, "median, 95% CI")
    by_index = {p[0]: p[1] for p in points}
    marked = [i for i in changes if i in by_index]
    if marked:
        ax.scatter(marked, [by_index[i] for i in marked], s=140, facecolors="none", edgecolors="red", lw=1.6, zorder=3,
                   label="change point")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels([str(n)[:14] for n in names], rotation=30 if len(names) > 5 else 0, ha="right" if len(names) > 5 else "center")
    ax.set_xlim(-0.5, len(names) - 0.5)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("revision (oldest first)")
    ax.set_ylabel("step time (ms)")
    _finish(ax, title)
    return _save(fig, path)
