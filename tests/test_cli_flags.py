"""The command line's flag groups (cli_flags) and its words before the parser (cli_argv).

tests/data/cli_options.json is every command's options as the CLI declared them before the case flags became one group
(each option's default, whether it takes several values, whether it is required): the group must give every command
the same options, with the same defaults.
"""

import json
from pathlib import Path

import click
import pytest
import typer

from perflab import cli
from perflab.cli_argv import CommandLine
from perflab.cli_flags import CASE_FLAGS, CaseFlags, case_flags
from perflab.errors import PerflabError

DECLARED = json.loads((Path(__file__).parent / "data" / "cli_options.json").read_text())
CASE_COMMANDS = ("bench", "ab", "track", "profile", "compare", "explain", "ncu", "breakeven")


def _options():
    group = typer.main.get_command(cli.app)
    ctx = click.Context(group, info_name="perflab")
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        default = lambda p: str(p.default) if isinstance(p.default, Path) else list(p.default) if isinstance(p.default, tuple) else p.default
        yield name, {p.opts[0]: dict(default=default(p), multiple=p.multiple, required=p.required) for p in command.params}


def test_every_command_has_the_options_it_had_with_their_defaults():
    options = dict(_options())
    assert sorted(options) == sorted(DECLARED)
    for name, declared in DECLARED.items():
        assert sorted(options[name]) == sorted(declared), name
        assert options[name] == declared, name


def test_every_command_that_takes_a_case_takes_it_from_the_group():
    options = dict(_options())
    group = {option.param_decls[0] for _, option in CASE_FLAGS.values()}
    for name in CASE_COMMANDS:  # breakeven, the fewest: a classify study's shapes and its timing
        assert len(group & set(options[name])) >= 11, name
    for name in set(options) - set(CASE_COMMANDS):
        # run's --batch-size is the samples a step of the user's program takes (for samples/s), not a case's shape
        case_only = {"--dtype", "--batch-size", "--warmup"} - ({"--batch-size"} if name == "run" else set())
        assert not case_only & set(options[name]), name


def test_the_groups_values_become_make_cases_options():
    flags = CaseFlags(dict(input_size=None, batch_size=8, dtype=["bf16", "fp16"], mode="eager", model_arg=["d_ff=64", "scale=0.5", "act=gelu"],
                           attn="sdpa"))
    assert flags.options(model=["gpt_tiny"]) == dict(input_size=[], batch_size=[8], dtype=["bf16", "fp16"], mode=["eager"], attn="sdpa",
                                                     model_args=dict(d_ff=64, scale=0.5, act="gelu"), model=["gpt_tiny"])
    with pytest.raises(PerflabError, match="--model-arg: expected NAME=VALUE such as d_ff=2048, got 'd_ff'"):
        CaseFlags(dict(model_arg=["d_ff"])).options()  # read when asked: compare of stored results never asks


def test_a_command_names_only_flags_of_the_group():
    with pytest.raises(ValueError, match=r"not flags of the case group: \['batch'\]"):
        case_flags(leave_out=("batch",))


@pytest.mark.parametrize("argv, parsed, program, wide", [
    (["bench", "--model", "a", "b", "--batch-size=1", "2"], ["bench", "--model", "a", "--model", "b", "--batch-size", "1", "--batch-size", "2"],
     [], False),
    (["--wide", "bench", "--dtype", "bf16"], ["bench", "--dtype", "bf16"], [], True),
    (["bench", "--wide", "--dtype", "bf16"], ["bench", "--dtype", "bf16"], [], True),
    # run: the program's words are its own (its --batch-size not expanded, its --wide not perflab's)
    (["run", "--steps", "3", "--", "train.py", "--batch-size", "1", "2", "--wide"], ["run", "--steps", "3"],
     ["train.py", "--batch-size", "1", "2", "--wide"], False),
    (["--wide", "run", "--out", "o", "train.py", "--wide"], ["run", "--out", "o"], ["train.py", "--wide"], True),
    (["run", "--wide", "--", "-m", "pkg.train"], ["run"], ["-m", "pkg.train"], True),
])
def test_the_words_are_read_once_before_the_parser(argv, parsed, program, wide):
    command = CommandLine.read(argv)
    assert (command.typed, command.parsed, command.program, command.wide) == (argv, parsed, program, wide)


