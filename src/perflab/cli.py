"""The perflab command line: parse flags, call the API, render. No logic of its own.

The CLI is thin: ``perflab X`` calls ``api.X``, and its command function is named as the API call it wraps (``bench``,
``analyze``, ``ab``, ...: a name api.py and cli.py share, as ``tests/test_names.py`` allows). ``perflab profile``
profiles a case (``api.profile_case``; ``api.profile`` is the profiler of a user's own loop), so its function is
``profile_case``. A command whose API call has another name (``demo``, ``models``, ``spec-schema``) has a name no other
room holds.

Options that take several values accept them space-separated (``--batch-size 1 8 64``) or repeated
(``--batch-size 1 --batch-size 8``): ``cli_argv`` reads the words before the parser. The flags that several commands
share, the case-flag group first, are declared once in ``cli_flags``. Bad input prints one line on stderr and exits with
status 2.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from perflab import cli_argv
from perflab.cli_argv import CommandLine
from perflab.cli_flags import (BUILD, FAMILY_SHAPES, GPU_DEVICE, ONE_BATCH_SIZE, ONE_INPUT_SIZE, OPT_INDUCTOR_CACHE, OPT_NO_INTERLEAVE,
                               OPT_NO_PIN, OPT_PARALLEL, OPT_PROCESSES, OPT_RANK_GPUS, OPT_STEPS, OPT_THRESHOLD, OPT_TRACE_DIR,
                               OPT_WORLD_SIZE, PAIRING_HELP, TIMING, CaseFlags, ProgramFlags, VersionsFlags, case_flags, program_flags,
                               versions_flags)
from perflab.cli_flags import OPT_A_ARGS, OPT_B_ARGS
from perflab.diagnosis.change_points import PROFILE_CHANGES
from perflab.errors import PerflabError
from perflab.paths import check_writable_file, write_failed
from perflab.report.terminal import TerminalConsole

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
# Tables fit COLUMNS, else the terminal, else (piped) 100 columns; --wide prints them whole (report.terminal).
out = TerminalConsole()
err = TerminalConsole(stderr=True)

def _print_version(value: bool) -> None:
    if value:
        from perflab.version import __version__

        print(f"perflab {__version__}")
        raise typer.Exit(0)


@app.callback()
def _global_options(
    version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version, help="Print perflab's version and exit."),
    wide: bool = typer.Option(False, "--wide", help="Print every table whole, at its natural width, whatever the terminal's "
                              "(anywhere on the line; by default tables fit COLUMNS, else the terminal, else 100 columns)."),
):
    """perflab: how fast is this transformer workload, where does the time go, and why."""


FORMATS = ("table", "csv", "study-csv", "json")


@app.command()
@case_flags()
def bench(
    model: List[str] = typer.Option(..., "--model", help="Model name(s): deit_base_patch16_224, topk_<vit>, evit_<vit>, timm:<name>, "
                                    "gpt_*, llama*, or your own: path/file.py:NAME, package.module:NAME, hf:DIR."),
    flags: CaseFlags = None,
    fmt: str = typer.Option("table", "--format", help="table, csv, study-csv (the token-reduction study's columns alone, its "
                            "flops holding GMACs as its column did) or json (one object per case per line)."),
    out_file: Optional[Path] = typer.Option(None, "--out", help="Also write the rows to this file (.csv, else JSON lines)."),
    memory_snapshot: Optional[Path] = typer.Option(None, "--memory-snapshot", help="GPU: write the CUDA memory history (a pickle "
                                                   "that pytorch.org/memory_viz opens) to this file; case ids are added for several cases."),
    no_pin: bool = OPT_NO_PIN,
    no_interleave: bool = OPT_NO_INTERLEAVE,
    processes: int = OPT_PROCESSES,
    parallel: Optional[str] = OPT_PARALLEL,
    gpus: Optional[str] = OPT_RANK_GPUS,
    world_size: Optional[int] = OPT_WORLD_SIZE,
    inductor_cache: Optional[Path] = OPT_INDUCTOR_CACHE,
):
    """Time models: every combination of the given sizes, batch sizes, dtypes and modes."""
    from perflab import api
    from perflab.report.console import bench_table, comparison_tables
    from perflab.report.export import write_rows

    _check_format(fmt)
    if out_file is not None:
        check_writable_file(out_file)
    ranks = _ranks(parallel, gpus, world_size, flags["device"])
    cases = list(dict.fromkeys(api.make_cases(**flags.options(model=model), **ranks.case_options())))  # --model X X: one case (rows alike otherwise)
    if memory_snapshot is not None:
        check_writable_file(memory_snapshot)
    rows, lost = _rows_or_lost(lambda: _run_with_progress(cases, memory_snapshot=memory_snapshot, pin=not no_pin,
                                                          interleave=not no_interleave, processes=processes, gpus=ranks.gpus,
                                                          inductor_cache=inductor_cache))
    if not _wrote_rows_as(fmt, rows):
        out.print(bench_table(rows))
        for table in comparison_tables(rows):
            out.print(table)
        if any(row.get("parallel") for row in rows):
            from perflab.report.parallel import scaling_table

            out.print(scaling_table(rows))
    _print_warnings(rows)  # under the tables, each once
    if out_file is not None:
        try:
            write_rows(rows, out_file)
        except OSError as exc:
            raise write_failed(out_file, exc) from None
    if lost is not None:
        raise lost  # one line, after every row measured before it was printed and written


@app.command()
def demo(device: str = typer.Option("auto", "--device", help="auto, cuda or cpu."), no_pin: bool = OPT_NO_PIN,
         no_interleave: bool = OPT_NO_INTERLEAVE,
         processes: Optional[int] = typer.Option(None, "--processes", help="Processes to spread the samples over (default: 3 on a "
                                                 "GPU, so the CIs hold from run to run; 1 on the CPU).")):
    """The token-reduction paradox in one command: DeiT baseline vs top-k, eager vs CUDA graph (GPU),
    or a small CPU version when no GPU is present."""
    from perflab import api
    from perflab.report.console import bench_table, speedup_table

    cases = api.demo_cases(device)
    if cases[0].device == "cpu":
        err.print("No GPU here: running a small CPU version (DeiT-Tiny, fp32, eager).")
    if processes is None:
        processes = api.DEMO_GPU_PROCESSES if cases[0].device == "cuda" else 1
    rows, lost = _rows_or_lost(lambda: _run_with_progress(cases, pin=not no_pin, interleave=not no_interleave, processes=processes, what="demo"))
    out.print(bench_table(rows, title="Baseline vs top-k (keep 0.1 at blocks 3, 6, 9)"))
    speedups = speedup_table(rows)
    if speedups is not None:
        out.print(speedups)
    _print_warnings(rows)
    if lost is not None:
        raise lost


def _check_format(fmt: str) -> None:
    """--format, before anything runs."""
    if fmt not in FORMATS:
        raise PerflabError(f"unknown format {fmt!r}; choose table, csv, study-csv or json")


def _wrote_rows_as(fmt: str, rows: list[dict]) -> bool:
    """--format csv or json: the rows written to stdout (True); table: nothing written, the command draws it (False)."""
    from perflab.report.export import to_csv, to_json_lines

    if fmt == "table":
        return False
    sys.stdout.write(to_json_lines(rows) if fmt == "json" else to_csv(rows, study=fmt == "study-csv"))
    return True


def _rows_or_lost(run):
    """(rows, None), or where a case lost the CUDA context (rows measured until then, the CudaContextLost to raise
    once they are printed and stored)."""
    from perflab.errors import CudaContextLost

    try:
        return run(), None
    except CudaContextLost as lost:
        return lost.rows, lost


def _run_with_progress(cases, memory_snapshot=None, pin: bool = True, interleave: bool = True, processes: int = 1, gpus=None,
                       inductor_cache=None, what: str = "bench"):
    from perflab import api
    from perflab.report.progress import BenchProgress

    with BenchProgress(err, cases, processes, what=what) as on_case:
        return api.bench(cases, on_case=on_case, memory_snapshot=memory_snapshot, pin=pin, interleave=interleave, processes=processes,
                         gpus=gpus, inductor_cache=inductor_cache)


def _text(line: str) -> str:
    """A line for rich's markup (a progress bar's or a status's) that prints as it is: a case's label may hold a path's brackets."""
    from rich.markup import escape

    return escape(line)


