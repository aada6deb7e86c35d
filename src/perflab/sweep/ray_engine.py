"""The Ray engine: a sweep's cases as Ray tasks over the GPUs (or CPUs) of many hosts.

Each case is one Ray task that asks for one GPU (``num_gpus=1``; CPU cases ask for one CPU). On the node
Ray picks, the task runs the same worker subprocess as the local engine (``run_case_in_subprocess``: its
own process group, killed at the time limit) and returns the row, the node's environment and the log.
The driver, this process, is the store's only writer: it decides what to run (resume, --retry-failed),
stores each row under the environment key of the node and GPU that produced it, and writes the logs.

Faults: the worker's own failures are rows, as locally. A node lost mid-case (``NodeDiedError``, or a
Ray worker whose node is gone) reruns the case elsewhere, up to ``node_retries`` times, then stores an
``error`` row naming the node. A killed driver takes its tasks with it (Ray ends a job's tasks when its
driver dies, and each worker subprocess dies with its parent); ``--resume`` runs what is missing.

Placement: a case pinned to a GPU type (``gpu: H100``), or run on every type (``across_gpus: true``),
asks for Ray's ``accelerator_type`` of the nodes whose GPU matches. A unit (a case, and the GPU type it
must run on, if any) is stored once: it counts as done when a row for its case is stored under the key
of a node environment that fits it.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from perflab.errors import PerflabError, first_line
from perflab.spec import Case
from perflab.sweep import runner
from perflab.sweep.lifecycle import SweepSession, SweepSummary
from perflab.sweep.spec import Experiment
from perflab.sweep.store import FAILED_STATUSES

RAY_MISSING = "--engine ray needs Ray: pip install 'perflab[ray]'"
NODE_RETRIES = 2  # reruns of a case whose node was lost, before it is stored as an error
LOG_LIMIT = 200_000  # characters of a case's log sent back to the driver
WAIT_S = 0.2


@dataclass(frozen=True)
class Unit:
    """One thing to run and store once: a case, on any node (gpu None) or on one GPU type."""

    case: Case
    gpu: str | None = None
    accelerator_type: str | None = None  # Ray's name for the GPU type, which the task asks for

    @property
    def log_name(self) -> str:
        return f"{self.case.id}.log" if self.gpu is None else f"{self.case.id}@{re.sub(r'[^A-Za-z0-9_.-]+', '_', self.gpu)}.log"

    def label(self) -> str:
        return self.case.label() + (f" on {self.gpu}" if self.gpu else "")


@dataclass
class Node:
    """A live Ray node and the environments its cases would be stored under (one per GPU type)."""

    node_id: str
    host: str
    accelerator_types: list[str]  # Ray's accelerator_type resources on the node
    envs: list[dict]  # probe_environment per GPU type (one, without GPUs, for CPU sweeps)

    @property
    def label(self) -> str:
        return f"{self.host}:{self.node_id[:6]}"


# What a spec's directory leaves behind when it travels to the nodes: results, traces, environments, VCS data.
MODEL_DIR_EXCLUDES = (".git", ".venv", "venv", "__pycache__", "runs", "perflab-traces", "*.sqlite", "*.sqlite-*", "*.json.gz",
                      "*.pickle", "*.whl", "*.pt", "*.safetensors", "*.bin")
MODEL_DIR_LIMIT = 100 * 2**20  # bytes of a zipped spec directory


def zip_directory(root) -> bytes:
    """The spec's directory as zip bytes (MODEL_DIR_EXCLUDES left out); PerflabError past MODEL_DIR_LIMIT."""
    import fnmatch
    import io
    import zipfile

    root = Path(root)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for folder, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if not any(fnmatch.fnmatch(d, p) for p in MODEL_DIR_EXCLUDES)]
            for name in files:
                if not any(fnmatch.fnmatch(name, p) for p in MODEL_DIR_EXCLUDES):
                    path = Path(folder) / name
                    archive.write(path, path.relative_to(root))
            if buffer.tell() > MODEL_DIR_LIMIT:
                raise PerflabError(f"{root}: the spec's directory is over {MODEL_DIR_LIMIT >> 20} MiB zipped; a spec that names its own "
                                   "model file travels to the Ray nodes with its directory: keep the spec and model code in a small folder")
    return buffer.getvalue()


