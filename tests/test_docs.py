"""The README leads and the docs hold together (torch-free, well under a second).

- README.md's output blocks (what a command prints) fit a 100-column terminal.
- README.md is at most 250 lines and its command table has a row for every command the CLI registers (read from
  the typer app, so a new command without a README row fails here) and for `--version` once the app has it.
- Every relative link in README.md, CHANGELOG.md and the docs pages resolves to a file, and a link to a heading of
  a Markdown page names a heading that page has (GitHub's anchors).
- No page but CHANGELOG.md names an issue number ("issue 27"), says "perflab before" or "the issue", or calls the
  studies perflab reproduces "seeds" in prose: the history is the CHANGELOG's, and the studies have names
  (docs/README.md maps the sources' numbers to them, in code spans). "random seed" is the word's other meaning.
- The spec example in docs/reference.md is a spec perflab's schema accepts.

The generated reports under docs/reports/ are left out of the wording rules: `perflab report` writes them and the
tests pin them byte for byte to their stores, so their wording is the report code's (they are link-checked).
"""

import re
from pathlib import Path

import msgspec
import pytest
import typer
import yaml

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = sorted(p for p in (ROOT / "docs").rglob("*.md") if "reports" not in p.relative_to(ROOT / "docs").parts)
REPORTS = sorted((ROOT / "docs" / "reports").rglob("*.md"))
WORDED = [README, *PAGES]  # the pages the wording rules hold for
LINKED = [README, ROOT / "CHANGELOG.md", *PAGES, *REPORTS]

FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
# "issue" is also the verb and noun of launching work ("issues 3 steps", "CPU issue 124 ms", "the issue time")
UNIT = r"(?:ms|µs|us|ns|s|steps?|times?|kernels?|launches)\b"
FORBIDDEN_ANYWHERE = [re.compile(rf"\bissues?\s*#?\d+(?![\d.]*\s*{UNIT})", re.I), re.compile(r"\bperflab before\b", re.I)]
FORBIDDEN_IN_PROSE = [re.compile(r"\bthe issue\b(?!\s+(?:time|estimate|cost|order|rate))", re.I), re.compile(r"(?<!random )\bseeds?\b", re.I)]


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def prose(text: str) -> str:
    """The text without fenced blocks and code spans (blanked, so line numbers stay)."""
    blank = lambda m: re.sub(r"[^\n]", " ", m.group(0))
    return CODE_SPAN.sub(blank, FENCE.sub(blank, text))


