"""A fresh process per case without paying the interpreter's start and torch's import per case (issue 23, P9).

A plain sweep worker (``python -m perflab.sweep.worker``) spends seconds before its case begins: the interpreter
starts and imports torch and perflab's measuring modules (4.91 s median a case over the lm_sizes grid on an H100
host, a fifth of a case). The launcher pays that once per sweep. It is a small server process, started by the
sweep's parent with ``python -m perflab.sweep.launcher``: it imports torch and perflab (``PRELOAD``), never touching
CUDA or NVML (nothing of a GPU is opened in it, so a child forked from it starts as clean as an exec'd one), and then
forks one child per case on request. Each child is still a fresh process of its own, as the plain worker is:

- its own pid, its own CUDA context and allocator (made in the child, after the fork), its own memory cap;
- its own session and process group (``setsid``), so a timeout kills it and whatever it started (compile workers)
  at once, as ``start_new_session`` does for the plain worker;
- its environment set from the request before anything reads it (``CUDA_VISIBLE_DEVICES`` is read when CUDA
  initialises, in the child; the intra-op thread count, read by torch's import, is set again from
  ``OMP_NUM_THREADS``);
- its stdout and stderr on the case's log, its stdin on /dev/null;
- its exit status reported to the parent as ``subprocess.Popen.returncode`` reports it (negative: the signal), so a
  crash, an OOM or a timeout gives the same row as before;
- killed when the launcher dies (Linux parent-death signal, armed by the worker against the launcher), and the
  launcher killed when the sweep's parent dies (the same, against the parent; and its control pipe's end).

Protocol (JSON lines): the parent writes ``{"argv": [...], "env": {...}, "log": PATH, "sent": time.time()}`` to the
launcher's stdin; the launcher answers ``{"started": N, "pid": PID}`` (N counts the requests) and, when the child
ends, ``{"exited": PID, "returncode": RC}`` on its stdout. ``{"ready": ...}`` comes first, once the imports are done
(with their seconds and the launcher's thread count: its own and numpy's OpenBLAS pool's, which stops around a fork).

Where it cannot work it is not used: ``PERFLAB_LAUNCHER=exec`` (or ``perflab sweep --launcher exec``) runs the plain
worker for every case; without ``os.fork`` (not Linux or macOS) the plain worker runs; the Ray engine runs the plain
worker (``runner.run_case_in_subprocess``: its tasks live in Ray's long-lived worker processes, where a launcher
would outlive the task that started it).
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

LAUNCHERS = ("fork", "exec")
LAUNCHER_ENV = "PERFLAB_LAUNCHER"

# What the launcher imports once: what every worker imports before its case's first stage (measured: the modules a
# CPU eager case had loaded by then); torch._dynamo after them (PRELOAD_COMPILER). Not inductor or its compile
# workers, nor transformers or timm (only some cases use them). What torch read from the environment at these
# imports is the launcher's environment, which is the sweep's: the runner sets no torch variable per case, only
# CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER (read when CUDA initialises, in the child) and the thread count (set again in the child).
PRELOAD = (
    "numpy",
    "torch",
    "torch.utils.flop_counter",
    "perflab.measure.harness",
    "perflab.sweep.worker",
    "perflab.sweep.store",
    "perflab.workloads.implementations",
    "perflab.workloads.classify",
    "perflab.workloads.lm",
    "perflab.workloads.decode",
    "perflab.models.registry",
    "perflab.models.lm",
    "perflab.models.llama",
    "perflab.models.vit",
    "perflab.diagnosis.profiling",
    "perflab.trace.capture",
)

# Imported after PRELOAD, where it leaves the GPU untouched: torch._dynamo. The FLOP count's first counted op imports it
# (torch._compile's dynamo-disabling wrapper around a dispatch mode): 1.5 s of every CPU case's check stage, and
# on a GPU host, where it pulls in triton too, more. If this import opens the CUDA driver, the launcher starts again
# without it (``--base-only``).
PRELOAD_COMPILER = ("torch._dynamo",)

START_TIMEOUT_S = 300.0  # the launcher's imports; a dead launcher is noticed at once (its pipe closes)


def choose_launcher(name: str | None = None) -> str:
    """``fork`` or ``exec``: ``name``, else ``$PERFLAB_LAUNCHER``, else fork where the OS has it. PerflabError on another."""
    from perflab.errors import PerflabError

    chosen = (name or os.environ.get(LAUNCHER_ENV) or "fork").strip().lower()
    if chosen not in LAUNCHERS:
        source = "--launcher" if name else LAUNCHER_ENV
        raise PerflabError(f"{source}: expected fork or exec, got {chosen!r}")
    if chosen == "fork" and not hasattr(os, "fork"):
        return "exec"
    return chosen


# ---------------------------------------------------------------------------------------------------
# The parent's side


class LaunchedWorker:
    """A child of the launcher, with the part of ``subprocess.Popen`` the runner uses: ``pid``, ``poll()``, ``wait()``,
    ``returncode``. The child is not the parent's own: its exit status comes through the launcher."""

    def __init__(self, launcher: Launcher, pid: int):
        self.launcher = launcher
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.launcher.collect()
            self.returncode = self.launcher.returncodes.pop(self.pid, None)
            if self.returncode is None and self.launcher.dead:
                # The launcher died before it reported this child's end: the child died with it (its parent-death
                # signal, SIGKILL), unless it had ended just before; a row it wrote first is still read.
                self.returncode = -signal.SIGKILL
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"launched worker {self.pid}", timeout)
            time.sleep(0.01)
        return self.returncode