def unzip_directory(data: bytes, target: Path) -> None:
    import io
    import zipfile

    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        archive.extractall(target)


def check_engine_options(engine: str, gpus, workers: int) -> None:
    """The Ray engine places cases itself: --gpus and --workers belong to the local engine."""
    if engine != "ray":
        raise PerflabError("--address joins a Ray cluster; give --engine ray with it")
    if gpus or workers != 1:
        raise PerflabError(f"{'--gpus' if gpus else '--workers'} is for --engine local; with --engine ray each case asks Ray for a GPU (or a CPU)")


def import_ray():
    try:
        import ray
    except ImportError:
        raise PerflabError(RAY_MISSING) from None
    return ray


def run_sweep_ray(
    experiment: Experiment,
    out_dir,
    *,
    address: str | None = None,
    resume: bool = False,
    retry_failed: bool = False,
    timeout_s: float | None = None,
    command: str = "",
    on_event=None,
    node_retries: int = NODE_RETRIES,
) -> SweepSummary:
    """Run ``experiment``'s missing cases as Ray tasks; see the module docstring. Returns a SweepSummary."""
    out_dir = Path(out_dir)
    timeout_s = runner.case_timeout(experiment, timeout_s)
    uses_cuda = any(c.device == "cuda" for c in experiment.cases)
    ray = import_ray()
    owned = _connect(ray, address, uses_cuda)
    try:
        nodes = probe_nodes(ray, uses_cuda)
        units = plan_units(experiment, nodes)
        keys = ",".join(_env_keys(nodes))
        summary = SweepSummary(out_dir, keys, total=len(units), skipped=0)
        with SweepSession(out_dir, summary, on_event=on_event) as session:
            runner.refuse_stored_unless_resuming(session.store, out_dir, resume)
            stored = session.store.statuses_by_env()
            todo = [u for u in units if not _done(u, nodes, stored, retry_failed)]
            summary.skipped = summary.total - len(todo)
            session.begin([(runner.environment_key(env), env) for node in nodes for env in node.envs], experiment=experiment,
                          record=experiment.to_json(), env_key=keys, n_cases=summary.total, n_skipped=summary.skipped, command=command,
                          start=dict(total=summary.total, skipped=summary.skipped, to_run=len(todo), env_key=keys,
                                     slots=[n.label for n in nodes]))
            session.drive(lambda: _Driver(ray, out_dir, session, nodes, timeout_s, uses_cuda, retry_failed, node_retries, stored,
                                          runner.worker_args(experiment, out_dir)).run(todo))
    finally:
        if owned:
            ray.shutdown()
    return summary


