"""Console tables that fit the terminal (report.fit), and the paired comparisons bench prints (report.tables.comparisons)."""

import io
import json
import re
import statistics
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from rich.cells import cell_len
from rich.console import Console
from rich.text import Text

from cli_util import run_cli_here
from perflab.report import fit
from perflab.report.console import bench_table, comparison_tables, speedup_table
from perflab.report.fit import short_forms
from perflab.report.tables import comparisons
from perflab.report.terminal import PIPED_WIDTH, WIDE_WIDTH, TerminalConsole, terminal_width

DATA = Path(__file__).parent / "data" / "reproduce" / "h100_demo_rows.jsonl"
TINY_VISION = str(Path(__file__).parent / "data" / "models" / "tiny_vision.py") + ":PatchNet"


def recorded(setting="demo"):
    return [r for r in map(json.loads, DATA.read_text().splitlines()) if r["setting"] == setting]


def render(*renderables, width=100) -> str:
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, highlight=False, color_system=None)
    for renderable in renderables:
        console.print(renderable)
    return buffer.getvalue()


def test_short_forms_keep_the_words_that_tell_names_apart():
    assert short_forms(["deit_tiny_patch16_224", "deit_small_patch16_224"]) == {"deit_tiny_patch16_224": "tiny",
                                                                                "deit_small_patch16_224": "small"}
    topk = short_forms(["deit_base_patch16_224", "topk_deit_base_patch16_224 kr0.1@3,6,9"])
    assert topk == {"deit_base_patch16_224": "deit", "topk_deit_base_patch16_224 kr0.1@3,6,9": "topk_kr0.1@3,6,9"}
    assert short_forms(["test:tiny", "tests/data/models/tiny_vision.py:PatchNet"])["tests/data/models/tiny_vision.py:PatchNet"] == "PatchNet"
    assert short_forms(["a_x_1", "a_x_2", "a_x_1"]) == {"a_x_1": "1", "a_x_2": "2"}
    assert short_forms(["m_a_b", "m_b_a"]) == {"m_a_b": "m1", "m_b_a": "m2"}  # the same words: numbered
    assert short_forms(["only_one"]) == {"only_one": "only_one"}
    assert short_forms(["/home/me/models/net.py:PatchNet"]) == {"/home/me/models/net.py:PatchNet": "PatchNet"}  # one long reference
    assert short_forms(["hf:/data/ckpt/llama-tiny/"]) == {"hf:/data/ckpt/llama-tiny/": "llama-tiny"}
    assert short_forms(["deit_small_patch16_224"]) == {"deit_small_patch16_224": "deit_small_patch16_224"}  # a built-in stays whole


def test_the_gpu_demo_fits_100_columns_with_every_row_told_apart_and_wide_keeps_everything():
    rows = recorded()
    tables = [bench_table(rows), *comparison_tables(rows)]
    text = render(*tables, width=100)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 100
    assert "…" not in text  # no cell cut
    first_table = lines[:next(i for i, line in enumerate(lines) if line.startswith("└"))]
    # the bench table: 8 rows (flags wrap onto more lines); model short forms with their legend
    first_cells = [line.split("│")[1].strip() for line in first_table if line.startswith("│") and line.split("│")[1].strip()]
    assert first_cells == ["deit"] * 4 + ["topk_kr0.1@3,6,9"] * 4
    assert "deit = deit_base_patch16_224; topk_kr0.1@3,6,9 = topk_deit_base_patch16_224 kr0.1@3,6,9" in text
    assert "every row: 224px, bf16" in text  # the key columns every row shares, said once
    assert "not shown at this width (--wide shows them): host µs" in text
    # three comparisons: the models, the batch sizes and the modes
    assert [t.title for t in tables[1:]] == ["Paired comparison: model", "Paired comparison: batch size", "Paired comparison: mode"]
    wide = render(*tables, width=10_000)
    assert "host µs" in wide and "deit_base_patch16_224 │" in wide and "\nevery row:" not in wide and "not shown" not in wide
    assert max(len(line) for line in wide.splitlines()) > 100
    narrow = render(bench_table(rows), width=60)
    assert max(len(line) for line in narrow.splitlines()) <= 60 and "…" not in narrow


def test_comparisons_pair_rows_that_differ_in_one_field_with_the_paired_ratio_per_item():
    rows = recorded()
    found = comparisons(rows)
    assert {k: len(v) for k, v in found.items()} == {"model": 4, "batch size": 4, "mode": 4}
    for entry in found["batch size"]:
        base, variant = entry["rows"]
        assert (base["batch_size"], variant["batch_size"]) == (1, 64) and base["model"] == variant["model"]
        # independently: the median (on logs) over rounds of base ms ÷ variant ms, times the 64 images a variant step holds
        by_round = {(p, r): v for v, p, r in zip(base["samples_ms"], base["sample_processes"], base["sample_rounds"])}
        ratios = [by_round[(p, r)] / v for v, p, r in zip(variant["samples_ms"], variant["sample_processes"], variant["sample_rounds"])]
        assert entry["paired"] and entry["speedup"] == pytest.approx(np.exp(np.median(np.log(ratios))) * 64)  # the median on logs
        assert entry["speedup_ci95"][0] <= entry["speedup"] <= entry["speedup_ci95"][1]
    for entry in found["model"]:
        assert entry["rows"][0]["model"] == "deit_base_patch16_224" and entry["rows"][1]["model"].startswith("topk_")
    # the demo's table is the model comparison, titled as before
    assert speedup_table(rows).title == "Top-k vs baseline" and len(speedup_table(rows).columns[0].cells) == 4
    assert comparisons([rows[0]]) == {}


