"""What to measure at the spec floor, one case; ``sweep/spec.py`` reads an experiment file of them.

Cases: everything that defines one measurement, with a stable id, and their validation.

A case is a model, a workload (what one timed step runs) and the shape parameters of the model's workload
family (``perflab.workloads``): input_size/keep_rate/reduction_loc for image classifiers, seq_len for
language models, prompt_len/context_len/new_tokens for decode. Field types are checked by msgspec
(``Case.from_dict``, the sweep spec's values), the meaning of the values by ``validate_case``.

A case serialises to the common fields plus the fields its family owns, so the ids of cases written by
earlier versions (image classifiers only) stay the same.

This module does not import torch at import time, so stored results can be read back without it;
``validate_case`` imports the family's implementation (and so torch) when it runs.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import typing
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Annotated, Any, Iterable, List, Literal, Optional

import msgspec

from perflab.errors import PerflabError, show, show_int
from perflab.references import is_reference
from perflab.workloads import FAMILIES, family_of, shape_defaults

DTYPES = ("fp32", "tf32", "bf16", "fp16")
MODES = ("eager", "compile", "compile:reduce-overhead", "compile:max-autotune", "cudagraph", "compile:max-autotune-gemm")
AUTOTUNE_MODES = ("compile:max-autotune", "compile:max-autotune-gemm")  # the modes whose kernels autotuning chooses
ATTN_IMPLS = ("sdpa", "explicit")
DEVICES = ("cuda", "cpu")
# Each data-parallel mode's options: name -> (type, default, what it is).
PARALLEL_OPTIONS = {
    "ddp": {"bucket_cap_mb": (float, 25.0, "DDP's gradient bucket size, MiB"),
            "grad_view": (bool, False, "gradient_as_bucket_view: gradients are views into the buckets (no copy)"),
            "no_sync": (int, 1, "micro-batches per step; all but the last backward under no_sync (gradient accumulation)")},
    "fsdp": {"reshard": (bool, True, "reshard_after_forward: free the gathered parameters after the forward, gather again in the backward")},
}


def _parallel_pattern() -> str:
    """A regular expression of ``parse_parallel``'s syntax (a mode, then its own option names), for the JSON Schema."""
    def mode(name: str, options) -> str:
        item = f"(?:(?:{'|'.join(options)})=[^,]*)?"
        return f"{name}(?::{item}(?:,{item})*)?"
    return "^(?:" + "|".join(mode(name, options) for name, options in PARALLEL_OPTIONS.items()) + ")$"

@dataclass(frozen=True)
class SpecField:
    """A Case field as an experiment file gives it (``perflab.spec_schema`` builds the file's schema from these).

    ``type``: the YAML type of one value; ``grid``: the type of a grid's entry, when it is not one value or a
    non-empty list of them; ``kind``/``plural``: what it holds, in error messages and the JSON Schema."""

    type: Any
    kind: str
    plural: str
    grid: Any = None


_SAME = object()  # CaseField.given: make_cases and the flag default to the Case's own default


@dataclass(frozen=True)
class CaseField:
    """One field of a case, declared once with what every stage needs of it (``CASE_FIELDS``).

    ``default``: the Case's value where none is given (a shape's None: its family's default). ``spec``: how an
    experiment file gives it (``perflab.spec_schema``). ``help``: its flag's help in the case-flag group that bench,
    ab, track, ... take (``perflab.cli_flags``); None: not a flag of the group (model, parallel, world_size: see the
    table). ``axis``: its place in make_cases' product of value lists (0 varies slowest), None where a call takes one
    value for every case. ``list_valued``: make_cases and its flag take a list (an axis; or keep_rate's, which one case
    holds whole). ``given``: make_cases' and the flag's default, where not the Case's (device: auto, resolved as the
    cases are made). ``flag``: as typed, where not --name with dashes. ``flag_type``: what the flag takes where it is
    text make_cases reads (--model-arg NAME=VALUE, --max-memory 24GiB). Which families own a field is theirs to say
    (``FamilySpec.fields``, ``.variants``): ``owners``."""

    name: str
    default: Any
    spec: SpecField
    help: str | None = None
    axis: int | None = None
    list_valued: bool = False
    given: Any = _SAME
    flag: str | None = None
    flag_type: Any = None

    @property
    def option(self) -> str:
        """Its flag as typed: ``--batch-size``."""
        return self.flag or "--" + self.name.replace("_", "-")

    @property
    def param(self) -> str:
        """The case-flag group's parameter name of its flag: ``batch_size``, ``model_arg``."""
        return self.option[2:].replace("-", "_")

    @property
    def in_group(self) -> bool:
        return self.help is not None

    @property
    def argument_default(self):
        """make_cases' default: ``given``, else the Case's, as a tuple for a list-valued field (empty where unset)."""
        if self.given is not _SAME:
            return self.given
        if self.list_valued:
            return () if self.default in (None, ()) else (self.default,)
        return self.default

    @property
    def flag_default(self):
        """The flag's default: make_cases', a list for one that takes several values."""
        if self.list_valued or typing.get_origin(self.flag_type) is list:
            return list(self.argument_default or ())
        return self.argument_default

    @property
    def owners(self) -> tuple[str, ...]:
        """The families whose cases have it (as a shape or a training variant); () for a field every case has."""
        return tuple(f.name for f in FAMILIES.values() if self.name in f.fields or self.name in f.variants)


