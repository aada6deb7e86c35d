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
        assert not {"--dtype", "--batch-size", "--warmup"} & set(options[name]), name


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
