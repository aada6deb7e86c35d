"""What keeps ``perflab run`` from harming the program it runs, and from recording what is not the program's.

- ``Guard``: the process perflab started (its pid, taken when the run begins: a forked child, ``os.fork`` or a
  multiprocessing/Hogwild worker, neither records nor reports), perflab's own failures (kept, and said after the
  program: never raised inside it), and SIGTERM taken as an interrupt (``Terminated``) so that what was measured is
  written; a forked child that gets SIGTERM dies of it, as it would alone.
- ``say``: one line on stderr that cannot fail: a program that closed ``sys.stderr`` still gets perflab's lines, on
  file descriptor 2.
- ``ProfilerWatch``: torch.profiler, whichever way the program starts one (``profile().start()``, ``with profile()``,
  ``torch.autograd.profiler.profile``, a schedule's warm-up), prepares its trace through
  ``torch.autograd.profiler.profile._prepare_trace``; perflab's trace stops there first (one profiler at a time).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Callable

TERM_EXIT = 128 + signal.SIGTERM  # 143: what a shell reports for a process SIGTERM ended


class Terminated(BaseException):
    """Raised in the program's main thread when the process perflab started gets SIGTERM: it unwinds the program as
    Ctrl-C does, so that what was measured is written; the run then exits 143."""


def say(text: str) -> None:
    """Print one line of perflab's on stderr; where the program closed or replaced ``sys.stderr`` by something that
    cannot take it, on file descriptor 2; where that is closed too, nowhere."""
    try:
        print(text, file=sys.stderr, flush=True)
        return
    except (AttributeError, ValueError, OSError):
        pass
    try:
        os.write(2, (text + "\n").encode(errors="replace"))
    except OSError:
        pass


class Guard:
    def __init__(self):
        self.pid = os.getpid()
        self.failures: list[str] = []  # perflab's own failures, said after the program
        self._saved_sigterm = None
        self._sigterm_installed = False

    @property
    def owner(self) -> bool:
        """Is this the process perflab started (not a forked child)?"""
        return os.getpid() == self.pid

    def failed(self, what: str, exc: BaseException) -> None:
        self.failures.append(f"{what} ({type(exc).__name__}: {exc})")

    def call(self, what: str, fn: Callable[[], object]) -> bool:
        """Run perflab's own ``fn``; a failure is kept for after the program, not raised into it. True if it ran."""
        try:
            fn()
            return True
        except Exception as exc:
            self.failed(what, exc)
            return False

    # --- SIGTERM ----------------------------------------------------------------------------------------

    def catch_sigterm(self) -> None:
        """SIGTERM raises ``Terminated`` in the program, where the program left SIGTERM at its default (a handler of
        its own, set before or while it runs, is its own and is left alone)."""
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread: SIGTERM then ends the process as alone
        current = signal.getsignal(signal.SIGTERM)
        if current is not signal.SIG_DFL:
            return
        self._saved_sigterm = current
        signal.signal(signal.SIGTERM, self._on_sigterm)
        self._sigterm_installed = True

    def _on_sigterm(self, signum, frame) -> None:
        if not self.owner:  # a forked child ends as it would alone
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        raise Terminated()

    def release_sigterm(self) -> None:
        if not self._sigterm_installed:
            return
        self._sigterm_installed = False
        if signal.getsignal(signal.SIGTERM) == self._on_sigterm:  # the program set none of its own
            signal.signal(signal.SIGTERM, self._saved_sigterm)


class ProfilerWatch:
    """Calls ``give_way()`` before any torch.profiler other than perflab's own (``is_ours(autograd_profile)``) prepares
    its trace, in the process perflab started."""

    def __init__(self, is_ours: Callable[[object], bool], give_way: Callable[[], None], guard: Guard):
        self.is_ours = is_ours
        self.give_way = give_way
        self.guard = guard
        self._saved = None

    def install(self) -> None:
        from torch.autograd import profiler as autograd_profiler

        watch = self
        prepare = autograd_profiler.profile._prepare_trace
        self._saved = prepare

        def prepare_trace(prof_self, *args, **kwargs):
            if watch.guard.owner and not watch.is_ours(prof_self):
                watch.guard.call("perflab's trace could not give way to the program's profiler", watch.give_way)
            return prepare(prof_self, *args, **kwargs)

        autograd_profiler.profile._prepare_trace = prepare_trace

    def remove(self) -> None:
        if self._saved is not None:
            from torch.autograd import profiler as autograd_profiler

            autograd_profiler.profile._prepare_trace = self._saved
            self._saved = None
