"""Errors that reach the user.

A :class:`PerflabError` means the input was wrong (a bad flag, an unreadable trace, a spec with an
unknown key). The CLI prints its message as one line on stderr and exits with status 2. Failures of a
*measurement* (an OOM, a crashed case) are not errors of this kind: they become result rows with a
status, so that the other cases still run.
"""

import json
import math


class PerflabError(Exception):
    """Bad input. The message says what was wrong and how to fix it, in one line."""

    exit_code = 2


class ModelLoadError(PerflabError):
    """A user's model could not be imported or built (a missing file, an import that fails, a factory that raises).
    On the command line it is bad input like any other; in a sweep worker it is that case's ``error`` row, since
    the same reference may import on the driver and not on a worker."""


class CudaContextLost(PerflabError):
    """A case left the CUDA context unusable (a device-side assert, an illegal memory access: CUDA errors that stick
    to the process), so no further case can run in this process. ``rows``: the rows measured so far, the failed
    case's last; callers print and store them, then this one line. Not bad input: exit status 1."""

    exit_code = 1

    def __init__(self, message: str, rows: list | None = None):
        super().__init__(message)
        self.rows = rows or []


def first_line(text) -> str:
    """The first line of a message (an exception's, a dynamo reason's), stripped; "" for an empty one."""
    text = str(text).strip()
    return text.splitlines()[0] if text else ""


def show_int(value: int) -> str:
    """An integer as a message shows it: in full up to 30 digits, else its length (str() refuses past 4300 digits)."""
    if value.bit_length() <= 100:
        return str(value)
    return f"{'-' if value < 0 else ''}an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"


class _Full(Exception):
    pass


def show(value, limit: int = 80) -> str:
    """A value as a message shows it (JSON for lists and mappings, repr otherwise), cut at ``limit`` characters.

    It serialises no more than it shows: a value whose parts are shared many times over (a YAML alias bomb: 600 bytes
    of text, 10^9 strings once expanded) costs ``limit`` characters, not its expanded size."""
    parts: list[str] = []
    size = 0

    def put(text: str) -> None:
        nonlocal size
        parts.append(text)
        size += len(text)
        if size > limit:
            raise _Full

    def scalar(v, as_json: bool) -> str:
        if isinstance(v, bool) or v is None:
            return json.dumps(v) if as_json else repr(v)
        if isinstance(v, int):
            return show_int(v)
        if isinstance(v, str):
            head = v[:limit + 1]
            return json.dumps(head) if as_json else repr(head)
        if isinstance(v, float):
            return json.dumps(v) if as_json else repr(v)
        text = str(v)[:limit + 1] if as_json else repr(v)[:limit + 1]
        return json.dumps(text) if as_json else text

    def walk(v) -> None:
        if isinstance(v, dict):
            put("{")
            for i, (k, x) in enumerate(v.items()):
                put((", " if i else "") + json.dumps(str(k)[:limit + 1]) + ": ")
                walk(x)
            put("}")
        elif isinstance(v, (list, tuple)):
            put("[")
            for i, x in enumerate(v):
                if i:
                    put(", ")
                walk(x)
            put("]")
        else:
            put(scalar(v, True))

    try:
        if isinstance(value, (list, dict)):
            walk(value)
        else:
            put(scalar(value, False))
    except _Full:
        pass
    text = "".join(parts)
    return text if len(text) <= limit else text[:limit - 3] + "..."
