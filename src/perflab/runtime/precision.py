"""Precision: fp32 (strict), tf32 (fp32 storage, TF32 matmuls), bf16/fp16 (autocast over fp32 weights).

With autocast the harness enters the context once around warm-up, capture and the timed loop, so the
cast of each weight to bf16/fp16 is made once and cached by autocast, as in a serving loop that enters
autocast once. (The seed code entered autocast per forward, which re-casts every weight every step.)
The cache only works under ``torch.no_grad()`` (not ``inference_mode``): autocast caches casts of leaf
tensors that require grad, and inference mode turns that off.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from perflab.workloads.base import AUTOCAST_DTYPES


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
