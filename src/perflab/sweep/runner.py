"""Run an experiment's cases, one subprocess per case, committing each row to the store as it finishes.

The parent process schedules and stores; it never touches CUDA (a context here would sit on GPU 0 and be
flagged as another process by every case there). Each case runs in a fresh worker process (``perflab.sweep.worker``)
with ``CUDA_VISIBLE_DEVICES`` set to its GPU; with several GPUs, one worker runs per GPU at a time. The worker is
forked by the sweep's launcher (``sweep.launcher``: torch and perflab imported once per sweep, no CUDA in it), or,
with ``launcher="exec"`` (``--launcher exec``, ``PERFLAB_LAUNCHER=exec``) and in the Ray engine, started as
``python -m perflab.sweep.worker``.

Outcomes: the worker's row (``ok``, ``oom``, ``error``, ``invalid``); ``error`` with the exit status when
the worker dies without a row (a segfault, an abort); ``timeout`` when it runs past the per-case limit
(its whole process group is killed). The sweep goes on after each.

``resume`` skips the cases stored under the same case id and environment key. The key hashes what makes
timings comparable: host, CPU, GPU names, driver, torch and CUDA versions, and perflab's version.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import json
import math
import os
import platform
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from perflab.errors import PerflabError
from perflab.spec import Case
from perflab.sweep.spec import Experiment
from perflab.paths import child_env
from perflab.sweep.lifecycle import EventHandler, SweepSession, SweepSummary
from perflab.sweep.store import FAILED_STATUSES, Store
from perflab.sweep.worker import alive_path

POLL_S = 0.05  # how often the parent looks at its workers
KILL_GRACE_S = 5.0

@dataclass
class _Running:
    case: Case
    slot: str
    proc: subprocess.Popen  # or a launcher's child (sweep.launcher.LaunchedWorker): pid, poll, wait
    started: float  # time.monotonic()
    deadline: float
    result_path: Path
    log_path: Path
    timeout_s: float  # the case's own limit, from the end of its worker's imports (extend_once_alive)
    alive_at: float | None = None  # when the worker was first seen past its imports (its alive file: ``alive_path``)

    @property
    def alive_path(self) -> Path:
        return alive_path(self.result_path)

    def extend_once_alive(self) -> None:
        """A worker in a new interpreter imports torch and perflab first (seconds, more on a loaded host), which are
        not the case's: its limit counts from when it says it is past them, at most ``IMPORT_ALLOWANCE_S`` after its
        start."""
        if self.alive_at is None and self.alive_path.exists():
            self.alive_at = time.monotonic()
            self.deadline = self.alive_at + self.timeout_s


def run_sweep(
    experiment: Experiment,
    out_dir,
    *,
    resume: bool = False,
    retry_failed: bool = False,
    gpus: list[int] | None = None,
    workers: int = 1,
    timeout_s: float | None = None,
    command: str = "",
    on_event: EventHandler | None = None,
    launcher: str | None = None,
) -> SweepSummary:
    """Run every case of ``experiment`` not yet in ``out_dir``'s store; see the module docstring.

    ``launcher``: ``fork`` (workers forked by the sweep's launcher) or ``exec`` (each started as a new interpreter);
    default ``$PERFLAB_LAUNCHER``, else fork.

    ``on_event(kind, **info)`` is called with kind "start" (total, skipped, to_run, env_key), "case_start"
    (case, slot), "case_done" (case, row, slot) and "finish" (summary), for progress displays.
    """
    from perflab.sweep.launcher import choose_launcher

    out_dir = Path(out_dir)
    timeout_s = case_timeout(experiment, timeout_s)
    launcher = choose_launcher(launcher)
    if experiment.gpu_pins or experiment.across_gpus:
        raise PerflabError(f"{experiment.source}: gpu: and across_gpus: place cases on a cluster's GPU types; run it with --engine ray")
    slots = worker_slots(experiment, gpus, workers)
    check_slots_fit(experiment.cases, slots)
    env = probe_environment(experiment, [s[len("gpu"):] for s in slots if s.startswith("gpu")])
    env_key = environment_key(env)

    summary = SweepSummary(out_dir, env_key, total=len(experiment.cases), skipped=0)
    with SweepSession(out_dir, summary, on_event=on_event) as session:
        todo = _cases_to_run(experiment, session.store, env_key, out_dir, resume, retry_failed)
        summary.skipped = summary.total - len(todo)
        session.begin([(env_key, env)], experiment=experiment, record=experiment.to_json(), env_key=env_key, n_cases=summary.total,
                      n_skipped=summary.skipped, command=command,
                      start=dict(total=summary.total, skipped=summary.skipped, to_run=len(todo), env_key=env_key, slots=slots))
        args = worker_args(experiment, out_dir) + ["--flops-cache", str((out_dir / "flops").resolve())]
        session.drive(lambda: _schedule(todo, slots, out_dir, timeout_s, env, env_key, session, retry_failed, args, launcher))
    return summary


def case_timeout(experiment: Experiment, timeout_s: float | None) -> float:
    """The per-case limit: --timeout, else the spec's; PerflabError unless positive and finite."""
    timeout_s = float(timeout_s if timeout_s is not None else experiment.timeout_s)
    if not (timeout_s > 0 and math.isfinite(timeout_s)):  # rejects nan and inf too
        raise PerflabError(f"--timeout must be a positive number of seconds, got {timeout_s:g}")
    return timeout_s


def refuse_stored_unless_resuming(store: Store, out_dir: Path, resume: bool) -> None:
    if not resume and store.count():
        raise PerflabError(
            f"{out_dir} already holds {store.count()} stored result(s); pass --resume to run only the missing cases, or give another --out"
        )


def _cases_to_run(experiment: Experiment, store: Store, env_key: str, out_dir: Path, resume: bool, retry_failed: bool) -> list[Case]:
    refuse_stored_unless_resuming(store, out_dir, resume)
    stored = store.statuses(env_key)
    return [c for c in experiment.cases if c.id not in stored or (retry_failed and stored[c.id] in FAILED_STATUSES)]


def worker_args(experiment: Experiment, out_dir: Path) -> list[str]:
    """Arguments every worker of this sweep gets beyond its case: the profile and ncu passes, when the spec asks.

    The same for every case (the worker decides whether its case matches ``ncu_where``), so the engines pass
    them on unchanged."""
    args = []
    if experiment.profile_steps:
        args += ["--profile-steps", str(experiment.profile_steps)]
    if experiment.ncu_top:
        args += ["--ncu-top", str(experiment.ncu_top), "--ncu-where", json.dumps(dict((k, list(v)) for k, v in experiment.ncu_where))]
    if args:
        args += ["--trace-dir", str((out_dir / "traces").resolve())]
    if experiment.names_references and experiment.model_root:
        args += ["--model-root", experiment.model_root]  # where the spec's file.py:NAME and hf:DIR are read from
    if not experiment.pin:
        args += ["--no-pin"]
    return args


def _schedule(todo, slots, out_dir, timeout_s, env, env_key, session: SweepSession, replace: bool, worker_args: list[str],
              launcher: str) -> None:
    """Run ``todo`` on the ``slots``, in order, each case as soon as it has slots enough, each row stored as it comes."""
    pending = collections.deque(todo)
    free = list(slots)
    running: list[_Running] = []
    forks = Forks(str(out_dir)) if launcher == "fork" and todo else None
    try:
        while pending or running:
            while pending and len(free) >= pending[0].world_size:  # in order: a case of N ranks waits for N free slots
                case = pending.popleft()
                slot = GROUP.join(free[:case.world_size])
                del free[:case.world_size]
                running.append(_start(case, slot, out_dir, timeout_s, len(slots), worker_args, forks))
                session.emit("case_start", case=case, slot=slot)
            time.sleep(POLL_S)
            for job in list(running):
                row = _finished_row(job, env, timeout_s)
                if row is None:
                    continue
                running.remove(job)
                free.extend(job.slot.split(GROUP))
                session.case_done(job.case, row, env_key, slot=job.slot, wall_s=time.monotonic() - job.started, replace=replace)
    finally:
        for job in running:  # interrupted: stop the workers; their cases stay unstored and rerun on --resume
            _kill(job.proc)
            job.result_path.unlink(missing_ok=True)
            job.alive_path.unlink(missing_ok=True)
        if forks is not None:
            forks.close()


class Forks:
    """The sweep's launcher (``sweep.launcher``), started when the first worker is asked for, and started again if it
    died (its children die with it: their cases become error rows, and the rest of the sweep goes on). Where it will
    not fork (its imports opened the GPU driver, or started a thread), every case runs in a new interpreter, said once
    on stderr."""

    def __init__(self, label: str = "", python: str | None = None, env: dict | None = None):
        self.label = label
        self.python = python  # the interpreter the launcher runs (default this one's), and its environment
        self.env = env
        self.launcher = None
        self.refused: str | None = None
        self.started = 0

    def start(self, argv: list[str], env: dict, log_path: Path):
        """The launcher's child running the worker with ``argv``; None where the launcher refused (exec it instead)."""
        from perflab.sweep.launcher import Launcher

        if self.refused:
            return None
        if self.launcher is None or self.launcher.dead:
            if self.launcher is not None:
                self.launcher.close()
            self.launcher = Launcher(self.label, python=self.python, env=self.env)
            ready = self.launcher.wait_ready()
            if ready.get("refused"):
                self.refused = ready["refused"]
                self.launcher.close()
                print(f"perflab sweep: the launcher will not fork workers ({self.refused}); each case starts a new interpreter",
                      file=sys.stderr, flush=True)
                return None
        # The first case waited for the launcher's imports: its start counts from the launcher's.
        sent = self.launcher.launched_at if self.started == 0 else None
        self.started += 1
        return self.launcher.start(argv, env, log_path, sent=sent)

    def close(self) -> None:
        if self.launcher is not None:
            self.launcher.close()


def run_case_in_subprocess(case: Case, work_dir: Path, timeout_s: float, env: dict, slot: str = "w0",
                           extra_args=(), forks: Forks | None = None, python: str | None = None,
                           worker_env: dict | None = None, tag: str = "") -> tuple[dict, Path]:
    """One case in its own worker process under the time limit, waited for: (its row, its log's path).

    The same start and finish as the local engine's scheduler (which polls many at once), with the worker started
    as a new interpreter (``python -m perflab.sweep.worker``), or forked by ``forks``' launcher: the Ray engine runs
    this on the node that holds the case's GPU, in a Ray worker process that lives on after the task, and versions
    (``sweep.versions``) run one process at a time. ``work_dir`` gets ``logs/`` and ``tmp/``. ``python``: the
    interpreter of a new one (default this one), ``worker_env`` its environment, ``tag`` added to its files' names.
    A worker given ``--together`` (``extra_args``: several cases timed in one process) writes ``{"rows": [...]}``
    instead of a row; that comes back as it is, and a failure as ``case``'s row.
    """
    for sub in ("logs", "tmp"):
        (work_dir / sub).mkdir(parents=True, exist_ok=True)
    job = _start(case, slot, work_dir, timeout_s, 1, extra_args, forks, python=python, worker_env=worker_env, tag=tag)
    try:
        while (row := _finished_row(job, env, timeout_s)) is None:
            time.sleep(POLL_S)
    finally:
        if job.proc.poll() is None:  # interrupted (or cancelled): take the worker's whole group with us
            _kill(job.proc)
        job.result_path.unlink(missing_ok=True)
        job.alive_path.unlink(missing_ok=True)
    return row, job.log_path


def _start(case: Case, slot: str, out_dir: Path, timeout_s: float, n_slots: int, extra_args=(), forks: Forks | None = None,
           python: str | None = None, worker_env: dict | None = None, tag: str = "") -> _Running:
    result_path = out_dir / "tmp" / f"{case.id}{tag}.json"
    result_path.unlink(missing_ok=True)
    alive_path(result_path).unlink(missing_ok=True)
    log_path = out_dir / "logs" / f"{case.id}{tag}.log"
    env = worker_env if worker_env is not None else slot_env(slot, n_slots)
    argv = ["--case", json.dumps(case.to_dict()), "--result", str(result_path), "--pin-index", str(pin_index(slot)), *extra_args]
    started = time.monotonic()
    with open(log_path, "w") as log:
        log.write(f"# {case.label()}  (case {case.id}, worker {slot})\n")
        log.flush()
        # A fresh child of the launcher, in a session of its own, its output appended to the log; or a new interpreter.
        proc = forks.start(argv, env, log_path) if forks is not None else None
        if proc is None:
            # A new session: the worker and anything it spawns (compile workers) form a group we can kill at once.
            cmd = [python or sys.executable, "-m", "perflab.sweep.worker", *argv, "--parent-pid", str(os.getpid()),
                   "--launched-at", repr(time.time())]
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    env=env, start_new_session=True)
    # the limit counts from the worker's own start: a forked case waits first for the launcher's one-time imports
    # (seconds; bounded by the launcher's START_TIMEOUT_S), which are not the case's; a new interpreter's own imports
    # are not the case's either (extend_once_alive)
    exec_imports = IMPORT_ALLOWANCE_S if isinstance(proc, subprocess.Popen) else 0.0
    return _Running(case, slot, proc, started, time.monotonic() + timeout_s + exec_imports, result_path, log_path, timeout_s)


