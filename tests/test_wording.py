"""What the user reads names things as the user knows them: no "seed 004", "seed-shaped" or "the seed's" (the lab
notebook's names of the studies perflab redoes) in any command's --help, in the report's text, or in an example spec
(the report prints its spec). A random seed (``--seed``, ``--order-seed``, "seeded") is another word and is fine."""

import ast
import re
from pathlib import Path

import click
import typer

from perflab import cli

ROOT = Path(__file__).resolve().parents[1]
# The studies by number ("seed 003", "seeds 001 and 002"), their shapes and their figures ("seed-shaped", "the seed's",
# "seed vs perflab", "compiled (seed)"); not "--seed", "random seed", "seeded", "the seed of the interleaved order".
NOTEBOOK_SEED = re.compile(r"(?i)\bseeds?\s+0*\d+|\bseed-shaped|\bseeds?'s?(?!\w)|\bthe\s+seeds?\b(?!\s+of\b)"
                           r"|\bseed\s+(testbench|harness|figures?|tables?|columns|grid|code|texts?|vs\b|printed|ran)|\(seed\)|\bseed\s*÷")


def test_the_pattern_tells_a_study_from_a_random_seed():
    for said in ("(seed 004's testbench)", "seed-shaped tables", "## Language models (seed 003)", "the seeds' sweeps (seeds 001 and 002)",
                 "(seed 000's table, per step)", "Seed ÷ perflab", "compiled (seed)", "one layer (the seed testbench)"):
        assert NOTEBOOK_SEED.search(said), said
    for fine in ("--seed", "--order-seed", "Random seed for weights and inputs.", "seeded random interleaved blocks",
                 "Seed of --order random", "the seed of the interleaved order"):
        assert not NOTEBOOK_SEED.search(fine), fine


def _help_texts():
    group = typer.main.get_command(cli.app)
    ctx = click.Context(group, info_name="perflab")
    yield "perflab", group.get_help(ctx)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        yield name, command.get_help(click.Context(command, info_name=name, parent=ctx))


def test_no_command_help_names_a_study_by_its_notebook_number():
    helps = dict(_help_texts())
    assert {"bench", "report", "results", "run", "compare", "explain", "profile", "ab", "track"} <= set(helps)
    said = {name: NOTEBOOK_SEED.findall(text) for name, text in helps.items()}
    assert not {name: hits for name, hits in said.items() if hits}
    assert "Llama decode testbench" in helps["bench"]  # --layers-only says what it reproduces


def _shown_strings(path: Path):
    """The string constants of a module that are not docstrings (docstrings are for the code's readers; every other
    string may reach the user: a table's title, a report's heading, an error)."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body
                  and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


def test_no_report_or_output_text_names_a_study_by_its_notebook_number():
    found = [f"{path.relative_to(ROOT)}:{line}: {text[:80]!r}" for path in sorted((ROOT / "src/perflab").rglob("*.py"))
             for line, text in _shown_strings(path) if NOTEBOOK_SEED.search(text)]
    assert not found, "\n".join(found)


def test_no_report_or_output_text_names_an_issue_number():
    """The project's history is the CHANGELOG's: "## Training on several GPUs (issue 27)" means nothing to a reader."""
    found = [f"{path.relative_to(ROOT)}:{line}: {text[:80]!r}" for path in sorted((ROOT / "src/perflab").rglob("*.py"))
             for line, text in _shown_strings(path) if re.search(r"(?i)\bissues? #?\d+", text)]
    assert not found, "\n".join(found)


def test_no_example_spec_names_a_study_by_its_notebook_number():
    """The report prints its spec, comments included."""
    specs = sorted((ROOT / "experiments").glob("*.yaml"))
    assert specs
    found = [f"{p.name}:{i}: {line}" for p in specs for i, line in enumerate(p.read_text().splitlines(), 1) if NOTEBOOK_SEED.search(line)]
    assert not found, "\n".join(found)
