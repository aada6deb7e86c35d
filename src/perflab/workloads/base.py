"""What a family's implementation hands the harness: a built workload (torch).

The harness, the profiler pass, ncu and the host timer all run a case through the same ``Built``: the
model on its device, a ``make_step`` that turns a model callable (the module itself, or its
``torch.compile``d version) into a no-argument step, and the facts the measurements need.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

# The dtypes bf16/fp16 cases compute in under autocast, over fp32 weights (runtime.workload.precision enters it).
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def image_batch(batch_size: int, input_size: int, device: str, seed: int) -> torch.Tensor:
    """Synthetic inputs of an image model: a seeded random batch, made once and reused (no loader in the timed loop)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(batch_size, 3, input_size, input_size, generator=generator)
    return x.to(device)


@dataclass
class Built:
    model: torch.nn.Module
    make_step: Callable[[Callable], Callable[[], Any]]  # model callable → one timed step
    needs_grad: bool  # the step records autograd (training workloads); else it runs under no_grad
    items_per_step: int  # what throughput counts: images, or tokens processed (lm), or tokens generated (decode)
    batch_of: Callable[[Any], int] = lambda out: int(out.shape[0])  # the batch a step's output shows it processed
    optimizer: torch.optim.Optimizer | None = None
    has_backward: bool = False
    autocast: bool = True  # the precision context autocasts (fp32 weights); False: weights are in the case's dtype
    extra: dict = field(default_factory=dict)  # family-specific state (inputs, caches, configs)
    annotate: bool = False  # steps mark their passes (forward, backward, optimizer) with profiler ranges

    def set_annotate(self, model_ranges: bool, passes: bool) -> None:
        """Turn the profile ranges of the model (eager only: ranges inside a compiled graph break it) and of
        the step's passes (forward, backward, optimizer: outside any compiled model) on or off."""
        self.annotate = passes
        if hasattr(self.model, "annotate"):
            self.model.annotate = model_ranges


def config_overrides(case, config_cls, fixed) -> dict:
    """The case's ``--model-arg`` overrides (and ``--layers`` as n_layers) for a config dataclass, checked:
    an unknown name (or one of ``fixed``, a name or names chosen elsewhere) is one clear error; whole floats become ints except for
    the float fields (rope_theta, norm_eps)."""
    from perflab.errors import PerflabError

    overrides = dict(case.model_args)
    if case.layers is not None:
        overrides["n_layers"] = case.layers
    fixed = (fixed,) if isinstance(fixed, str) else tuple(fixed)
    allowed = [k for k in config_cls.__dataclass_fields__ if k not in fixed]
    for key, value in overrides.items():
        if key not in allowed:
            raise PerflabError(f"--model-arg {key}: {case.model} has no such dimension; choose from {', '.join(allowed)}")
        if isinstance(value, float) and value.is_integer() and key not in ("rope_theta", "norm_eps"):
            overrides[key] = int(value)
    return overrides


class Implementation:
    """A family's torch side. Subclasses: workloads.classify, workloads.lm, workloads.decode."""

    family: str = ""
    modes_invalid: dict = {}  # workload → {mode: reason} for modes that cannot run it

    def validate(self, case):
        """Family checks; returns the normalised case. PerflabError (one line) on bad input."""
        raise NotImplementedError

    def trains(self, case) -> bool:
        """Whether the case's step records autograd (``Built.needs_grad``), known before building: such a step casts
        its weights afresh every step (its own autocast), so it is never timed under a kept autocast cache."""
        return False

    def build(self, case) -> Built:
        """The model on ``case.device`` and the step factory, seeded. Called under the case's precision."""
        raise NotImplementedError

    def analytic(self, case) -> dict:
        """Numbers known without running: ``params``, ``flops_per_step`` (formula), ``bytes_per_step`` ..."""
        return {}

    def check(self, case, built: Built) -> dict:
        """Before timing, with one eager call: what the step actually processed (tokens seen, ...)."""
        return {}

    def after_timing(self, case, built: Built, step, row: dict) -> dict:
        """Extra measurements after the timed loop (e.g. per-token latencies of a generation); row keys."""
        return {}

    def pass_costs(self, case, row: dict) -> dict | None:
        """Per pass of a step with several (``forward``/``backward``/``optimizer``; ``prefill``/``decode``), in step
        order: ``{"flops": ..., "bytes": ...}`` (the least bytes the pass must move). None: one pass only."""
        return None

    def default_fixes(self, case) -> list[str]:
        """The fixes ``perflab explain`` tries on this case unless told otherwise (explain.parse_fix specs)."""
        return []

    def min_bytes(self, case, row: dict) -> float:
        """The least DRAM traffic one step needs (for the memory floor): the family's stated bytes per step,
        else every weight read once in the compute dtype."""
        if row.get("bytes_per_step"):
            return float(row["bytes_per_step"])
        return int(row.get("params") or 0) * (2 if case.dtype in ("bf16", "fp16") else 4)

    def check_mode(self, case) -> None:
        from perflab.errors import PerflabError

        reason = self.modes_invalid.get(case.workload, {}).get(case.mode)
        if reason:
            raise PerflabError(f"mode {case.mode} cannot run the {case.workload} workload: {reason}")
