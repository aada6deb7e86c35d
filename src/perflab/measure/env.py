"""The environment a result was measured in: GPU, driver, torch/CUDA versions, host."""

from __future__ import annotations

import platform
import socket

import torch

from perflab.runtime.device import gpu_identity
from perflab.version import __version__


def environment(device: str, monitor_info: dict | None = None) -> dict:
    env = {
        "perflab": __version__,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_threads": torch.get_num_threads(),
        "device": device,
    }
    if device == "cuda":
        gpu = gpu_identity()
        env.update(
            gpu_name=gpu.name,
            gpu_memory_gb=round(gpu.total_memory / 2**30, 1),
            compute_capability="{}.{}".format(*gpu.capability),
            sm_count=gpu.sm_count,
            cudnn=torch.backends.cudnn.version(),
        )
    else:
        env["gpu_name"] = None
    env.update(monitor_info or {})
    return env


def device_name(env: dict) -> str:
    return env.get("gpu_name") or f"CPU ({env.get('cpu')}, {env.get('cpu_threads')} threads)"
