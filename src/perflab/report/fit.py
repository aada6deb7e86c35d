"""Console tables that fit the terminal's width without cutting a cell that tells rows apart.

A ``FittedTable`` is a rich renderable: it is laid out when printed, for the width it is given. At its natural width
every column is shown whole (``perflab --wide`` prints at that width). Narrower, it gives up, in this order, until the
table fits: columns with nothing in them; key columns (those that tell rows apart) holding one value for every row,
said once in the caption instead; long key values (model names), replaced by short unique forms with a legend; whole
lines in the columns that may wrap (flags); and then the columns marked droppable, in their order, named in the
caption. Where even that leaves the table too wide, the long key values are numbered instead (``m1``, ``m2``, with the
legend), which may spare some of the dropped columns. Where the columns left are still too wide for their whole words,
numbers never give way: the other columns' words fold (the key columns keep their width), and a table made with
``cut_names`` (``fit_table``: analyze's) cuts a name (a kernel's, a range's, a header's word) wider than its column in
its middle with an ellipsis instead (``Prof…p#0``: its head and its tail, which tell names apart, kept), or wraps a
header's word after its hyphen; the widest names first, the key columns' too. Only then would rich squeeze what is
left, folding a cell onto a second line rather than cutting it.
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
MIN_NAME = 5  # a name is cut to no fewer characters than this (two either side of the ellipsis)
# A number as a cell prints it (47,686.6, 55.1%, 1.03×, (2.403–9.061), ≥75%): digits and the signs around them, no
# letters. Never cut, never wrapped.
NUMBER = re.compile(r"[-+−–±≥≤~<>()\[\].,:/%×]*\d[-+−–±≥≤~<>()\[\].,:/%×\d]*")


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
    cut_names: bool = False  # too narrow for whole words: names cut in their middle (``cut_names``), not folded

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.table_for(options.max_width)

    def table_for(self, width: int) -> Table:
        columns, notes = fit_columns(self.columns, width, cut_names=self.cut_names)
        widths = column_widths(columns, width, self.cut_names)
        table = plain_table(self.title, header_style="bold", box=box.HEAVY_HEAD)
        cut = self.cut_names and table_width(min_width(c) for c in columns) > width  # names narrower than their words
        for col, w in zip(columns, widths):
            # A cell that may not wrap has room for its whole line (column_widths); a header wraps at its spaces.
            table.add_column(fitted_header(col.header, w) if cut else col.header, justify=col.justify, overflow="fold", width=w)
        for i in range(len(columns[0].cells) if columns else 0):
            table.add_row(*(cut_names(col.cells[i], w) if cut else col.cells[i] for col, w in zip(columns, widths)))
        lines = notes + list(self.caption)
        if lines:
            table.caption = "\n".join(lines)
            table.caption_justify = "left"
        return table


def plain_table(title=None, columns: Iterable = (), rows: Iterable = (), **options) -> Table:
    """A rich ``Table`` as rich lays it out, not fitted: the one builder of the tables that are no ``FittedTable``, those
    that other code reads back as rich Tables (``fit_table``, ``run_page.table_html``) or that print as rich lays them
    out. ``columns``: headers (justified left), or (header, justify) or (header, justify, overflow); ``rows``: cells, one
    list a row; ``options``: rich's (``header_style``, ``show_header``, ``caption``, ``box``)."""
    table = Table(title=title, **options)
    for column in columns:
        header, justify, overflow = (column, "left", "ellipsis") if isinstance(column, str) else (tuple(column) + ("ellipsis",))[:3]
        table.add_column(header, justify=justify, overflow=overflow)
    for row in rows:
        table.add_row(*row)
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