_INT = SpecField(int, "an integer", "integers")
_BOOL = SpecField(bool, "true or false", "booleans")

# Every field of a case, declared once, in the order the case-flag group lists them in --help. Derived from it: the Case's
# defaults, the case-flag group (perflab.cli_flags), make_cases' defaults and product (perflab.api), the fields an
# experiment file may set (perflab.spec_schema). A new Case field is one entry here (and, for a family's own, a name
# in its FamilySpec); tests/test_case_fields.py holds each list to this table.
CASE_FIELDS = {f.name: f for f in (
    CaseField("model", MISSING, SpecField(str, "a model name", "model names"), axis=0, list_valued=True),  # each command's own --model
    CaseField("input_size", None, _INT, "Image models: input resolution(s), pixels (default 224).", axis=1, list_valued=True),
    CaseField("batch_size", None, _INT, "Batch size(s) (default: 1 for image models and decode, 4 for language models).", axis=2,
              list_valued=True),
    CaseField("keep_rate", (), SpecField(float | list[float], "a number or a list of numbers", "keep rates (numbers, or lists of numbers)",
                                         grid=float | list[float | list[float]]),
              "Keep rate, one value or one per reduction location (token-reducing models only).", list_valued=True),
    CaseField("reduction_loc", (), SpecField(int | list[int], "a list of integers", "location lists, e.g. [[3, 6, 9]]", grid=list[list[int]]),
              "Blocks (0-based) that reduce tokens.", list_valued=True),
    CaseField("workload", None, SpecField(str, "a workload name", "workload names"),
              "What one timed step runs: forward (image models); forward, train_forward, forward_backward, train_step (gpt_*); "
              "decode, prefill, generate (llama*).", axis=5, list_valued=True),
    CaseField("seq_len", None, _INT, "Language models: tokens per sequence (default 128).", axis=6, list_valued=True),
    CaseField("prompt_len", None, _INT, "Decode: prompt tokens of prefill and generate.", axis=7, list_valued=True),
    CaseField("context_len", None, _INT, "Decode: the cache position of the timed decode step (default 512).", axis=8, list_valued=True),
    CaseField("new_tokens", None, _INT, "Decode: tokens to generate after the prefill (generate).", axis=9, list_valued=True),
    CaseField("layers", None, _INT, "Language models and decode: run this many layers."),
    CaseField("layers_only", False, _BOOL, "Decode: the layers alone, without embedding and head (the Llama decode testbench's one layer)."),
    CaseField("model_args", (), SpecField(dict[str, int | float | str], "a mapping of dimension names to numbers, e.g. {d_ff: 2048}",
                                          "mappings of dimension names to numbers, e.g. [{d_ff: 2048}]"),
              "Override a dimension of the named config, e.g. d_ff=2048, or pass a keyword argument to your own model's factory "
              "(repeatable; ints, floats or strings).", given=None, flag="--model-arg", flag_type=List[str]),
    CaseField("max_memory", None, SpecField(int | str, "a size such as 24GiB", "sizes"),
              "Cap the CUDA allocator, e.g. 24GiB: would it fit on a smaller GPU? Past it: an oom row.", flag_type=Optional[str]),
    CaseField("family", None, SpecField(Literal[tuple(FAMILIES)], "a family name", "family names"),
              "classify, lm or decode: which inputs your own model takes, where perflab cannot tell from the reference."),
    CaseField("attn", "sdpa", SpecField(Literal[ATTN_IMPLS], "a string", "strings"), "Attention implementation: sdpa or explicit."),
    CaseField("dtype", "fp32", SpecField(Literal[DTYPES], "a string", "strings"), "fp32, tf32, bf16 or fp16 (bf16/fp16 via autocast).",
              axis=3, list_valued=True),
    CaseField("mode", "eager", SpecField(Literal[MODES], "a string", "strings"),
              "eager, compile, compile:reduce-overhead, compile:max-autotune, compile:max-autotune-gemm (max-autotune of the matmuls "
              "only) or cudagraph.", axis=4, list_valued=True),
    CaseField("device", "cuda", SpecField(Literal[DEVICES + ("auto",)], "a string", "strings"), "auto, cuda or cpu.", given="auto"),
    CaseField("warmup", 10, _INT, "Untimed iterations before timing."),
    CaseField("min_time", 1.0, SpecField(float, "a number", "numbers"),
              "Seconds of timed work to aim for per case (a slow step stops before 50 iterations once it has twice the steps for this)."),
    CaseField("iters", None, SpecField(int | None, "an integer or null", "integers"), "Exact number of timed iterations (overrides --min-time)."),
    CaseField("repeats", 20, _INT, "Number of timing samples the timed iterations are split into."),
    CaseField("seed", 0, _INT, "Random seed for weights and inputs."),
    CaseField("optimizer", None, SpecField(str, "an optimizer name", "optimizer names"),
              "Language models, train_step: AdamW fused, foreach, in_backward (per parameter, from its gradient's hook) or "
              "in_backward_stream (the same on a side CUDA stream). Default: fused on GPU, for-loop on CPU."),
    CaseField("checkpoint_activations", False, _BOOL, "Language models, forward_backward and train_step: recompute each block's "
              "activations in the backward (less memory, one more forward)."),
    # data parallel: --parallel and --world-size are the flags of the commands that run ranks (with --gpus), not the group's.
    # parse_parallel checks a mode's options; the JSON Schema's pattern names them.
    CaseField("parallel", None, SpecField(Annotated[str, msgspec.Meta(extra_json_schema={"pattern": _parallel_pattern()})],
                                          "ddp or fsdp, options after a colon (e.g. ddp:bucket_cap_mb=100)", "data-parallel modes (ddp, fsdp)")),
    CaseField("world_size", 1, SpecField(Annotated[int, msgspec.Meta(ge=1)], "a whole number of ranks, 1 or more",
                                         "whole numbers of ranks, 1 or more")),
)}
DEFAULT = {name: f.default for name, f in CASE_FIELDS.items() if f.default is not MISSING}  # the Case's
ARGUMENT_DEFAULT = {name: f.argument_default for name, f in CASE_FIELDS.items() if f.default is not MISSING}  # make_cases'
# make_cases' product: its axes, slowest first (the cases come out in this order).
AXES = tuple(sorted((name for name, f in CASE_FIELDS.items() if f.axis is not None), key=lambda name: CASE_FIELDS[name].axis))
# Data-parallel fields and their "not set" value (serialised only when set).
PARALLEL_FIELDS = {name: DEFAULT[name] for name in ("parallel", "world_size")}
# lm training variants and their "not set" value (serialised only when set).
TRAINING_VARIANTS = {name: DEFAULT[name] for name, f in CASE_FIELDS.items() if any(name in fam.variants for fam in FAMILIES.values())}
# How each field is given on the command line, for messages.
FLAG = {name: f.option for name, f in CASE_FIELDS.items()}


