"""FLOPs by counting what actually runs (torch.utils.flop_counter), at the measured batch size and size.

FLOPs here are real FLOPs: 2 per multiply-add, attention matmuls included. MACs = FLOPs / 2 are given
beside them, for comparison with timm, fvcore and the seeds (which printed MACs as "flops").
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.utils import flop_counter


def _sdpa_cpu_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return flop_counter.sdpa_flop_count(query_shape, key_shape, value_shape)


def _sdpa_cpu_backward_flops(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return flop_counter.sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


def _extra_formulas() -> dict:
    # The CPU's fused attention ops have no formula in torch's registry, so SDPA on the CPU would count
    # as 0 FLOPs; give them the same formulas as the CUDA kernels (forward 2·B·H·L·S·(E + Ev), backward 2×).
    extra = {}
    cpu_sdpa = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if cpu_sdpa is not None and cpu_sdpa not in flop_counter.flop_registry:
        extra[cpu_sdpa] = _sdpa_cpu_flops
    cpu_sdpa_backward = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    if cpu_sdpa_backward is not None and cpu_sdpa_backward not in flop_counter.flop_registry:
        extra[cpu_sdpa_backward] = _sdpa_cpu_backward_flops
    return extra


def count_flops(run_once: Callable[[], object]) -> int:
    """FLOPs of one call of ``run_once`` (a forward at the measured batch size)."""
    with flop_counter.FlopCounterMode(display=False, custom_mapping=_extra_formulas()) as counter:
        run_once()
    return int(counter.get_total_flops())


def count_params(model: torch.nn.Module) -> tuple[int, int]:
    """(total, trainable) parameter counts."""
    params = list(model.parameters())
    return sum(p.numel() for p in params), sum(p.numel() for p in params if p.requires_grad)