def _print_warnings(rows):
    from perflab.report.console import exempt_line, warning_lines

    for line in warning_lines(rows):
        err.say(line)
    line = exempt_line(rows)
    if line:
        err.say(f"note: {line}", markup=False)


@app.command()
def sweep(
    ctx: typer.Context,
    spec: Path = typer.Argument(..., help="Experiment spec (YAML): grid, cases, comparisons, breakeven."),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Output directory (default: the spec's out:, else runs/<name>)."),
    resume: bool = typer.Option(False, "--resume", help="Skip the cases already stored for this environment."),
    retry_failed: bool = typer.Option(False, "--retry-failed", help="With --resume, run error and timeout cases again."),
    gpus: Optional[str] = typer.Option(None, "--gpus", help="GPUs to use, e.g. 0,1: one worker per GPU, in parallel."),
    workers: int = typer.Option(1, "--workers", help="CPU cases run side by side (their timings then share the cores)."),
    timeout: Optional[float] = typer.Option(None, "--timeout", help="Seconds per case before its worker is killed (default: the spec's, else 600)."),
    list_cases: bool = typer.Option(False, "--list", help="Print the cases and exit."),
    max_cases: int = typer.Option(10_000, "--max-cases", help="Refuse a spec of more cases than this (counted before expanding)."),
    engine: str = typer.Option("local", "--engine", help="local (this host) or ray (a Ray cluster; pip install 'perflab[ray]')."),
    address: Optional[str] = typer.Option(None, "--address", help="With --engine ray: auto or ray://host:port (default: a local Ray instance)."),
    no_pin: bool = OPT_NO_PIN,
    launcher: Optional[str] = typer.Option(None, "--launcher", help="fork: each case's fresh process forked by a launcher that "
                                           "imported torch once for the sweep (default); exec: each a new interpreter "
                                           "(PERFLAB_LAUNCHER sets the default; --engine ray always execs)."),
    inductor_cache: Optional[Path] = OPT_INDUCTOR_CACHE,
):
    """Run an experiment spec, one fresh process per case; each result is stored at once in OUT/results.sqlite."""
    from perflab import api
    from perflab.report.progress import ClusterProgress, SweepProgress
    from perflab.sweep.runner import command_line

    experiment = api.load_experiment(spec, max_cases=max_cases)
    if list_cases:
        for case in experiment.cases:
            out.print(f"{case.id}  {case.label()}", soft_wrap=True, markup=False)
        out.print(f"{len(experiment.cases)} cases")
        return
    drawer = (ClusterProgress if engine == "ray" else SweepProgress)(err)  # ray: the cases per node
    summary = api.sweep(experiment, out_dir, resume=resume, retry_failed=retry_failed, gpus=_parse_gpus(gpus), workers=workers,
                        timeout_s=timeout, command=command_line(cli_argv.of(ctx).typed), on_event=drawer, engine=engine, address=address,
                        pin=not no_pin, launcher=launcher, inductor_cache=inductor_cache)
    _print_sweep_summary(summary)


@app.command()
def results(
    out_dir: Path = typer.Argument(..., help="A sweep's output directory."),
    fmt: str = typer.Option("table", "--format", help="table, csv (the token-reduction study's speed_test.py columns first, its flops "
                            "named gmacs: it held GMACs), study-csv (those columns alone, under the study's names) or json (one object "
                            "per case per line)."),
):
    """Print the rows stored by a sweep."""
    from perflab import api
    from perflab.report.console import bench_table

    _check_format(fmt)
    unreadable = []
    rows = api.results(out_dir, on_unreadable=_warn_unreadable(out_dir, unreadable))
    if not _wrote_rows_as(fmt, rows):
        from perflab.report.console import exempt_line
        from perflab.report.versions import program_results

        skipped = f" ({len(unreadable)} unreadable, skipped)" if unreadable else ""
        if rows and all(row.get("kind") == "program" for row in rows):  # a program's ab or track: its sides
            program_results(out, rows, f"{out_dir}: {len(rows)} stored results{skipped}")
            return
        out.print(bench_table(rows, title=f"{out_dir}: {len(rows)} stored results{skipped}"))
        line = exempt_line(rows)
        if line:
            out.say(f"note: {line}", markup=False)  # wrapped to the width, as bench says it


@app.command()
def models(as_json: bool = typer.Option(False, "--json", help="Print one JSON object.")):
    """The models --model takes: perflab's own by workload family, the prefixes that make variants, and the forms of a
    reference to your own model (file.py:NAME, package.module:NAME, hf:DIR)."""
    import json

    from perflab import api
    from perflab.report.console import catalog_tables

    catalog = api.model_catalog()
    if as_json:
        sys.stdout.write(json.dumps(catalog) + "\n")
        return
    for table in catalog_tables(catalog):
        out.print(table)


@app.command("spec-schema")
def spec_schema(
    out_file: Optional[Path] = typer.Option(None, "--out", help="Write the schema to this file (default: print it)."),
):
    """Print the JSON Schema of an experiment spec file, for editors (e.g. yaml-language-server's $schema)."""
    from perflab import api

    text = api.spec_schema_json()
    if out_file is None:
        sys.stdout.write(text)
        return
    check_writable_file(out_file)
    try:
        out_file.write_text(text)
    except OSError as exc:
        raise PerflabError(f"{out_file}: could not write the schema ({exc.strerror or exc})") from None
    out.print(f"wrote {out_file}", soft_wrap=True, markup=False)


@app.command()
def report(
    out_dir: Path = typer.Argument(..., help="A sweep's output directory, or a perflab run's (its --out)."),
    n_boot: int = typer.Option(2000, "--bootstrap", help="Bootstrap replicates for break-even CIs (a whole number, 100 to 100,000)."),
    spec: Optional[Path] = typer.Option(None, "--spec", help="The experiment whose cases to count and mark 'not run' "
                                        "(default: the store's latest sweep's, which is a subset if that sweep ran one)."),
):
    """Write OUT/report.md: the studies' tables (token reduction, GPT sizes, Llama decode) with CIs and flags, plots (PNG) beside it, environment, spec.
    For a perflab run's directory, write its page, OUT/report.html (self-contained: open it in a browser)."""
    from perflab import api

    unreadable = []
    path = api.report(out_dir, n_boot=n_boot, spec=spec, on_unreadable=_warn_unreadable(out_dir, unreadable))
    skipped = f" ({len(unreadable)} unreadable stored record(s) left out, named in its Status section)" if unreadable else ""
    out.print(f"wrote {path}{skipped}", soft_wrap=True, markup=False)


def _warn_unreadable(out_dir, seen: list):
    """A callback for the store's unreadable records: one warning line each on stderr, kept in ``seen``."""
    def warn(item):
        seen.append(item)
        _say_unreadable(out_dir, item)
    return warn


def _say_unreadable(out_dir, item) -> None:
    err.print(f"warning: {out_dir}: {item.line()}", markup=False, soft_wrap=True)  # one line each, to grep


@app.command()
@case_flags(leave_out=("input_size", *FAMILY_SHAPES, *BUILD),
            batch_size=(List[int], typer.Option([1], "--batch-size", help="Batch size(s); one analysis each.")),
            keep_rate=(List[float], typer.Option([], "--keep-rate", help="Keep rate(s) of the variant.")),
            reduction_loc=(List[int], typer.Option([], "--reduction-loc", help="Blocks (0-based) where the variant reduces tokens.")),
            dtype=(List[str], typer.Option(["fp32"], "--dtype", help="fp32, tf32, bf16 or fp16; one analysis each.")),
            mode=(List[str], typer.Option(["eager"], "--mode", help="Execution mode(s); one analysis each.")),
            repeats=(int, typer.Option(20, "--repeats", help="Timing samples per case (the bootstrap resamples them).")))
def breakeven(
    ctx: typer.Context,
    model: List[str] = typer.Option(..., "--model", help="Baseline model, e.g. deit_base_patch16_224."),
    variant: str = typer.Option(..., "--variant", help="Variant model, e.g. topk_deit_base_patch16_224."),
    input_sizes: str = typer.Option("160:640:32", "--input-sizes", help="start:stop:step (stop included) or a comma list."),
    flags: CaseFlags = None,
    out_dir: Path = typer.Option(Path("runs/breakeven"), "--out", help="Output directory (store, report, plots)."),
    resume: bool = typer.Option(False, "--resume", help="Skip the cases already stored for this environment."),
    gpus: Optional[str] = typer.Option(None, "--gpus", help="GPUs to use, e.g. 0,1: one worker per GPU."),
    timeout: Optional[float] = typer.Option(None, "--timeout", help="Seconds per case before its worker is killed (600)."),
    n_boot: int = typer.Option(2000, "--bootstrap", help="Bootstrap replicates for the CIs (a whole number, 100 to 100,000)."),
):
    """Find the token count where the variant starts beating the baseline: measure both across input sizes,
    fit t(n) = a + b·n + c·n² to each, report the crossover with a bootstrap CI, and plot it."""
    from perflab import api
    from perflab.report.progress import SweepProgress
    from perflab.sweep.runner import command_line

    if len(model) != 1:
        raise PerflabError(f"--model: give one baseline model, got {len(model)}")
    api.check_bootstrap(n_boot)  # before the sweep, not after it
    experiment = api.breakeven_experiment(model[0], variant, input_sizes, **flags.options(), timeout_s=timeout)
    summary = api.sweep(experiment, out_dir, resume=resume, gpus=_parse_gpus(gpus), timeout_s=timeout,
                        command=command_line(cli_argv.of(ctx).typed), on_event=SweepProgress(err, what="breakeven"))
    _print_sweep_summary(summary)
    if summary.interrupted:
        return
    for analysis in api.breakeven(out_dir, n_boot=n_boot):
        text = analysis.result.summary() if analysis.result else f"no fit: {analysis.problem}"
        out.print(f"{analysis.name}: {text}", soft_wrap=True, markup=False)
    out.print(f"wrote {api.report(out_dir, n_boot=n_boot)}", soft_wrap=True, markup=False)


@app.command()
@versions_flags()
@program_flags()
def ab(
    ctx: typer.Context,
    versions: VersionsFlags = None,
    program: ProgramFlags = None,
    a_args: Optional[str] = OPT_A_ARGS,
    b_args: Optional[str] = OPT_B_ARGS,
    repo: Optional[Path] = typer.Option(None, "--repo", help="The git repository (a directory in it) whose revisions --a and --b are."),
    a: Optional[str] = typer.Option(None, "--a", help="Version A: a revision of --repo (a commit, branch or tag)."),
    b: Optional[str] = typer.Option(None, "--b", help="Version B: a revision of --repo."),
    python_a: Optional[str] = typer.Option(None, "--python-a", help="Version A: a Python interpreter (another environment) instead."),
    python_b: Optional[str] = typer.Option(None, "--python-b", help="Version B: a Python interpreter."),
    rounds: Optional[int] = typer.Option(None, "--rounds", help="Rounds, 2 to 100: each times every case at A and at B (blocks: in one "
                                         "process; processes: in two side by side, an even number). Default: 3 (blocks), 4 (processes)."),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="The store (default runs/ab/<date-time>)."),
    pairing: Optional[str] = typer.Option(None, "--pairing", help=f"How A and B are paired in each round. {PAIRING_HELP}. Default: "
                                          "blocks for --repo; interpreters (--python-a/--python-b) can only pair processes."),
    threshold: float = typer.Option(0.05, "--threshold", help="A ratio beyond 1 ± this fraction, its CI excluding 1, is faster or "
                                    "slower (default 0.05); a CI inside it is no change."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
):
    """A/B two versions of the code (git revisions) or of the environment (interpreters) on the same cases: B's time ÷
    A's is paired per round (revisions: timed interleaved in one process; interpreters: their processes side by side),
    with a 95% CI over the rounds.

    With a program after -- (perflab ab [--repo R --a REV --b REV | --python-a PY --python-b PY | --a-args "..." --b-args
    "..."] -- SCRIPT [ARGS]): each side, each round, is a fresh perflab run of the program, in a balanced order, and
    their mean steps are compared (docs/regressions.md)."""
    import json

    from perflab import api
    from perflab.report.versions import ab_document, everyone, order_line, render_comparison, render_versions
    from perflab.report.progress import VersionsProgress
    from perflab.sweep.runner import command_line

    words = cli_argv.of(ctx).program
    if words:
        _refuse_for_program("ab", versions, pairing)
        from perflab.report.versions import program_ab_document, render_program_ab

        summary, comparison = api.ab_program(words, repo=repo, a=a, b=b, python_a=python_a, python_b=python_b, a_args=a_args, b_args=b_args,
                                             **program.options(), batch_size=versions.case["batch_size"], seq_len=versions.case["seq_len"],
                                             rounds=rounds, order=versions.values["order"], seed=versions.values["order_seed"], out=out_dir,
                                             timeout_s=versions.values["timeout"], threshold=threshold, aa=versions.values["aa"],
                                             command=command_line(cli_argv.of(ctx).typed), on_event=VersionsProgress(err, what=f"{ctx.info_name} of {words[0]}"))
        if as_json:
            sys.stdout.write(json.dumps(program_ab_document(summary, comparison)) + "\n")
        else:
            render_program_ab(out, summary, comparison)
        _versions_interrupted(summary, "run the command again, into another --out")
        return
    _refuse_for_models("ab", program, a_args=a_args, b_args=b_args)
    summary, comparison = api.ab(repo=repo, a=a, b=b, python_a=python_a, python_b=python_b, **versions.options(), rounds=rounds,
                                 out=out_dir, threshold=threshold, command=command_line(cli_argv.of(ctx).typed),
                                 on_event=VersionsProgress(err, what="ab"), pairing=pairing)
    if as_json:
        sys.stdout.write(json.dumps(ab_document(summary, comparison)) + "\n")
    else:
        render_versions(out, summary.versions)
        render_comparison(out, comparison, tuple(v.label for v in summary.versions))
        order = order_line([(v.name, summary.rows_of(v)) for v in everyone(summary)])
        if order:
            out.say(order, markup=False)
        out.say(f"store: {summary.out_dir}; report: perflab report {summary.out_dir}", markup=False)
    _versions_interrupted(summary, "run the command again (given --out, into another directory: ab does not add rows to a store "
                                   "that holds its versions)")
    _versions_failed(summary)


@app.command()
@versions_flags()
@program_flags()
def track(
    ctx: typer.Context,
    versions: VersionsFlags = None,
    program: ProgramFlags = None,
    repo: Path = typer.Option(..., "--repo", help="The git repository (a directory in it) whose revisions to run."),
    revs: List[str] = typer.Option([], "--revs", help="Revisions, oldest first (comma- or space-separated, or repeated)."),
    rev_range: Optional[str] = typer.Option(None, "--range", help="A..B: A, then each commit after it up to B (first parents)."),
    out_dir: Path = typer.Option(..., "--out", help="The store; a revision's rows already there are reused."),
    rounds: Optional[int] = typer.Option(None, "--rounds", help="Rounds, 1 to 100: each times every case at every revision (blocks: in one "
                                         "process; processes: one after another); with 3 or more, neighbours' ratios have a CI over the "
                                         "rounds. Default 1; a program's: 2 (an even number, 2 or more)."),
    pairing: Optional[str] = typer.Option(None, "--pairing", help=f"How the revisions are paired in each round. {PAIRING_HELP}. "
                                          "Default: blocks (a program's: processes)."),
    threshold: float = typer.Option(0.05, "--threshold", help="A step between neighbouring revisions beyond 1 ± this fraction, its "
                                    "CI excluding 1, is a change point (default 0.05)."),
    profile_changes: int = typer.Option(PROFILE_CHANGES, "--profile-changes", help="Traced steps a side with which each change point's two "
                                        "revisions are profiled: the step's Δ by kernel (or operator) category with its CI, and the "
                                        "ab command that reproduces it (0: none)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
):
    """Run the same cases at each of a list of revisions into one store, and find the revisions where a case got
    faster or slower (each against the one before it), each profiled on both sides; perflab report OUT plots them.

    With a program after -- (perflab track --repo R --revs R1,R2,... -- SCRIPT [ARGS]): each revision, each round, is a
    fresh perflab run of the program, and each revision's mean step is compared with the one before it."""
    import json

    from perflab import api
    from perflab.report.versions import render_series
    from perflab.report.progress import VersionsProgress
    from perflab.sweep.runner import command_line

    words = cli_argv.of(ctx).program
    if words:
        _refuse_for_program("track", versions, pairing, profile_changes=profile_changes)
        from perflab.report.versions import program_track_document, render_program_track

        batch, seq = (_one_value(versions.case[name], flag) for name, flag in (("batch_size", "--batch-size"), ("seq_len", "--seq-len")))
        summary, series = api.track_program(words, repo=repo, revs=revs, range_=rev_range, **program.options(), batch_size=batch,
                                            seq_len=seq, rounds=rounds, order=versions.values["order"], seed=versions.values["order_seed"],
                                            out=out_dir, timeout_s=versions.values["timeout"], threshold=threshold, aa=versions.values["aa"],
                                            command=command_line(cli_argv.of(ctx).typed), on_event=VersionsProgress(err, what=f"{ctx.info_name} of {words[0]}"))
        if as_json:
            sys.stdout.write(json.dumps(program_track_document(summary, series, threshold)) + "\n")
        else:
            render_program_track(out, summary, series, threshold)
        _versions_interrupted(summary, "run the command again, into another --out")
        return
    _refuse_for_models("track", program)
    rounds, pairing = 1 if rounds is None else rounds, pairing or "blocks"
    summary, series = api.track(repo=repo, revs=revs, range_=rev_range, **versions.options(), out=out_dir, rounds=rounds, threshold=threshold,
                                command=command_line(cli_argv.of(ctx).typed), on_event=VersionsProgress(err, what="track"), pairing=pairing,
                                profile_changes=profile_changes)
    if as_json:
        from perflab.report.versions import track_document

        sys.stdout.write(json.dumps(track_document(summary, series, threshold)) + "\n")
    else:
        render_series(out, series, threshold)
        out.say(f"{summary.stored} row(s) stored now, {summary.reused} reused; store: {summary.out_dir}; report: perflab report "
                f"{summary.out_dir}", markup=False)
    _versions_interrupted(summary, "run the command again: it reuses them")
    _versions_failed(summary)


def _refuse_for_program(command: str, versions: VersionsFlags, pairing: Optional[str], profile_changes: int = PROFILE_CHANGES) -> None:
    """A program after "--": the flags that describe perflab's model cases, or how they share a process, are refused."""
    from perflab.cli_flags import case_flags_given

    given = case_flags_given(versions.case, allowed=("batch_size", "seq_len"))
    given += [flag for flag, value in (("--model", versions.values["model"]), ("--spec", versions.values["spec"]),
                                       ("--no-pin", versions.values["no_pin"]), ("--launcher", versions.values["launcher"])) if value]
    if profile_changes != PROFILE_CHANGES:
        given.append("--profile-changes")
    if given:
        raise PerflabError(f"{given[0]}: {command} of a program (a program after --) times it with perflab run, whose own options are "
                           "--skip, --steps, --batch-size, --seq-len, --nproc, --input, --step and --step-range; leave "
                           f"{given[0]} out, or give the cases as --model or --spec without a program")
    if pairing not in (None, "processes"):
        raise PerflabError(f"--pairing {pairing}: a program's sides each run in processes of their own (perflab run), paired "
                           "process by process: --pairing processes, or leave it out")


def _refuse_for_models(command: str, program: ProgramFlags, **more) -> None:
    given = program.given() + [f"--{name.replace('_', '-')}" for name, value in more.items() if value is not None]
    if given:
        raise PerflabError(f"{given[0]}: is for {command} of a program (perflab {command} ... -- SCRIPT [ARGS]); no program was given after --")


def _one_value(values, flag: str):
    values = list(values or [])
    if len(values) > 1:
        raise PerflabError(f"{flag}: track of a program takes one value (every revision's), got {len(values)}")
    return values[0] if values else None


def _versions_interrupted(summary, again: str) -> None:
    if summary.interrupted:
        err.print(f"interrupted: the cases whose rounds all ran are stored; {again}", soft_wrap=True, markup=False)
        raise typer.Exit(130)


def _versions_failed(summary) -> None:
    from perflab.report.versions import failures_line

    line = failures_line(summary.failed())
    if line:
        err.print(line, soft_wrap=True, markup=False)
        raise typer.Exit(1)


def _ranks(parallel: Optional[str], gpus: Optional[str], world_size: Optional[int], device: str):
    from perflab import api

    return api.ranks(parallel, _parse_gpus(gpus), world_size, device)


def _parse_gpus(text: Optional[str]) -> Optional[list]:
    if text is None:
        return None
    parts = [p.strip() for p in text.replace(" ", ",").split(",") if p.strip()]
    if not parts or not all(p.isdigit() for p in parts):
        raise PerflabError(f"--gpus: expected GPU indices like 0,1, got {text!r}")
    return [int(p) for p in parts]


def _print_sweep_summary(summary) -> None:
    counts = ", ".join(f"{n} {status}" for status, n in sorted(summary.counts.items())) or "nothing run"
    out.print(f"{summary.total} cases: {summary.done} run now ({counts}), {summary.skipped} already stored; store: {summary.store_path}",
              soft_wrap=True, markup=False)
    if summary.interrupted:
        err.print(f"interrupted; {summary.total - summary.skipped - summary.done} case(s) not run: rerun with --resume to finish")
        raise typer.Exit(130)
    out.print(f"report: perflab report {summary.out_dir}", soft_wrap=True, markup=False)


def main(argv: list[str] | None = None, *, command: CommandLine | None = None) -> None:
    """Run one command line: ``argv`` (sys.argv's words after the program's name when None), or the ``command`` that
    ``entry`` already read from them."""
    command = command if command is not None else CommandLine.read(sys.argv[1:] if argv is None else argv)
    out.configure(wide=command.wide)
    err.configure(wide=command.wide)
    try:
        status = app(args=command.parsed, prog_name="perflab", standalone_mode=False, obj=command)
    except PerflabError as exc:
        _fail(str(exc), exc.exit_code)
    except click_exceptions.NoArgsIsHelpError if hasattr(click_exceptions, "NoArgsIsHelpError") else () as exc:
        out.print(exc.format_message(), markup=False, soft_wrap=True)  # `perflab` alone: the help (click prints it in standalone mode only)
        sys.exit(0)
    except click_exceptions.MissingParameter as exc:
        took = cli_argv.took_the_arguments(command) if getattr(exc.param, "param_type_name", None) == "argument" else ""
        _fail(exc.format_message().replace("\n", " ") + (f" {took}" if took else ""), 2)
    except click_exceptions.ClickException as exc:
        _fail(exc.format_message().replace("\n", " "), 2)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        _fail("interrupted", 130)
    else:
        # Without standalone mode, click returns the code of a typer.Exit(code) instead of exiting.
        if isinstance(status, int) and status:
            sys.exit(status)


def entry() -> None:
    """The program's entry point (``perflab``, ``python -m perflab``): ``main``, then an exit bounded in time: if the
    interpreter's teardown (a library's atexit handler, a thread it left) keeps the process alive a minute after the
    command finished, the process ends with the command's status and says where it was stuck (``runtime.exit_watch``)."""
    code = 1
    command = CommandLine.read(sys.argv[1:])
    try:
        main(command=command)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        raise
    finally:
        # perflab run: the teardown is the user's program's (its non-daemon threads are its own to keep), not perflab's
        if not command.program:
            from perflab.runtime.exit_watch import arm

            arm(code)


def _fail(message: str, code: int) -> None:
    print(f"perflab: error: {message}", file=sys.stderr)
    sys.exit(code)


@app.command()
def analyze(
    path: Path = typer.Argument(..., help="A Kineto trace (.json, .json.gz from torch.profiler) or an nsys SQLite export."),
    top: int = typer.Option(10, "--top", help="How many kernels to list, by total time."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
    csv_dir: Optional[Path] = typer.Option(None, "--csv", help="Also write the tables (and the kernel table) as CSV files into this directory."),
    gap_us: float = typer.Option(5.0, "--step-gap-threshold-us", help="Idle gaps shorter than this (µs) whose work was already launched count as kernel gaps."),
):
    """Where every microsecond goes: GPU busy vs idle by cause per step (exact), top kernels, categories, ranges, launches."""
    from perflab import api

    if top < 1:
        raise PerflabError(f"--top must be at least 1, got {top}")
    if not (0 <= gap_us < float("inf")):
        raise PerflabError(f"--step-gap-threshold-us must be a finite number >= 0, got {gap_us}")
    if csv_dir is not None and csv_dir.exists() and not csv_dir.is_dir():
        raise PerflabError(f"{csv_dir}: exists and is not a directory; give --csv a directory")
    result = api.analyze(path, top=top, kernel_gap_threshold_us=gap_us)
    if as_json:
        sys.stdout.write(result.to_json() + "\n")
    else:
        from perflab.report.trace_console import render_trace_report

        render_trace_report(out, result)
    if csv_dir is not None:
        result.write_csv(csv_dir)


@app.command("profile")
@case_flags(leave_out=("iters", "repeats"))
def profile_case(
    model: List[str] = typer.Option(..., "--model", help="Model name(s), as for bench."),
    flags: CaseFlags = None,
    steps: int = OPT_STEPS,
    out_dir: Path = OPT_TRACE_DIR,
    top: int = typer.Option(10, "--top", help="How many kernels to list."),
    by_module: bool = typer.Option(False, "--by-module", help="Also attribute every kernel to the innermost nn.Module that launched it "
                                   "(ranges from hooks that time nothing; eager mode): a tree of inclusive and exclusive GPU time."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object per case instead of tables."),
    no_pin: bool = OPT_NO_PIN,
    parallel: Optional[str] = OPT_PARALLEL,
    gpus: Optional[str] = OPT_RANK_GPUS,
    world_size: Optional[int] = OPT_WORLD_SIZE,
):
    """Time a case untraced, then record a profiled pass (trace.json.gz, opens in Perfetto) and account for
    every microsecond of its steps; reports the profiler's inflation (traced step ÷ untraced median)."""
    import json

    from perflab import api
    from perflab.report.trace_console import render_trace_report

    ranks = _ranks(parallel, gpus, world_size, flags["device"])
    cases = api.make_cases(**flags.options(model=model), **ranks.case_options())
    if ranks.parallel:
        for case in cases:
            with err.status(_text(f"{case.label()}: timing on {case.world_size} ranks, then profiling {steps} steps on each")):
                result = api.profile_parallel(case, out_dir, steps=steps, gpus=ranks.gpus)
            _print_warnings([result["row"]])
            if as_json:
                sys.stdout.write(json.dumps({k: v for k, v in result.items() if k != "row"} | {"case": case.to_dict()}) + "\n")
            else:
                from perflab.report.parallel import render_rank_accounts

                out.rule(case.label())
                render_rank_accounts(out, result)
        return
    for case in cases:
        with err.status(_text(f"{case.label()}: timing, then profiling {steps} steps")):
            result = api.profile_case(case, out_dir, steps=steps, top=top, pin=not no_pin, by_module=by_module)
        row = result["row"]
        _print_warnings([row])
        if result["report"] is None:
            continue
        if as_json:
            summary = result["report"].to_dict()
            summary.update(case=case.to_dict(), untraced_median_ms=row["median_ms"], traced_step_ms=result["traced_step_ms"],
                           profiler_inflation=result["inflation"], trace_path=str(result["trace_path"]))
            sys.stdout.write(json.dumps(summary) + "\n")
            continue
        out.rule(case.label())
        out.print(f"untraced median {row['median_ms']:.4f} ms (harness) · traced step {result['traced_step_ms']:.4f} ms · "
                  f"profiler inflation ×{result['inflation']:.2f} · trace: {result['trace_path']}")
        render_trace_report(out, result["report"])


@app.command()
@case_flags(leave_out=(*TIMING, *BUILD), input_size=ONE_INPUT_SIZE,
            batch_size=(List[int], typer.Option([], "--batch-size", help="Batch size (default: the family's); one for both, or two: A's then B's.")),
            dtype=(List[str], typer.Option(["fp32"], "--dtype", help="One for both, or two: A's then B's.")),
            mode=(List[str], typer.Option(["eager"], "--mode", help="One for both, or two: A's then B's (--mode eager --mode compile).")))
def compare(
    a: str = typer.Argument(..., help="A trace (.json/.json.gz/.sqlite), or a model name to profile with the options below."),
    b: str = typer.Argument(..., help="The same for B."),
    flags: CaseFlags = None,
    steps: int = OPT_STEPS,
    out_dir: Path = OPT_TRACE_DIR,
    by_module: bool = typer.Option(False, "--by-module", help="Profile the cases with module ranges and say which modules changed (eager)."),
    threshold: float = OPT_THRESHOLD,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
):
    """Why B's step takes longer or shorter than A's: Δwall = Σ Δ(category GPU time) + Δ(idle by cause), exactly.

    A and B are traces or model names (the same name twice compares two settings of one model). Options that
    take several values (--mode, --dtype, --batch-size, --workload, --seq-len, --context-len, ...) take one value for
    both sides or two values, A's then B's.

    A and B may instead be two stored runs: stores (sweep output directories) or bench --out files (.csv or JSON
    lines). Their cases are matched by case id; each gets B's time ÷ A's with a 95% CI and a verdict at
    --threshold (docs/regressions.md)."""
    import json

    from perflab import api
    from perflab.report.explain_console import render_comparison

    if api.are_results(a, b):
        result = api.compare_results(a, b, threshold=threshold, on_unreadable=_say_unreadable)
        if as_json:
            # strict JSON: the rows' times were checked finite and in range, so no ratio or bound can be NaN or Infinity
            sys.stdout.write(json.dumps(dict(result.to_dict(), a=str(a), b=str(b)), allow_nan=False) + "\n")
        else:
            from perflab.report.versions import render_comparison as render_results

            render_results(out, result, (str(a), str(b)))
        return
    items = api.compare_items(a, b, **flags.options())
    with err.status("comparing"):
        comparison = api.compare(items[0], items[1], steps=steps, out_dir=out_dir, by_module=by_module, threshold=threshold)
    if as_json:
        sys.stdout.write(json.dumps(comparison.to_dict()) + "\n")
    else:
        render_comparison(out, comparison)


@app.command()
@case_flags(leave_out=("mode", "seed"), input_size=ONE_INPUT_SIZE, batch_size=ONE_BATCH_SIZE, device=GPU_DEVICE,
            dtype=(Optional[str], typer.Option(None, "--dtype", help="fp32, tf32, bf16 or fp16 (default: bf16 on a GPU, fp32 on the CPU; "
                                               "the output says which).")))
def explain(
    model: str = typer.Argument(..., help="The model to explain (topk_deit_base_patch16_224, ...)."),
    vs: Optional[str] = typer.Option(None, "--vs", help="A second model to compare with at the same settings (e.g. the baseline)."),
    flags: CaseFlags = None,
    modes: List[str] = typer.Option([], "--modes", help="Modes to predict and then measure (default: cudagraph and compile:reduce-overhead)."),
    fixes: List[str] = typer.Option([], "--fixes", help="Fixes to predict and then measure: optimizer:NAME, checkpoint, batch:N, a mode, "
                                    "or several joined by + (measured only); 'none' for none. Default: the family's (lm train_step: the "
                                    "other optimizers and checkpoint; decode: batch ×2 ×4 ×8 ×16). With --parallel: ddp:OPTION=VALUE "
                                    "(bucket_cap_mb, grad_view, no_sync), fsdp, fsdp:reshard=false, compile (default: buckets ×4, "
                                    "grad_view=true, no_sync=4, fsdp)."),
    fixes_on: str = typer.Option("best", "--fixes-on", help="What the fixes are applied on: best (the fastest of eager and the modes, "
                                 "measured first; the fixes then timed with it), eager, or a mode."),
    steps: int = OPT_STEPS,
    compile_budget: Optional[float] = typer.Option(None, "--compile-budget", help="Seconds each compiled case may take to compile: it "
                                                   "compiles first in a child process within them (filling inductor's caches), or is a "
                                                   "timeout row."),
    out_dir: Path = OPT_TRACE_DIR,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    no_pin: bool = OPT_NO_PIN,
    markdown: Optional[Path] = typer.Option(None, "--markdown", help="Also write the tables as markdown to this file."),
    by_module: bool = typer.Option(False, "--by-module", help="The eager profile also records module ranges: GPU time per module "
                                   "(the tree of perflab profile --by-module)."),
    parallel: Optional[str] = OPT_PARALLEL,
    gpus: Optional[str] = OPT_RANK_GPUS,
    world_size: Optional[int] = OPT_WORLD_SIZE,
):
    """Explain a case: exact accounting, floors (per pass for training steps and generate), the comparison with
    --vs, predictions for CUDA graphs, torch.compile and the family's fixes, those measured (with their compile
    time), and fixes ranked by measured gain. With --parallel (a train_step on several ranks): the bytes a step
    communicates, the bus bandwidth and the floor, each rank's communication, exposed and overlapped, and the
    communication fixes predicted, then measured."""
    import json

    from perflab import api
    from perflab.report.explain_console import render_explanation
    from perflab.report.progress import ExplainProgress

    ranks = _ranks(parallel, gpus, world_size, flags["device"])
    dtype, dtype_note = flags["dtype"], None
    if dtype is None:
        dtype, dtype_note = api.explain_dtype(flags["device"])
    cases = api.make_cases(**flags.one_case_options("explain", model=[model] + ([vs] if vs else []), dtype=[dtype], mode=["eager"]),
                           **ranks.case_options())
    case, other = cases[0], (cases[1] if vs else None)
    if markdown is not None:
        check_writable_file(markdown)
    with ExplainProgress(err) as progress:
        result = api.explain(case, other, out_dir=out_dir, steps=steps, modes=modes, on_stage=progress.on_stage, on_case=progress.on_case,
                             pin=not no_pin, fixes=fixes or None, by_module=by_module, fixes_on=fixes_on, compile_budget_s=compile_budget,
                             gpus=ranks.gpus)
    if as_json:
        sys.stdout.write(json.dumps(dict(result.to_dict(), dtype_note=dtype_note)) + "\n")
    else:
        if dtype_note:
            out.print(dtype_note, soft_wrap=True, markup=False)
        render_explanation(out, result)
    if markdown is not None:
        from perflab.report.explain_markdown import explanation_markdown

        try:
            markdown.write_text(explanation_markdown(result) + "\n")
        except OSError as exc:
            raise write_failed(markdown, exc) from None


@app.command()
def ceilings(
    gpus: Optional[str] = typer.Option(None, "--gpus", help="Also sweep all-reduce over these GPUs (two or more, e.g. 0,1): "
                                       "bus bandwidth as nccl-tests measures it, for the communication floor of --parallel."),
    refresh: bool = typer.Option(False, "--refresh", help="Measure again instead of reading the cache."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
):
    """This GPU's measured ceilings (matmul TFLOP/s per dtype, copy bandwidth, launch costs), cached; with --gpus,
    the all-reduce bus bandwidth of those GPUs (1 MiB to 1 GiB)."""
    import json

    from perflab import api

    result = api.ceilings(_parse_gpus(gpus), refresh=refresh, on_note=lambda line: err.print(f"note: {line}", markup=False))
    if as_json:
        sys.stdout.write(json.dumps(result) + "\n")
        return
    from perflab.report.console import ceilings_lines

    for line in ceilings_lines(result):
        out.print(line, markup=False, soft_wrap=True)


@app.command()
@case_flags(leave_out=(*TIMING, *BUILD), input_size=ONE_INPUT_SIZE, batch_size=ONE_BATCH_SIZE, device=GPU_DEVICE,
            dtype=(str, typer.Option("bf16", "--dtype", help="fp32, tf32, bf16 or fp16 (bf16/fp16 via autocast).")),
            mode=(str, typer.Option("eager", "--mode", help="One mode, as for bench (eager, compile, cudagraph, ...).")))
def ncu(
    model: str = typer.Argument(..., help="The model whose top kernels to read counters for."),
    top: int = typer.Option(10, "--top", help="How many of the top kernels (by time in a profile pass)."),
    flags: CaseFlags = None,
    out_dir: Path = OPT_TRACE_DIR,
    as_json: bool = typer.Option(False, "--json", help="Print the table as JSON records."),
    per_config: int = typer.Option(0, "--per-config", help="Launches profiled per launch configuration (kernel, grid, block), "
                                   "each weighted by the step's launches of it (faster on large models; not yet checked on a "
                                   "GPU against every launch); 0 (default) profiles every launch."),
):
    """Nsight Compute counters (SM, memory and DRAM throughput, occupancy, L1/L2 hit rates, roofline class)
    for the top kernels of a case, read inside the timed step range with the clocks left alone."""
    from perflab import api
    from perflab.report.explain_console import render_ncu
    from perflab.trace.ncu import find_ncu

    if top < 1:
        raise PerflabError(f"--top must be at least 1, got {top}")
    if per_config < 0:
        raise PerflabError(f"--per-config must be 0 (every launch) or more, got {per_config}")
    find_ncu()
    (case,) = api.make_cases(**flags.one_case_options("ncu", model=[model]))
    with err.status(_text(f"{case.label()}: profiling, then running ncu on the top {top} kernels")):
        table, _ = api.ncu(case, top=top, out_dir=out_dir, per_config=per_config)
    if as_json:
        sys.stdout.write(table.to_json(orient="records") + "\n")
    else:
        render_ncu(out, table, case.label())


if __name__ == "__main__":
    main()


@app.command(context_settings={"allow_interspersed_args": False})
def run(
    ctx: typer.Context,
    skip: int = typer.Option(5, "--skip", help="Steps to let run first (warm-up, compilation), untimed."),
    steps: int = typer.Option(20, "--steps", help="Steps to time, untraced (CUDA events on the step's stream; the host clock on the CPU)."),
    trace: int = typer.Option(3, "--trace", help="Steps to trace with torch.profiler after the timed ones and the profiler's warm-up (0: none)."),
    trace_warmup: int = typer.Option(3, "--trace-warmup", help="Steps run under the profiler before the traced ones and thrown away: "
                                     "its start-up lands in them, not in the traced steps."),
    inflation_limit: float = typer.Option(1.10, "--inflation-limit", help="Traced ÷ untraced step beyond which the run is flagged "
                                          "trace_inflated: its traced accounting then describes the profiler, not the program."),
    no_shapes: bool = typer.Option(False, "--no-shapes", help="Trace without operator shapes (cheaper; FLOPs, MFU and the compute floor "
                                   "are then left out)."),
    step: Optional[str] = typer.Option(None, "--step", help="A step is each call of this function: QUALNAME or FILE:QUALNAME "
                                       "(decode_one_token, Model.forward). Default: every optimizer step."),
    step_range: Optional[str] = typer.Option(None, "--step-range", help="A step is each NVTX or record_function range whose name starts "
                                             "with this (e.g. BENCHMARK, the range the Llama decode testbench marks)."),
    stop_after: bool = typer.Option(False, "--stop-after", help="Stop the program after the traced steps (exit code 0)."),
    out_dir: Path = typer.Option(Path("perflab-run"), "--out", help="Directory for run.json and the trace(s)."),
    nproc: Optional[str] = typer.Option(None, "--nproc", help="Run the program under torchrun with this many ranks (one per GPU); "
                                        "a list (1,2) runs it at each count and reports the scaling over the first."),
    stall_factor: float = typer.Option(1.5, "--stall-factor", help="A timed step longer than this × the median is a stall: its share "
                                       "of the wall time and its cause (input, a synchronising call, the program's own work) are reported."),
    inputs: Optional[List[str]] = typer.Option(None, "--input", help="A function whose calls are waits for input, beside every "
                                               "DataLoader's (QUALNAME or FILE:QUALNAME: get_batch, MyLoader.__next__); repeatable."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help="Samples a step takes, for samples/s where the batches do not "
                                             "say (default: counted from the batches the DataLoader or --input returned)."),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", help="Tokens a sample has, for tokens/s with --batch-size."),
):
    """Run your own program unchanged, time its steps, trace a few and explain them:
    perflab run [OPTIONS] -- SCRIPT [ARGS...] (or -- -m MODULE [ARGS...]; also python -m perflab run under torchrun).

    The program keeps its __main__, sys.argv, output and exit code; perflab's report goes to stderr and OUT/run.json."""
    from perflab import api

    code = api.run(cli_argv.of(ctx).program, skip=skip, steps=steps, trace=trace, step=step, step_range=step_range, stop_after=stop_after,
                   out_dir=out_dir, nproc=_rank_counts(nproc), render=_run_render(ctx), trace_warmup=trace_warmup, inflation_limit=inflation_limit,
                   record_shapes=not no_shapes, render_scaling=_render_scaling, stall_factor=stall_factor, inputs=tuple(inputs or ()),
                   batch_size=batch_size, seq_len=seq_len)
    raise typer.Exit(code)


def _rank_counts(text: str | None) -> int | list[int] | None:
    """--nproc N (one run under torchrun) or N,M,... (a run at each count and the scaling)."""
    if text is None:
        return None
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise PerflabError(f"--nproc: expected a rank count or a list of them (2, or 1,2), got {text!r}") from None
    return counts if "," in text else counts[0]


def _render_scaling(section: dict) -> None:
    from perflab.report.program import render_scaling

    render_scaling(err, section)


def _run_render(ctx):
    """run's console report on stderr, at the command line's --wide, made again by the report's own process."""
    from perflab.report.program import StderrRender

    return StderrRender(wide=cli_argv.of(ctx).wide)