class Launcher:
    """The parent's handle on one launcher process; ``start`` forks a worker in it. Close it when the sweep ends."""

    def __init__(self, label: str = "", python: str | None = None, env: dict | None = None):
        """``python``: the interpreter to run it (default this one), with ``env`` (default this process's, with this
        perflab on PYTHONPATH)."""
        self.launched_at = time.time()
        from perflab.paths import child_env

        env = child_env() if env is None else env
        cmd = [python or sys.executable, "-m", "perflab.sweep.launcher", "--parent-pid", str(os.getpid())]
        if label:
            cmd += ["--label", label]
        # Its own session: a Ctrl-C at the terminal reaches the parent, which stops the workers; the launcher then ends.
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, start_new_session=True)
        os.set_blocking(self.proc.stdout.fileno(), False)
        self._buffer = b""
        self.returncodes: dict[int, int] = {}
        self.ready: dict | None = None
        self._requests = 0
        self._started: dict[int, int] = {}  # request number → child pid
        self.dead = False

    def wait_ready(self) -> dict:
        """The launcher's first message, once its imports are done: ``{"ready": pid, "import_s": ..., "threads": ...}``,
        with ``"refused": why`` where it will not fork (the imports opened the CUDA driver, or started a thread); then it
        has ended. A launcher that died says so in ``refused`` too."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while self.ready is None:
            self.collect()
            if self.dead and self.ready is None:
                self.ready = {"refused": f"the launcher ended during its imports (exit status {self.proc.poll()})"}
            elif time.monotonic() > deadline:
                self.close()
                self.ready = {"refused": f"the launcher did not finish its imports within {START_TIMEOUT_S:g} s"}
            else:
                time.sleep(0.01)
        return self.ready

    def start(self, argv: list[str], env: dict, log_path: Path, sent: float | None = None) -> LaunchedWorker:
        """Fork a worker with ``argv`` (the worker's arguments), ``env`` and its output on ``log_path`` (appended to).
        ``sent``: when the case asked for its process (default now), the start of its ``start_and_imports``."""
        from perflab.errors import PerflabError

        self._requests += 1
        number = self._requests
        request = {"argv": list(argv), "env": dict(env), "log": str(log_path), "sent": time.time() if sent is None else sent}
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self.dead = True
        deadline = time.monotonic() + START_TIMEOUT_S
        while number not in self._started:
            self.collect()
            if self.dead:
                raise PerflabError(f"the sweep's launcher (pid {self.proc.pid}) ended (exit status {self.proc.poll()}); "
                                   f"run again with --launcher exec (or {LAUNCHER_ENV}=exec) to start each worker on its own")
            if time.monotonic() > deadline:
                raise PerflabError(f"the sweep's launcher (pid {self.proc.pid}) did not start a worker within {START_TIMEOUT_S:g} s")
            time.sleep(0.005)
        return LaunchedWorker(self, self._started.pop(number))

    def collect(self) -> None:
        """Read what the launcher has said so far (without waiting)."""
        while True:
            try:
                chunk = os.read(self.proc.stdout.fileno(), 65536)
            except BlockingIOError:
                break
            except OSError:
                chunk = b""
            if not chunk:
                self._lost()
                break
            self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            if not line.strip():
                continue
            message = json.loads(line)
            if "started" in message:
                self._started[message["started"]] = message["pid"]
            elif "exited" in message:
                self.returncodes[message["exited"]] = message["returncode"]
            elif "ready" in message:
                self.ready = message

    def _lost(self) -> None:
        """The launcher's pipe closed: it died. Its children died with it (their parent-death signal)."""
        if not self.dead:
            self.dead = True
            self.proc.wait()

    def close(self) -> None:
        """End the launcher: its stdin closes and it exits; killed if it does not within a few seconds."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        self.dead = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


# ---------------------------------------------------------------------------------------------------
# The launcher's side


def serve(parent_pid: int, base_only: bool = False, label: str = "") -> int:
    from perflab.sweep.worker import exit_with_parent

    if parent_pid:
        exit_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops the sweep; the launcher ends with its pipe
    out = sys.stdout.buffer
    started = time.perf_counter()
    import numpy  # noqa: F401  (its OpenBLAS starts its threads here; they stop around each fork, see fork_hazard)

    baseline = native_threads()
    for name in PRELOAD:
        __import__(name)
    hazard = fork_hazard(baseline)
    if hazard is None and not base_only:
        for name in PRELOAD_COMPILER:
            __import__(name)
        if fork_hazard(baseline) is not None:  # start again without it: a fresh interpreter, the same pipes
            sys.stdout.flush()
            args = [sys.executable, "-m", "perflab.sweep.launcher", "--parent-pid", str(parent_pid), "--base-only"]
            os.execv(sys.executable, args + (["--label", label] if label else []))
    ready = {"ready": os.getpid(), "import_s": time.perf_counter() - started, "threads": native_threads(),
             "preloaded": list(PRELOAD) + ([] if base_only else list(PRELOAD_COMPILER))}
    if hazard is not None:
        _say(out, dict(ready, refused=hazard))
        return 3
    _say(out, ready)
    control = sys.stdin.buffer.fileno()
    os.set_blocking(control, False)
    selector = selectors.DefaultSelector()
    selector.register(control, selectors.EVENT_READ)
    pending = b""
    children: set[int] = set()
    requests = 0
    open_ = True
    while open_ or children:
        if open_:
            selector.select(timeout=0.02)
            try:
                chunk = os.read(control, 65536)
            except BlockingIOError:
                chunk = None
            if chunk == b"":  # the parent closed the pipe (or died): no more requests
                open_ = False
                selector.unregister(control)
            elif chunk:
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.strip():
                        requests += 1
                        pid = _fork_worker(json.loads(line), (control, out.fileno(), selector.fileno()))
                        children.add(pid)
                        _say(out, {"started": requests, "pid": pid})
        else:
            time.sleep(0.02)
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                children.discard(pid)
                _say(out, {"exited": pid, "returncode": os.waitstatus_to_exitcode(status)}, quiet=True)
    return 0


def fork_hazard(baseline_threads: int | None = 1) -> str | None:
    """Why a child forked from this process now would not start clean, or None: torch initialised CUDA, the GPU driver
    is open (a file descriptor on ``/dev/nvidia*``: ``cuInit`` or ``nvmlInit`` ran, and a child's own CUDA would then
    fail), or a thread runs beyond the ``baseline_threads`` there were after numpy's import (a fork copies only the
    calling thread, with whatever locks the others held). numpy's OpenBLAS starts its pool at its import and stops it
    before each fork (its ``pthread_atfork`` handler), so those threads are the baseline, not a hazard; torch's OpenMP
    pool starts at the first parallel op, which the imports do not run.

    The driver's library being mapped is not a hazard: a CUDA 13 build of torch maps ``libcuda.so`` at its import
    (cuBLASLt's loader dlopens it) without initialising it, and a child forked after that runs CUDA (H100, torch 2.11,
    2026-11-26). Initialising it opens ``/dev/nvidiactl``, which is what this looks for."""
    import threading

    import torch

    if torch.cuda.is_initialized():
        return "CUDA was initialised by the imports"
    opened = driver_files()
    if opened:
        return f"the imports opened the GPU driver ({', '.join(opened)})"
    if threading.active_count() > 1:
        return f"the imports started {threading.active_count() - 1} Python thread(s)"
    threads = native_threads()
    if threads is not None and baseline_threads is not None and threads > baseline_threads:
        return f"the imports started {threads - baseline_threads} thread(s)"
    return None


def driver_files() -> list[str]:
    """The GPU driver's device files this process holds open (``/dev/nvidia*``, from ``/proc/self/fd``), sorted."""
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return []
    opened = set()
    for fd in fds:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/dev/nvidia"):
            opened.add(target)
    return sorted(opened)