def fit_table(table) -> "FittedTable":
    """A rich ``Table`` of text cells made a ``FittedTable`` (as ``text_table`` builds one: its first column tells the rows
    apart, every column wraps at its spaces), so that it fits the width it is printed at by the same rules, a name too
    long for its column cut in its middle (``cut_names``) and, where even its numbers do not fit, its columns from the
    right left out (named under it); anything else as it is."""
    if not isinstance(table, Table):
        return table
    n = len(table.columns)  # where even the numbers do not fit, the columns from the right go first, the first two stay
    columns = [Column(str(col.header), [str(cell) for cell in col.cells], col.justify, key=i == 0, wrap=True, drop=n - i if i > 1 else 0)
               for i, col in enumerate(table.columns)]
    caption = [str(table.caption)] if table.caption else []
    return FittedTable(columns, title=str(table.title) if table.title else None, caption=caption, cut_names=True)


def _line_width(text: str) -> int:
    return max((Text(line).cell_len for line in text.split("\n")), default=0)


def _word_width(text: str) -> int:
    """The widest word, an indented line's first word with its indent (a tree's levels)."""
    widths = [Text(word).cell_len for word in text.split()]
    for line in text.split("\n"):
        if line.strip():
            widths.append(Text(line[:len(line) - len(line.lstrip())] + line.split()[0]).cell_len)
    return max(widths, default=0)


def is_number(word: str) -> bool:
    return NUMBER.fullmatch(word) is not None


def _number_width(col: Column) -> int:
    """The widest number in the column's cells: the narrowest it goes, since no number is cut."""
    return max((Text(w).cell_len for c in col.plain() for w in c.split() if is_number(w)), default=0)


def cut_in_the_middle(text: Text, width: int) -> Text:
    """``text`` (one word) cut to ``width`` cells with an ellipsis in its middle: its head and its tail kept."""
    keep = max(width - 1, 2)
    head = (keep + 1) // 2
    return Text.assemble(text[:head], "…", text[len(text) - (keep - head):])


def cut_names(cell: str, width: int) -> Text:
    """A cell (markup) whose words wider than ``width`` that are names are cut in their middle (``cut_in_the_middle``);
    numbers, and words that fit, as they are (rich wraps the cell at its spaces)."""
    text = Text.from_markup(cell)
    parts, at = [], 0
    for match in re.finditer(r"\S+", text.plain):
        word = match.group(0)
        if Text(word).cell_len > width and not is_number(word):
            parts += [text[at:match.start()], cut_in_the_middle(text[match.start():match.end()], width)]
            at = match.end()
    return Text.assemble(*parts, text[at:]) if parts else text


def fitted_header(header: str, width: int) -> Text:
    """A header (markup) whose words wider than ``width`` wrap after a hyphen where that makes them fit
    (``host-`` / ``bound µs``), else are cut in their middle."""
    text = Text.from_markup(header)
    parts, at = [], 0
    for match in re.finditer(r"\S+", text.plain):
        word = match.group(0)
        if Text(word).cell_len <= width:
            continue
        pieces = re.findall(r"[^-]+-?|-", word)  # as _header_width splits it
        if "-" in word and max(len(p) for p in pieces) <= width:
            lines, line = [], ""
            for piece in pieces:
                if line and len(line) + len(piece) > width:
                    lines.append(line)
                    line = ""
                line += piece
            parts += [text[at:match.start()], Text("\n".join(lines + [line]))]
        else:
            parts += [text[at:match.start()], cut_in_the_middle(text[match.start():match.end()], width)]
        at = match.end()
    return Text.assemble(*parts, text[at:]) if parts else text


def _header_width(header: str) -> int:
    """The narrowest a header goes whole: its widest word, a hyphenated word wrapped after its hyphens."""
    words = Text.from_markup(header).plain.split()
    return max((max(len(p) for p in re.findall(r"[^-]+-?|-", w)) for w in words), default=0)


def cut_width(col: Column) -> int:
    """The narrowest a column goes with its names cut (``cut_names``) and its header's words whole: its numbers', and
    a key column's names still told apart once cut."""
    least = max(_number_width(col), _header_width(col.header), MIN_NAME)
    if not col.key:
        return least
    cells = col.plain()
    for width in range(least, natural_width(col)):
        if len({cut_names(c, width).plain for c in cells}) == len(set(cells)):
            return width
    return max(least, natural_width(col))


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


