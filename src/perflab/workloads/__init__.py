"""Workload families: what one timed step runs, and which shape parameters a case of that family has.

A family is chosen by the model's name (``family_of``):

- ``classify``: an image batch through a ViT/DeiT (token reduction optional), timm models and perflab's own
  ``test:*`` fault models. Shape fields: input_size, keep_rate, reduction_loc. One workload: ``forward``.
- ``lm``: a token batch through a GPT (``gpt_small`` ... ``gpt_2.7b``, models/lm.py). Shape fields: seq_len,
  layers, model_args. Workloads: forward, train_forward, forward_backward, train_step.
- ``decode``: a Llama with a static KV cache (``llama3_8b`` ..., models/llama.py). Shape fields: prompt_len,
  context_len, new_tokens, layers, layers_only, model_args. Workloads: prefill, decode, generate.

This module is torch-free: it says which fields a family owns (so a case serialises to exactly those, and
ids of cases written by earlier versions stay the same), their defaults, and the case's label. Building
and running a case (torch) is in ``perflab.workloads.<family>``; every stage downstream sees only the
Case, the result row and the KernelTable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Fields every case has, whatever its family (all of them were in a case of perflab 0.1).
COMMON_FIELDS = ("model", "batch_size", "attn", "dtype", "mode", "device", "warmup", "min_time", "iters", "repeats", "seed")


@dataclass(frozen=True)
class FamilySpec:
    name: str
    fields: tuple[str, ...]  # the shape fields it owns, beyond COMMON_FIELDS
    workloads: tuple[str, ...]
    defaults: dict = field(default_factory=dict)  # filled in when a case leaves them unset (None)
    item: str = "sample"  # what throughput counts: "img", "token"
    describe: str = ""

    @property
    def default_workload(self) -> str:
        return self.workloads[0]

    def shape(self, fields) -> list[str]:
        """The family's shape words of a case, from its fields (a Case, or a row's ``case`` mapping):
        ``224px``; ``L2 train_step seq512``; ``decode ctx4096``; ``generate prompt128+128``."""
        get = fields.get if isinstance(fields, dict) else (lambda key: getattr(fields, key, None))
        if self.name == "classify":
            return [f"{get('input_size')}px"]
        parts = []
        if get("layers") is not None:
            parts.append(f"L{get('layers')}" + ("-only" if get("layers_only") else ""))
        elif get("layers_only"):
            parts.append("layers-only")
        workload = get("workload")
        if self.name == "lm":
            return parts + [workload, f"seq{get('seq_len')}"]
        if workload == "prefill":
            return parts + [workload, f"prompt{get('prompt_len')}"]
        if workload == "decode":
            return parts + [workload, f"ctx{get('context_len')}"]
        return parts + [workload, f"prompt{get('prompt_len')}+{get('new_tokens')}"]

    def label(self, case) -> list[str]:
        parts = [case.model]
        shape = self.shape(case)
        if self.name == "classify":
            if case.keep_rate:
                parts.append("kr" + "/".join(f"{r:g}" for r in case.keep_rate) + "@" + ",".join(map(str, case.reduction_loc)))
        elif case.model_args:  # after the layers, before the workload
            at = 1 if case.layers is not None or case.layers_only else 0
            shape.insert(at, ",".join(f"{k}={v:g}" for k, v in case.model_args))
        parts += shape + [f"bs{case.batch_size}", case.dtype, case.mode]
        if getattr(case, "optimizer", None):  # lm training variants, only when set
            parts.append(f"opt:{case.optimizer}")
        if getattr(case, "checkpoint_activations", False):
            parts.append("ckpt")
        if case.max_memory is not None:
            parts.append(f"cap{format_bytes(case.max_memory)}")
        return parts


FAMILIES = {
    "classify": FamilySpec(
        "classify", ("input_size", "keep_rate", "reduction_loc"), ("forward",),
        defaults={"input_size": 224, "batch_size": 1}, item="img",
        describe="image batch through a ViT/DeiT (optional token reduction) or a timm model",
    ),
    "lm": FamilySpec(
        "lm", ("workload", "seq_len", "layers", "model_args"), ("forward", "train_forward", "forward_backward", "train_step"),
        defaults={"seq_len": 128, "batch_size": 4}, item="token",
        describe="token batch through a GPT: inference forward, forward with autograd, forward+backward, or a full AdamW step",
    ),
    "decode": FamilySpec(
        "decode", ("workload", "prompt_len", "context_len", "new_tokens", "layers", "layers_only", "model_args"),
        ("decode", "prefill", "generate"),
        defaults={"batch_size": 1}, item="token",
        describe="a Llama with a static KV cache: one decode step at a context length, a prefill, or prefill + generation",
    ),
}

# The defaults of the decode family depend on the workload (a decode step needs a context, a prefill a prompt).
DECODE_DEFAULTS = {
    "decode": {"context_len": 512},
    "prefill": {"prompt_len": 512},
    "generate": {"prompt_len": 128, "new_tokens": 128},
}

LM_PREFIXES = ("gpt_",)
DECODE_PREFIXES = ("llama",)


def family_of(model: str) -> FamilySpec:
    """The family a model name belongs to (by name, without importing torch)."""
    if model.startswith(LM_PREFIXES):
        return FAMILIES["lm"]
    if model.startswith(DECODE_PREFIXES):
        return FAMILIES["decode"]
    return FAMILIES["classify"]


def item_of(rows) -> str | None:
    """What the throughput of these rows counts ("img", "token"), when all rows' families agree; else None."""
    items = {FAMILIES.get(r.get("family") or "classify", FAMILIES["classify"]).item for r in rows}
    return items.pop() if len(items) == 1 else None


def shape_defaults(family: FamilySpec, workload: str | None) -> dict[str, Any]:
    out = dict(family.defaults)
    if family.name != "classify":
        out["workload"] = family.default_workload
    if family.name == "decode":
        out.update(DECODE_DEFAULTS.get(workload or family.default_workload, {}))
    return out


def format_bytes(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    if n >= 2**30:
        return f"{n / 2**30:.3g}GiB"
    return f"{n}B"


def parse_bytes(text) -> int:
    """'24GiB', '24GB', '512MiB', '2.5e10' or an integer → bytes. ValueError on anything else."""
    if isinstance(text, bool):
        raise ValueError(text)
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        s = str(text).strip()
        units = {"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "b": 1}
        scale = 1.0
        for suffix, factor in units.items():
            if s.lower().endswith(suffix):
                s, scale = s[: -len(suffix)].strip(), factor
                break
        value = float(s) * scale
    if not (value > 0 and value < 2**60):
        raise ValueError(text)
    return int(value)