def test_ab_and_track_hand_the_api_their_shared_flags_alike(monkeypatch, tmp_path):
    """The versions group (--model with the case flags, --spec, --order, --order-seed, --aa, --timeout, --no-pin, --launcher)
    reaches api.ab and api.track as the same keyword arguments."""
    from types import SimpleNamespace

    from cli_util import run_cli_here
    from perflab import api
    from perflab.analysis.regressions import RowComparison

    summary = SimpleNamespace(interrupted=True, versions=[], out_dir=tmp_path, rounds=2, pairing="blocks", reused=0, stored=1, copy=None)
    seen = {}
    monkeypatch.setattr(api, "ab", lambda **kw: (seen.setdefault("ab", kw), (summary, RowComparison([])))[1])
    monkeypatch.setattr(api, "track", lambda **kw: (seen.setdefault("track", kw), (summary, []))[1])
    shared = ["--model", "m.py:M", "--batch-size", "2", "--order", "random", "--order-seed", "7", "--timeout", "30", "--no-pin",
              "--launcher", "exec", "--no-aa", "--json"]
    run_cli_here("ab", "--repo", tmp_path, "--a", "x", "--b", "y", *shared)
    run_cli_here("track", "--repo", tmp_path, "--revs", "x", "y", "--out", tmp_path, *shared)
    for name in ("ab", "track"):
        kw = seen[name]
        assert (kw["spec"], kw["order"], kw["seed"], kw["timeout_s"], kw["launcher"], kw["pin"], kw["aa"]) == \
            (None, "random", 7, 30.0, "exec", False, False), name
        assert (kw["case_options"]["model"], kw["case_options"]["batch_size"], kw["case_options"]["dtype"]) == (["m.py:M"], [2], ["fp32"]), name


def test_a_number_flags_values_end_at_the_first_word_that_is_no_number_so_compares_models_stay_its_arguments(monkeypatch):
    """perflab compare --batch-size 1 64 MODEL MODEL: A and B are the models, --batch-size 1 for A and 64 for B."""
    from cli_util import run_cli_here
    from perflab import api

    seen = {}

    def items(a, b, **options):
        seen.update(a=a, b=b, batch_size=options["batch_size"])
        raise PerflabError("stop here")

    monkeypatch.setattr(api, "compare_items", items)
    r = run_cli_here("compare", "--batch-size", "1", "64", "gpt_tiny", "gpt_tiny", "--device", "cpu")
    assert r.stderr.strip() == "perflab: error: stop here"
    assert seen == dict(a="gpt_tiny", b="gpt_tiny", batch_size=[1, 64])
    assert CommandLine.read(["bench", "--keep-rate", "0.5", "-1e-1", "x", "--batch-size", "x"]).parsed == [
        "bench", "--keep-rate", "0.5", "--keep-rate", "-1e-1", "x", "--batch-size", "x"]  # the first word is always a value


def test_a_flag_of_several_values_that_took_the_commands_argument_says_so_in_one_line():
    from cli_util import assert_one_line_error, run_cli_here

    r = run_cli_here("explain", "--dtype", "bf16", "fp16", "gpt_tiny")
    assert_one_line_error(r, "Missing argument 'model'.", "--dtype took bf16 fp16 gpt_tiny as its values",
                          "give the arguments before the flag")


def test_a_number_flag_whose_values_are_all_numbers_is_not_said_to_have_taken_a_missing_argument():
    """compare --batch-size 1 64 without A and B: the numbers are A's and B's batch sizes; a number flag stops at the
    first word that is no number, so it took no model, and the error says only what is missing."""
    from perflab.cli_argv import took_the_arguments

    assert took_the_arguments(CommandLine.read(["compare", "--batch-size", "1", "64"])) == ""
    assert took_the_arguments(CommandLine.read(["compare", "--batch-size", "1", "64", "--mode", "eager", "compile", "gpt_tiny"])) == (
        "--mode took eager compile gpt_tiny as its values (every word after such a flag, up to the next flag, is one of its "
        "values): give the arguments before the flag")
    assert took_the_arguments(CommandLine.read(["explain", "--batch-size", "gpt_tiny", "8"])).startswith(
        "--batch-size took gpt_tiny 8 as its values")  # its first word is always a value, a number or not