def _connect(ray, address: str | None, uses_cuda: bool) -> bool:
    """Join ``address``, or start a local Ray instance on this machine's GPUs; True if we started it."""
    if ray.is_initialized():
        return False  # a caller (a test, a notebook) already connected this process
    try:
        if address:
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
        else:
            # address="local": a new instance, never the last cluster `ray start` left in /tmp/ray.
            ray.init(address="local", num_gpus=runner.gpu_count() if uses_cuda else None, include_dashboard=False,
                     logging_level=logging.WARNING, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        where = f"--address {address}" if address else "a local Ray instance"
        raise PerflabError(f"{where}: Ray could not start or connect ({_first_line(exc)})") from None
    return True


# ---------------------------------------------------------------------------------------------------
# Nodes and units


def probe_nodes(ray, uses_cuda: bool) -> list[Node]:
    """Every live node that can run the sweep's cases (with GPUs, for a CUDA sweep), probed on the node."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    live = [n for n in ray.nodes() if n.get("Alive")]
    if uses_cuda:
        live = [n for n in live if n.get("Resources", {}).get("GPU", 0) >= 1]
        if not live:
            raise PerflabError("the spec's cases run on CUDA, and no node of this Ray cluster has a GPU")
    probe = ray.remote(_probe_node)
    refs = [probe.options(num_cpus=0, max_retries=0,
                          scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(uses_cuda)
            for n in live]
    out = []
    for n, ref in zip(live, refs):
        try:
            host, envs = ray.get(ref)
        except (ray.exceptions.TaskUnschedulableError, ray.exceptions.NodeDiedError):
            continue  # a node lost just now, not yet marked dead: it gets no cases
        types = sorted(k.split(":", 1)[1] for k in n.get("Resources", {}) if k.startswith("accelerator_type:"))
        out.append(Node(n["NodeID"], host, types, envs))
    if not out:
        raise PerflabError("no live node of this Ray cluster answered")
    return out


def _probe_node(uses_cuda: bool) -> tuple[str, list[dict]]:
    """On a node: its host name and one environment per GPU type it holds (or one without GPUs)."""
    if not uses_cuda:
        return socket.gethostname(), [runner.probe_environment(None, uses_cuda=False)]
    names, _ = runner.gpu_inventory()
    first_of_each = {}
    for index, name in enumerate(names):
        first_of_each.setdefault(name, str(index))
    envs = [runner.probe_environment(None, [i], uses_cuda=True) for i in first_of_each.values()] or [runner.probe_environment(None, uses_cuda=True)]
    return socket.gethostname(), envs


def gpu_matches(name: str | None, wanted: str) -> bool:
    """Whether a GPU name ("NVIDIA H100 80GB HBM3") or Ray accelerator type ("H100") is of type ``wanted``."""
    def words(text):
        return [w for w in re.split(r"[\s_-]+", text.upper()) if w and w not in ("NVIDIA", "GEFORCE", "TESLA")]

    have, want = words(name or ""), words(wanted)
    return bool(want) and any(have[i:i + len(want)] == want for i in range(len(have)))


def _node_fits(node: Node, gpu: str) -> bool:
    return any(gpu_matches(t, gpu) for t in node.accelerator_types) or any(gpu_matches(e.get("gpu_name"), gpu) for e in node.envs)


def plan_units(experiment: Experiment, nodes: list[Node]) -> list[Unit]:
    """The units to run: each case anywhere, or on each GPU type it is pinned to (or each one present)."""
    present = sorted({t for n in nodes for t in n.accelerator_types})
    units = []
    for case in experiment.cases:
        gpus = experiment.pins(case) or (present if experiment.across_gpus and case.device == "cuda" else [])
        if experiment.across_gpus and case.device == "cuda" and not gpus:
            raise PerflabError("across_gpus: no node of this Ray cluster reports a GPU type (Ray's accelerator_type resource); "
                               "give each node one, e.g. ray start --resources='{\"accelerator_type:H100\": 1}'")
        if not gpus:
            units.append(Unit(case))
        for gpu in gpus:
            units.append(Unit(case, gpu, _accelerator_type(gpu, nodes, present)))
    return units


def _accelerator_type(gpu: str, nodes: list[Node], present: list[str]) -> str:
    fitting = [n for n in nodes if _node_fits(n, gpu)]
    types = sorted({t for n in fitting for t in n.accelerator_types})
    if not fitting:
        raise PerflabError(f"gpu: {gpu}: no node of this Ray cluster has that GPU type (present: {', '.join(present) or 'none reported'})")
    if len(types) != 1:
        why = "reports no accelerator_type" if not types else f"matches several ({', '.join(types)}); name one"
        raise PerflabError(f"gpu: {gpu}: Ray cannot place it: the matching nodes' GPU type {why}")
    return types[0]


def _env_keys(nodes: list[Node]) -> list[str]:
    return list(dict.fromkeys(runner.environment_key(e) for n in nodes for e in n.envs))


def _unit_keys(unit: Unit, nodes: list[Node]) -> set[str]:
    """The environment keys a row of this unit may be stored under: those of the nodes (and GPU) it fits."""
    if unit.gpu is None:
        return set(_env_keys(nodes))
    return {runner.environment_key(e) for n in nodes for e in n.envs
            if gpu_matches(e.get("gpu_name"), unit.gpu) or (len(n.envs) == 1 and _node_fits(n, unit.gpu))}


def _done(unit: Unit, nodes: list[Node], stored: dict, retry_failed: bool) -> bool:
    for key in _unit_keys(unit, nodes):
        status = stored.get((unit.case.id, key))
        if status is not None and not (retry_failed and status in FAILED_STATUSES):
            return True
    return False


# ---------------------------------------------------------------------------------------------------
# The task (runs on a node)


def run_unit(case_dict: dict, uses_cuda: bool, timeout_s: float, attempt: str, tracker, worker_args=(), model_dir: bytes | None = None) -> dict:
    """On the node Ray chose: say where we are, run the case's worker subprocess, return row, env and log."""
    import ray

    node_id = ray.get_runtime_context().get_node_id()
    host = socket.gethostname()
    tracker.started.remote(attempt, node_id, host)
    gpu_ids = [str(g) for g in ray.get_gpu_ids()]
    case = Case.from_dict(case_dict)
    worker_args = list(worker_args)
    env = runner.probe_environment(None, gpu_ids[:1] or None, uses_cuda=uses_cuda)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="perflab-case-") as work:
        if model_dir is not None and "--model-root" in worker_args:  # the driver's path may not exist on this node
            root = Path(work) / "model_root"
            unzip_directory(model_dir, root)
            worker_args[worker_args.index("--model-root") + 1] = str(root)
        # gpu<id>: the worker sees only Ray's GPU, numbered in PCI order as NVML names it.
        row, log_path = runner.run_case_in_subprocess(case, Path(work), timeout_s, env, slot=f"gpu{gpu_ids[0]}" if gpu_ids else "ray",
                                                      extra_args=worker_args)
        log = log_path.read_text(errors="replace")[-LOG_LIMIT:]
    return {"row": row, "env": env, "env_key": runner.environment_key(env), "node_id": node_id, "host": host,
            "wall_s": time.monotonic() - started, "log": log}