@dataclass(frozen=True)
class Case:
    """One measurement. Frozen and hashable; ``id`` is a short hash of its serialised fields.

    Unset shape fields (None) take the family's defaults when the case is made. Each field's default (and all else a
    stage needs of it) is declared in ``CASE_FIELDS``.
    """

    model: str
    workload: str | None = DEFAULT["workload"]  # what one timed step runs; None: the family's default
    input_size: int | None = DEFAULT["input_size"]  # classify: image side, pixels
    batch_size: int | None = DEFAULT["batch_size"]
    keep_rate: tuple[float, ...] = DEFAULT["keep_rate"]  # classify: token reduction
    reduction_loc: tuple[int, ...] = DEFAULT["reduction_loc"]
    seq_len: int | None = DEFAULT["seq_len"]  # lm: tokens per sequence
    prompt_len: int | None = DEFAULT["prompt_len"]  # decode: prompt tokens (prefill, generate)
    context_len: int | None = DEFAULT["context_len"]  # decode: cache position of the timed decode step
    new_tokens: int | None = DEFAULT["new_tokens"]  # decode: tokens generated after the prefill (generate)
    layers: int | None = DEFAULT["layers"]  # lm, decode: run this many layers (None: the config's)
    layers_only: bool = DEFAULT["layers_only"]  # decode: the layers alone, without embedding, final norm and head (seed 004's testbench)
    model_args: tuple[tuple[str, float], ...] = DEFAULT["model_args"]  # lm, decode: overrides of the named config's dimensions
    attn: str = DEFAULT["attn"]
    dtype: str = DEFAULT["dtype"]
    mode: str = DEFAULT["mode"]
    device: str = DEFAULT["device"]
    max_memory: int | None = DEFAULT["max_memory"]  # bytes the allocator may use (cap, to ask "would it fit on a smaller GPU")
    warmup: int = DEFAULT["warmup"]  # untimed iterations after the first call (which compiles, for compile modes)
    min_time: float = DEFAULT["min_time"]  # seconds of timed work to aim for, unless iters is set
    iters: int | None = DEFAULT["iters"]  # exact number of timed iterations (overrides min_time)
    repeats: int = DEFAULT["repeats"]  # number of timing samples the timed iterations are split into
    seed: int = DEFAULT["seed"]
    family: str | None = DEFAULT["family"]  # the workload family; perflab's own model names imply it, a reference may state it
    # ---- lm training variants: serialised only when set, so the ids of other cases do not change ----
    optimizer: str | None = DEFAULT["optimizer"]  # train_step's AdamW: fused, foreach, in_backward, in_backward_stream (None: fused on GPU, for-loop on CPU)
    checkpoint_activations: bool = DEFAULT["checkpoint_activations"]  # recompute each block's activations in the backward (torch.utils.checkpoint)
    # ---- data parallel: serialised only when set ----
    parallel: str | None = DEFAULT["parallel"]  # "ddp" or "fsdp", with options ("ddp:bucket_cap_mb=100,grad_view=true", "fsdp:reshard=false")
    world_size: int = DEFAULT["world_size"]  # ranks (one process per GPU); the batch is per rank

    def __post_init__(self):
        if isinstance(self.model_args, dict):
            object.__setattr__(self, "model_args", tuple(sorted(self.model_args.items())))
        if self.family is None and isinstance(self.model, str) and not is_reference(self.model):
            object.__setattr__(self, "family", family_of(self.model).name)
        family = self.family_spec
        if family is None:  # a reference whose family is not known yet: validate_case finds it, then fills the defaults
            return
        for name, value in shape_defaults(family, self.workload).items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)
        if self.workload is None and family.name == "classify":
            object.__setattr__(self, "workload", "forward")

    @property
    def family_spec(self):
        """The case's FamilySpec; None for a reference whose family is not resolved yet."""
        return FAMILIES.get(self.family) if self.family else None

    @property
    def is_reference(self) -> bool:
        return is_reference(self.model)

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
        """The common fields, the family's own shape fields, and max_memory when set; ``family`` for a reference
        (perflab's own names imply theirs, so their ids are what they always were)."""
        family = self.family_spec
        d = asdict(self)
        if not self.is_reference:
            d.pop("family")
        elif d["family"] is None:
            d.pop("family")
        for name, empty in SHAPE_FIELDS.items():
            if (name not in family.fields) if family is not None else getattr(self, name) == empty:
                d.pop(name)
        if "layers_only" in d and not d["layers_only"]:
            d.pop("layers_only")
        for name in family.optional if family is not None else ():
            if name in d and getattr(self, name) == SHAPE_FIELDS[name]:
                d.pop(name)
        if "model_args" in d:
            d["model_args"] = dict(self.model_args)
        if d["max_memory"] is None:
            d.pop("max_memory")
        for name, default in TRAINING_VARIANTS.items():  # only when set: existing case ids stay the same
            if d[name] == default:
                d.pop(name)
        for name, default in PARALLEL_FIELDS.items():
            if d[name] == default:
                d.pop(name)
        for key in ("keep_rate", "reduction_loc"):
            if key in d:
                d[key] = list(d[key])
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Case":
        """A case from plain data (JSON, YAML); field types are checked, PerflabError names the field."""
        if not isinstance(data, dict):
            raise PerflabError(f"a case is a mapping of fields, got {type(data).__name__}")
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise PerflabError(f"unknown case field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        if "model" not in data:
            raise PerflabError("a case needs a model")
        data = {k: convert_field(k, v) for k, v in data.items()}
        return cls(**data)

    def label(self) -> str:
        family = self.family_spec
        text = " ".join(family.label(self)) if family is not None else self.model
        return f"{text} {self.parallel}x{self.world_size}" if self.parallel else text


# Shape fields (a family's own, FamilySpec.fields) and their "not set" value, in the Case's order: a field a case's family
# does not own must be left at it.
SHAPE_FIELDS = {f.name: f.default for f in fields(Case) if any(f.name in family.fields for family in FAMILIES.values())}
_HINTS = typing.get_type_hints(Case)

# Every integer of a case is stored (SQLite's INTEGER: signed 64-bit) and handed to torch (sizes and seeds: int64) and
# numpy (int64 columns); past these bounds one of them fails only once the case runs, or its row cannot be stored.
INT64_MIN, INT64_MAX = -(2 ** 63), 2 ** 63 - 1


def check_int64(name: str, value) -> None:
    """PerflabError naming the field for an integer (or one inside a tuple or list) outside signed 64 bits."""
    for item in (value if isinstance(value, (tuple, list)) else (value,)):
        if isinstance(item, (tuple, list)):
            check_int64(name, item)
        elif isinstance(item, int) and not isinstance(item, bool) and not INT64_MIN <= item <= INT64_MAX:
            raise PerflabError(f"{name}: {show_int(item)} is past the integers perflab can store and run (signed 64-bit, "
                               f"-2^63 to 2^63-1, as SQLite, torch and numpy hold them)")


def check_integers(case: "Case") -> None:
    """Every integer field of a case within signed 64 bits (``check_int64``); a Case built in code is checked here
    before anything runs."""
    for f in fields(case):
        value = getattr(case, f.name)
        check_int64(f.name, [v for _, v in value] if f.name == "model_args" else value)


def convert_field(name: str, value):
    """One Case field's value, type-checked by msgspec (ints stay ints; lists become tuples); PerflabError if wrong."""
    if name == "keep_rate" and isinstance(value, (int, float)) and not isinstance(value, bool):
        value = [value]
    if name == "reduction_loc" and isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if name == "model_args":
        if isinstance(value, (list, tuple)) and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in value):
            value = dict(value)
        if not isinstance(value, dict):
            raise PerflabError(f"model_args: expected a mapping of dimension names to numbers, e.g. {{d_ff: 2048}}, got {show(value)}")
        return tuple(sorted((str(k), convert_field("model_args." + str(k), v)) for k, v in value.items()))
    if name == "max_memory" and isinstance(value, str):
        from perflab.workloads import parse_bytes

        try:
            size = parse_bytes(value)
        except ValueError:
            raise PerflabError(f"max_memory: expected a size such as 24GiB, 24GB or 512MiB, got {show(value)}") from None
        check_int64(name, size)
        return size
    hint = _HINTS.get(name, float)
    if name.startswith("model_args."):
        hint = int | float | str
    try:
        converted = msgspec.convert(value, type=hint)
    except msgspec.ValidationError as exc:
        raise PerflabError(f"{name}: {_describe(exc, hint)}, got {show(value)}") from None
    check_int64(name, converted)
    return converted