def column_widths(columns: list[Column], width: int, cut_names: bool = False) -> list[int | None]:
    """Each column's width: natural where the table fits (None: rich's own), else its narrowest, then the room left
    given to the columns that may not wrap, those that need least of it first (a header back on one line), and what
    remains shared among the wrapping ones in proportion to what each lacks. Too narrow for that, the words give way
    (``_narrower``)."""
    natural = [natural_width(c) for c in columns]
    if table_width(natural) <= width:
        return [None] * len(columns)
    widths = [min_width(c) for c in columns]
    room = width - table_width(widths)
    if room < 0:
        return _narrower(columns, widths, width, cut_names)
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


def _narrower(columns: list[Column], widths: list[int], width: int, cut_names: bool) -> list[int]:
    """Widths for a table too narrow for its columns' whole words (rich would squeeze every column evenly, a narrow key's
    to nothing, and fold numbers). The columns that tell rows apart keep their width and the others wrap at their
    spaces; then names give way and numbers never do: folded within a word, the other columns' only; or, ``cut_names``,
    cut in their middle (``cut_names``), the widest first, down to the widest key's, then the keys' too, a header's words
    kept whole (or wrapped after a hyphen), then those as well."""
    words = [w if c.key else max([_word_width(c.header)] + [_word_width(p) for p in c.plain()]) for c, w in zip(columns, widths)]
    widths = _narrowed(widths, words, table_width(widths) - width)
    numbers = [_number_width(c) for c in columns]
    if not cut_names:
        return _narrowed(widths, [w if c.key else max(n, 1) for c, w, n in zip(columns, widths, numbers)], table_width(widths) - width)
    numbers = [max(n, MIN_NAME) for n in numbers]
    floors = [cut_width(c) for c in columns]
    widest_key = max((w for c, w in zip(columns, widths) if c.key), default=0)
    widths = _narrowed(widths, [w if c.key else max(f, widest_key) for c, w, f in zip(columns, widths, floors)], table_width(widths) - width)
    widths = _narrowed(widths, floors, table_width(widths) - width)
    return _narrowed(widths, numbers, table_width(widths) - width)


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


def fit_columns(columns: list[Column], width: int, cut_names: bool = False) -> tuple[list[Column], list[str]]:
    """The columns to show at ``width`` and the caption lines that say what was moved out of them: with short forms of
    the long key values that read as names, or, where the table cannot fit with those, numbered ones. ``cut_names``:
    a column is dropped only where the table does not fit with its names cut (``cut_width``)."""
    if not columns or table_width(natural_width(c) for c in columns) <= width:
        return columns, []
    fitted, notes = _fit_columns(columns, width, numbered=False, cut_names=cut_names)
    if table_width(min_width(c) for c in fitted) > width and any(c.short or c.numbered for c in fitted):
        numbered, numbered_notes = _fit_columns(columns, width, numbered=True, cut_names=cut_names)
        if table_width(min_width(c) for c in numbered) < table_width(min_width(c) for c in fitted) or len(numbered) > len(fitted):
            return numbered, numbered_notes
    return fitted, notes


def _fit_columns(columns: list[Column], width: int, numbered: bool, cut_names: bool = False) -> tuple[list[Column], list[str]]:
    notes: list[str] = []
    least = cut_width if cut_names else min_width
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
    if table_width(least(c) for c in columns) > width:
        every, dropped = columns, []
        for col in sorted((c for c in columns if c.drop), key=lambda c: c.drop):
            columns = [c for c in columns if c is not col]
            dropped.append(col)
            if table_width(least(c) for c in columns) <= width:
                break
        if table_width(least(c) for c in columns) <= width:
            # a column dropped before the one that made room comes back where it fits again (the most needed first)
            for col in reversed(dropped[:-1]):
                back = [c for c in every if any(c is k for k in columns) or c is col]
                if table_width(least(c) for c in back) <= width:
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
