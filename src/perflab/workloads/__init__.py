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


@dataclass(frozen=True)
class FamilySpec:
    """A family's torch-free facts. Each family's own words (its shape label, its workload-dependent defaults)
    live in its subclass below, so no stage downstream branches on family names."""

    name: str
    fields: tuple[str, ...]  # the shape fields it owns, beyond those every case has (each declared in perflab.spec.CASE_FIELDS)
    workloads: tuple[str, ...]
    defaults: dict = field(default_factory=dict)  # filled in when a case leaves them unset (None)
    item: str = "sample"  # what throughput counts: "img", "token"
    describe: str = ""
    optional: tuple[str, ...] = ()  # owned fields a case serialises only when set (so older case ids stay the same)
    variants: tuple[str, ...] = ()  # training-variant fields (--optimizer, ...) its cases may set
    report: str | None = None  # the module of its own report tables (``sections``, ``summary``), imported by name
    model_fields: tuple[str, ...] = ()  # fields that make another model variant, not another point (token reduction)
    parallel_workloads: tuple[str, ...] = ()  # workloads that may run data-parallel (--parallel): a backward whose gradients are reduced
    optimizer_workloads: tuple[str, ...] = ()  # workloads that step an optimizer: what explain --parallel explains

    @property
    def default_workload(self) -> str:
        return self.workloads[0]

    def defaults_for(self, workload: str | None) -> dict[str, Any]:
        """The shape defaults of a case of this family running ``workload``."""
        return dict(self.defaults, workload=self.default_workload)

    def shape(self, fields) -> list[str]:
        """The family's shape words of a case, from its fields (a Case, or a row's ``case`` mapping):
        ``224px``; ``L2 train_step seq512``; ``decode ctx4096``; ``generate prompt128+128``."""
        raise NotImplementedError

    def label(self, case) -> list[str]:
        parts = [case.model] + self.label_extra(case) + self.shape(case) + [f"bs{case.batch_size}", case.dtype, case.mode]
        if getattr(case, "optimizer", None):  # lm training variants, only when set
            parts.append(f"opt:{case.optimizer}")
        if getattr(case, "checkpoint_activations", False):
            parts.append("ckpt")
        if case.max_memory is not None:
            parts.append(f"cap{format_bytes(case.max_memory)}")
        return parts

    def label_extra(self, case) -> list[str]:
        """Words between the model and its shape (token reduction, config overrides)."""
        return [",".join(f"{k}={_arg_text(v)}" for k, v in case.model_args)] if case.model_args else []


def _arg_text(value) -> str:
    return f"{value:g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def _get(fields):
    return fields.get if isinstance(fields, dict) else (lambda key: getattr(fields, key, None))


def _layer_words(get) -> list[str]:
    if get("layers") is not None:
        return [f"L{get('layers')}" + ("-only" if get("layers_only") else "")]
    return ["layers-only"] if get("layers_only") else []


@dataclass(frozen=True)
class ClassifySpec(FamilySpec):
    def defaults_for(self, workload):
        return dict(self.defaults)

    def shape(self, fields) -> list[str]:
        return [f"{_get(fields)('input_size')}px"]

    def label_extra(self, case) -> list[str]:
        words = super().label_extra(case)
        if case.keep_rate:
            words.append("kr" + "/".join(f"{r:g}" for r in case.keep_rate) + "@" + ",".join(map(str, case.reduction_loc)))
        return words


@dataclass(frozen=True)
class LMSpec(FamilySpec):
    def shape(self, fields) -> list[str]:
        get = _get(fields)
        return _layer_words(get) + [get("workload"), f"seq{get('seq_len')}"]


# The defaults of the decode family depend on the workload (a decode step needs a context, a prefill a prompt).
DECODE_DEFAULTS = {
    "decode": {"context_len": 512},
    "prefill": {"prompt_len": 512},
    "generate": {"prompt_len": 128, "new_tokens": 128},
}


@dataclass(frozen=True)
class DecodeSpec(FamilySpec):
    def defaults_for(self, workload):
        return super().defaults_for(workload) | DECODE_DEFAULTS.get(workload or self.default_workload, {})

    def shape(self, fields) -> list[str]:
        get = _get(fields)
        workload = get("workload")
        words = {"prefill": [f"prompt{get('prompt_len')}"], "decode": [f"ctx{get('context_len')}"]}
        return _layer_words(get) + [workload] + words.get(workload, [f"prompt{get('prompt_len')}+{get('new_tokens')}"])


FAMILIES = {
    "classify": ClassifySpec(
        "classify", ("input_size", "keep_rate", "reduction_loc", "model_args"), ("forward",),
        defaults={"input_size": 224, "batch_size": 1}, item="img", optional=("model_args",), model_fields=("keep_rate", "reduction_loc"),
        describe="image batch through a ViT/DeiT (optional token reduction), a timm model, or your own image model",
    ),
    "lm": LMSpec(
        "lm", ("workload", "seq_len", "layers", "model_args"),
        ("forward", "train_forward", "forward_backward", "train_step"),
        defaults={"seq_len": 128, "batch_size": 4}, item="token", report="perflab.report.lm",
        parallel_workloads=("forward_backward", "train_step"), optimizer_workloads=("train_step",),
        variants=("optimizer", "checkpoint_activations"),
        describe="token batch through a GPT or your own LM: inference forward, forward with autograd, forward+backward, or a full AdamW step",
    ),
    "decode": DecodeSpec(
        "decode", ("workload", "prompt_len", "context_len", "new_tokens", "layers", "layers_only", "model_args"),
        ("decode", "prefill", "generate"),
        defaults={"batch_size": 1}, item="token", report="perflab.report.decode",
        describe="a Llama (or your own gpt-fast-style or transformers causal LM) with a static KV cache: one decode step at a "
                 "context length, a prefill, or prefill + generation",
    ),
}

# train_step's AdamW implementations (--optimizer); the lm family's, used by its validation and explain's fixes.
OPTIMIZERS = ("fused", "foreach", "in_backward", "in_backward_stream")

LM_PREFIXES = ("gpt_",)
DECODE_PREFIXES = ("llama",)


def family_of(model: str) -> FamilySpec:
    """The family a model name of perflab's own belongs to (by name, without importing torch). A reference to a
    user's model carries its family in the case (``Case.family``); see ``family_of_row``."""
    if model.startswith(LM_PREFIXES):
        return FAMILIES["lm"]
    if model.startswith(DECODE_PREFIXES):
        return FAMILIES["decode"]
    return FAMILIES["classify"]


def family_of_row(row: dict) -> FamilySpec:
    """The family of a stored row (or a case mapping): its own ``family`` key, else the one its model name implies."""
    name = row.get("family") or (row.get("case") or {}).get("family")
    if name in FAMILIES:
        return FAMILIES[name]
    return family_of(str(row.get("model") or (row.get("case") or {}).get("model") or ""))


def item_of(rows) -> str | None:
    """What the throughput of these rows counts ("img", "token"), when all rows' families agree; else None."""
    items = {family_of_row(r).item for r in rows}
    return items.pop() if len(items) == 1 else None


def shape_defaults(family: FamilySpec, workload: str | None) -> dict[str, Any]:
    return family.defaults_for(workload)


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