# Threads a fork may leave behind: their library re-arms them in the child. jemalloc's background purging thread
# appeared on the GPU host at perflab.trace.capture's import (2026-11-26; which library's jemalloc was not checked:
# pyarrow's, through pandas, is the likely one). jemalloc takes its locks before a fork and marks its background
# threads unstarted in the child (its design); measured: the children forked past it ran CUDA and their cases.
FORK_SAFE_THREADS = ("jemalloc_bg_thd",)


def native_threads() -> int | None:
    """The threads of this process (``/proc/self/task``) less those a fork is safe with (``FORK_SAFE_THREADS``, by
    name); None where /proc does not say."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    count = 0
    for task in tasks:
        try:
            name = Path(f"/proc/self/task/{task}/comm").read_text().strip()
        except OSError:
            name = ""
        count += name not in FORK_SAFE_THREADS
    return count


def _say(out, message: dict, quiet: bool = False) -> None:
    try:
        out.write((json.dumps(message) + "\n").encode())
        out.flush()
    except (BrokenPipeError, OSError):
        if not quiet:
            raise


def _fork_worker(request: dict, control_fds) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    with warnings.catch_warnings():  # Python 3.12 warns of any second thread; fork_hazard allowed only FORK_SAFE_THREADS
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        code = _child(request, control_fds)
    except SystemExit as exc:  # as the interpreter ends on it: its code, or its message and status 1
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
    except BaseException:  # as an uncaught exception ends a plain worker: traceback on its log, status 1
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _child(request: dict, control_fds) -> int:
    forked = time.time()
    os.setsid()  # its own group: a timeout kills it and what it started, as start_new_session does for the plain worker
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL if sig != signal.SIGINT else signal.default_int_handler)
    null = os.open(os.devnull, os.O_RDONLY)
    log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    for fd in (null, log, *control_fds):
        if fd > 2:
            os.close(fd)
    print(f"# forked by the sweep's launcher (pid {os.getppid()}): pid {os.getpid()}", file=sys.stderr, flush=True)
    os.environ.clear()
    os.environ.update(request["env"])
    _reapply_environment()
    import atexit
    import random

    import numpy as np

    random.seed()  # as a fresh interpreter would be (Python reseeds at fork anyway; numpy does not)
    np.random.seed()
    from perflab.sweep import worker

    # Its start is counted from the parent's request (the first case also waits for the launcher's imports).
    argv = list(request["argv"]) + ["--parent-pid", str(os.getppid()), "--launched-at", repr(float(request.get("sent") or forked))]
    code = worker.main(argv)
    atexit._run_exitfuncs()  # what a plain worker runs at its exit (the launcher's own ran none yet)
    return code


def _reapply_environment() -> None:
    """What torch read from the environment at its import in the launcher, read again from the child's: the intra-op
    threads (OMP_NUM_THREADS, which a sweep of several CPU workers sets per worker)."""
    import torch

    threads = os.environ.get("OMP_NUM_THREADS", "").strip()
    if threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m perflab.sweep.launcher", description=__doc__.splitlines()[0])
    parser.add_argument("--parent-pid", type=int, default=0, help="exit when this process dies")
    parser.add_argument("--label", default="", help="what the launcher serves (a sweep's directory), for ps")
    parser.add_argument("--base-only", action="store_true", help="import PRELOAD only, not PRELOAD_COMPILER")
    args = parser.parse_args(argv)
    code = serve(args.parent_pid, args.base_only, args.label)
    # Its children have all exited and every message is written: end here, without the interpreter's teardown of torch
    # (a second or more of module finalisers that every sweep's parent would wait for in close()).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
