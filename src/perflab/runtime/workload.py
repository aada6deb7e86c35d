"""A case's workload, built and warmed up exactly as the harness runs it, for the passes beside timing
(profiling, ncu, the host's issue time)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from perflab.models.registry import build_model
from perflab.runtime.device import synchronize
from perflab.runtime.inputs import image_batch
from perflab.runtime.modes import make_step
from perflab.runtime.precision import precision


@dataclass
class Workload:
    model: torch.nn.Module
    vit_config: object | None  # the ViTConfig for perflab's ViTs, else None
    inputs: torch.Tensor
    step: Callable[[], torch.Tensor]


@contextlib.contextmanager
def warm_workload(case) -> Iterator[Workload]:
    """Seeded model and input on the case's device; inside no_grad and the case's precision (held for
    the block, so autocast's weight casts stay cached), the step for its mode, warmed up and synchronised."""
    torch.manual_seed(case.seed)
    model, vit_config = build_model(case)
    model = model.to(case.device)
    x = image_batch(case.batch_size, case.input_size, case.device, case.seed)
    with torch.no_grad(), precision(case.dtype, case.device):
        step = make_step(model, x, case.mode)
        for _ in range(case.warmup + 1):
            step()
        synchronize(case.device)
        yield Workload(model, vit_config, x, step)