def _describe(exc: msgspec.ValidationError, hint) -> str:
    text = str(exc).split(" - at ")[0].split(", got ")[0]  # "Expected `int`, got `str`": the value itself is shown instead
    text = text.replace("`", "")
    return text[0].lower() + text[1:] if text else f"expected {hint}"


def parse_parallel(text: str, flag: str | None = "--parallel") -> tuple[str, dict]:
    """``ddp``, ``fsdp`` or either with options, ``ddp:bucket_cap_mb=100,grad_view=true``: (mode, options with defaults).
    PerflabError (one line) for an unknown mode, option or value; its message starts with ``flag`` and the text
    (``--parallel ddp:x=1: ...``), or with neither where ``flag`` is None (a spec names the key instead)."""
    def fail(message: str):
        raise PerflabError(f"{flag} {text}: {message}" if flag else message)

    mode, _, rest = str(text).partition(":")
    if mode not in PARALLEL_OPTIONS:
        fail(f"unknown mode {mode!r}; choose ddp or fsdp (options after a colon, e.g. ddp:bucket_cap_mb=100)")
    known = PARALLEL_OPTIONS[mode]
    options = {name: default for name, (_, default, _) in known.items()}
    for item in filter(None, rest.split(",")):
        name, eq, value = item.partition("=")
        if name not in known or not eq:
            fail(f"{mode} takes {', '.join(f'{k}=VALUE' for k in known)}, got {item!r}")
        kind = known[name][0]
        try:
            if kind is bool:
                if value.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(value)
                parsed = value.lower() in ("true", "1")
            else:
                parsed = kind(value)
        except ValueError:
            fail(f"{name} takes a {kind.__name__}, got {value!r}")
        if kind is not bool and not parsed > 0:
            fail(f"{name} must be positive, got {value}")
        options[name] = parsed
    return mode, options


