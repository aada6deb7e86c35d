"""Console tables that fit the terminal's width without cutting a cell that tells rows apart.

A ``FittedTable`` is a rich renderable: it is laid out when printed, for the width it is given. At its natural width
every column is shown whole (``perflab --wide`` prints at that width). Narrower, it gives up, in this order, until the
table fits: columns with nothing in them; key columns (those that tell rows apart) holding one value for every row,
said once in the caption instead; long key values (model names), replaced by short unique forms with a legend; whole
lines in the columns that may wrap (flags); and then the columns marked droppable, in their order, named in the
caption. Where even that leaves the table too wide, the long key values are numbered instead (``m1``, ``m2``, with the
legend), which may spare some of the dropped columns. Only then would rich squeeze what is left, and even then it folds a
cell onto a second line rather than cut it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Iterable

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.markup import escape
from rich.table import Table
from rich.text import Text

EMPTY = ("", "–", "-")
PADDING = 2  # one space either side of a cell
SHORT_OVER = 12  # key values longer than this get a short form when the table is too wide
SHORT_FORM_MAX = 16  # a short form longer than this keeps only its last word


@dataclass
class Column:
    header: str
    cells: list[str]  # rich markup
    justify: str = "left"
    key: bool = False  # tells rows apart: never cut; said in the caption when every row holds the same value
    short: bool = False  # a key whose long values may take short unique forms, with a legend (model names)
    numbered: bool = False  # names that take no short form but may be numbered (m1, m2, ...), with a legend, as a last resort
    wrap: bool = False  # may wrap onto several lines (at spaces) to fit
    drop: int = 0  # 0: always shown; else dropped when narrow, lowest first
    caption_as: str | None = None  # how a value every row shares reads in the caption: "bs {}"; default "{header} {}"

    def plain(self) -> list[str]:
        return [Text.from_markup(c).plain for c in self.cells]


@dataclass
class FittedTable:
    columns: list[Column]
    title: str | None = None
    caption: list[str] = field(default_factory=list)  # lines under the table, whatever its width

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.table_for(options.max_width)

    def table_for(self, width: int) -> Table:
        columns, notes = fit_columns(self.columns, width)
        widths = column_widths(columns, width)
        table = Table(title=self.title, header_style="bold", box=box.HEAVY_HEAD)
        for col, w in zip(columns, widths):
            # A cell that may not wrap has room for its whole line (column_widths); a header wraps at its spaces.
            table.add_column(col.header, justify=col.justify, overflow="fold", width=w)
        for i in range(len(columns[0].cells) if columns else 0):
            table.add_row(*(col.cells[i] for col in columns))
        lines = notes + list(self.caption)
        if lines:
            table.caption = "\n".join(lines)
            table.caption_justify = "left"
        return table


def text_table(header: list[str], rows: list[list[str]], title: str | None = None, left: Iterable[str] = (),
               drop: Iterable[str] = (), caption: Iterable[str] = (), numbered: Iterable[str] = (),
               folds: bool = False) -> FittedTable:
    """A ``FittedTable`` of plain-text cells (not markup): the first column tells the rows apart; every column wraps at
    its spaces, never within a number or word; ``left``: the headers of the columns justified left (others right);
    ``drop``: headers, in the order their columns are given up where the table is too wide; ``numbered``: headers of
    the columns of names that may be numbered, with a legend, where nothing else makes the table fit; ``folds``: the
    first column holds names too long for any terminal (kernels'), folded within a name where the others need the room."""
    left, order, numbered = set(left), list(drop), set(numbered)
    cells = [[escape(str(row[i])) for row in rows] for i in range(len(header))]
    columns = [Column(escape(name), cells[i], "left" if name in left else "right", key=i == 0 and not folds, wrap=True,
                      numbered=name in numbered, drop=order.index(name) + 1 if name in order else 0) for i, name in enumerate(header)]
    return FittedTable(columns, title=title, caption=[escape(line) for line in caption])


def _line_width(text: str) -> int:
    return max((Text(line).cell_len for line in text.split("\n")), default=0)


def _word_width(text: str) -> int:
    """The widest word, an indented line's first word with its indent (a tree's levels)."""
    widths = [Text(word).cell_len for word in text.split()]
    for line in text.split("\n"):
        if line.strip():
            widths.append(Text(line[:len(line) - len(line.lstrip())] + line.split()[0]).cell_len)
    return max(widths, default=0)


def natural_width(col: Column) -> int:
    return max([_line_width(col.header)] + [_line_width(c) for c in col.plain()])


def min_width(col: Column) -> int:
    """The narrowest the column goes without cutting: a header wraps at its spaces; a cell wraps only if the column may."""
    cells = col.plain()
    body = [_word_width(c) if col.wrap else _line_width(c) for c in cells]
    return max([_word_width(col.header)] + body)


def table_width(widths: Iterable[int]) -> int:
    widths = list(widths)
    return sum(w + PADDING for w in widths) + len(widths) + 1  # cells, padding, and the box's vertical lines


def column_widths(columns: list[Column], width: int) -> list[int | None]:
    """Each column's width: natural where the table fits (None: rich's own), else its narrowest, then the room left
    given to the columns that may not wrap, those that need least of it first (a header back on one line), and what
    remains shared among the wrapping ones in proportion to what each lacks."""
    natural = [natural_width(c) for c in columns]
    if table_width(natural) <= width:
        return [None] * len(columns)
    widths = [min_width(c) for c in columns]
    room = width - table_width(widths)
    if room < 0:  # too narrow still: the columns that tell rows apart keep their width; the others wrap at their spaces,
        # then fold within words (rich would squeeze every column evenly, a narrow key's to nothing)
        words = [w if c.key else max([_word_width(c.header)] + [_word_width(p) for p in c.plain()]) for c, w in zip(columns, widths)]
        widths = _narrowed(widths, words, -room)
        return _narrowed(widths, [w if c.key else 1 for c, w in zip(columns, widths)], table_width(widths) - width)
    for i in sorted((i for i, c in enumerate(columns) if not c.wrap), key=lambda i: natural[i] - widths[i]):
        extra = max(0, min(room, natural[i] - widths[i]))
        widths[i] += extra
        room -= extra
    # the wrapping columns share the rest equally, a column that needs less than its share taking only that (its
    # cells back on one line) and leaving the remainder to the others
    pending = [i for i, c in enumerate(columns) if c.wrap and natural[i] > widths[i]]
    while room > 0 and pending:
        share = room // len(pending)
        whole = [i for i in pending if natural[i] - widths[i] <= share]
        if not whole:  # each takes its share, and the first ones a column more each until none is left
            for n, i in enumerate(pending):
                widths[i] += share + (n < room % len(pending))
            break
        for i in whole:
            room -= natural[i] - widths[i]
            widths[i] = natural[i]
        pending = [i for i in pending if i not in whole]
    return widths


def _narrowed(widths: list[int], floors: list[int], excess: int) -> list[int]:
    """``widths`` less ``excess`` columns, taken one at a time from the widest of those above their floor (where they
    cannot give it all, rich squeezes what is left)."""
    widths = list(widths)
    for _ in range(excess):
        candidates = [i for i, w in enumerate(widths) if w > floors[i]]
        if not candidates:
            break
        widths[max(candidates, key=lambda i: widths[i])] -= 1
    return widths


def fit_columns(columns: list[Column], width: int) -> tuple[list[Column], list[str]]:
    """The columns to show at ``width`` and the caption lines that say what was moved out of them: with short forms of
    the long key values that read as names, or, where the table cannot fit with those, numbered ones."""
    if not columns or table_width(natural_width(c) for c in columns) <= width:
        return columns, []
    fitted, notes = _fit_columns(columns, width, numbered=False)
    if table_width(min_width(c) for c in fitted) > width and any(c.short or c.numbered for c in fitted):
        numbered, numbered_notes = _fit_columns(columns, width, numbered=True)
        if table_width(min_width(c) for c in numbered) < table_width(min_width(c) for c in fitted) or len(numbered) > len(fitted):
            return numbered, numbered_notes
    return fitted, notes


def _fit_columns(columns: list[Column], width: int, numbered: bool) -> tuple[list[Column], list[str]]:
    notes: list[str] = []
    n_rows = len(columns[0].cells)
    columns = [c for c in columns if any(p.strip() not in EMPTY for p in c.plain())] or columns[:1]
    if table_width(natural_width(c) for c in columns) > width:
        # Key columns with one value for every row (of one row, a model column is shortened instead)
        shared = [c for c in columns if c.key and len(set(c.plain())) == 1 and (n_rows > 1 or not c.short)]
        if len(shared) == len([c for c in columns if c.key]):
            shared = shared[1:]  # the table keeps a key column
        if shared:
            notes.append(("every row: " if n_rows > 1 else "")
                         + ", ".join((c.caption_as or c.header + " {}").format(escape(c.plain()[0])) for c in shared))
            columns = [c for c in columns if not any(c is s for s in shared)]
    if table_width(natural_width(c) for c in columns) > width:
        # every short column together (a baseline and a variant column hold the same kind of name)
        long = [c for c in columns if c.short or numbered and c.numbered]
        long = long if any(natural_width(c) > SHORT_OVER for c in long) else []
        names = [v for c in long for v in c.plain()]
        forms = numbered_forms(names) if numbered else short_forms(names)
        if not numbered and forms == numbered_forms(names):
            forms = {}  # names with no short form that reads: numbered only where nothing else makes the table fit
        legend = [escape(f"{forms[name]} = {name}") for name in forms if forms[name] != name]
        if legend:  # the forms are plain text (of the cells' markup), made markup again
            columns = [replace(c, cells=[escape(forms[p]) for p in c.plain()]) if c in long else c for c in columns]
            notes.append("; ".join(legend))
    if table_width(min_width(c) for c in columns) > width:
        every, dropped = columns, []
        for col in sorted((c for c in columns if c.drop), key=lambda c: c.drop):
            columns = [c for c in columns if c is not col]
            dropped.append(col)
            if table_width(min_width(c) for c in columns) <= width:
                break
        if table_width(min_width(c) for c in columns) <= width:
            # a column dropped before the one that made room comes back where it fits again (the most needed first)
            for col in reversed(dropped[:-1]):
                back = [c for c in every if any(c is k for k in columns) or c is col]
                if table_width(min_width(c) for c in back) <= width:
                    columns = back
        dropped = [c.header.replace("\n", " ") for c in dropped if not any(c is k for k in columns)]
        if dropped:
            notes.append(f"not shown at this width (--wide shows them): {', '.join(dropped)}")
    return columns, notes


def short_forms(names: list[str], sep: str = "_") -> dict[str, str]:
    """A short form of each name that tells it from the others: its words (split at ``_``, ``/``, ``:``, spaces and a
    ``.`` before a letter) that not every name shares, joined by ``sep``; where that is still long, its last such word (a reference's
    NAME). ``deit_tiny_patch16_224``, ``deit_small_patch16_224`` → ``tiny``, ``small``. A name with no words of its own
    keeps its first; where forms would collide or not be shorter, the names are numbered ``m1``, ``m2``, ... One name
    alone: a long reference keeps its NAME (``path/to/net.py:Net`` → ``Net``), any other name itself."""
    distinct = list(dict.fromkeys(names))
    if len(distinct) < 2:
        return {n: _reference_name(n) for n in distinct}
    words = {n: [w for w in re.split(r"[_/: ]+|\.(?=[A-Za-z])", n) if w] or [n] for n in distinct}
    shared = set.intersection(*(set(w) for w in words.values()))
    forms = {}
    for name in distinct:
        own = [w for w in words[name] if w not in shared]
        form = sep.join(own) if own else words[name][0]
        forms[name] = form if len(form) <= SHORT_FORM_MAX else own[-1]
    if len(set(forms.values())) < len(distinct) or any(len(forms[n]) >= len(n) for n in distinct):
        forms = numbered_forms(distinct)
    return forms


def numbered_forms(names: list[str]) -> dict[str, str]:
    """``m1``, ``m2``, ... for each distinct name, in order."""
    return {n: f"m{i + 1}" for i, n in enumerate(dict.fromkeys(names))}


def _reference_name(name: str) -> str:
    """A long reference's last part after a ``:`` or ``/`` (``file.py:NAME``, ``package.module:NAME``, ``hf:DIR``); else the name."""
    tail = re.split(r"[:/]", name.rstrip("/"))[-1]
    return tail if len(name) > SHORT_FORM_MAX and tail else name


def fold_cells(renderable):
    """A table built elsewhere, made to fold a cell that does not fit onto a second line instead of cutting it with an
    ellipsis; other renderables unchanged."""
    if isinstance(renderable, Table):
        for column in renderable.columns:
            if column.overflow == "ellipsis":
                column.overflow = "fold"
    elif isinstance(renderable, Group):
        for item in renderable.renderables:
            fold_cells(item)
    return renderable
