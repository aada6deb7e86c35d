"""A step's memory, measured in a pass of its own (never inside the timed loop).

The peak: on a GPU the CUDA caching allocator's statistics give it, the most allocated during a few steps above what
was allocated before the case was built (a process may hold other cases' memory: a reduce-overhead case's CUDA-graph
pool lives as long as dynamo's cache; earlier cases' garbage is collected first). On the CPU there are no such
statistics, so :class:`LiveTensorBytes` counts them: a dispatch mode that sees every tensor an op creates and adds its
storage's bytes until the storage is freed, so the count at each op is the bytes of tensors alive then (created inside
the pass; what was alive before it, the parameters, the optimizer's state and the inputs, is added from the built
case).

``activation_bytes``, what the model's forward leaves alive for the backward (the live bytes when its forward returns,
less those when it began), is counted by :class:`LiveTensorBytes` on every device. The allocator's
``memory_allocated`` between the same two points also moves with what the previous step left and frees meanwhile
(an H100 run read a checkpointed block of perflab's GPT at 6,045,696 to 6,537,216 bytes by it, where each block's own
marks and the live tensors read its 6,291,456: its fp32 input and its weights' bf16 casts).

``step_memory(case)`` is what ``benchmarks/checkpoint_cost.py`` and the tests use to compare activation checkpointing
against the plain step on any device.
"""

from __future__ import annotations

import gc
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveTensorBytes(TorchDispatchMode):
    """Bytes of the tensors created inside the mode and still alive: ``current`` and the ``peak`` over the ops.

    Each storage counts once, from the op that created it until it is freed (a weakref finalizer on the storage); a
    view or an in-place op's output, which shares an input's storage, is no new memory. Tensors created before the
    mode (parameters, optimizer state, inputs) are not counted."""

    def __init__(self):
        super().__init__()
        self._bytes: dict[int, int] = {}
        self.current = 0
        self.peak = 0

    def _track(self, t) -> None:
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            return
        storage = t.untyped_storage()
        key, size = storage.data_ptr(), storage.nbytes()
        if size == 0 or key in self._bytes:
            return
        self._bytes[key] = size
        self.current += size
        self.peak = max(self.peak, self.current)
        weakref.finalize(storage, self._free, key)

    def _free(self, key: int) -> None:
        self.current -= self._bytes.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # a view or an in-place op returns storage its inputs already had: not new memory (and, for a parameter's view,
        # memory the mode never saw created)
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor) and t.device.type != "meta"}
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta" and t.untyped_storage().data_ptr() not in inputs:
                self._track(t)
        return out


def _tensor_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            storage = t.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
    return total


def held_bytes(built) -> int:
    """What a built case holds between steps: parameters, buffers, the optimizer's state and the inputs."""
    tensors = list(built.model.parameters()) + list(built.model.buffers())
    if built.optimizer is not None and hasattr(built.optimizer, "state"):
        for state in built.optimizer.state.values():
            tensors += [v for v in state.values() if isinstance(v, torch.Tensor)]
    tensors += [v for v in built.extra.values() if isinstance(v, torch.Tensor)]
    return _tensor_bytes(tensors)


def step_memory(case, steps: int = 2) -> dict:
    """Build ``case``, run one step (the optimizer's state is created), then ``steps`` more under the measurement.
    Returns bytes: ``peak`` (the most alive at once, the case's held memory included), ``held`` (between steps:
    parameters, buffers, optimizer state, inputs), ``activation_bytes`` (left alive by the model's forward, the largest
    over the steps, counted by live tensors) and ``how`` (how the peak was read: ``cuda-allocator`` or ``live-tensors``). Eager only: a compiled step's memory is the
    harness's to read (its row's ``peak_mem_alloc_mb``)."""
    from perflab.runtime.device import synchronize
    from perflab.runtime.workload import build, step_context

    if case.mode != "eager":
        from perflab.errors import PerflabError

        raise PerflabError(f"step_memory measures eager steps; {case.mode} is measured by the harness (peak_mem_alloc_mb)")
    cuda = case.device == "cuda"
    gc.collect()  # an earlier case's cycles, freed now and not in the middle of this one's peak
    if cuda:
        torch.cuda.synchronize()
        before_build = torch.cuda.memory_allocated()
    built = build(case)
    with step_context(case, built):
        step = built.make_step(built.model)
        step()
        synchronize(case.device)
        held = held_bytes(built)
        marks: list[int] = []
        tracker = LiveTensorBytes()
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        pre = built.model.register_forward_pre_hook(lambda *_: marks.append(-tracker.current))
        post = built.model.register_forward_hook(lambda *_: marks.append(tracker.current))
        try:
            with tracker:
                for _ in range(steps):
                    step()
            synchronize(case.device)
        finally:
            pre.remove()
            post.remove()
    forward = [marks[i] + marks[i + 1] for i in range(0, len(marks) - 1, 2)]
    if cuda:
        peak = torch.cuda.max_memory_allocated() - before_build
        how = "cuda-allocator"
    else:
        peak = held + tracker.peak
        how = "live-tensors"
    return {"peak": peak, "held": held, "activation_bytes": max(forward) if forward else None, "how": how}