def test_terminal_width_honours_columns_and_is_100_when_piped():
    assert terminal_width({"COLUMNS": "73"}, isatty=False) == 73
    assert terminal_width({"COLUMNS": "73"}, isatty=True) == 73
    assert terminal_width({}, isatty=False) == PIPED_WIDTH == 100
    assert terminal_width({}, isatty=True) is None  # rich asks the terminal
    assert terminal_width({"COLUMNS": "999999999"}, isatty=False) == 10_000  # a rule of a billion columns never ended
    ruled = TerminalConsole(file=io.StringIO(), color_system=None)
    ruled.configure(environ={"COLUMNS": "60"}, isatty=False)
    ruled.rule("dir[/x]/m.py:Net 32px")  # a case's label: text, not markup (it raised MarkupError)
    assert ruled.file.getvalue().split()[1:3] == ["dir[/x]/m.py:Net", "32px"] and len(ruled.file.getvalue().rstrip("\n")) == 60
    console = TerminalConsole(file=io.StringIO())
    console.configure(environ={"COLUMNS": "80"}, isatty=False)
    assert console.width == 80
    console.configure(wide=True, environ={"COLUMNS": "80"}, isatty=False)
    assert console.width > 1000 and console.rule_width == 80


def test_bench_of_two_models_fits_columns_tells_them_apart_and_compares_them(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    args = ["bench", "--model", "test:tiny", TINY_VISION, "--input-size", "32", "--device", "cpu", "--iters", "4", "--repeats", "4",
            "--warmup", "1"]
    result = run_cli_here(*args)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 100 and "…" not in result.stdout
    assert "Paired comparison: model" in result.stdout
    assert f"PatchNet = {TINY_VISION}" in result.stdout.replace("\n", "")
    rows_cells = [line.split("│")[1].strip() for line in lines if line.startswith("│") and line.split("│")[1].strip()]
    assert rows_cells[:2] == ["test", "PatchNet"]


# ---------------------------------------------------------------------------------------------------
# Honest intervals: a CI from fewer than 5 units states the coverage it has


def test_order_coverage_is_what_the_ranks_guarantee():
    from perflab.stats import order_coverage

    assert [order_coverage(1, n, range(1, n + 1)) for n in (2, 3, 4, 5)] == [0.5, 0.75, 0.875, 0.9375]
    assert order_coverage(2, 3, [1, 2, 3, 4]) == 6 / 16  # ranks 2..3 of 4: P(B = 2), B ~ Binomial(4, 1/2)
    assert order_coverage(0.5, 1.5, [1, 2, 3]) == 0.0  # one value inside: nothing guaranteed


def test_hierarchical_ci_states_95_percent_from_five_units_only():
    from perflab.stats import hierarchical_ci

    rng = np.random.default_rng(3)
    x = np.exp(rng.normal(0, 0.05, 20))
    assert hierarchical_ci(x, None, np.arange(20)).coverage == 0.95  # 5 stretches
    four = hierarchical_ci(x[:4], None, np.arange(4))
    assert four.n_units == 4 and four.level == "time" and four.coverage <= 0.875
    assert four.low <= min(x[:4]) and four.high >= max(x[:4]) and four.coverage == 0.875  # the t-interval holds all four
    two = hierarchical_ci(x[:2], None, np.arange(2))
    assert two.level == "pooled" and two.coverage == 0.5 and (two.low, two.high) == (min(x[:2]), max(x[:2]))


def test_two_samples_give_no_95_percent_label(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    result = run_cli_here("bench", "--model", "test:tiny", "--input-size", "32", "--device", "cpu", "--iters", "2", "--repeats", "2",
                          "--warmup", "1")
    assert result.returncode == 0, result.stderr
    assert "95%" not in result.stdout.replace("CI: 95% from 5 or more units", "")
    assert "ms/batch (CI)" in result.stdout and "min–max of 2" in result.stdout
    assert "CI: 95% from 5 or more units" in result.stdout  # the caption says why
    rows = json.loads(run_cli_here("bench", "--model", "test:tiny", "--input-size", "32", "--device", "cpu", "--iters", "2",
                                   "--repeats", "2", "--warmup", "1", "--format", "json").stdout)
    assert rows["n_samples"] == 2 and rows["ci_level"] == "pooled" and rows["ci_coverage"] == 0.5
    # the JSON's CI key names no level it does not have: ci_ms beside its level (ci95_ms, the same, kept one release)
    assert rows["ci_ms"] == rows["ci95_ms"] == sorted(rows["samples_ms"])


# ---------------------------------------------------------------------------------------------------
# Warnings worth reading


def _row(label, flags, warnings, status="ok"):
    return {"label": label, "status": status, "flags": list(flags), "warnings": list(warnings), "message": "boom"}


def test_a_warning_every_row_shares_is_said_once_and_the_host_noise_in_one_line():
    from perflab.report.console import warning_lines

    cv = [f"timing samples vary by CV {v}% (threshold 5%); the machine may be busy or the step too short" for v in (13, 25, 9, 16)]
    rows = [_row(f"deit_tiny_patch16_224 224px bs{bs} fp32 eager", ["high_cv"] + (["host_contention"] if bs == 8 else []),
                 [cv[i]] + (["the timing thread waited for a CPU 56% of the timed loop"] if bs == 8 else []))
            for i, bs in enumerate((1, 8, 2, 4))]
    rows[2]["flags"].append("batch_mismatch")
    rows[2]["warnings"].append("each step processed 1 images, not the 2 requested")
    rows.append(_row("deit_tiny_patch16_224 224px bs16 fp32 eager", [], [], status="oom"))
    lines = warning_lines(rows)
    assert lines[0] == "[red]oom[/red]: deit_tiny_patch16_224 224px bs16 fp32 eager: boom"
    assert lines[1] == ("[yellow]warning[/yellow]: high_cv (every row): timing samples vary by more than CV 5%; the machine may be "
                        "busy or the step too short | host_contention (bs8): the timing thread waited for a CPU 56% of the timed loop")
    assert lines[2:] == ["[yellow]warning[/yellow]: deit_tiny_patch16_224 224px bs2 fp32 eager: each step processed 1 images, not the 2 requested"]
    assert warning_lines([_row("a", [], [])]) == []


def test_two_modes_on_a_busy_host_are_said_once_beside_it_not_as_each_steps_own():
    """Rows whose timing thread waited for a CPU (host_contention) and whose samples fell in two modes: the slow mode may
    be the other work's, so the modes join the host's line once instead of a line a row calling them the step's own (the
    demo on a 2-core host under another job printed four warning lines); two modes on a quiet host stay each row's."""
    from perflab.measure.checks import BUSY_BIMODAL
    from perflab.report.console import warning_lines

    modes = "two modes: 16 of 20 samples at 35.1 ms (80%), 4 at 79.61 ms (20%); the CV of 39.5% is the distance between the modes, not noise"
    busy = "the timing thread waited for a CPU 31.0% of the timed loop"
    rows = [_row(f"deit_tiny_patch16_224 224px bs{bs} fp32 eager", ["bimodal", "host_contention"], [modes, busy]) for bs in (1, 8)]
    rows.append(_row("deit_tiny_patch16_224 224px bs2 fp32 eager", ["host_contention"], [busy]))
    assert warning_lines(rows) == [f"[yellow]warning[/yellow]: bimodal (bs1, bs8): {BUSY_BIMODAL} | host_contention (every row): {busy}"]
    quiet = [_row(f"deit_tiny_patch16_224 224px bs{bs} fp32 eager", ["bimodal"] if bs == 1 else [], [modes] if bs == 1 else []) for bs in (1, 8)]
    assert warning_lines(quiet) == [f"[yellow]warning[/yellow]: deit_tiny_patch16_224 224px bs1 fp32 eager: {modes}"]


def test_flags_on_every_row_leave_the_table_cells_for_its_caption():
    rows = recorded()
    text = render(bench_table(rows), width=10_000)
    assert "flags on every row: other_processes, throttled" in text
    cells = "\n".join(line for line in text.splitlines() if line.startswith("│"))
    assert cells.count("high_cv") == 3 and "other_processes" not in cells  # the rows' own flags stay in their cells


def test_the_profilers_stage_lines_are_kept_off_stderr(capfd, tmp_path):
    import sys

    import torch

    from perflab.trace.capture import record_steps

    def step():
        print("the step's own line", file=sys.stderr, flush=True)
        return torch.ones(8, 8) @ torch.ones(8, 8)

    record_steps(step, tmp_path / "t.json", "cpu", steps=1, warmup=1)
    err = capfd.readouterr().err
    assert "USDT" not in err and "STAGE:" not in err
    assert err.count("the step's own line") == 2  # everything else that was written is passed on


def test_names_and_messages_with_brackets_are_printed_as_they_are_not_read_as_markup():
    from perflab.report.console import warning_lines

    rows = recorded()
    for row in rows:  # a path of one's own may hold brackets
        row["model"], row["label"] = (row[k].replace("deit_base", "deit[/base]") for k in ("model", "label"))
    rows[0] = dict(rows[0], status="error", message="expected [batch, 3] in [/data/x]")
    rows[1] = dict(rows[1], flags=["tokens_mismatch"], warnings=["a [b]message[/b] of its own"])
    for width in (100, 10_000):
        text = render(bench_table(rows), *comparison_tables(rows), width=width).replace("\n", "").replace("│", "").replace(" ", "")
        assert "expected[batch,3]in[/data/x]" in text
        assert "topk_deit[/base]_patch16_224kr0.1@3,6,9" in text  # the legend (100) or the cells (wide)
    buffer = io.StringIO()
    console = TerminalConsole(file=buffer, color_system=None)
    console.configure(environ={"COLUMNS": "100"}, isatty=False)
    for line in warning_lines(rows):
        console.say(line)
    said = buffer.getvalue().replace("\n  ", " ")
    assert "error: deit[/base]_patch16_224 224px bs1 bf16 eager: expected [batch, 3] in [/data/x]" in said
    assert "a [b]message[/b] of its own" in said


def test_a_warning_with_no_flag_is_said_once_not_dropped():
    from perflab.report.console import warning_lines

    failed = "process 2 of 3 failed (RuntimeError: boom); the rows pool the 1 that finished"  # measure.harness appends it
    rows = [_row(f"m bs{bs}", ["high_cv"], ["timing samples vary by CV 9.0% (threshold 5%)", failed]) for bs in (1, 2)]
    assert warning_lines(rows) == [f"[yellow]warning[/yellow]: high_cv (every row): timing samples vary by CV 9.0% (threshold 5%) | "
                                   f"every row: {failed}"]
    rows[1]["warnings"] = rows[1]["warnings"][:1]
    assert warning_lines(rows)[1:] == [f"[yellow]warning[/yellow]: m bs1: {failed}"]
    assert warning_lines(rows[:1]) == [f"[yellow]warning[/yellow]: m bs1: high_cv: timing samples vary by CV 9.0% (threshold 5%) | {failed}"]


def test_a_coverage_bound_is_never_rounded_up():
    from perflab.stats import ci_note

    assert [ci_note(c, None) for c in (0.875, 0.75, 0.9375, 0.5)] == ["≥87.5%", "≥75%", "≥93.7%", "≥50%"]
    assert ci_note(0.5, 2) == "min–max of 2" and ci_note(0.95, None) == "" and ci_note(None, None) == ""


def test_bench_of_a_model_whose_path_holds_brackets_on_a_terminal(tmp_path, monkeypatch):
    import shutil

    from perflab import cli

    monkeypatch.chdir(tmp_path)
    model = Path("models_of_mine[") / "y]" / "a_rather_long_module_name.py"  # models_of_mine[/y]/...: a closing tag to rich's markup
    model.parent.mkdir(parents=True)
    shutil.copy(TINY_VISION.rsplit(":", 1)[0], model)
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setattr(cli, "err", TerminalConsole(file=io.StringIO(), force_terminal=True, stderr=True))  # the progress bar shows
    result = run_cli_here("bench", "--model", f"{model}:PatchNet", "--input-size", "32", "--device", "cpu", "--iters", "2",
                          "--repeats", "2", "--warmup", "1")
    assert result.returncode == 0, result.stderr
    assert "models_of_mine[/y]/a_rather_long_module_name.py" in result.stdout and "MarkupError" not in result.stderr
    # one long path of one's own: shortened to its NAME with a legend, so the other columns keep their room (they had none)
    assert f"PatchNet = {model}:PatchNet" in " ".join(result.stdout.split())
    assert "img/s" in result.stdout and "status" in result.stdout
    assert max(len(line) for line in result.stdout.splitlines()) <= 100


def test_too_narrow_for_whole_words_the_columns_that_tell_rows_apart_keep_their_width():
    rows = recorded()
    lines = render(bench_table(rows), width=60).splitlines()
    assert max(len(line) for line in lines) <= 60
    cells = [[c.strip() for c in line.split("│")[1:4]] for line in lines if line.startswith("│") and line.split("│")[1].strip()]
    # rich squeezed every column evenly, and the bs column (2 wide) to nothing: bs 1 and bs 64 could not be told apart
    assert [(bs, mode) for _, bs, mode in cells] == [(str(r["batch_size"]), r["mode"]) for r in rows]


def test_a_warning_names_its_rows_as_the_table_does_not_by_a_number_the_table_never_shows():
    """make demo's four rows (two models at two batch sizes): high_cv on one row named by its model and batch size,
    the table's own cells, not "m4"."""
    from perflab.report.console import table_names, warning_lines

    labels = [f"{model} 224px bs{bs} fp32 eager" for model in ("deit_tiny_patch16_224", "topk_deit_tiny_patch16_224 kr0.1@3,6,9")
              for bs in (1, 8)]
    rows = [_row(label, [], []) for label in labels]
    rows[3] = _row(labels[3], ["high_cv", "host_contention"], ["timing samples vary by CV 13%", "the timing thread waited"])
    rows[0] = _row(labels[0], ["host_contention"], ["the timing thread waited"])
    assert warning_lines(rows) == ["[yellow]warning[/yellow]: host_contention (deit_tiny_patch16_224 bs1, topk_deit_tiny_patch16_224 "
                                   "kr0.1@3,6,9 bs8): the timing thread waited | high_cv (topk_deit_tiny_patch16_224 kr0.1@3,6,9 bs8): "
                                   "timing samples vary by CV 13%"]
    assert table_names([_row("a bs1", [], []), _row("a bs1", [], [])]) == {"a bs1": "a bs1"}


def test_host_us_is_explained_under_the_table_that_shows_it():
    rows = recorded()
    wide = " ".join(render(bench_table(rows), width=10_000).split())
    assert "┃ host µs ┃" in wide
    assert ("host µs: the host's speed around the case, a fixed CPU micro-workload (Python and tiny torch ops) timed before and after "
            "the timed loop, µs a run (lower: a faster host), and its ratio to the median of its environment's rows") in wide
    without = [{k: v for k, v in r.items() if k != "host_canary_us"} for r in rows]
    assert "host µs" not in render(bench_table(without), width=10_000)  # rows before the canary: no column, no legend


def test_gflops_of_a_tiny_decode_are_shown_with_significant_digits_not_as_zero():
    from perflab.report.md import gflops

    assert [gflops(v) for v in (35.14, 1.0, 0.829, 0.000252, 0.0123, 0.0, None)] == ["35.14", "1.00", "0.83", "0.00025", "0.012", "0",
                                                                                     "–"]
    rows = [dict(r, gflops=0.000252) for r in recorded()[:1]]
    assert "0.00025" in render(bench_table(rows), width=10_000)


# ---------------------------------------------------------------------------------------------------
# Narrow terminals: no cell splits a number or a word, no line is wider than the terminal, and footers wrap

BOX_DRAWING = re.compile("[\u2500-\u257f]")


def printed(draw, columns: int, wide: bool = False) -> str:
    """What ``draw(console)`` prints on stdout's console at ``COLUMNS=columns`` (``wide``: with --wide)."""
    console = TerminalConsole(file=io.StringIO(), color_system=None)
    console.configure(wide=wide, environ={"COLUMNS": str(columns)}, isatty=False)
    draw(console)
    return console.file.getvalue()


def printed_words(text: str) -> set[str]:
    return set(BOX_DRAWING.sub(" ", text).split())


def printed_and_noted(draw, width: int) -> tuple[str, set[str]]:
    """What ``draw`` prints at ``width``, and the words of the notes the tables' fitting wrote there (short forms,
    columns not shown)."""
    notes = []

    def fitted_and_noted(columns, at, fit_columns=fit.fit_columns, **options):
        shown, said = fit_columns(columns, at, **options)
        notes.extend(said)
        return shown, said

    with mock.patch.object(fit, "fit_columns", fitted_and_noted):
        text = printed(draw, width)
    return text, printed_words(Text.from_markup("\n".join(notes)).plain)


def assert_never_split(draw, widths=(60, 80, 100), longer_fold: int = WIDE_WIDTH) -> dict[int, str]:
    """``draw(console)`` printed at each of ``widths``: no line is wider, and each number, ratio, CI (2.403–9.061) and
    word is printed whole: every word printed is one printed at full width (--wide and COLUMNS=10000: no table narrowed,
    no line wrapped), or one of the notes the tables' fitting wrote at this width (short forms, columns not shown).
    A cell folded mid-number prints pieces ("(2.403–9.0", "61)") that are neither. Only a word longer than
    ``longer_fold`` characters (a kernel's name) may fold. Returns the text at each width."""
    whole = printed_words(printed(draw, WIDE_WIDTH, wide=True))
    texts = {}
    for width in widths:
        text, notes = printed_and_noted(draw, width)
        texts[width] = text
        wider = [line for line in text.splitlines() if cell_len(line) > width]
        assert not wider, f"{len(wider)} line(s) wider than {width} columns:\n" + "\n".join(wider)
        split = printed_words(text) - whole - notes
        split = {piece for piece in split if not any(piece in word for word in whole if len(word) > longer_fold)}
        assert not split, f"split at {width} columns: {sorted(split)}\n{text}"
    return texts


def test_bench_paired_tables_keep_their_numbers_whole_and_the_gflops_at_80_columns():
    rows = recorded()
    tokens = [dict(r, family="lm", label=None, model=r["model"].replace("deit_base_patch16_224", "gpt_small"),
                   case={"workload": "train_step", "seq_len": 512}) for r in rows]
    for rows, unit, item in ((rows, "img", "img"), (tokens, "sample", "tok")):
        tables = comparison_tables(rows)
        texts = assert_never_split(lambda console: [console.print(t) for t in tables])
        # the FLOP question's column stays at 80 columns in each table (models, batch sizes, modes); the throughputs go first
        for table in tables:
            shown = [c.header for c in fit.fit_columns(table.columns, 80)[0]]
            assert f"GFLOPs/{unit}" in shown
        model_rows = [line for line in texts[80].split("Paired comparison: batch size")[0].splitlines() if line.startswith("│")]
        assert sum("35.13 →" in line for line in model_rows) == 4  # the base's FLOPs → the top-k model's, on each pair's row
        batch_sizes = " ".join(texts[80].split("Paired comparison: batch size")[1].split("Paired comparison: mode")[0].split())
        assert f"not shown at this width (--wide shows them): baseline {item}/s, variant {item}/s, paired CI speedup:" in batch_sizes


def stored(case_id, processes, key, model="model.py:Net"):
    """A stored row of one case at one version, measured in three processes."""
    median = statistics.median(processes)
    return {"case_id": case_id, "status": "ok", "model": model, "input_size": 32, "batch_size": int(case_id[-1]), "dtype": "fp32",
            "mode": "eager", "median_ms": median, "ci95_ms": [min(processes), max(processes)], "process_medians_ms": list(processes),
            "version": {"key": key, "session": key}}


def version(name, revision, subject):
    from perflab.sweep.versions import Version

    return Version(name, "revision", f"{name}:commit:{revision}", "/home/me/.venv/bin/python", commit=revision * 40, subject=subject,
                   revision=revision, env={"torch": "2.5.1+cu124", "cuda": "12.4", "driver": "550.54.15", "perflab": "0.4.0"})


AB_A = [stored("c1", [2.39, 2.403, 2.41], "A"), stored("c2", [4.95, 5.0, 5.05], "A")]
AB_B = [stored("c1", [9.0, 9.061, 9.2], "B"), stored("c2", [3.0, 5.1, 9.0], "B")]


def test_compare_and_ab_at_60_80_and_100_columns_split_no_number_and_wrap_their_footers():
    from perflab.analysis.regressions import compare_rows
    from perflab.report.versions import render_comparison, render_versions

    comparison = compare_rows(AB_A, AB_B, 0.05)
    assert [c.verdict for c in comparison.changes] == ["slower", "inconclusive"]
    texts = assert_never_split(lambda console: render_comparison(console, comparison, ("runs/a/results.jsonl", "runs/b/results.csv")))
    at_80 = texts[80].splitlines()
    cells = [[cell.strip() for cell in line.split("│")[1:-1]] for line in at_80 if line.startswith("│")]
    assert [row[-2:] for row in cells if row[-1]] == [["3.785×", "slower"], ["1.033×", "inconclusive"]]
    assert ["(3.673–3.899)", "(0.264–4.045)"] == [row[-2] for row in cells if row[-2].startswith("(")]  # the CIs whole, below
    assert "not shown at this width (--wide shows them): CI over (n)" in texts[80]  # how each CI was taken: said below too
    footer = texts[80].split("└")[1].splitlines()[2:]
    assert footer[0].startswith("A: runs/a/results.jsonl; B: runs/b/results.csv. B/A above 1") and len(footer) >= 5
    assert all(line.startswith("  ") for line in footer[1:4])  # the first note wrapped, its further lines indented
    versions = [version("A", "c2", "the matmul as it was"), version("B", "c3", "doubled matmul")]
    texts = assert_never_split(lambda console: (render_versions(console, versions),
                                                render_comparison(console, comparison, tuple(v.label for v in versions))))
    assert texts[60].startswith("A: revision c2 (c2c2c2c2c2: the matmul as it was) · torch\n  2.5.1+cu124 · CUDA 12.4")


def test_track_series_and_its_footer_fit_60_80_and_100_columns():
    from perflab.analysis.regressions import revision_series
    from perflab.report.versions import render_series

    rows = [stored("c1", p, k) for k, p in (("k1", [2.39, 2.403, 2.41]), ("k2", [2.4, 2.41, 2.42]), ("k3", [9.0, 9.061, 9.2]))]
    series = revision_series(rows, [("k1", "c1"), ("k2", "c2"), ("k3", "c3")])
    assert [p.step.verdict if p.step else None for p in series[0].points] == [None, "no change", "slower"]
    texts = assert_never_split(lambda console: render_series(console, series, 0.05))
    footer = texts[80].split("┘")[-1].strip("\n").splitlines()
    assert footer[0].startswith("model.py:Net 32px bs1 fp32 eager: noise floor on this host ±1.1% to ±3.0% (each")
    assert footer[3].startswith("Each revision against the one before it") and len(footer) == 6 and footer[4].startswith("  its 95% CI")
    assert "│ c2       │ 2.41 (2.4–2.42) │            1.004× │ processes (3) │ no change   │" in texts[80]


def measured(ms, host_ms, gpu_ms, first_step_s=None, mfu=None):
    return {"status": "ok", "median_ms": ms, "host_held_ms": host_ms, "device_ms": gpu_ms, "first_step_s": first_step_s,
            "peak_mem_alloc_mb": 1843.2, "mfu": mfu}


def test_explains_fixes_tables_split_no_number_or_word():
    from types import SimpleNamespace

    from perflab.analysis.fixes import Fix
    from perflab.report.explain_console import _print_table, render_fixes
    from perflab.report.explain_parallel import FIX_HEADER, FIX_TITLE, fix_rows

    cudagraph = measured(8.0, 0.5, 7.8, first_step_s=3.2, mfu=0.412)
    fixes = []
    for name, changes, predicted, ms in (("optimizer:foreach", {"optimizer": "foreach"}, 8.61, 8.5),
                                         ("optimizer:in_backward_stream", {"optimizer": "in_backward_stream"}, 7.92, 8.04),
                                         ("checkpoint", {"checkpoint_activations": True}, 9.734, 9.0),
                                         ("compile:reduce-overhead+optimizer:in_backward_stream",
                                          {"mode": "compile:reduce-overhead", "optimizer": "in_backward_stream"}, None, 8.0)):
        fx = Fix(name, changes, predicted, "the optimizer's bytes ÷ copy bandwidth", base="cudagraph", base_row=cudagraph,
                 predicted_host_ms=0.5, predicted_gpu_ms=None if predicted is None else predicted - 0.2)
        fx.measured = measured(ms, 0.52, ms - 0.2, first_step_s=40.0 if "compile" in name else 3.1, mfu=0.39)
        fixes.append(fx)
    case = SimpleNamespace(eager_row=measured(10.0, 4.0, 9.1, first_step_s=0.4, mfu=0.322), eager_ms=10.0, fix_results=fixes)
    texts = assert_never_split(lambda console: render_fixes(console, case))
    assert "optimizer:in_backward_stream" in texts[80] and "compile:reduce-overhead+optimizer:in_backward_stream" in texts[100]

    # explain --parallel's: its "parallel after" column was folded into "paralle l" at 100 columns
    def prediction(ms):
        return SimpleNamespace(ms=ms, compute_ms=ms - 1.2, exposed_ms=1.2)

    parallel = [SimpleNamespace(name=name, parallel=after, mode="eager", base_row={"median_ms": 12.31}, prediction=prediction(p),
                                measured_ms=ms, measured={"status": "ok"}, error=p / ms - 1, throughput_gain=12.31 / ms,
                                throughput_gain_ci95=(12.31 / ms - 0.021, 12.31 / ms + 0.019), measured_compute_ms=ms - 1.1,
                                measured_exposed_ms=1.1)
                for name, after, p, ms in (("ddp:bucket_cap_mb=100", "ddp:bucket_cap_mb=100", 11.9, 12.05),
                                           ("ddp:grad_view=true", "ddp:bucket_cap_mb=100,grad_view=true", 11.6, 11.92),
                                           ("fsdp:reshard=false", "fsdp:reshard=false", 13.2, 13.71))]
    explained = SimpleNamespace(case=SimpleNamespace(parallel="ddp:bucket_cap_mb=100", mode="eager"), row={"median_ms": 12.31},
                                step=SimpleNamespace(compute_ms=11.1, exposed_ms=1.21), fix_results=parallel)
    texts = assert_never_split(lambda console: _print_table(console, FIX_TITLE, FIX_HEADER, fix_rows(explained)))
    for width, text in texts.items():  # whole in its header, or named among the columns not shown
        assert "┃ parallel after " in text or "parallel after" in " ".join(text.split("shows them):")[-1].split()), width
    assert "│ 2 │ ddp:grad_view=true    │ eager │    12.310 │      11.600 │     11.920 │ -2.7% │         1.03× │" in texts[100]


def test_compare_of_two_traces_splits_no_number_or_word():
    from perflab.analysis.compare import compare_traces
    from perflab.report.explain_console import render_comparison
    from perflab.trace import load_trace

    traces = Path(__file__).parent / "data" / "traces"
    comparison = compare_traces(load_trace(traces / "eager_vit.json.gz"), load_trace(traces / "train_step.json.gz"),
                                ("a/trace.json.gz", "b/trace.json.gz"))
    texts = assert_never_split(lambda console: render_comparison(console, comparison), longer_fold=40)
    assert "kernels added per step (b/trace.json.gz vs a/trace.json.gz)" in texts[80]
    added = texts[80].split("kernels added per step")[1].split("kernels removed")[0]
    sgemm = comparison.added_kernels.set_index("name").loc["sgemm_largek_lds64"]
    assert [[cell.strip() for cell in line.split("│")[-3:-1]] for line in added.splitlines() if "sgemm_largek_lds64" in line] == [
        [f"{sgemm['delta_count']:+.0f}", f"{sgemm['delta_time_ns'] / 1e3:+.2f}"]]  # the numbers keep their room beside a long name


def test_compare_of_two_result_files_at_80_columns(tmp_path, monkeypatch):
    from perflab import api
    from perflab.report.export import write_rows
    from perflab.report.versions import render_comparison

    # relative names: a long temporary path (pytest-xdist's) would wrap in the notes whatever the table does
    monkeypatch.chdir(tmp_path)
    files = Path("a.jsonl"), Path("b.csv")
    for rows, path in zip((AB_A, AB_B), files):
        write_rows([{k: v for k, v in row.items() if k != "version"} for row in rows], path)
    monkeypatch.setenv("COLUMNS", "80")
    result = run_cli_here("compare", *files)
    assert result.returncode == 0, result.stderr
    assert max(cell_len(line) for line in result.stdout.splitlines()) <= 80
    comparison = api.compare_results(*files, threshold=0.05)
    whole = printed(lambda console: render_comparison(console, comparison, tuple(map(str, files))), WIDE_WIDTH, wide=True)
    dropped = "not shown at this width (--wide shows them): CI over (n)"
    assert dropped in result.stdout and printed_words(result.stdout) - printed_words(whole) - printed_words(dropped) == set()
    assert {"2.403", "9.061", "(9–9.2)", "inconclusive", "(4.95–5.05)"} <= printed_words(result.stdout)
    footer = result.stdout.split("└")[1].splitlines()[2:]
    assert footer[0].startswith("A: ") and footer[1].startswith("  ") and len(footer) >= 5  # the notes wrapped, not one 229-column line


def test_the_module_tree_of_explain_and_analyze_splits_no_number_or_word():
    import perflab
    from perflab.report.trace_console import modules_table

    report = perflab.analyze(Path(__file__).parent / "data" / "traces" / "by_module_lm_forward.json.gz")
    texts = assert_never_split(lambda console: console.print(modules_table(report)))
    # the tree's levels keep their indent, so a child is never wrapped or folded at its indent's expense
    assert "│         │     attention_norm │        385.1 │   1.0% │       385.1 │      72 │" in texts[80]
    assert "│     attention_norm │" in texts[60] and "not shown at this width (--wide shows them): class" in texts[80]


def _cells(text: str) -> list[tuple[str, ...]]:
    return [tuple(c.strip() for c in line.strip()[1:-1].split("│")) for line in text.splitlines() if line.startswith("│")]


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_run_draws_the_traced_steps_accounting_and_top_kernels_with_analyzes_drawers(kind):
    """perflab run's tables of its traced steps are analyze's: the same rows, cell for cell, CPU words on a CPU trace."""
    from perflab.analysis.program import program_report
    from perflab.analysis.trace_report import analyze_trace
    from perflab.report.program import run_tables
    from perflab.report.trace_console import summary_table, top_kernels_table
    from perflab.trace.kineto import load_kineto

    data = Path(__file__).parent / "data"
    if kind == "cpu":
        trace = load_kineto(data / "cpu_only.json.gz", ops=True)
        report = program_report(timing={"median_ms": 1.0}, trace=trace, device="cpu")
    else:  # a run.json perflab run wrote on an H200, beside its trace
        trace = load_kineto(data / "run" / "nanogpt_cuda_only_h200.json.gz")
        report = json.loads((data / "run" / "nanogpt_cuda_only_h200_run.json").read_text())
    analyzed = analyze_trace(trace, top=10)
    run_text = render(*run_tables(report), width=400)
    summary, top = render(summary_table(analyzed), width=400), render(top_kernels_table(analyzed), width=400)
    run_rows = _cells(run_text)
    accounting = [row for row in _cells(summary) if row[2]]  # wall, the work's union and the idle causes (the rest has no share)
    assert len(accounting) == (3 if kind == "cpu" else 5) and all(row in run_rows for row in accounting)
    assert _cells(top) and all(row in run_rows for row in _cells(top))
    work = "operators" if kind == "cpu" else "kernels"
    assert f"Top {len(_cells(top))} {work} by total time" in run_text
    assert ("CPU operators (torch's top-level, per thread)" in run_text) == (kind == "cpu")


def test_analyze_at_80_columns_splits_no_number_and_cuts_a_name_only_in_its_middle():
    """analyze's tables at 80 columns printed "47,686. / 6" and "Profile / rStep#0": rich squeezed every column alike.
    Now numbers are never cut or wrapped; a name that cannot fit is cut in its middle (its head and tail kept, so the
    rows stay told apart) and a header's word wraps after its hyphen."""
    import perflab
    from perflab.report.trace_console import render_trace_report

    report = perflab.analyze(Path(__file__).parent / "data" / "run" / "nanogpt_h100.json.gz")
    whole = printed_words(printed(lambda console: render_trace_report(console, report), WIDE_WIDTH, wide=True))
    for width in (60, 80, 100):
        text, notes = printed_and_noted(lambda console: render_trace_report(console, report), width)
        assert max(cell_len(line) for line in text.splitlines()) <= width
        for word in printed_words(text) - whole - notes:
            if fit.is_number(word):
                raise AssertionError(f"a number split at {width} columns: {word}\n{text}")
            head, cut, tail = word.partition("…")
            assert (cut and any(w.startswith(head) and w.endswith(tail) and len(w) > len(word) for w in whole)
                    or word.endswith("-") and any(w.startswith(word) for w in whole)
                    or any(w.endswith(word) and "-" in w for w in whole)), f"{word!r} at {width} columns\n{text}"
    text = printed(lambda console: render_trace_report(console, report), 80)
    steps = [[c.strip() for c in line.split("│")[1:-1]] for line in text.split("Accounting per step")[1].split("└")[0].splitlines()
             if line.startswith("│")]
    assert steps == [["Prof…p#0", "47,686.6", "26,268.7", "20,682.7", "621.9", "113.3", "55.1%", "484"],
                     ["Prof…p#1", "70,087.0", "26,971.1", "42,311.1", "374.2", "430.6", "38.5%", "484"],
                     ["Prof…p#2", "71,416.8", "27,101.4", "43,602.3", "390.2", "322.9", "37.9%", "484"]]
    assert "┃    host- ┃" in text and "┃ bound µs ┃" in text  # the header wrapped after its hyphen
    kernels = [line.split("│")[1].strip() for line in text.split("Top 10 kernels")[1].split("└")[0].splitlines() if line.startswith("│")]
    assert "nvjet_sm90_t…z_coopB_TNN" in kernels and "nvjet_sm90_t…z_coopB_NNN" in kernels  # told apart by their tails


def test_ab_labels_each_sides_ci_by_its_own_coverage_as_results_does():
    """ab headed its sides' CIs "95% CI" where `results` labelled the same rows' intervals ≥75% (three processes)."""
    from perflab.analysis.regressions import compare_rows, revision_series
    from perflab.report.versions import render_comparison, render_series

    a, b = [dict(r, ci_coverage=0.75) for r in AB_A], [dict(r, ci_coverage=0.75) for r in AB_B]
    text = printed(lambda console: render_comparison(console, compare_rows(a, b, 0.05), ("a", "b")), WIDE_WIDTH, wide=True)
    assert "A ms (CI)" in text and "B ms (CI)" in text and "95% CI ┃" not in text.split("B/A time")[0]
    assert "2.403 (2.39–2.41) ≥75%" in text and "9.061 (9–9.2) ≥75%" in text
    assert "from fewer, the coverage their ranks guarantee, said beside each (3 units: ≥75%" in text
    assert "2.403 (2.390–2.410) ≥75%" in render(bench_table([a[0]]), width=10_000)  # results says the same of the row
    series = revision_series([dict(r, version={"key": k}) for r, k in ((a[0], "k1"), (b[0], "k2"))], [("k1", "c1"), ("k2", "c2")])
    text = printed(lambda console: render_series(console, series, 0.05), WIDE_WIDTH, wide=True)
    assert " ms (CI) ┃" in text and "2.403 (2.39–2.41) ≥75%" in text
    # rows whose CIs are 95% keep the 95% label
    assert "A ms (95% CI)" in printed(lambda console: render_comparison(console, compare_rows(AB_A, AB_B, 0.05), ("a", "b")), WIDE_WIDTH, wide=True)


def test_explain_parallels_fixes_keep_the_base_beside_each_fix_at_every_width():
    """At 100 columns a long fix name made the table give up "base beside it ms": each fix's throughput ratio (over the
    base rebuilt beside it) then read against the profiled base, which it contradicts (12.31 ms ÷ 12.05 ≠ 1.07×)."""
    from types import SimpleNamespace

    from perflab.report.explain_console import _print_table
    from perflab.report.explain_parallel import FIX_HEADER, FIX_TITLE, fix_rows

    fixes = [SimpleNamespace(name=name, parallel=name, mode="eager", base_row={"median_ms": base},
                             prediction=SimpleNamespace(ms=p, compute_ms=p - 1.2, exposed_ms=1.2), measured_ms=ms, measured={"status": "ok"},
                             error=p / ms - 1, throughput_gain=base / ms, throughput_gain_ci95=(base / ms - 0.02, base / ms + 0.02),
                             measured_compute_ms=ms - 1.1, measured_exposed_ms=1.1)
             for name, p, ms, base in (("ddp:bucket_cap_mb=100", 11.9, 12.05, 12.9),
                                       ("ddp:bucket_cap_mb=25,grad_view=true,static_graph=true", 11.6, 11.92, 12.4))]
    explained = SimpleNamespace(case=SimpleNamespace(parallel="ddp:bucket_cap_mb=100", mode="eager"), row={"median_ms": 12.31},
                                step=SimpleNamespace(compute_ms=11.1, exposed_ms=1.21), fix_results=fixes)
    texts = assert_never_split(lambda console: _print_table(console, FIX_TITLE, FIX_HEADER, fix_rows(explained)))
    for width, text in texts.items():
        assert "beside" in text.split("┡")[0] and "12.900" in text and "12.400" in text, width  # each fix's own base, beside its ratio
        assert "base beside it ms" not in " ".join(text.split("shows them):")[-1].split()), width