def slugs(text: str) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation but - and _ dropped, spaces to -, -1, -2
    for repeats."""
    seen: dict[str, int] = {}
    for line in FENCE.sub("", text).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
        n = seen.get(base, 0)
        seen[base] = n + 1
        yield base if n == 0 else f"{base}-{n}"


def readme_commands() -> dict[str, str]:
    """The README's command table: the first cell's code (`bench`, `--version`) → its row."""
    text = README.read_text()
    section = text.split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"\|\s*`([^`]+)`\s*\|", line)
        if m:
            rows[m.group(1)] = line
    return rows


def test_readme_is_at_most_250_lines_and_leads_with_install_quick_start_and_commands():
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    headings = re.findall(r"^## (.+)$", text, re.M)
    assert headings[:3] == ["Install", "Quick start", "Commands"], headings
    # the quick start shows both outputs: the GPU's speedup table and the CPU version's
    assert "make demo" in text and "make test" in text
    assert text.count("Top-k vs baseline") == 2 and "On an H100" in text and "Without a GPU" in text


def output_lines_over(text: str, columns: int) -> list[str]:
    """The lines of a Markdown page's output blocks (fenced without a language: what a command prints) wider than
    ``columns``: a terminal that narrow wraps them, and a table then falls apart."""
    wide, fence = [], None
    for line in text.splitlines():
        if line.startswith("```"):
            fence = None if fence is not None else line[3:].strip()
        elif fence == "" and len(line) > columns:
            wide.append(line)
    return wide


def test_the_readme_output_blocks_fit_a_100_column_terminal():
    assert output_lines_over(README.read_text(), 100) == []
    # the rule reads output blocks only: a wide line of code, or one in an output block, is told apart
    page = "```bash\n" + "x" * 120 + "\n```\n```\n" + "y" * 101 + "\n" + "z" * 100 + "\n```\n"
    assert output_lines_over(page, 100) == ["y" * 101]


def test_every_registered_command_has_a_row_in_the_readme_command_table():
    from perflab import cli

    group = typer.main.get_command(cli.app)
    registered = {name for name, command in group.commands.items() if not command.hidden}
    rows = readme_commands()
    assert registered, "the typer app registers no command"
    missing = sorted(registered - set(rows))
    assert not missing, f"commands without a row in README.md's command table: {missing}"
    for name in registered:  # each row: what it answers, whether it needs a GPU, an example that runs that command
        cells = [c.strip() for c in rows[name].strip().strip("|").split("|")]
        assert len(cells) == 4, rows[name]
        assert cells[1] and cells[2].split()[0].rstrip(",") in {"yes", "no", "optional"}, rows[name]
        assert f"perflab {name}" in cells[3], rows[name]
    if any("--version" in getattr(p, "opts", ()) for p in group.params):
        assert "--version" in rows


def test_the_command_table_rule_would_catch_a_missing_row():
    # the reading of the table is what the test above relies on: a command it cannot find must count as missing
    rows = readme_commands()
    assert {"bench", "demo", "analyze", "explain", "sweep"} <= set(rows)
    assert "no-such-command" not in rows


@pytest.mark.parametrize("page", LINKED, ids=rel)
def test_every_relative_link_resolves(page):
    text = page.read_text()
    broken = []
    for target in LINK.findall(FENCE.sub("", text)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor.lower() not in set(slugs(dest.read_text())):
            broken.append(target)
    assert not broken, f"{rel(page)}: links that do not resolve: {broken}"


@pytest.mark.parametrize("page", WORDED, ids=rel)
def test_no_page_names_an_issue_number_or_undefined_seeds(page):
    text = page.read_text()
    found = [(p.pattern, m.group(0), text.count("\n", 0, m.start()) + 1) for p in FORBIDDEN_ANYWHERE for m in p.finditer(text)]
    plain = prose(text)
    found += [(p.pattern, m.group(0), plain.count("\n", 0, m.start()) + 1) for p in FORBIDDEN_IN_PROSE for m in p.finditer(plain)]
    assert not found, f"{rel(page)}: (pattern, text, line): {found}"


def test_the_wording_rules_catch_what_they_forbid_and_pass_what_they_allow():
    bad = ["Before issue 22 the share", "see issues 3", "as in issue #15", "(issue 23, P9)", "issue 27.", "perflab before interleaving",
           "the seeds' paradox", "seed 003's tables", "the issue's runs"]
    ok = ["the random seed for weights", "`--seed N`", "seeded random order", "```\nseed 003\n```", "`seed 004`",
          "untraced issue 3.635 ms", "issues 3 steps behind it", "CPU issue 124 ms against", "the issue time"]
    hits = lambda s: any(p.search(s) for p in FORBIDDEN_ANYWHERE) or any(p.search(prose(s)) for p in FORBIDDEN_IN_PROSE)
    assert [s for s in bad if not hits(s)] == []
    assert [s for s in ok if hits(s)] == []


def test_the_spec_example_in_the_reference_is_a_spec_perflab_accepts():
    from perflab.spec_schema import SpecFile

    text = (ROOT / "docs" / "reference.md").read_text()
    block = re.search(r"^```yaml\n(.*?)^```", text, re.S | re.M).group(1)
    spec = msgspec.convert(yaml.safe_load(block), SpecFile)
    assert set(spec.comparisons) == {"tr", "graph"} and spec.grid.batch_size == [1, 8, 64]
    with pytest.raises(msgspec.ValidationError):  # the same check refuses a mistake (a list where a mapping goes)
        msgspec.convert({**yaml.safe_load(block), "comparisons": [{"baseline": "a"}]}, SpecFile)
