"""The command line's words before the parser sees them: what was typed, perflab's own arguments and, for
``perflab run``, the program's.

- Options that take several values accept them space-separated (``--batch-size 1 8 64``): they are expanded to
  repeated flags (``--batch-size 1 --batch-size 8 ...``), which is what the parser takes. The values run to the next
  flag; a number option's also end at a word that is no number (``compare --batch-size 1 64 A B``).
- ``perflab run [OPTIONS] -- SCRIPT [ARGS]`` (or ``run [OPTIONS] SCRIPT [ARGS]``), and ``ab``/``track [OPTIONS] --
  SCRIPT [ARGS]`` (only after ``--``): the program's words are split off first, so that its own options never reach
  perflab's parser, nor the expansion above. ``--a-args``/``--b-args`` take their one word as it is.
- ``--wide`` is global: before the command, or anywhere among perflab's own arguments (never the program's).

``cli.main`` reads the words once into a ``CommandLine`` and hands it to the commands as the parser's context
object (``of(ctx)``): a sweep records the words as typed, ``run`` takes the program's.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

# Options that take one or more values after a single flag (expanded to repeated flags before parsing).
MULTI_VALUE_OPTIONS = {"--model", "--input-size", "--batch-size", "--keep-rate", "--reduction-loc", "--dtype", "--mode", "--modes",
                       "--workload", "--seq-len", "--prompt-len", "--context-len", "--new-tokens", "--model-arg", "--fixes", "--revs"}
# Of those, the ones whose values are numbers: a word that is no number ends their values.
NUMBER_OPTIONS = {"--input-size", "--batch-size", "--keep-rate", "--reduction-loc", "--seq-len", "--prompt-len", "--context-len", "--new-tokens"}
# perflab run's options that take a value: the word after each is that value, not the program
RUN_VALUE_OPTIONS = {"--skip", "--steps", "--trace", "--trace-warmup", "--inflation-limit", "--out", "--step", "--step-range", "--nproc",
                     "--stall-factor", "--input", "--batch-size", "--seq-len"}
# Commands that take a program after "--" (ab and track of the user's own program): only "--" splits it off
PROGRAM_AFTER_DASHES = {"ab", "track"}
# Options whose value is one word taken as it is, whatever it looks like (an argument string for the program:
# --a-args "--batch-size=8" is not perflab's --batch-size)
VERBATIM_OPTIONS = {"--a-args", "--b-args"}


@dataclass(frozen=True)
class CommandLine:
    typed: list[str]  # the words as typed, after the program's name (a sweep records its command line)
    parsed: list[str]  # perflab's own words, as the parser takes them: several values expanded, --wide taken out
    program: list[str]  # perflab run: the program's own command line (after "--", or from the script on); else empty
    wide: bool  # --wide was given: tables are printed whole

    @classmethod
    def read(cls, argv: list[str]) -> CommandLine:
        typed = list(argv)
        wide_first = bool(typed) and typed[0] == "--wide"  # a global flag before the command (perflab --wide run ...)
        own, program = split_program(typed[1:] if wide_first else typed)
        parsed = expand_multi_value_options(own) if not program or own[:1] != ["run"] else own
        parsed, wide_later = take_flag(parsed, "--wide")
        return cls(typed, parsed, program, wide_first or wide_later)


def of(ctx) -> CommandLine:
    """The command line a command was given: the one ``cli.main`` read, else (the app called some other way) sys.argv's."""
    given = getattr(ctx, "obj", None)
    return given if isinstance(given, CommandLine) else CommandLine.read(sys.argv[1:])


def expand_multi_value_options(argv: list[str], names=MULTI_VALUE_OPTIONS) -> list[str]:
    """``--opt a b c`` → ``--opt a --opt b --opt c`` for the options that take several values."""
    result: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        name = token.partition("=")[0]
        if token in VERBATIM_OPTIONS:
            result += argv[i:i + 2]
            i += 2
            continue
        if name in names:
            values, i = _values(argv, i)
            if not values:
                result.append(token)  # let the parser report the missing value
            for v in values:
                result += [name, v]
            continue
        result.append(token)
        if token == "--":
            result += argv[i + 1 :]
            break
        i += 1
    return result