class _Tracker:
    """A small actor on the driver's node: tasks report where they started, for progress and lost nodes."""

    def __init__(self):
        self.events = []

    def started(self, attempt: str, node_id: str, host: str) -> None:
        self.events.append((attempt, node_id, host))

    def drain(self) -> list:
        events, self.events = self.events, []
        return events


@dataclass
class _Attempt:
    unit: Unit
    attempt: str  # "<case id>[@gpu]#<n>"
    reruns: int
    submitted: float
    node: tuple[str, str] | None = None  # (node id, host) once started


class _Driver:
    """Submits the units, stores each result as it comes, reruns units whose node was lost."""

    def __init__(self, ray, out_dir, session: SweepSession, nodes, timeout_s, uses_cuda, replace, node_retries, stored, worker_args=()):
        self.ray, self.out_dir, self.session, self.store, self.summary = ray, out_dir, session, session.store, session.summary
        self.nodes, self.timeout_s, self.uses_cuda, self.replace = nodes, timeout_s, uses_cuda, replace
        self.node_retries, self.emit, self.stored = node_retries, session.emit, stored
        self.worker_args = list(worker_args)  # the spec's profile (and ncu) pass: the same on every node
        # The spec's directory when a case names a user's model (--model-root in the worker arguments).
        self.model_root = self.worker_args[self.worker_args.index("--model-root") + 1] if "--model-root" in self.worker_args else None
        # ...which travels with every task through the object store (zipped once), so a node without this checkout
        # can import the user's model.
        self.model_dir = ray.put(zip_directory(self.model_root)) if self.model_root else None
        self.in_flight: dict = {}  # ObjectRef → _Attempt
        self.by_attempt: dict[str, _Attempt] = {}

    def run(self, todo: list[Unit]) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        (self.out_dir / "logs").mkdir(exist_ok=True)
        here = self.ray.get_runtime_context().get_node_id()
        self.tracker = self.ray.remote(_Tracker).options(
            num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False)).remote()
        self.task = self.ray.remote(run_unit)
        try:
            for unit in todo:
                self._submit(unit, 0)
            while self.in_flight:
                ready, _ = self.ray.wait(list(self.in_flight), num_returns=1, timeout=WAIT_S)
                self._note_starts()
                for ref in ready:
                    attempt = self.in_flight.pop(ref)
                    self._finish(ref, attempt)
                    self._forget(attempt)
        finally:
            for ref in self.in_flight:  # interrupted: stop the tasks (their workers die with them); --resume reruns them
                self.ray.cancel(ref, force=True)

    def _submit(self, unit: Unit, reruns: int) -> None:
        # max_retries=0: the driver reruns a lost node's case itself, to count it and name the node.
        options = {"max_retries": 0, **({"num_gpus": 1} if unit.case.device == "cuda" else {"num_cpus": 1})}
        if unit.accelerator_type:
            options["accelerator_type"] = unit.accelerator_type
        attempt = _Attempt(unit, f"{unit.case.id}{'@' + unit.gpu if unit.gpu else ''}#{reruns}", reruns, time.monotonic())
        ref = self.task.options(**options).remote(unit.case.to_dict(), self.uses_cuda, self.timeout_s, attempt.attempt, self.tracker,
                                                    self.worker_args, self.model_dir)
        self.in_flight[ref] = attempt
        self.by_attempt[attempt.attempt] = attempt

    def _note_starts(self) -> None:
        for attempt_id, node_id, host in self.ray.get(self.tracker.drain.remote()):
            attempt = self.by_attempt.get(attempt_id)
            if attempt is not None:
                attempt.node = (node_id, host)
                self.emit("case_start", case=attempt.unit.case, slot=f"{host}:{node_id[:6]}")

    def _finish(self, ref, attempt: _Attempt) -> None:
        ray = self.ray
        unit = attempt.unit
        try:
            result = ray.get(ref)
        except ray.exceptions.RayTaskError as exc:  # our task raised: a row, not a crash of the sweep
            result = self._failed(attempt, "error", f"the Ray task failed: {_first_line(exc.cause if exc.cause else exc)}")
        except ray.exceptions.RayError as exc:
            self._note_starts()
            node_id, host = attempt.node or (_node_in_message(exc), "?")
            if isinstance(exc, ray.exceptions.NodeDiedError) or not _alive(ray, node_id):
                if attempt.reruns < self.node_retries:
                    self.summary.reruns += 1
                    self._submit(unit, attempt.reruns + 1)
                    return
                result = self._failed(attempt, "error", f"node {(node_id or '?')[:12]} ({host}) was lost while running the case; "
                                      f"gave up after {attempt.reruns} rerun(s)", node_id)
            else:
                result = self._failed(attempt, "error", f"the Ray worker running the case died ({type(exc).__name__}: {_first_line(exc)})", node_id)
        self._store(attempt, result)

    def _forget(self, attempt: _Attempt) -> None:
        self.by_attempt.pop(attempt.attempt, None)

    def _failed(self, attempt: _Attempt, status: str, message: str, node_id: str | None = None) -> dict:
        """A row for a case that left no row: under the environment of its node (else the first fitting one)."""
        node_id = node_id or (attempt.node[0] if attempt.node else None)
        node = next((n for n in self.nodes if n.node_id == node_id), None)
        keys = _unit_keys(attempt.unit, self.nodes)
        candidates = [e for n in ([node] if node else self.nodes) for e in n.envs if runner.environment_key(e) in keys]
        env = candidates[0] if candidates else self.nodes[0].envs[0]
        row = runner.parent_row(attempt.unit.case, status, message, env)
        return {"row": row, "env": env, "env_key": runner.environment_key(env), "node_id": node_id,
                "host": node.host if node else (attempt.node[1] if attempt.node else None), "wall_s": None, "log": None}

    def _store(self, attempt: _Attempt, result: dict) -> None:
        unit, row, key = attempt.unit, result["row"], result["env_key"]
        row.update(node_id=result["node_id"], node_host=result["host"], gpu_name=result["env"].get("gpu_name"),
                   reruns=attempt.reruns)
        if unit.gpu:
            row["gpu_type"] = unit.gpu
        self.store.put_environment(key, result["env"])  # a node that joined after the probe
        self.session.case_done(unit.case, row, key, slot=f"{result['host']}:{(result['node_id'] or '?')[:6]}", wall_s=result["wall_s"],
                               replace=self.replace)
        if self.replace:  # --retry-failed: the rerun's row replaces the failed one, wherever that was stored
            for other in _unit_keys(unit, self.nodes) - {key}:
                if self.stored.get((unit.case.id, other)) in FAILED_STATUSES:
                    self.store.delete(unit.case.id, other)
        if result["log"] is not None:
            (self.out_dir / "logs" / unit.log_name).write_text(result["log"])


def _alive(ray, node_id: str | None) -> bool:
    return any(n["NodeID"] == node_id and n.get("Alive") for n in ray.nodes())


def _node_in_message(exc) -> str | None:
    match = re.search(r"node ID: ([0-9a-f]{16,})", str(exc))
    return match.group(1) if match else None


def _first_line(exc) -> str:
    return first_line(exc)[:300] or type(exc).__name__