def format_parallel(mode: str, options: dict) -> str:
    """``parse_parallel``'s text for a mode and its options: the options that differ from their defaults, in the
    mode's order (``ddp``, ``ddp:bucket_cap_mb=100,grad_view=true``)."""
    known = PARALLEL_OPTIONS[mode]
    parts = []
    for name, (kind, default, _) in known.items():
        value = options.get(name, default)
        if value != default:
            parts.append(f"{name}={str(value).lower() if kind is bool else format(value, 'g') if kind is float else value}")
    return mode + (":" + ",".join(parts) if parts else "")


def merge_parallel(base: str, change: str) -> str:
    """The data-parallel mode after a fix ``change`` on ``base``: the change's options over the base's where the modes
    are the same (``ddp:grad_view=true`` on ``ddp:bucket_cap_mb=100`` keeps the buckets), the change alone otherwise."""
    base_mode, base_options = parse_parallel(base)
    mode, options = parse_parallel(change)
    if mode != base_mode:
        return format_parallel(mode, options)
    given = {item.partition("=")[0] for item in filter(None, change.partition(":")[2].split(","))}
    return format_parallel(mode, {**base_options, **{k: v for k, v in options.items() if k in given}})


def _validate_parallel(case: Case, family) -> None:
    if case.world_size < 1:
        raise PerflabError(f"world size must be at least 1, got {case.world_size}")
    if case.parallel is None:
        if case.world_size != 1:
            raise PerflabError(f"{case.world_size} ranks need a data-parallel mode: add --parallel ddp or --parallel fsdp")
        return
    parse_parallel(case.parallel)
    if case.world_size < 2:
        raise PerflabError(f"--parallel {case.parallel} needs at least 2 ranks (one per GPU; --gpus, --world-size, a spec's world_size), "
                           f"got {case.world_size}")
    if case.workload not in family.parallel_workloads:
        runs = f"the {family.name} family's {' and '.join(family.parallel_workloads)} workloads" if family.parallel_workloads else "none of the " \
               f"{family.name} family's workloads"
        raise PerflabError(f"--parallel trains a model on several ranks (a backward whose gradients are reduced): it applies to {runs}, "
                           f"not {case.model} {case.workload}")
    if case.mode == "cudagraph" or case.mode.startswith("compile:"):
        raise PerflabError(f"--parallel runs eager or compile (torch.compile of the wrapped model), not mode {case.mode}")
    if case.max_memory is not None:
        raise PerflabError("--max-memory caps one process's allocator; it does not apply with --parallel")
    if case.optimizer is not None and case.optimizer.startswith("in_backward"):
        raise PerflabError(f"--optimizer {case.optimizer} steps from gradient hooks, before the gradients are reduced; use fused or foreach with --parallel")


