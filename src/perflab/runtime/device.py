"""Choosing the device, with a clear error when CUDA is asked for and absent."""

from __future__ import annotations

import torch

from perflab.errors import PerflabError


def resolve_device(device: str) -> str:
    """'auto' → 'cuda' if a GPU is usable, else 'cpu'. 'cuda' without a GPU is an error."""
    device = device.lower()
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        why = "this torch build has no CUDA" if torch.version.cuda is None else "no GPU is visible"
        raise PerflabError(f"CUDA was requested but is not available ({why}; torch {torch.__version__}): run it where a GPU is "
                          "visible, or with --device cpu where the command runs on the CPU (its --help says)")
    if device not in ("cuda", "cpu"):
        raise PerflabError(f"unknown device {device!r}; choose auto, cuda or cpu")
    return device


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()
