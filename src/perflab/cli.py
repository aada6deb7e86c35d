"""The perflab command line: parse flags, call the API, render. No logic of its own.

Options that take several values accept them space-separated (``--batch-size 1 8 64``) or repeated
(``--batch-size 1 --batch-size 8``). Bad input prints one line on stderr and exits with status 2.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from perflab.errors import PerflabError

try:  # typer ≥ 0.20 vendors click; older versions use the click package
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover - depends on the installed typer
    from click import exceptions as click_exceptions

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="perflab: how fast is this transformer workload, where does the time go, and why.",
)
# When piped, rich would fall back to 80 columns and squeeze the tables; give them room instead.
out = Console(highlight=False, width=None if sys.stdout.isatty() else 220)
err = Console(stderr=True, highlight=False, soft_wrap=True)

# Options that take one or more values after a single flag (expanded to repeated flags before parsing).
MULTI_VALUE_OPTIONS = {"--model", "--input-size", "--batch-size", "--keep-rate", "--reduction-loc", "--dtype", "--mode"}

FORMATS = ("table", "csv", "json")



@app.command()
def bench(
    model: List[str] = typer.Option(..., "--model", help="Model name(s): deit_base_patch16_224, topk_<vit>, evit_<vit>, timm:<name>."),
    input_size: List[int] = typer.Option([224], "--input-size", help="Input resolution(s), pixels."),
    batch_size: List[int] = typer.Option([1], "--batch-size", help="Batch size(s)."),
    keep_rate: List[float] = typer.Option([], "--keep-rate", help="Keep rate, one value or one per reduction location."),
    reduction_loc: List[int] = typer.Option([], "--reduction-loc", help="Blocks (0-based) that reduce tokens."),
    attn: str = typer.Option("sdpa", "--attn", help="Attention implementation: sdpa or explicit."),
    dtype: List[str] = typer.Option(["fp32"], "--dtype", help="fp32, tf32, bf16 or fp16 (bf16/fp16 via autocast)."),
    mode: List[str] = typer.Option(["eager"], "--mode", help="eager, compile, compile:reduce-overhead, compile:max-autotune or cudagraph."),
    warmup: int = typer.Option(10, "--warmup", help="Untimed iterations before timing."),
    min_time: float = typer.Option(1.0, "--min-time", help="Seconds of timed work to aim for per case."),
    iters: Optional[int] = typer.Option(None, "--iters", help="Exact number of timed iterations (overrides --min-time)."),
    repeats: int = typer.Option(20, "--repeats", help="Number of timing samples the timed iterations are split into."),
    device: str = typer.Option("auto", "--device", help="auto, cuda or cpu."),
    seed: int = typer.Option(0, "--seed", help="Seed for weights and inputs."),
    fmt: str = typer.Option("table", "--format", help="table, csv or json (one object per case per line)."),
    out_file: Optional[Path] = typer.Option(None, "--out", help="Also write the rows to this file (.csv, else JSON lines)."),
):
    """Time models: every combination of the given sizes, batch sizes, dtypes and modes."""
    from perflab import api
    from perflab.report.console import bench_table
    from perflab.report.export import to_csv, to_json_lines, write_rows

    if fmt not in FORMATS:
        raise PerflabError(f"unknown format {fmt!r}; choose table, csv or json")
    cases = api.make_cases(
        model=model, input_size=input_size, batch_size=batch_size, keep_rate=keep_rate, reduction_loc=reduction_loc,
        attn=attn, dtype=dtype, mode=mode, device=device, warmup=warmup, min_time=min_time, iters=iters,
        repeats=repeats, seed=seed,
    )
    rows = _run_with_progress(cases)
    _print_warnings(rows)
    if fmt == "json":
        sys.stdout.write(to_json_lines(rows))
    elif fmt == "csv":
        sys.stdout.write(to_csv(rows))
    else:
        out.print(bench_table(rows))
    if out_file is not None:
        write_rows(rows, out_file)


@app.command()
def demo(device: str = typer.Option("auto", "--device", help="auto, cuda or cpu.")):
    """The token-reduction paradox in one command: DeiT baseline vs top-k, eager vs CUDA graph (GPU),
    or a small CPU version when no GPU is present."""
    from perflab import api
    from perflab.report.console import bench_table
    from perflab.runtime.device import resolve_device

    device = resolve_device(device)
    if device == "cuda":
        spec = dict(model=["deit_base_patch16_224", "topk_deit_base_patch16_224"], input_size=[224], batch_size=[1, 64], dtype=["bf16"], mode=["eager", "cudagraph"])
    else:
        err.print("No GPU here: running a small CPU version (DeiT-Tiny, fp32, eager).")
        spec = dict(model=["deit_tiny_patch16_224", "topk_deit_tiny_patch16_224"], input_size=[224], batch_size=[1, 8], dtype=["fp32"], mode=["eager"], min_time=0.5, warmup=3)
    cases = api.make_cases(keep_rate=[0.1], reduction_loc=[3, 6, 9], device=device, **spec)
    rows = _run_with_progress(cases)
    _print_warnings(rows)
    out.print(bench_table(rows, title="Baseline vs top-k (keep 0.1 at blocks 3, 6, 9)"))
    out.print(_speedup_table(rows))


def _speedup_table(rows):
    from rich.table import Table

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


def _run_with_progress(cases):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from perflab import api

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err, transient=True) as progress:
        task = progress.add_task("starting", total=len(cases))

        def on_case(index, case, stage):
            progress.update(task, completed=index, description=f"{case.label()}: {stage}")

        rows = api.bench(cases, on_case=on_case)
        progress.update(task, completed=len(cases))
    return rows


def _print_warnings(rows):
    for row in rows:
        if row.get("status") != "ok":
            err.print(f"[red]{row['status']}[/red]: {row['model']} {row['input_size']}px bs{row['batch_size']} {row['dtype']} {row['mode']}: {row.get('message')}")
        for message in row.get("warnings") or []:
            err.print(f"[yellow]warning[/yellow]: {row['model']} {row['input_size']}px bs{row['batch_size']} {row['dtype']} {row['mode']}: {message}")


def expand_multi_value_options(argv: list[str], names=MULTI_VALUE_OPTIONS) -> list[str]:
    """``--opt a b c`` → ``--opt a --opt b --opt c`` for the options that take several values."""
    result: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        name, eq, value = token.partition("=")
        if name in names:
            values = [value] if eq else []
            j = i + 1
            while j < len(argv) and not _is_flag(argv[j]):
                values.append(argv[j])
                j += 1
            if not values:
                result.append(token)  # let the parser report the missing value
            for v in values:
                result += [name, v]
            i = j
            continue
        result.append(token)
        if token == "--":
            result += argv[i + 1 :]
            break
        i += 1
    return result


def _is_flag(token: str) -> bool:
    if not token.startswith("-") or token == "-":
        return False
    try:  # negative numbers are values, not flags
        float(token)
        return False
    except ValueError:
        return True


def main(argv: list[str] | None = None) -> None:
    argv = expand_multi_value_options(list(sys.argv[1:] if argv is None else argv))
    try:
        app(args=argv, prog_name="perflab", standalone_mode=False)
    except PerflabError as exc:
        _fail(str(exc), exc.exit_code)
    except click_exceptions.NoArgsIsHelpError if hasattr(click_exceptions, "NoArgsIsHelpError") else ():
        sys.exit(0)  # the help text was printed
    except click_exceptions.ClickException as exc:
        _fail(exc.format_message().replace("\n", " "), 2)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        _fail("interrupted", 130)


def _fail(message: str, code: int) -> None:
    print(f"perflab: error: {message}", file=sys.stderr)
    sys.exit(code)


if __name__ == "__main__":
    main()