def validate_case(case: Case) -> Case:
    """Raise PerflabError (one line, says how to fix) for anything that cannot be measured; returns the
    case normalised by its family (sorted reduction locations, ...)."""
    check_integers(case)  # before a reference is built to find its family
    case = resolve_family(case)
    case = Case.from_dict(case.to_dict() | _foreign_fields(case))
    family = case.family_spec
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
    if case.warmup < 0:
        raise PerflabError(f"warmup must be 0 or more, got {case.warmup}")
    if case.repeats < 1:
        raise PerflabError(f"repeats must be at least 1, got {case.repeats}")
    if case.iters is not None and case.iters < 1:
        raise PerflabError(f"iters must be at least 1, got {case.iters}")
    if not (case.min_time > 0 and math.isfinite(case.min_time)):
        raise PerflabError(f"min-time must be a positive number of seconds, got {case.min_time}")
    if case.max_memory is not None:
        if case.max_memory <= 0:
            raise PerflabError(f"max-memory must be a positive size such as 24GiB, got {case.max_memory}")
        if case.device != "cuda":
            raise PerflabError("--max-memory caps the CUDA allocator, so it needs --device cuda")
    for name, empty in SHAPE_FIELDS.items():
        if name != "workload" and name not in family.fields and getattr(case, name) != empty:
            raise PerflabError(_foreign_message(case, family, name))
    if case.workload not in family.workloads:
        others = [f.name for f in FAMILIES.values() if case.workload in f.workloads]
        where = f"; {case.workload} is a workload of the {others[0]} family ({_family_models(others[0])})" if others else ""
        raise PerflabError(f"{case.model} ({family.name} family) has no workload {case.workload!r}; choose {', '.join(family.workloads)}{where}")
    for name, unset in TRAINING_VARIANTS.items():
        if getattr(case, name) != unset and name not in family.variants:
            owners = " and ".join(f.name for f in FAMILIES.values() if name in f.variants)
            raise PerflabError(f"{FLAG[name]} applies to models of the {owners} family, not {case.model} ({family.name} family)")
    _validate_parallel(case, family)
    from perflab.workloads.implementations import implementation

    return implementation(case).validate(case)


