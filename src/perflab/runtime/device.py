"""Choosing the device, with a clear error when CUDA is asked for and absent; the GPU's identity, read in one place."""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class GpuIdentity:
    """A CUDA device as torch reports it (``torch.cuda.get_device_properties``)."""

    index: int  # torch's index (CUDA_VISIBLE_DEVICES applied)
    name: str
    uuid: str  # NVML's spelling, "GPU-…": the handle of the same device under any CUDA_VISIBLE_DEVICES
    capability: tuple[int, int]
    total_memory: int  # bytes
    sm_count: int


def gpu_identity(index: int | None = None) -> GpuIdentity:
    """The identity of torch's CUDA device ``index`` (the current device by default): the one place perflab reads a
    GPU's name, UUID, compute capability, memory and SM count (the environment of a row, the ceilings' cache key, the
    datasheet, a memory cap, NVML's handle). Initialises CUDA; never call it where no GPU is to be touched."""
    if index is None:
        index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    uuid = str(props.uuid)
    return GpuIdentity(index, props.name, uuid if uuid.startswith("GPU-") else "GPU-" + uuid, (props.major, props.minor),
                       props.total_memory, props.multi_processor_count)