IMPORT_ALLOWANCE_S = 60.0  # the longest a new interpreter's imports may take before its case's limit starts anyway


def pin_index(slot: str) -> int:
    """Which core a slot's worker pins its timing thread to, counted from the end of its affinity set: the
    slot's number (``gpu3`` → 3, ``w1`` → 1), so workers side by side do not share a core."""
    digits = "".join(ch for ch in slot.split(GROUP)[0] if ch.isdigit())
    return int(digits) if digits else 0


def _finished_row(job: _Running, env: dict, timeout_s: float) -> dict | None:
    """The job's row once it has finished (or run out of time); None while it runs."""
    returncode = job.proc.poll()
    if returncode is None:
        job.extend_once_alive()
    if returncode is None and time.monotonic() < job.deadline:
        return None
    job.alive_path.unlink(missing_ok=True)
    if returncode is None:
        _kill(job.proc)
        job.result_path.unlink(missing_ok=True)
        return parent_row(job.case, "timeout", f"no result within the {timeout_s:g} s limit; the worker was killed (log: {_rel(job.log_path)})", env)
    row = _read_result(job.result_path)
    if row is not None:
        return row  # a row written before a crash at exit is still a full row
    return parent_row(job.case, "error", f"{_describe_exit(returncode)} without a result{_last_log_line(job.log_path)} (log: {_rel(job.log_path)})", env)