def resolve_family(case: Case) -> Case:
    """The case with its family known and checked: perflab's own names imply theirs (a different --family is an
    error); a reference states it (hf: architectures), or the workload names it, or the built module shows it."""
    if case.family is not None and case.family not in FAMILIES:
        raise PerflabError(f"unknown family {case.family!r}; choose {', '.join(FAMILIES)}")
    if not case.is_reference:
        implied = family_of(case.model).name
        if case.family != implied:
            raise PerflabError(f"{case.model} is a model of the {implied} family; --family {case.family} does not apply to it")
        return case
    from perflab.models.reference import infer_family
    from perflab.references import declared_family, parse_reference

    parse_reference(case.model)  # a malformed reference is one clear error
    declared = declared_family(case.model)
    if case.family is not None:
        if declared is not None and not (declared == case.family or (declared, case.family) == ("lm", "decode")):
            raise PerflabError(f"{case.model} is a {declared} model by its config's architectures; --family {case.family} does not apply")
        return case
    owners = [f.name for f in FAMILIES.values() if case.workload in f.workloads]
    if declared is None and len(owners) == 1:  # a workload of one family names it
        family = owners[0]
    else:  # the config's architectures (with its workload), or the built module
        family = infer_family(case.model, dict(case.model_args), case.workload)
    fields_ = {f.name: getattr(case, f.name) for f in fields(Case)}
    return Case(**dict(fields_, family=family))
def _foreign_fields(case: Case) -> dict:
    """Shape fields set on a case whose family does not own them (to_dict drops them; validation refuses them)."""
    family = case.family_spec
    out = {}
    for name, empty in SHAPE_FIELDS.items():
        if name not in family.fields and getattr(case, name) != empty:
            out[name] = getattr(case, name)
    if "model_args" in out:
        out["model_args"] = dict(out["model_args"])
    return out


def _family_models(name: str) -> str:
    return {"classify": "ViT/DeiT, timm:*", "lm": "gpt_*", "decode": "llama*"}[name] + ", or your own model with --family " + name


def _foreign_message(case: Case, family, name: str) -> str:
    owners = [f.name for f in FAMILIES.values() if name in f.fields]
    owner = f"; it applies to the {' and '.join(owners)} famil{'ies' if len(owners) > 1 else 'y'} ({', '.join(_family_models(o) for o in owners)})" if owners else ""
    return f"{FLAG[name]} does not apply to {case.model}, a model of the {family.name} family{owner}"


def expand_grid(base: dict[str, Any], grid: dict[str, Iterable]) -> list[dict[str, Any]]:
    """The product of the grid's value lists over a base dict (later keys vary fastest)."""
    keys = list(grid)
    out = []
    for values in itertools.product(*(list(grid[k]) for k in keys)):
        d = dict(base)
        d.update(zip(keys, values))
        out.append(d)
    return out
