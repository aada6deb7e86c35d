"""A program's whole loop at the program floor, watched as it runs; ``analysis/loop.py`` makes its figures.

The whole loop of a program's step, watched without a trace: its waits for input and its synchronising calls.

``LoopWatch`` wraps, for the timed steps only (``active``):

- **Input**: each ``__next__`` of a ``torch.utils.data.DataLoader``'s iterator, and each call of a function the user
  names (``--input QUALNAME``: nanoGPT's ``get_batch``, an iterable's ``MyLoader.__next__``). A wait is stamped at its
  start and its end by the step clock (``clock.StepClock``: a CUDA event on the current stream and the host clock). The
  GPU time between the two events is the part of the wait the GPU spent idle: the start event completes when the
  work queued before the wait is done, the end event when the host comes back, so their interval is the wait that no
  queued work hid (**exposed**); the rest of the host's wait was **hidden** under queued GPU work. On the CPU every
  wait is exposed. The batch returned says how many samples (its first tensor's first dimension) and tokens (an
  integer batch × sequence tensor) the step took.
- **The loader's workers**: each batch a DataLoader worker fetches is timed in the worker (the dataset fetchers are
  wrapped before the workers are forked; a spawned worker wraps them at its start, ``program.children``) and
  appended to a file of its process in ``worker_dir``: the workers' own time per batch.
- **Synchronising calls** on CUDA tensors and streams: ``torch.cuda.synchronize``, ``Stream.synchronize``,
  ``Event.synchronize``, ``Tensor.item``, ``.tolist``, ``.cpu``, a blocking ``.to("cpu")``, and the implicit ones
  ``bool(t)``, ``float(t)`` and ``int(t)`` (``if loss.isnan():``). Each call's host time blocked and its source line
  (the caller, and the innermost frame of the program's own files when the caller is a library's).

Nothing here reads a clock that is not the step clock's or ``time.perf_counter_ns``; what it records is handed to
``analysis.loop`` (torch-free), which splits each step into what fills it. perflab's own work at a step boundary
(reading events, starting the profiler) runs with the watch ``paused``: it is not the program's.
"""

from __future__ import annotations

import contextlib
import os
import struct
import sys
import threading
import time
from pathlib import Path

WORKER_DIR_ENV = "PERFLAB_WORKER_DIR"  # where DataLoader workers append their batches' times (a spawned worker reads it)
_RECORD = struct.Struct("<qq")  # a worker's batch: start and end, perf_counter_ns (CLOCK_MONOTONIC: one clock across processes)
_INHERITED = object()  # a patched attribute the class did not define itself


def _compiling():
    """torch.compiler.is_compiling (False on a torch without it). Every wrapper asks it first, before it reads any state
    of perflab's: dynamo, tracing a compiled function that calls a wrapper, then sees only the original call, and puts
    no guard on perflab's state (a guard would recompile the program's function when the timed steps begin)."""
    import torch

    return getattr(torch.compiler, "is_compiling", lambda: False)


def batch_counts(batch) -> tuple[int | None, int | None]:
    """(samples, tokens) of a batch: its first tensor's first dimension, and for an integer tensor of two dimensions
    (token ids, batch × sequence) its elements; (None, None) where no tensor is found."""
    tensor = _first_tensor(batch, 0)
    if tensor is None or tensor.dim() == 0:
        return None, None
    tokens = int(tensor.numel()) if tensor.dim() == 2 and not tensor.is_floating_point() and not tensor.is_complex() else None
    return int(tensor.shape[0]), tokens


def _first_tensor(obj, depth: int):
    import torch

    if isinstance(obj, torch.Tensor):
        return obj
    if depth > 3:
        return None
    if isinstance(obj, dict):
        values = [obj[k] for k in ("input_ids", "pixel_values") if k in obj] + list(obj.values())
    elif isinstance(obj, (list, tuple)):
        values = list(obj)
    else:
        values = [getattr(obj, k) for k in ("input_ids", "pixel_values") if hasattr(obj, k)]
    for value in values[:8]:
        found = _first_tensor(value, depth + 1)
        if found is not None:
            return found
    return None


