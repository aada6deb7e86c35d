"""Cases: everything that defines one measurement, with a stable id, and their validation.

This module does not import torch at import time, so stored results can be read back without it;
``validate_case`` imports the model registry (and so torch) when it runs.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Iterable

from perflab.errors import PerflabError

DTYPES = ("fp32", "tf32", "bf16", "fp16")
MODES = ("eager", "compile", "compile:reduce-overhead", "compile:max-autotune", "cudagraph")
ATTN_IMPLS = ("sdpa", "explicit")
DEVICES = ("cuda", "cpu")


@dataclass(frozen=True)
class Case:
    """One measurement. Frozen and hashable; ``id`` is a short hash of every field."""

    model: str
    input_size: int = 224
    batch_size: int = 1
    keep_rate: tuple[float, ...] = ()
    reduction_loc: tuple[int, ...] = ()
    attn: str = "sdpa"
    dtype: str = "fp32"
    mode: str = "eager"
    device: str = "cuda"
    warmup: int = 10  # untimed iterations after the first call (which compiles, for compile modes)
    min_time: float = 1.0  # seconds of timed work to aim for, unless iters is set
    iters: int | None = None  # exact number of timed iterations (overrides min_time)
    repeats: int = 20  # number of timing samples the timed iterations are split into
    seed: int = 0

    @property
    def id(self) -> str:
        return hashlib.sha1(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:12]

    @property
    def method(self) -> str:
        for prefix in ("topk_", "evit_"):
            if self.model.startswith(prefix):
                return prefix[:-1]
        return "baseline"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["keep_rate"] = list(self.keep_rate)
        d["reduction_loc"] = list(self.reduction_loc)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Case":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise PerflabError(f"unknown case field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        if "model" not in data:
            raise PerflabError("a case needs a model")
        data = dict(data)
        for key in ("keep_rate", "reduction_loc"):
            if key in data:
                data[key] = _as_tuple(data[key])
        return coerce_case(cls(**data))

    def label(self) -> str:
        parts = [self.model, f"{self.input_size}px", f"bs{self.batch_size}", self.dtype, self.mode]
        if self.keep_rate:
            parts.insert(1, "kr" + "/".join(f"{r:g}" for r in self.keep_rate) + "@" + ",".join(map(str, self.reduction_loc)))
        return " ".join(parts)


def _as_tuple(value) -> tuple:
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(value)
    return (value,)


_FIELD_TYPES = {
    "model": str, "input_size": int, "batch_size": int, "attn": str, "dtype": str, "mode": str,
    "device": str, "warmup": int, "min_time": float, "repeats": int, "seed": int,
}


def coerce_case(case: Case) -> Case:
    """Check field types (as from YAML or JSON) and normalise numbers; raise PerflabError naming the field."""
    changes = {}
    for name, typ in _FIELD_TYPES.items():
        value = getattr(case, name)
        changes[name] = _coerce(name, value, typ)
    if case.iters is not None:
        changes["iters"] = _coerce("iters", case.iters, int)
    changes["keep_rate"] = tuple(_coerce("keep_rate", v, float) for v in case.keep_rate)
    changes["reduction_loc"] = tuple(_coerce("reduction_loc", v, int) for v in case.reduction_loc)
    return replace(case, **changes)


def _coerce(name: str, value, typ):
    if typ is str:
        if not isinstance(value, str):
            raise PerflabError(f"{name} must be a string, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PerflabError(f"{name} must be a number, got {value!r}")
    if typ is int:
        if float(value) != int(value):
            raise PerflabError(f"{name} must be a whole number, got {value!r}")
        return int(value)
    return float(value)


def validate_case(case: Case) -> Case:
    """Raise PerflabError (one line, says how to fix) for anything that cannot be measured."""
    from perflab.models.registry import parse_model_name
    from perflab.models.vit import vit_configs

    case = coerce_case(case)
    name = parse_model_name(case.model)
    if case.dtype not in DTYPES:
        raise PerflabError(f"unknown dtype {case.dtype!r}; choose one of {', '.join(DTYPES)}")
    if case.mode not in MODES:
        raise PerflabError(f"unknown mode {case.mode!r}; choose one of {', '.join(MODES)}")
    if case.attn not in ATTN_IMPLS:
        raise PerflabError(f"unknown attention implementation {case.attn!r}; choose sdpa or explicit")
    if case.device not in DEVICES:
        raise PerflabError(f"unknown device {case.device!r}; choose cuda or cpu")
    if case.device == "cpu" and case.mode == "cudagraph":
        raise PerflabError("mode cudagraph needs a CUDA device; use --device cuda or another mode")
    if case.batch_size < 1:
        raise PerflabError(f"batch size must be at least 1, got {case.batch_size}")
    if case.input_size < 1:
        raise PerflabError(f"input size must be positive, got {case.input_size}")
    if case.warmup < 0:
        raise PerflabError(f"warmup must be 0 or more, got {case.warmup}")
    if case.repeats < 1:
        raise PerflabError(f"repeats must be at least 1, got {case.repeats}")
    if case.iters is not None and case.iters < 1:
        raise PerflabError(f"iters must be at least 1, got {case.iters}")
    if not (case.min_time > 0 and math.isfinite(case.min_time)):
        raise PerflabError(f"min-time must be a positive number of seconds, got {case.min_time}")
    for rate in case.keep_rate:
        if not (0.0 < rate <= 1.0):
            raise PerflabError(f"keep rate {rate:g} is outside (0, 1]; give the fraction of tokens to keep, e.g. 0.1")
    if name.family == "vit":
        config = vit_configs[name.base]
        patch, depth = 16, config["depth"]
        if case.input_size % patch:
            lower = case.input_size - case.input_size % patch
            raise PerflabError(f"input size {case.input_size} is not divisible by the patch size {patch}; try {lower} or {lower + patch}")
        for loc in case.reduction_loc:
            if not (0 <= loc < depth):
                raise PerflabError(f"reduction location {loc} is beyond the depth of {name.base} ({depth} blocks: 0..{depth - 1})")
        if len(set(case.reduction_loc)) != len(case.reduction_loc):
            raise PerflabError(f"reduction locations repeat: {list(case.reduction_loc)}")
    if name.reduces_tokens:
        if not case.keep_rate or not case.reduction_loc:
            raise PerflabError(f"{case.model} needs --keep-rate and --reduction-loc (e.g. --keep-rate 0.1 --reduction-loc 3 6 9)")
        if len(case.keep_rate) not in (1, len(case.reduction_loc)):
            raise PerflabError(
                f"give one keep rate or one per reduction location: {len(case.keep_rate)} rates for {len(case.reduction_loc)} locations"
            )
        if len(case.keep_rate) == 1:
            case = replace(case, reduction_loc=tuple(sorted(case.reduction_loc)))
        else:
            pairs = sorted(zip(case.reduction_loc, case.keep_rate))
            case = replace(case, reduction_loc=tuple(p[0] for p in pairs), keep_rate=tuple(p[1] for p in pairs))
    elif case.keep_rate or case.reduction_loc:
        raise PerflabError(
            f"{case.model} does not reduce tokens, so --keep-rate/--reduction-loc do nothing; use topk_{case.model} or evit_{case.model}"
        )
    return case


def expand_grid(base: dict[str, Any], grid: dict[str, Iterable]) -> list[dict[str, Any]]:
    """The product of the grid's value lists over a base dict (later keys vary fastest)."""
    keys = list(grid)
    out = []
    for values in itertools.product(*(list(grid[k]) for k in keys)):
        d = dict(base)
        d.update(zip(keys, values))
        out.append(d)
    return out