def test_every_option_of_every_command_says_what_it_takes():
    # --help is where a user learns a flag: one without a help text shows its name and default only
    group = typer.main.get_command(cli.app)
    ctx = click.Context(group, info_name="perflab")
    silent = [f"{name} {p.opts[0]}" for name in group.list_commands(ctx) for p in group.get_command(ctx, name).params
              if p.param_type_name == "option" and not (getattr(p, "help", None) or "").strip()]
    assert silent == []


def test_a_choice_flag_whose_values_are_all_its_choices_is_not_said_to_have_taken_a_missing_argument():
    """compare --mode eager compile without A and B: the modes are A's and B's, not models, so the error says only what
    is missing; a word that is no mode or dtype among the values is still said to be taken."""
    from perflab.cli_argv import took_the_arguments

    assert took_the_arguments(CommandLine.read(["compare", "--mode", "eager", "compile:reduce-overhead"])) == ""
    assert took_the_arguments(CommandLine.read(["compare", "--dtype", "bf16", "fp16"])) == ""
    assert took_the_arguments(CommandLine.read(["explain", "--modes", "cudagraph", "deit_tiny_patch16_224"])).startswith(
        "--modes took cudagraph deit_tiny_patch16_224 as its values")


def test_explain_and_ncu_refuse_several_values_of_a_case_flag_instead_of_taking_a_case_the_user_did_not_name(monkeypatch):
    """explain gpt_small --vs gpt_medium --seq-len 128 256 made four cases and explained gpt_small seq128 against
    gpt_small seq256 (cases[1]), never gpt_medium; ncu's one-case unpacking ended in a ValueError traceback."""
    from cli_util import assert_one_line_error, run_cli_here
    from perflab import api
    from perflab.trace import ncu

    monkeypatch.setattr(api, "explain", lambda *a, **kw: (_ for _ in ()).throw(AssertionError("explained")))
    r = run_cli_here("explain", "gpt_small", "--vs", "gpt_medium", "--seq-len", "128", "256", "--device", "cpu")
    assert_one_line_error(r, "--seq-len: explain takes one case, got 2 values (128 256); run it once per value")
    monkeypatch.setattr(ncu, "find_ncu", lambda: "ncu")
    r = run_cli_here("ncu", "gpt_small", "--workload", "forward", "train_step")
    assert_one_line_error(r, "--workload: ncu takes one case, got 2 values (forward train_step); run it once per value")
    # a token-reducing case's keep rates and reduction locations are one case's
    seen = []

    def explained(case, vs, **kw):
        seen.append((case.model, case.keep_rate, case.reduction_loc, vs.model))
        raise PerflabError("stop here")

    monkeypatch.setattr(api, "explain", explained)
    r = run_cli_here("explain", "topk_deit_tiny_patch16_224", "--vs", "deit_tiny_patch16_224", "--keep-rate", "0.5", "0.7",
                     "--reduction-loc", "3", "6", "--device", "cpu")
    assert_one_line_error(r, "stop here")
    assert seen == [("topk_deit_tiny_patch16_224", (0.5, 0.7), (3, 6), "deit_tiny_patch16_224")]


def test_a_flag_a_command_takes_once_given_several_values_is_refused_not_read_as_its_last():
    """explain's --batch-size and compare's --input-size take one value: --batch-size 1 8 (or the flag twice) reached
    the parser as two flags, which kept 8 and said nothing."""
    from cli_util import assert_one_line_error, run_cli_here

    r = run_cli_here("explain", "deit_tiny_patch16_224", "--batch-size", "1", "8", "--device", "cpu")
    assert_one_line_error(r, "--batch-size: explain takes one value, got 2 (1 8)")
    r = run_cli_here("compare", "deit_tiny_patch16_224", "deit_tiny_patch16_224", "--input-size", "224", "--input-size=384", "--device", "cpu")
    assert_one_line_error(r, "--input-size: compare takes one value, got 2 (224 384)")
