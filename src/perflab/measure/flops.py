"""FLOPs by counting what actually runs (torch.utils.flop_counter), at the measured batch size and size.

FLOPs here are real FLOPs: 2 per multiply-add, attention matmuls included. MACs = FLOPs / 2 are given
beside them, for comparison with timm, fvcore and the seeds (which printed MACs as "flops").
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch.utils import flop_counter

from perflab.analysis.op_flops import BUILTIN_NAMESPACES, HEAVY_NAME  # one rule for a matmul's kind of op, by name


def _sdpa_cpu_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return flop_counter.sdpa_flop_count(query_shape, key_shape, value_shape)


def _sdpa_cpu_backward_flops(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return flop_counter.sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


# Fused attention ops whose shapes are (batch, heads, seq, dim): forward (query, key, value, ...), backward
# (grad_out, query, key, value, ...).
_SDPA_FORWARD = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention")
_SDPA_BACKWARD = tuple(name + "_backward" for name in _SDPA_FORWARD)


def _gqa(formula, first: int):
    """``formula`` with grouped-query attention counted as the kernels compute it: key and value heads (dim 1 of the
    shapes at positions first+1 and first+2) repeated up to the query's heads. torch's formulas assert equal head
    counts, so SDPA with ``enable_gqa`` (transformers' Llama on a GPU) would fail the count instead."""
    def counted(*shapes, **kwargs):
        shapes = list(shapes)
        query = shapes[first]
        for i in (first + 1, first + 2):
            shape = shapes[i]
            if len(shape) == 4 and len(query) == 4 and shape[1] != query[1] and shape[1] and query[1] % shape[1] == 0:
                shapes[i] = (shape[0], query[1], shape[2], shape[3])
        return formula(*shapes, **kwargs)

    return counted


def _extra_formulas() -> dict:
    # The CPU's fused attention ops have no formula in torch's registry, so SDPA on the CPU would count
    # as 0 FLOPs; give them the same formulas as the CUDA kernels (forward 2·B·H·L·S·(E + Ev), backward 2×).
    extra = {}
    for names, first in ((_SDPA_FORWARD, 0), (_SDPA_BACKWARD, 1)):
        for name in names:
            op = getattr(torch.ops.aten, name, None)
            if op is not None and op in flop_counter.flop_registry:
                # the registry holds shape wrappers (FlopCounterMode wraps custom entries itself): wrap the raw formula
                entry = flop_counter.flop_registry[op]
                extra[op] = _gqa(getattr(entry, "__wrapped__", entry), first)
    cpu_sdpa = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if cpu_sdpa is not None and cpu_sdpa not in flop_counter.flop_registry:
        extra[cpu_sdpa] = _gqa(_sdpa_cpu_flops, 0)
    cpu_sdpa_backward = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    if cpu_sdpa_backward is not None and cpu_sdpa_backward not in flop_counter.flop_registry:
        extra[cpu_sdpa_backward] = _gqa(_sdpa_cpu_backward_flops, 1)
    return extra


@dataclass
class FlopCount:
    """FLOPs of one call, and the ops that did heavy tensor work without a FLOP formula (name → calls), with a lower bound
    of what they did: 2 × their output's elements × the inner dimension of their first input of two or more dims (one
    multiply-add per output element and input feature; a fused encoder layer does several times that)."""

    flops: int
    uncounted: dict = field(default_factory=dict)
    uncounted_flops_min: int = 0

    @property
    def uncounted_share_min(self) -> float:
        total = self.flops + self.uncounted_flops_min
        return self.uncounted_flops_min / total if total else 0.0

    def to_dict(self) -> dict:
        return {"flops": int(self.flops), "uncounted": dict(self.uncounted), "uncounted_flops_min": int(self.uncounted_flops_min)}

    @classmethod
    def from_dict(cls, d: dict) -> "FlopCount":
        return cls(int(d["flops"]), dict(d.get("uncounted") or {}), int(d.get("uncounted_flops_min") or 0))


def _op_name(packet) -> str:
    return getattr(packet, "_qualified_op_name", None) or str(packet)


def _heavy_lower_bound(packet, args, out) -> int | None:
    """A lower bound of an uncounted op's FLOPs where it does a matmul's kind of work (by name, or any op of a custom
    namespace, whose code torch cannot see into); None for the others."""
    name = _op_name(packet)
    namespace, _, short = name.partition("::")
    if namespace in BUILTIN_NAMESPACES and not HEAVY_NAME.search(short):
        return None
    inputs = [a for a in torch.utils._pytree.tree_leaves(args) if isinstance(a, torch.Tensor) and a.dim() >= 2]
    outputs = [o for o in torch.utils._pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]
    if not inputs or not outputs:
        return None
    return 2 * max(o.numel() for o in outputs) * inputs[0].shape[-1]


class _WatchingCounter(flop_counter.FlopCounterMode):
    """torch's counter, noting every op it cannot count that does heavy tensor work (``_heavy_lower_bound``)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.uncounted: dict[str, int] = {}
        self.uncounted_flops_min = 0

    def _count_flops(self, func_packet, out, args, kwargs):
        if func_packet not in self.flop_registry:
            bound = _heavy_lower_bound(func_packet, (args, kwargs), out)
            if bound is not None:
                name = _op_name(func_packet)
                self.uncounted[name] = self.uncounted.get(name, 0) + 1
                self.uncounted_flops_min += bound
        return super()._count_flops(func_packet, out, args, kwargs)


@contextlib.contextmanager
def _mha_fastpath(enabled: bool):
    """nn.TransformerEncoderLayer's and nn.MultiheadAttention's fused inference path on or off (torch.backends.mha)."""
    mha = getattr(torch.backends, "mha", None)
    if mha is None:
        yield
        return
    before = mha.get_fastpath_enabled()
    mha.set_fastpath_enabled(enabled)
    try:
        yield
    finally:
        mha.set_fastpath_enabled(before)


def count_step(run_once: Callable[[], object], mha_fastpath: bool = False) -> FlopCount:
    """FLOPs of one call of ``run_once``, with the heavy ops it could not count.

    Counted with the fused fast path of nn.TransformerEncoderLayer and nn.MultiheadAttention off (``mha_fastpath``):
    its one op per layer (aten::_transformer_encoder_layer_fwd, _native_multi_head_attention) has no FLOP formula, so
    a model made of those layers would count its head alone; unfused, the same layer runs the same matmuls as ops that
    have one. The timed step keeps the fast path."""
    with _mha_fastpath(mha_fastpath), _WatchingCounter(display=False, custom_mapping=_extra_formulas()) as counter:
        run_once()
    return FlopCount(int(counter.get_total_flops()), dict(counter.uncounted), int(counter.uncounted_flops_min))


def count_flops(run_once: Callable[[], object]) -> int:
    """FLOPs of one call of ``run_once`` (a forward at the measured batch size)."""
    return count_step(run_once).flops


# ---------------------------------------------------------------------------------------------------
# One count per eager step in a sweep (issue 23, P9)
#
# The count runs one eager step under the counter before the mode's own first call, whatever the mode: the cases of a
# sweep that differ only in their mode or timing (decode.yaml's five modes of one shape) count the same step. A
# sweep's workers share the counts in a directory of the sweep (``--flops-cache``); a case whose step was counted
# reuses that number (``flops_counted_in``: the case that counted it) and skips the extra step.

# Case fields that change how a case is timed, not its eager step (the mode's step is built from the same model: only
# a CUDA graph's optimizer is made capturable, and an optimizer step has no counted op).
NOT_COUNTED = ("mode", "warmup", "min_time", "iters", "repeats", "max_memory")


def count_key(case) -> str | None:
    """The identity of the eager step ``count_flops`` counts for ``case``: its fields but ``NOT_COUNTED``, with torch's
    and perflab's versions (the formulas). None for a user's model (file.py:NAME, hf:...), whose code may change
    between runs of a resumed sweep: it is counted in each case."""
    import hashlib
    import json

    from perflab.version import __version__

    if case.is_reference:
        return None
    fields = {k: v for k, v in case.to_dict().items() if k not in NOT_COUNTED}
    fields["torch"], fields["perflab"] = torch.__version__, __version__
    return hashlib.sha1(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:16]


class FlopCache:
    """Counts by ``count_key`` in a directory, one small JSON file each (written through a rename: workers side by
    side never read half a file)."""

    def __init__(self, root):
        from pathlib import Path

        self.root = Path(root)

    def get(self, key: str) -> tuple[FlopCount, str] | None:
        """(the count, the id of the case that counted it), or None."""
        import json

        try:
            entry = json.loads((self.root / f"{key}.json").read_text())
            return FlopCount.from_dict(entry), str(entry["case_id"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def put(self, key: str, count: FlopCount, case_id: str) -> None:
        import json
        import os

        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / f"{key}.json"
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(dict(count.to_dict(), case_id=case_id)))
        os.replace(tmp, path)


def count_flops_once(case, run_once: Callable[[], Callable[[], object]], cache: FlopCache | None) -> tuple[FlopCount, str | None]:
    """(the count of one eager step of ``case``, the id of the case that counted it where it was not this one). With a
    cache, a count stored under the case's ``count_key`` is reused and the step not run; else ``run_once()`` gives the
    step, counted and stored."""
    key = count_key(case) if cache is not None else None
    if key is not None:
        hit = cache.get(key)
        if hit is not None:
            return hit[0], (hit[1] if hit[1] != case.id else None)
    count = count_step(run_once())
    if key is not None:
        cache.put(key, count, case.id)
    return count, None


def count_params(model: torch.nn.Module) -> tuple[int, int]:
    """(total, trainable) parameter counts."""
    params = list(model.parameters())
    return sum(p.numel() for p in params), sum(p.numel() for p in params if p.requires_grad)