def loader_settings(iterator) -> dict:
    """A DataLoader's settings, from its iterator: what the input fix changes."""
    loader_batch = getattr(getattr(iterator, "_index_sampler", None), "batch_size", None)
    return {"num_workers": int(getattr(iterator, "_num_workers", 0) or 0), "pin_memory": bool(getattr(iterator, "_pin_memory", False)),
            "prefetch_factor": getattr(iterator, "_prefetch_factor", None), "persistent_workers": bool(getattr(iterator, "_persistent_workers", False)),
            "batch_size": loader_batch, "dataset": type(getattr(iterator, "_dataset", None)).__name__}


class LoopWatch:
    """Input waits and synchronising calls, recorded while ``active``. ``clock()`` gives the step clock in use (None
    before the first timed step); ``own_file(path)`` says whether a source file is the program's."""

    def __init__(self, clock=None, own_file=None, input_names: tuple[str, ...] = (), worker_dir: Path | None = None):
        self.clock = clock or (lambda: None)
        self.own_file = own_file or (lambda path: False)
        self.input_names = tuple(input_names)
        self.worker_dir = Path(worker_dir) if worker_dir else None
        self.active = False
        self.waits: list[tuple] = []  # (start stamp, end stamp, samples, tokens, source)
        self.syncs: list[tuple] = []  # (call, site, start_ns, end_ns)
        self.loaders: dict[int, dict] = {}  # the DataLoaders waited on while active, by iterator
        self.inputs_found: dict[str, str] = {}  # --input names: where each was found, or why not
        self._saved: list[tuple] = []  # (owner, attribute, original) to put back
        self._local = threading.local()
        self._paused = 0
        self._sites: dict = {}  # (code, line) of a synchronising call's caller → its site

    # --- installation ---------------------------------------------------------------------------------

    def install(self) -> None:
        import torch
        import torch.utils.data.dataloader as dataloader

        self._wrap_input(dataloader._BaseDataLoaderIter, "__next__", "DataLoader", loader=True)
        self._wrap_fetchers()
        for owner, name, check in self._sync_points(torch):
            self._wrap_sync(owner, name, check)

    def remove(self) -> None:
        self.active = False
        for owner, name, original in reversed(self._saved):
            if original is _INHERITED:  # it was the base class's: the base's comes back
                delattr(owner, name)
            else:
                setattr(owner, name, original)
        self._saved = []

    def _patch(self, owner, name: str, wrapper) -> None:
        own = getattr(owner, "__dict__", {})
        self._saved.append((owner, name, own[name] if name in own else _INHERITED))
        wrapper.__wrapped__ = getattr(owner, name)
        setattr(owner, name, wrapper)

    @contextlib.contextmanager
    def paused(self):
        """perflab's own work (reading events, the profiler): not the program's waits."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def _recording(self) -> bool:
        return self.active and not self._paused and not getattr(self._local, "depth", 0)

    # --- input ------------------------------------------------------------------------------------------

    def _wrap_input(self, owner, name: str, source: str, loader: bool = False) -> None:
        original = getattr(owner, name)
        watch = self
        compiling = _compiling()

        def timed_next(*args, **kwargs):
            if compiling() or not watch._recording():
                return original(*args, **kwargs)
            clock = watch.clock()
            if clock is None:
                return original(*args, **kwargs)
            local = watch._local
            local.depth = getattr(local, "depth", 0) + 1  # a loader calling a named input inside it is one wait
            try:
                start = clock.stamp()
                batch = original(*args, **kwargs)
                end = clock.stamp()
            finally:
                local.depth -= 1
            samples, tokens = batch_counts(batch)
            watch.waits.append((start, end, samples, tokens, source))
            if loader and args and id(args[0]) not in watch.loaders:
                watch.loaders[id(args[0])] = loader_settings(args[0])
            return batch

        self._patch(owner, name, timed_next)

    def find_inputs(self, main_module) -> None:
        """Wrap the functions ``--input`` names, found in the program's ``__main__`` (QUALNAME) or in the loaded module
        of that file (FILE:QUALNAME). Called once the program has defined them (its first step)."""
        for spec in self.input_names:
            if spec in self.inputs_found:
                continue
            file, _, qualname = spec.rpartition(":")
            modules = [main_module] if not file else [m for m in list(sys.modules.values())
                                                      if getattr(m, "__file__", None) and Path(m.__file__).name == Path(file).name]
            found = None
            for module in modules:
                owner, parts = module, qualname.split(".")
                for part in parts[:-1]:
                    owner = getattr(owner, part, None)
                    if owner is None:
                        break
                if owner is not None and callable(getattr(owner, parts[-1], None)):
                    found = (owner, parts[-1], module)
                    break
            if found is None:
                self.inputs_found[spec] = "not found: no such function in the program when its first step began"
                continue
            owner, name, module = found
            self._wrap_input(owner, name, spec)
            self.inputs_found[spec] = f"found in {getattr(module, '__file__', None) or module.__name__}"

    def _wrap_fetchers(self) -> None:
        """Each batch a DataLoader worker fetches, timed in the worker and appended to its file in ``worker_dir``."""
        if self.worker_dir is None:
            return
        from torch.utils.data._utils import fetch

        os.environ[WORKER_DIR_ENV] = str(self.worker_dir)
        for cls in (fetch._MapDatasetFetcher, fetch._IterableDatasetFetcher):
            wrap_fetcher(cls, self._patch)

    # --- synchronising calls --------------------------------------------------------------------------------

    @staticmethod
    def _sync_points(torch) -> list[tuple]:
        def cuda_tensor(args, kwargs) -> bool:
            return bool(args) and isinstance(args[0], torch.Tensor) and synchronises(args[0])

        def to_host(args, kwargs) -> bool:
            if not cuda_tensor(args, kwargs) or kwargs.get("non_blocking") or (len(args) > 2 and args[2] is True):
                return False
            target = kwargs.get("device", args[1] if len(args) > 1 else None)
            if isinstance(target, torch.Tensor):
                target = target.device
            return (isinstance(target, str) and target.startswith("cpu")) or (isinstance(target, torch.device) and target.type == "cpu")

        def always(args, kwargs) -> bool:
            return True

        points = [(torch.cuda, "synchronize", always), (torch.cuda.Stream, "synchronize", always), (torch.cuda.Event, "synchronize", always)]
        points += [(torch.Tensor, name, cuda_tensor) for name in ("item", "tolist", "cpu", "__bool__", "__float__", "__int__")]
        points.append((torch.Tensor, "to", to_host))
        return points

    def _wrap_sync(self, owner, name: str, check) -> None:
        original = getattr(owner, name)
        watch = self
        compiling = _compiling()
        call = f"{owner.__name__}.{name}" if owner.__name__ not in ("cuda",) else f"torch.cuda.{name}"
        call = {"Tensor.__bool__": "bool(tensor)", "Tensor.__float__": "float(tensor)", "Tensor.__int__": "int(tensor)"}.get(call, call)

        def synchronising(*args, **kwargs):
            if compiling() or not watch._recording() or not check(args, kwargs):
                return original(*args, **kwargs)
            local = watch._local
            local.depth = getattr(local, "depth", 0) + 1  # print(t) calls tolist and item inside: one call
            start = time.perf_counter_ns()
            try:
                return original(*args, **kwargs)
            finally:
                end = time.perf_counter_ns()
                local.depth -= 1
                watch.syncs.append((call, watch._site(sys._getframe(1)), start, end))

        self._patch(owner, name, synchronising)

    def _site(self, frame) -> str:
        """``file:line (function)`` of the caller; where that is a library's, `` via `` the innermost frame of the
        program's own files too. Kept per calling line: the walk up the stack is paid once a line, not once a call
        (a library's line called from several of the program's is named by the first)."""
        key = (frame.f_code, frame.f_lineno)
        site = self._sites.get(key)
        if site is None:
            site = self._sites[key] = self._find_site(frame)
        return site

    def _find_site(self, frame) -> str:
        caller = f"{_short(frame.f_code.co_filename)}:{frame.f_lineno} ({frame.f_code.co_name})"
        if self.own_file(frame.f_code.co_filename):
            return caller
        outer, depth = frame.f_back, 0
        while outer is not None and depth < 40:
            if self.own_file(outer.f_code.co_filename):
                return f"{caller} via {_short(outer.f_code.co_filename)}:{outer.f_lineno} ({outer.f_code.co_name})"
            outer, depth = outer.f_back, depth + 1
        return caller

    # --- what was recorded ------------------------------------------------------------------------------

    def take(self) -> dict:
        """The waits and syncs recorded so far, read (the wait events' GPU interval: one synchronisation, after the
        steps) into plain columns for ``analysis.loop``; the records are cleared."""
        clock = self.clock()
        waits = {"start_ns": [], "end_ns": [], "exposed_ms": [], "samples": [], "tokens": [], "source": []}
        for start, end, samples, tokens, source in self.waits:
            gpu_ms, host_ms = clock.read(start, end) if clock is not None else ((end[1] - start[1]) / 1e6,) * 2
            waits["start_ns"].append(start[1])
            waits["end_ns"].append(end[1])
            # an event pair's interval: the GPU's idle part of the wait; on the CPU the whole wait (host clock twice)
            waits["exposed_ms"].append(min(float(gpu_ms), float(host_ms)))
            waits["samples"].append(samples)
            waits["tokens"].append(tokens)
            waits["source"].append(source)
        sites: list[str] = []
        syncs = {"call": [], "site": [], "start_ns": [], "end_ns": []}
        for call, site, start, end in self.syncs:
            if site not in sites:
                sites.append(site)
            syncs["call"].append(call)
            syncs["site"].append(sites.index(site))
            syncs["start_ns"].append(start)
            syncs["end_ns"].append(end)
        self.waits, self.syncs = [], []
        return {"waits": waits, "syncs": dict(syncs, sites=sites), "loaders": list(self.loaders.values()),
                "inputs": dict(self.inputs_found) or None}


def synchronises(tensor) -> bool:
    """Does reading this tensor on the host wait for the GPU? A CUDA tensor's does; a CPU tensor's .item() waits on
    nothing (an optimizer's step counters are CPU tensors read every step)."""
    return tensor.is_cuda


def _short(path: str) -> str:
    """A source file's path as a reader knows it: from its package (site-packages/transformers/trainer.py →
    transformers/trainer.py), else as given."""
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


# --- DataLoader workers ----------------------------------------------------------------------------------------------


def wrap_fetcher(cls, patch) -> None:
    """``cls.fetch`` timed in DataLoader workers: each batch's (start, end) appended to the worker's own file in the
    directory ``PERFLAB_WORKER_DIR`` names (``WORKER_DIR_ENV``). In the main process (``num_workers=0``) nothing is
    written: the main process's fetches are its input waits. ``patch(owner, name, wrapper)`` installs it."""
    original = cls.fetch

    def fetch(self, possibly_batched_index):
        from torch.utils.data import get_worker_info

        if get_worker_info() is None:
            return original(self, possibly_batched_index)
        start = time.perf_counter_ns()
        try:
            return original(self, possibly_batched_index)
        finally:
            _append_worker_batch(start, time.perf_counter_ns())

    fetch._perflab = True
    patch(cls, "fetch", fetch)


_worker_file: dict = {}  # this process's file: {"pid": pid, "fd": fd}


def _append_worker_batch(start: int, end: int) -> None:
    folder = os.environ.get(WORKER_DIR_ENV)
    if not folder:
        return
    pid = os.getpid()
    if _worker_file.get("pid") != pid:  # a forked worker inherits its parent's dict: a file of its own
        try:
            _worker_file.update(pid=pid, fd=os.open(os.path.join(folder, f"worker-{pid}.bin"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644))
        except OSError:
            _worker_file.update(pid=pid, fd=None)
    fd = _worker_file.get("fd")
    if fd is not None:
        try:
            os.write(fd, _RECORD.pack(start, end))
        except OSError:
            pass


def read_worker_batches(folder: Path, start_ns: int, end_ns: int) -> dict:
    """The batches DataLoader workers fetched that began inside [start_ns, end_ns]: each one's ms and its worker's pid."""
    out = {"ms": [], "pid": []}
    folder = Path(folder)
    if not folder.is_dir():
        return out
    for path in sorted(folder.glob("worker-*.bin")):
        try:
            data = path.read_bytes()
            pid = int(path.stem.split("-", 1)[1])
        except (OSError, ValueError):
            continue
        for offset in range(0, len(data) - len(data) % _RECORD.size, _RECORD.size):
            start, end = _RECORD.unpack_from(data, offset)
            if start_ns <= start <= end_ns:
                out["ms"].append((end - start) / 1e6)
                out["pid"].append(pid)
    return out
