"""A case's workload, built and run exactly as the harness runs it, for every pass (timing, profiling, ncu,
the host's issue time): its model, its grad mode and its precision.

Precision: fp32 (strict), tf32 (fp32 storage, TF32 matmuls), bf16/fp16 (autocast over fp32 weights). With autocast the
harness enters the context once around warm-up, capture and the timed loop, so the cast of each weight to bf16/fp16
is made once and cached by autocast, as in a serving loop that enters autocast once (entered per forward, it would
re-cast every weight every step, a cost no such loop pays). The cache only works under ``torch.no_grad()`` (not
``inference_mode``): autocast caches casts of leaf tensors that require grad, and inference mode turns that off.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from perflab.runtime.device import gpu_identity, synchronize
from perflab.runtime.modes import make_step
from perflab.workloads.base import AUTOCAST_DTYPES, Built


@dataclass
class Workload:
    built: Built
    step: Callable[[], Any]

    @property
    def model(self) -> torch.nn.Module:
        return self.built.model


def build(case, **options) -> Built:
    """The case's model and step factory, seeded, on its device (``options``: the family's build options, e.g. ``shard``)."""
    from perflab.workloads.implementations import implementation

    torch.manual_seed(case.seed)
    return implementation(case).build(case, **options)


@contextlib.contextmanager
def step_context(case, built: Built) -> Iterator[None]:
    """Autograd on for training workloads, else no_grad; and the case's precision.

    no_grad, not inference_mode: under inference_mode autocast does not cache its weight casts, so every
    step would re-cast every weight (3 casts per Linear instead of 1, measured with the profiler).
    """
    grad = torch.enable_grad() if built.needs_grad else torch.no_grad()
    with grad, precision(case.dtype, case.device, autocast=built.autocast):
        yield


@contextlib.contextmanager
def precision(dtype: str, device_type: str, autocast: bool = True) -> Iterator[None]:
    """fp32/tf32 matmul precision for the block; with ``autocast``, bf16/fp16 autocast over it (a family whose
    weights are already in the case's dtype, like decode, passes autocast=False)."""
    previous = (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32)
    torch.set_float32_matmul_precision("high" if dtype == "tf32" else "highest")
    torch.backends.cudnn.allow_tf32 = dtype == "tf32"
    try:
        if autocast and dtype in AUTOCAST_DTYPES:
            with torch.autocast(device_type, dtype=AUTOCAST_DTYPES[dtype]):
                yield
        else:
            yield
    finally:
        torch.set_float32_matmul_precision(previous[0])
        torch.backends.cudnn.allow_tf32 = previous[1]


@contextlib.contextmanager
def memory_cap(case) -> Iterator[None]:
    """Cap the CUDA caching allocator at ``case.max_memory`` bytes for the block (an OOM past it is an ``oom`` row)."""
    if case.max_memory is None or case.device != "cuda":
        yield
        return
    total = gpu_identity().total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, case.max_memory / total))
    try:
        yield
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)


@contextlib.contextmanager
def warm_workload(case) -> Iterator[Workload]:
    """Seeded model and inputs on the case's device; inside the case's grad and precision contexts (held for
    the block, so autocast's weight casts stay cached), the step for its mode, warmed up and synchronised."""
    with memory_cap(case):
        built = build(case)
        with step_context(case, built):
            step = make_step(built, case.mode)
            for _ in range(case.warmup + 1):
                step()
            synchronize(case.device)
            yield Workload(built, step)
