"""stdout's rich console: as wide as the terminal (``COLUMNS`` first; 100 columns when piped), or, with ``--wide``,
as wide as each table. Light to import: the CLI makes it before any command runs."""

from __future__ import annotations

import os
import sys
import textwrap

from rich.console import Console
from rich.rule import Rule
from rich.text import Text

PIPED_WIDTH = 100  # stdout is not a terminal and COLUMNS is unset
WIDE_WIDTH = 10_000  # --wide: wider than any table, so each is printed at its natural width


def terminal_width(environ=None, isatty: bool | None = None) -> int | None:
    """The width tables are fitted to: ``COLUMNS`` where set (at most ``WIDE_WIDTH``: a rule is drawn that wide), else
    the terminal's (None: rich asks it), else 100."""
    environ = os.environ if environ is None else environ
    columns = environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return min(int(columns), WIDE_WIDTH)
    if isatty if isatty is not None else sys.stdout.isatty():
        return None
    return PIPED_WIDTH


class TerminalConsole(Console):
    """stdout's console: fitted to ``terminal_width`` (set again by ``configure`` for each command line), or, ``wide``,
    printing every table at its natural width. A table built without ``report.fit`` folds a cell it cannot fit onto
    a second line instead of cutting it."""

    def __init__(self, **kwargs):
        super().__init__(highlight=False, **kwargs)
        self.rule_width: int | None = None

    def configure(self, wide: bool = False, environ=None, isatty: bool | None = None) -> None:
        width = terminal_width(environ, self.is_terminal if isatty is None else isatty)
        self._width = None  # rich asks the terminal again
        self.rule_width = width or self.size.width
        if wide or width:
            self.width = WIDE_WIDTH if wide else width

    def say(self, line: str, markup: bool = True) -> None:
        """One message (a warning, a note), wrapped to the width with its further lines indented, so each message
        still starts a line of its own: ``warning: ...``."""
        text = Text.from_markup(line) if markup else Text(line)
        width = min(self.width, self.rule_width or PIPED_WIDTH)
        lines = textwrap.wrap(text.plain, width=width, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False)
        wrapped = Text("\n".join(lines) or "")
        prefix = text.plain.split(":", 1)[0]
        for span in text.spans:  # the message's own styles (a coloured "warning" or status), where they fall in its first word
            if span.end <= len(prefix):
                wrapped.stylize(span.style, span.start, span.end)
        super().print(wrapped)

    def print(self, *objects, **kwargs) -> None:
        from perflab.report.fit import fold_cells

        super().print(*(fold_cells(o) for o in objects), **kwargs)

    def rule(self, title="", *, characters: str = "─", style="rule.line", align="center") -> None:
        """A rule under a title that is text (a case's label, which may hold a path's brackets), not markup."""
        width = min(self.width, self.rule_width or PIPED_WIDTH)
        title = Text(title) if isinstance(title, str) else title
        self.print(Rule(title, characters=characters, style=style, align=align), width=width)


