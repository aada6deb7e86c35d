"""A finished command's process exits: a bound on the time between the command's end and the process's.

When a command has printed and written everything, what is left is the interpreter's teardown: joining non-daemon
threads, then the atexit handlers. Libraries add to it. inductor's ``shutdown_compile_workers`` sends its compile
worker process a shutdown message and waits up to 300 s for it (``SubprocPool.shutdown``), and a worker that does not
answer keeps a finished ``perflab explain`` alive for those 300 s (an explain of gpt_large's compiled train
step printed its report and was still running 240 s later). The teardown owes the user nothing by then, so
``arm`` starts a daemon thread at the command's end: if the process is still alive ``grace_s`` later, the thread
writes every thread's stack, the non-daemon threads and the child processes to a file, says so in one line, and ends
the process with the command's exit status. A process that exits in time never hears from it.

Only the program's entry point (``perflab.cli.entry``) arms it; ``perflab.cli.main``, which tests call in-process, does not.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import tempfile
import threading
import time

EXIT_GRACE_S = 60.0  # a CUDA process with compiled models tears down in seconds; a minute is a stuck teardown


def arm(code: int, grace_s: float = EXIT_GRACE_S) -> threading.Thread:
    """Start the watch for a command that finished with exit status ``code``; returns its (daemon) thread."""
    thread = threading.Thread(target=_watch, args=(code, grace_s), name="perflab-exit-watch", daemon=True)
    thread.start()
    return thread


def _watch(code: int, grace_s: float) -> None:
    time.sleep(grace_s)
    try:
        path = report_stuck_exit()
        where = f"; the stacks are in {path}" if path else ""
        print(f"perflab: note: the command finished {grace_s:g} s ago but the process had not exited "
              f"(non-daemon threads: {', '.join(_non_daemon_threads()) or 'none'}; child processes: "
              f"{', '.join(str(pid) for pid, _ in child_processes()) or 'none'}){where}; ending it", file=sys.stderr, flush=True)
        sys.stdout.flush()
    finally:
        os._exit(code)


def report_stuck_exit() -> str | None:
    """Every thread's stack, the non-daemon threads and the child processes, written to a file; its path (None if none
    could be written)."""
    try:
        fd, path = tempfile.mkstemp(prefix=f"perflab-exit-{os.getpid()}-", suffix=".txt")
        with os.fdopen(fd, "w") as out:
            out.write(f"non-daemon threads: {_non_daemon_threads()}\nchild processes:\n")
            for pid, command in child_processes():
                out.write(f"  {pid} {command}\n")
            out.write("\nstacks:\n")
            out.flush()
            faulthandler.dump_traceback(file=out, all_threads=True)
        return path
    except OSError:
        return None


def _non_daemon_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if not t.daemon and t is not threading.main_thread() and t.is_alive()]


def child_processes(pid: int | None = None) -> list[tuple[int, str]]:
    """(pid, command line) of the processes whose parent is ``pid`` (default: this one), read from /proc (Linux; empty
    elsewhere)."""
    pid = os.getpid() if pid is None else pid
    out = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            parent = int(stat[stat.rindex(")") + 2:].split()[1])  # after "pid (comm) state"
            if parent != pid:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, ValueError):
            continue
        out.append((int(entry), command[:200]))
    return out
