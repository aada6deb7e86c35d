"""Synthetic inputs: a seeded random image batch, made once and reused (no loader in the timed loop)."""

from __future__ import annotations

import torch


def image_batch(batch_size: int, input_size: int, device: str, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(batch_size, 3, input_size, input_size, generator=generator)
    return x.to(device)