def several_values(argv: list[str], names=MULTI_VALUE_OPTIONS) -> list[tuple[str, list[str]]]:
    """(flag, its values) for each flag of ``names`` in ``argv`` (before any ``--``) that took more than one word."""
    runs, i = [], 0
    while i < len(argv) and argv[i] != "--":
        if argv[i].partition("=")[0] in names:
            name = argv[i].partition("=")[0]
            values, i = _values(argv, i)
            if len(values) > 1:
                runs.append((name, values))
        else:
            i += 1
    return runs


def repeated_values(parsed: list[str], names=MULTI_VALUE_OPTIONS) -> dict[str, list[str]]:
    """Each flag of ``names`` that the parser's words (``CommandLine.parsed``, before any ``--``) give more than once,
    with its values in order: where a command takes the flag once, the parser would keep the last alone."""
    given: dict[str, list[str]] = {}
    i = 0
    while i < len(parsed) and parsed[i] != "--":
        name, eq, value = parsed[i].partition("=")
        if name in names and (eq or i + 1 < len(parsed)):
            given.setdefault(name, []).append(value if eq else parsed[i + 1])
            i += 1 if eq else 2
        else:
            i += 1
    return {name: values for name, values in given.items() if len(values) > 1}


def took_the_arguments(command: CommandLine) -> str:
    """Where a command's argument is missing: the flags of several values that may have taken it, in words ('' if none).
    A number flag takes no word that is no number past its first, so one whose values are all numbers took no argument
    (``compare --batch-size 1 64`` with A and B missing: its values are the comparison's, not A and B); likewise a
    flag of known choices whose values are all among them (``compare --mode eager compile``: no model is a mode)."""
    from perflab.spec import DTYPES, MODES

    choices = {"--dtype": DTYPES, "--mode": MODES, "--modes": MODES}
    runs = [(name, values) for name, values in several_values(split_program(command.typed)[0])
            if not all(map(_is_number, values) if name in NUMBER_OPTIONS else (v in choices.get(name, ()) for v in values))]
    if not runs:
        return ""
    took = "; ".join(f"{name} took {' '.join(values)} as its values" for name, values in runs)
    return f"{took} (every word after such a flag, up to the next flag, is one of its values): give the arguments before the flag"


def _values(argv: list[str], i: int) -> tuple[list[str], int]:
    """The values of the flag at ``argv[i]`` (``--opt=a`` or ``--opt a b``), and where the words after them start. A
    number flag's values end at the first word after its first that is no number (compare's A and B after them)."""
    name, eq, value = argv[i].partition("=")
    values = [value] if eq else []
    j = i + 1
    while j < len(argv) and not _is_flag(argv[j]) and not (values and name in NUMBER_OPTIONS and not _is_number(argv[j])):
        values.append(argv[j])
        j += 1
    return values, j


def take_flag(argv: list[str], flag: str) -> tuple[list[str], bool]:
    """``argv`` without ``flag`` (before any ``--``), and whether it was there: a global flag, taken wherever it stands."""
    end = argv.index("--") if "--" in argv else len(argv)
    kept = [token for token in argv[:end] if token != flag]
    return kept + argv[end:], len(kept) < end


def _is_flag(token: str) -> bool:
    return token.startswith("-") and token != "-" and not _is_number(token)  # negative numbers are values, not flags


def _is_number(token: str) -> bool:
    try:
        float(token)
        return True
    except ValueError:
        return False


def split_program(argv: list[str]) -> tuple[list[str], list[str]]:
    """``run [OPTIONS] -- SCRIPT [ARGS]`` (or ``run [OPTIONS] SCRIPT [ARGS]``): (perflab's arguments, the program's),
    so that the program's own options never reach perflab's parser."""
    if argv and argv[0] in PROGRAM_AFTER_DASHES:
        i = 1
        while i < len(argv):
            if argv[i] in VERBATIM_OPTIONS:
                i += 2
                continue
            if argv[i] == "--":
                return argv[:i], argv[i + 1:]
            i += 1
        return argv, []
    if not argv or argv[0] != "run":
        return argv, []
    i = 1
    while i < len(argv):
        token = argv[i]
        if token == "--":
            return argv[:i], argv[i + 1:]
        if token in RUN_VALUE_OPTIONS:
            i += 2
            continue
        if token.startswith("-"):
            i += 1
            continue
        return argv[:i], argv[i:]
    return argv, []
