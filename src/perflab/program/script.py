"""The user's program: which one (a file or ``-m module``), and running it in this process as Python would.

As ``runpy.run_path`` does, the program runs as a module of its own that is ``sys.modules["__main__"]`` while it runs
(the caller's ``__main__`` comes back after), so that what pickles by reference to ``__main__`` (a spawned DataLoader
worker, a multiprocessing target) finds the program's own functions, what dynamo installs in the program's globals
stays there, and ``sys.argv``, ``sys.path[0]`` and ``__file__`` are what ``python SCRIPT ARGS`` gives. Its exit code
is its own: ``sys.exit(n)`` gives n, an exception gives 1 with its traceback (perflab's frames left out), Ctrl-C
gives 130, SIGTERM 143.

A program that cannot start (a syntax error, a file that is not Python, a ``-m`` module that is not found) is found
out before anything is installed or written: ``check_starts`` prints the syntax error as Python prints it and raises
a one-line ``PerflabError`` (exit 2).
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback
import types
from dataclasses import dataclass, field, replace
from pathlib import Path

from perflab.errors import PerflabError
from perflab.program.guard import TERM_EXIT, Terminated, say

INTERPRETERS = ("python", "python3")


@dataclass(frozen=True)
class Program:
    path: Path | None  # a script file, or None for a module
    module: str | None  # ``-m module``
    args: tuple[str, ...]
    code: types.CodeType | None = field(default=None, compare=False, repr=False)  # a script's, compiled by check_starts

    @property
    def label(self) -> str:
        what = str(self.path) if self.path is not None else f"-m {self.module}"
        return " ".join([what, *self.args])


def parse_program(tail: list[str]) -> Program:
    """The program in a command line's tail: ``SCRIPT ARGS...``, ``-m MODULE ARGS...``, either after ``python``; one
    that cannot start is a PerflabError here (``check_starts``), before anything is installed or written."""
    tail = list(tail)
    if tail and (Path(tail[0]).name in INTERPRETERS or Path(tail[0]).name.startswith("python3.") or tail[0] == sys.executable):
        tail = tail[1:]
    if not tail:
        raise PerflabError("perflab run needs a program: perflab run [OPTIONS] -- SCRIPT [ARGS...] (or -- -m MODULE [ARGS...])")
    if tail[0] == "-m":
        if len(tail) < 2:
            raise PerflabError("perflab run -- -m needs a module name")
        return check_starts(Program(None, tail[1], tuple(tail[2:])))
    if tail[0].startswith("-"):
        raise PerflabError(f"{tail[0]}: perflab run takes the program's own options after the script, not before it "
                           "(perflab run [OPTIONS] -- SCRIPT [ARGS...])")
    path = Path(tail[0])
    if not path.exists():
        raise PerflabError(f"{path}: no such file (perflab run [OPTIONS] -- SCRIPT [ARGS...])")
    if path.is_dir():
        raise PerflabError(f"{path}: is a directory, not a Python script")
    return check_starts(Program(path, None, tuple(tail[1:])))


def check_starts(program: Program) -> Program:
    """The program, compiled (a script) or found (a module), or a one-line PerflabError saying why it cannot start;
    a syntax error is printed first, as Python prints it."""
    if program.path is not None:
        path = program.path.resolve()
        try:
            source = path.read_bytes()
        except OSError as exc:
            raise PerflabError(f"{program.path}: cannot be read ({exc.strerror}); nothing was run") from None
        try:
            code = compile(source, str(path), "exec")
        except SyntaxError as exc:
            _print_syntax_error(exc)
            raise PerflabError(f"{program.path}: the program cannot start: {type(exc).__name__} at line {exc.lineno} "
                               "(shown above); nothing was run") from None
        except ValueError as exc:  # null bytes (a binary file) on Pythons before 3.12
            raise PerflabError(f"{program.path}: the program cannot start: not a Python script ({exc}); nothing was run") from None
        return replace(program, code=code)
    find = getattr(runpy, "_get_module_details", None)  # what runpy.run_module looks the module up with
    if find is None:
        return program
    saved_path0 = sys.path[0] if sys.path else None
    sys.path[0:1] = [os.getcwd()]  # as python -m finds it, and as run_program runs it
    try:
        find(program.module)
    except SyntaxError as exc:
        _print_syntax_error(exc)
        raise PerflabError(f"-m {program.module}: the program cannot start: {type(exc).__name__} at line {exc.lineno} "
                           "(shown above); nothing was run") from None
    except ImportError as exc:
        raise PerflabError(f"-m {program.module}: the program cannot start: {exc}; nothing was run") from None
    except Exception as exc:  # its package's __init__ raised while the module was looked up (python says the same)
        raise PerflabError(f"-m {program.module}: the program cannot start: error while finding the module "
                           f"({type(exc).__name__}: {exc}); nothing was run") from None
    finally:
        if saved_path0 is not None:
            sys.path[0] = saved_path0
    return program


def _print_syntax_error(exc: SyntaxError) -> None:
    try:
        traceback.print_exception(type(exc), exc, None, file=sys.stderr)
    except (AttributeError, ValueError, OSError):
        pass


@dataclass
class Outcome:
    """How the program ended: its exit code, and the exception that ended it (None for a normal end or sys.exit)."""

    code: int
    exception: BaseException | None = None
    interrupted: bool = False
    message: str | None = None  # what ``sys.exit("text")`` printed
    terminated: bool = False  # SIGTERM


def run_program(program: Program, stop: type[BaseException] | None = None) -> Outcome:
    """Run ``program`` to its end in this process. ``stop``: an exception class perflab raises inside the program to end
    it early (``--stop-after``): an exit with code 0."""
    saved_argv, saved_path0 = list(sys.argv), sys.path[0] if sys.path else None
    saved_main = sys.modules.get("__main__")
    try:
        if program.path is not None:
            path = program.path.resolve()
            sys.argv = [str(program.path), *program.args]
            sys.path[0] = str(path.parent)
            code = program.code if program.code is not None else compile(path.read_bytes(), str(path), "exec")
            main = types.ModuleType("__main__")
            main.__dict__.update({"__file__": str(path), "__builtins__": __builtins__, "__cached__": None})
            sys.modules["__main__"] = main
            exec(code, main.__dict__)
        else:
            sys.argv = [program.module, *program.args]
            sys.path[0] = os.getcwd()
            runpy.run_module(program.module, run_name="__main__", alter_sys=True)
        return Outcome(0)
    except SystemExit as exc:
        if stop is not None and isinstance(exc, stop):
            return Outcome(0)
        return _exit_outcome(exc)
    except KeyboardInterrupt as exc:
        return Outcome(130, exc, interrupted=True)
    except Terminated as exc:  # SIGTERM: an interrupt; alone, the process would have ended with 128 + 15
        return Outcome(TERM_EXIT, exc, interrupted=True, terminated=True)
    except BaseException as exc:  # the program's own error: its traceback and exit code 1, as Python gives them
        if stop is not None and isinstance(exc, stop):
            return Outcome(0)
        return Outcome(1, exc)
    finally:
        sys.argv = saved_argv
        if saved_path0 is not None and sys.path:
            sys.path[0] = saved_path0
        if saved_main is not None:
            sys.modules["__main__"] = saved_main


def _exit_outcome(exc: SystemExit) -> Outcome:
    code = exc.code
    if code is None:
        return Outcome(0)
    if isinstance(code, int):
        return Outcome(code)
    return Outcome(1, message=str(code))


def print_program_traceback(outcome: Outcome, program: Program) -> None:
    """The program's traceback as Python prints it, from the program's own first frame (perflab's are left out);
    nothing for SIGTERM (Python prints nothing when it ends a process), nothing where the program closed stderr."""
    exc = outcome.exception
    if outcome.terminated:
        return
    if exc is None:
        if outcome.message is not None:
            say(outcome.message)
        return
    tb = exc.__traceback__
    own = str(program.path.resolve()) if program.path is not None else None
    skip = tb
    while skip is not None and own is not None and skip.tb_frame.f_code.co_filename != own:
        skip = skip.tb_next
    if own is None:  # -m: from the first frame outside perflab and runpy
        skip = tb
        while skip is not None and ("perflab" in skip.tb_frame.f_code.co_filename or skip.tb_frame.f_code.co_filename.endswith("runpy.py")):
            skip = skip.tb_next
    try:
        traceback.print_exception(type(exc), exc, skip if skip is not None else tb, file=sys.stderr)
    except (AttributeError, ValueError, OSError):  # Python, too, prints no traceback to a closed stderr
        pass