def _read_result(path: Path) -> dict | None:
    try:
        row = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    finally:
        path.unlink(missing_ok=True)
    return row if isinstance(row, dict) and ("case_id" in row or isinstance(row.get("rows"), list)) else None  # rows: --together


def parent_row(case: Case, status: str, message: str, env: dict) -> dict:
    """The row of a case whose worker left none (a crash, a timeout, a lost node), written by the parent."""
    from perflab.measure.harness import failed_row  # the same keys as the worker's rows

    return failed_row(case, status, message, dict(env, device=case.device))


def _describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"worker killed by {name} (exit status {returncode})"
    return f"worker exited with status {returncode}"


def _last_log_line(log_path: Path) -> str:
    try:
        lines = [line.strip() for line in log_path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    lines = [line for line in lines if not line.startswith("#") and "stage:" not in line]
    return f": {lines[-1][:300]}" if lines else ""


def _rel(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


def _kill(proc: subprocess.Popen) -> None:
    """Kill the worker's whole process group and reap it (a launcher's child that has not yet made its group: itself)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        proc.wait(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        pass


def slot_env(slot: str, n_slots: int = 1) -> dict:
    """The environment of the worker in ``slot`` (of ``n_slots`` side by side): this perflab first on its path, its GPUs."""
    env = child_env()  # the worker must import this perflab even when it was found through a relative PYTHONPATH
    if n_slots > 1:
        # Workers side by side: split the host's cores, or their thread pools oversubscribe them many times
        # over (a GPU worker's launch thread then waits for a core, and launch-bound timings suffer).
        threads = str(max(1, (os.cpu_count() or 1) // n_slots))
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env.setdefault(name, threads)
    if slot.startswith("gpu"):  # a data-parallel case's group of slots sees its GPUs as 0..N-1, one rank each
        env["CUDA_VISIBLE_DEVICES"] = ",".join(part[len("gpu"):] for part in slot.split(GROUP))
        env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # so --gpus 3 is nvidia-smi's GPU 3
    return env


GROUP = "+"  # joins the slots of a case that takes several (a data-parallel case: one slot per rank)


def check_slots_fit(cases, slots: list[str]) -> None:
    """Each case takes ``world_size`` slots (GPUs, or CPU workers): one needing more than there are is one clear error."""
    widest = max(cases, key=lambda c: c.world_size, default=None)
    if widest is not None and widest.world_size > len(slots):
        kind = "GPUs (--gpus)" if slots[0].startswith("gpu") else "workers (--workers)"
        raise PerflabError(f"case {widest.label()} runs {widest.world_size} ranks, one per slot; this sweep has {len(slots)} {kind}: "
                           f"give at least {widest.world_size}")


def worker_slots(experiment: Experiment, gpus: list[int] | None, workers: int) -> list[str]:
    """Worker slots: one per GPU (``gpu<physical id>``), else ``workers`` CPU slots (``w0``, ``w1``, ...)."""
    uses_cuda = any(c.device == "cuda" for c in experiment.cases)
    if uses_cuda:
        _require_cuda(experiment)
    if gpus:
        if not uses_cuda:
            raise PerflabError("--gpus: the spec's cases run on the CPU; use --workers N to run CPU cases side by side")
        if len(set(gpus)) != len(gpus) or any(g < 0 for g in gpus):
            raise PerflabError(f"--gpus: give distinct GPU indices, e.g. 0,1; got {','.join(map(str, gpus))}")
        visible = _parent_visible_devices()
        count = gpu_count()
        bad = [g for g in gpus if g >= count]
        if bad:
            seen = f"{count} visible: 0..{count - 1}" if count else "none visible"
            raise PerflabError(f"--gpus: GPU {bad[0]} does not exist here ({seen})")
        # Indices count within the parent's CUDA_VISIBLE_DEVICES when it is set.
        return [f"gpu{visible[g] if visible is not None else g}" for g in gpus]
    if workers < 1:
        raise PerflabError(f"--workers must be at least 1, got {workers}")
    if uses_cuda and workers > 1:
        raise PerflabError("--workers runs CPU cases side by side; for CUDA cases give --gpus 0,1,... (one worker per GPU)")
    return [f"w{i}" for i in range(workers)]


def _require_cuda(experiment: Experiment) -> None:
    import torch

    if torch.version.cuda is None:
        why = "this torch build has no CUDA"
    elif gpu_count() == 0:
        why = "no GPU is visible"
    else:
        return
    raise PerflabError(
        f"{experiment.source}: the spec's cases run on CUDA, which is not available here ({why}; torch {torch.__version__}); "
        "run it on a GPU machine or choose the CPU (device: cpu)"
    )


def _parent_visible_devices() -> list[str] | None:
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    return [v.strip() for v in value.split(",") if v.strip()]


def gpu_count() -> int:
    """GPUs on this host, from NVML where it can be read (no CUDA runtime in the parent), else from torch."""
    names, _ = gpu_inventory()
    if names:
        visible = _parent_visible_devices()
        return len(visible) if visible is not None else len(names)
    import torch

    return torch.cuda.device_count()


# ---------------------------------------------------------------------------------------------------
# The environment key


ENV_KEY_FIELDS = ("host", "cpu", "gpus", "driver", "torch", "cuda", "perflab")


def probe_environment(experiment: Experiment | None, physical_gpus: list[str] | None = None, *, uses_cuda: bool | None = None) -> dict:
    """What the parent can learn about where the cases will run, without a CUDA context (NVML, nvidia-smi).

    ``physical_gpus``: the GPU ids the workers will see (``--gpus``); else the first visible GPU.
    ``uses_cuda``: whether GPU names belong in it (default: whether any of the experiment's cases runs on CUDA).
    """
    import torch

    from perflab.version import __version__

    env = {
        "host": socket.gethostname(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "perflab": __version__,
        "gpus": [],
        "driver": None,
        "gpu_name": None,
    }
    if uses_cuda is None:
        uses_cuda = any(c.device == "cuda" for c in experiment.cases)
    if uses_cuda:
        inventory, driver = gpu_inventory()
        if not physical_gpus:
            visible = _parent_visible_devices()
            physical_gpus = visible[:1] if visible else ["0"]
        names = [_gpu_name(inventory, g) for g in physical_gpus]
        env.update(gpus=names, driver=driver, gpu_name=names[0] if names else None)
    return env


def _gpu_name(inventory: list[str], physical_id: str) -> str:
    if physical_id.isdigit() and int(physical_id) < len(inventory):
        return inventory[int(physical_id)]
    return inventory[0] if len(set(inventory)) == 1 else f"GPU {physical_id}"


def environment_key(env: dict) -> str:
    """A hash of ``ENV_KEY_FIELDS``, and of ``version`` where the environment is one version of the code (``perflab ab``
    and ``track``: a commit or an interpreter; ``sweep.versions``), so each version's rows are stored apart."""
    fields = {k: env.get(k) for k in ENV_KEY_FIELDS}
    fields["gpus"] = sorted(set(fields["gpus"] or []))
    if env.get("version"):
        fields["version"] = env["version"]
    return hashlib.sha1(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]


@functools.lru_cache(maxsize=1)
def gpu_inventory() -> tuple[list[str], str | None]:
    """GPU names in PCI order and the driver version, from NVML (or nvidia-smi where pynvml is missing)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            names = [_text(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))) for i in range(pynvml.nvmlDeviceGetCount())]
            return names, _text(pynvml.nvmlSystemGetDriverVersion())
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        pass
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout
        rows = [[part.strip() for part in line.split(",")] for line in out.splitlines() if line.strip()]
        return [r[0] for r in rows], (rows[0][1] if rows and len(rows[0]) > 1 else None)
    except Exception:
        return [], None


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def command_line(argv: list[str] | None = None) -> str:
    return "perflab " + shlex.join(argv if argv is not None else sys.argv[1:])
