"""The experiment file's schema: msgspec Structs, decoded in one pass, every mistake one line naming the key path.

The Case fields a spec may set come from their declarations: each field's ``spec`` in ``perflab.spec.CASE_FIELDS``
(the fields every case has first, then each family's own, ``FamilySpec.fields`` and ``.variants``), and
``SCHEDULING_FIELDS`` below for where a case runs. A new field is one line in that table; the schema, the grid's
types, the messages and ``perflab spec-schema`` follow. The sections' own keys (harness,
comparisons, breakeven, the top level) are the Structs below.

``decode`` checks types and key names in one pass, then each Case-field value's meaning (a model perflab can build, a
size that parses) and hands back a ``Spec`` of normalised values; whether a whole case can run is
``perflab.sweep.spec``'s part, after this. ``json_schema`` is the JSON Schema an editor validates against.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, replace
import re
import types
from typing import Annotated, Any, ClassVar, Union, get_args, get_origin, get_type_hints

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from perflab.errors import PerflabError, show
from perflab.spec import CASE_FIELDS, INT64_MAX, Case, SpecField, convert_field, parse_parallel
from perflab.workloads import FAMILIES

SCHEDULING_FIELDS = {"gpu": SpecField(str, "a GPU type, e.g. H100", "GPU types, e.g. [H100, H200]")}  # not in case ids
BREAKEVEN_MULTI = ("batch_size", "dtype", "mode")  # lists here give one analysis per combination


def case_field_specs() -> dict[str, SpecField]:
    """Every Case field a spec may set, by name: the common ones, then each family's."""
    out = {name: f.spec for name, f in CASE_FIELDS.items() if not f.owners}
    for family in FAMILIES.values():
        out.update((name, CASE_FIELDS[name].spec) for name in family.fields + family.variants)
    return out


def _is_union(tp) -> bool:
    return get_origin(tp) in (Union, types.UnionType)


def _one(spec: SpecField):
    return Annotated[spec.type, Meta(description=spec.kind)]


def _grid(spec: SpecField, text: str = "", null: bool = False):
    """A grid's entry: a non-empty list of values, or one value (a list of one; not null, unless ``null``)."""
    one = Union[tuple(a for a in get_args(spec.type) if a is not type(None))] if _is_union(spec.type) and not null else spec.type
    tp = spec.grid if spec.grid is not None else Union[one, Annotated[list[spec.type], Meta(min_length=1)]]
    return Annotated[tp, Meta(description=text or f"a list of {spec.plural}")]


def _values(spec: SpecField):
    """ncu_where's entry: one value, or a list of values (each named in a message by its index)."""
    return _grid(spec) if spec.grid is not None else Union[_one(spec), list[_one(spec)]]


def _fields(specs: dict[str, SpecField], kind) -> list[tuple]:
    return [(name, kind(spec) | UnsetType, UNSET) for name, spec in specs.items()]


_HINTS = get_type_hints(Case)
# Case fields whose unset value is None (a shape the family fills in, no memory cap, ...) may be null in a spec.
_CASE = {name: replace(spec, type=spec.type | None) if name not in ("model", "workload", "family")
         and type(None) in get_args(_HINTS[name]) else spec for name, spec in case_field_specs().items()}
_SPEC_CASE = _CASE | SCHEDULING_FIELDS
_OPTS = dict(kw_only=True, forbid_unknown_fields=True, omit_defaults=True)

# A mapping of Case fields: the spec's defaults, an explicit case, one side of a comparison.
CaseFields = msgspec.defstruct("CaseFields", _fields(_SPEC_CASE, _one), **_OPTS)
CaseFilter = msgspec.defstruct("CaseFilter", _fields(_CASE, _one), **_OPTS)
# A grid: Case fields to value lists; its product is the cases. ncu_where: the values each field may take.
GridBlock = msgspec.defstruct("GridBlock", _fields(_SPEC_CASE, _grid), **_OPTS)
CaseValues = msgspec.defstruct("CaseValues", _fields(_CASE, _values), **_OPTS)


def _described(tp, text: str):
    return Annotated[tp, Meta(description=text)]


_WHOLE = Meta(ge=0, le=INT64_MAX)  # stored and handed on as signed 64-bit integers, as every integer of a spec
HARNESS_CASE_FIELDS = ("warmup", "min_time", "iters", "repeats")  # the repeats policy, as harness: gives it
_HARNESS_CASE = {k: _CASE[k] for k in HARNESS_CASE_FIELDS}


class _Harness(Struct, **_OPTS):
    timeout_s: _described(float, "a positive number of seconds") = 600.0
    profile_steps: _described(Annotated[int, _WHOLE], "a whole number of steps (0 for no profile pass)") = 0
    ncu_top: _described(Annotated[int, _WHOLE], "a whole number of kernels (0 for no ncu pass)") = 0
    ncu_where: _described(CaseValues | None, "a mapping of case fields to the values they may take") = None
    pin: _described(bool, "true or false") = True


Harness = msgspec.defstruct("Harness", _fields(_HARNESS_CASE, _one), bases=(_Harness,), **_OPTS)


class ComparisonEntry(Struct, **_OPTS):
    missing: ClassVar[str] = "missing; give a model name or a mapping of case fields"
    baseline: _described(str | CaseFilter, "a model name or a mapping of case fields")
    variant: _described(str | CaseFilter, "a model name or a mapping of case fields")
    labels: _described(Annotated[list[str], Meta(min_length=2, max_length=2)] | None,
                       "two strings [baseline label, variant label]") = None


class _Breakeven(Struct, **_OPTS):
    missing: ClassVar[str] = "missing; a break-even needs model, variant and input_sizes"
    model: _described(str, "a model name")
    variant: _described(str, "a model name")
    input_sizes: _described(str | int | list[int], "start:stop:step (e.g. 160:640:32) or a list of integers")
    name: _described(str | UnsetType, "a string") = UNSET


BreakevenEntry = msgspec.defstruct(
    "BreakevenEntry", [(name, (_grid(spec, f"{spec.kind} or a list of {spec.plural}", null=True) if name in BREAKEVEN_MULTI else _one(spec)) | UnsetType, UNSET)
                  for name, spec in _CASE.items() if name not in ("model", "input_size")],
    bases=(_Breakeven,), **_OPTS)

_MAPPING = "a mapping of keys to values"


class SpecFile(Struct, **_OPTS):
    """An experiment file (``perflab.sweep.spec`` documents its keys)."""

    name: _described(str | UnsetType, "a string") = UNSET
    description: _described(str | None, "a string") = None
    out: _described(str | None, "a string") = None
    defaults: _described(CaseFields | None, _MAPPING) = None
    harness: _described(Harness | None, _MAPPING) = None
    grid: _described(GridBlock | Annotated[list[_described(GridBlock, "a non-empty mapping of case fields to value lists")],
                                           Meta(min_length=1)] | None,
                     "a mapping of case fields to value lists (or a list of such mappings)") = None
    cases: _described(list[_described(CaseFields, _MAPPING)] | None, "a list") = None
    comparisons: _described(dict[str, _described(ComparisonEntry, _MAPPING)] | None, _MAPPING) = None
    breakeven: _described(BreakevenEntry | Annotated[list[_described(BreakevenEntry, _MAPPING)], Meta(min_length=1)] | None,
                          "a mapping (or a non-empty list of mappings) with model, variant, input_sizes and batch_size") = None
    across_gpus: _described(bool, "true or false") = False


def given(struct, raw: dict) -> dict[str, Any]:
    """The fields a spec set on a decoded Struct, in the order the file gives them (a grid's order is its cases')."""
    return {k: getattr(struct, k) for k in raw}


def json_schema() -> dict:
    """The JSON Schema of an experiment file, for editors (``perflab spec-schema``)."""
    schema = msgspec.json.schema(SpecFile)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "perflab experiment spec", **schema}


def decode(data: Any, source: str) -> "Spec":
    """A spec read into plain data (YAML) → its Spec, decoded in one pass and each Case-field value checked (a model
    that exists, a size that parses) and normalised; PerflabError, one line naming the file and key path."""
    if data is None:
        raise PerflabError(f"{source}: the spec is empty; give at least a grid, cases or a breakeven section")
    if not isinstance(data, dict):
        keys = ", ".join(SpecFile.__struct_fields__)
        raise PerflabError(f"{source}: the spec must be a mapping of keys ({keys}), got {_type_name(data)}")
    try:
        doc = msgspec.convert(data, SpecFile)
    except msgspec.ValidationError as exc:
        key, message = explain_validation_error(str(exc), data)
        raise PerflabError(f"{source}: {key}: {message}" if key else f"{source}: {message}") from None
    return _Values(source).spec(doc, data)


@dataclass(frozen=True)
class Spec:
    """A decoded spec: the file's Structs, and its Case-field values checked and normalised (Case types), each
    section's fields in the order the file gives them (a grid's order is its cases')."""

    file: SpecFile
    harness: dict  # the repeats policy fields given under harness
    defaults: dict
    ncu_where: tuple  # (field, allowed values)
    grids: list  # (key, {field: [values]}) per grid
    cases: list  # (key, {field: value}) per explicit case
    breakevens: list  # (key, {field: value, or [values] for batch_size/dtype/mode}) as given; name and input_sizes as written
    comparisons: list  # (name, baseline filter, variant filter, labels or None)
    reducing: frozenset  # the models named here that reduce tokens (keep rates apply to them)


class _Values:
    """Checks what each Case-field value of a decoded spec means, naming its key on a mistake."""

    def __init__(self, source: str):
        self.source, self.models = source, {}

    def fail(self, key: str, message: str):
        raise PerflabError(f"{self.source}: {key}: {message}")

    def value(self, key: str, field: str, value):
        if field == "model":
            self.models[value] = self.model(key, value)
        if field == "gpu":
            if not value.strip():
                self.fail(key, f"expected {SCHEDULING_FIELDS['gpu'].kind}, got {show(value)}")
            return value.strip()
        if field in ("keep_rate", "reduction_loc") and value == []:
            self.fail(key, f"expected {_CASE[field].kind}, got []")
        if field == "parallel" and value is not None:
            try:
                parse_parallel(value, flag=None)  # a mode and its options, as --parallel reads them
            except PerflabError as exc:
                self.fail(key, str(exc))
        if isinstance(value, str) and field != "max_memory":
            return value
        try:
            return convert_field(field, value)
        except PerflabError as exc:
            self.fail(key, str(exc).removeprefix(f"{field}: "))

    def model(self, key: str, name: str) -> bool:
        """Whether the named model reduces tokens; PerflabError naming the key for one perflab cannot build."""
        from perflab.models.registry import parse_model_name

        try:
            return parse_model_name(name).reduces_tokens
        except PerflabError as exc:
            self.fail(key, str(exc))

    def fields(self, key: str, struct, raw: dict, many=()) -> dict:
        """The fields a section gives, checked; those in ``many`` hold a value or a list of values (a list out)."""
        return {f: [self.value(f"{key}.{f}", f, x) for x in (v if isinstance(v, list) else [v])] if f in many
                else self.value(f"{key}.{f}", f, v) for f, v in given(struct, raw).items()}

    def spec(self, doc: SpecFile, data: dict) -> Spec:
        harness, raw = doc.harness or Harness(), data.get("harness") or {}
        policy = {k: self.value(f"harness.{k}", k, getattr(harness, k)) for k in raw if k in HARNESS_CASE_FIELDS}
        where = self.fields("harness.ncu_where", harness.ncu_where, raw["ncu_where"], many=_CASE) if harness.ncu_where else {}
        defaults = self.fields("defaults", doc.defaults, data["defaults"]) if doc.defaults else {}
        grids = [] if doc.grid is None else [("grid", doc.grid, data["grid"])] if not isinstance(doc.grid, list) else [
            (f"grid[{i}]", block, r) for i, (block, r) in enumerate(zip(doc.grid, data["grid"]))]
        grids = [(key, self.fields(key, block, r, many=_SPEC_CASE)) for key, block, r in grids]
        cases = [(f"cases[{i}]", self.fields(f"cases[{i}]", c, data["cases"][i])) for i, c in enumerate(doc.cases or ())]
        listed = isinstance(doc.breakeven, list)
        entries = zip(doc.breakeven, data["breakeven"]) if listed else [(doc.breakeven, data.get("breakeven"))] if doc.breakeven else []
        breakevens = []
        for i, (entry, r) in enumerate(entries):
            key = f"breakeven[{i}]" if listed else "breakeven"
            named = {"model": self.value(f"{key}.model", "model", entry.model), "variant": self.value(f"{key}.variant", "model", entry.variant)}
            named |= {f: r[f] for f in ("name", "input_sizes") if f in r}  # as written: input_sizes is read with the sizes
            multi = [f for f in BREAKEVEN_MULTI if isinstance(r.get(f), list)]
            checked = self.fields(key, entry, {f: v for f, v in r.items() if f not in named}, many=multi)
            breakevens.append((key, {f: named[f] if f in named else checked[f] for f in r}))
        comparisons = []
        for name, entry in (doc.comparisons or {}).items():
            sides = [self.side(f"comparisons.{name}.{side}", getattr(entry, side), data["comparisons"][name][side])
                     for side in ("baseline", "variant")]
            comparisons.append((name, *sides, entry.labels))
        return Spec(doc, policy, defaults, tuple((k, tuple(v)) for k, v in where.items()), grids, cases, breakevens, comparisons,
                    frozenset(m for m, reduces in self.models.items() if reduces))

    def side(self, key: str, value, raw) -> dict:
        """One side of a comparison: a model name, or case fields (lists where the case has tuples)."""
        filt = {"model": self.value(f"{key}.model", "model", value)} if isinstance(value, str) else self.fields(key, value, raw)
        if not filt:
            self.fail(key, "empty filter; give a model name or case fields")
        return {f: list(v) if isinstance(v, tuple) else v for f, v in filt.items()}


# ---------------------------------------------------------------------------------------------------
# msgspec's errors → the key path and a sentence


_AT = re.compile(r"^(.*?)(?: - at `(.*)`)?$", re.S)
_PART = re.compile(r"\.([^.\[]+)|\[(\d+)\]|\[\.\.\.\]")


def explain_validation_error(error: str, data) -> tuple[str, str]:
    """(key path, message) for a msgspec ValidationError's text on ``data`` (decoded into SpecFile)."""
    what, where = _AT.match(error).groups()
    where = where or "$"
    if where.startswith("`key` in"):
        return _render(_walk(where.removeprefix("`key` in `").rstrip("`"), data)[0]), "expected string keys"
    parts, tp, (at, value, text), leaf = _walk(where, data)
    if m := re.match(r"Object contains unknown field `(.*)`", what):
        known = list(_struct_of(tp).__struct_fields__)
        close = difflib.get_close_matches(m[1], known, n=1)
        hint = f"; did you mean {close[0]}?" if close else f"; known keys: {', '.join(known)}"
        return _render(parts + [m[1]]), f"unknown key{hint}"
    if m := re.match(r"Object missing required field `(.*)`", what):
        return _render(parts + [m[1]]), getattr(_struct_of(tp), "missing", "missing")
    path, field = _render(at), (at[-1] if at and isinstance(at[-1], str) else "")
    if what.startswith("Invalid enum value") and field in _CASE:
        bad = re.search(r"'(.*)'", what)
        return path, f"unknown {field} {show(bad[1] if bad else value)}; choose one of {', '.join(_enum(_CASE[field].type))}"
    if "length >= 1" in what and value == []:
        return path, "empty list; give at least one value"
    if text:  # inside a list or mapping the key holds, the place and the value that failed too
        inside = f" (at {_render(parts[len(at):])}: {show(leaf)})" if len(parts) > len(at) else ""
        return path, f"expected {text}, got {show(value)}{inside}"
    return _render(parts), what[0].lower() + what[1:].replace("`", "")


def _walk(where: str, data):
    """Follow a msgspec path ($.grid[0].batch_size) through SpecFile's types and the data: the path's parts, the
    type there, and (parts, value, description) of the deepest described key on the way, which errors name."""
    tp, value, parts = SpecFile, data, []
    described = ([], data, None)
    for m in _PART.finditer(where[1:]):
        name, index = m.group(1), m.group(2)
        tp = _pick(tp, value)
        if name is not None:
            tp = {f.name: f.type for f in msgspec.structs.fields(_struct_of(tp))}.get(name, Any)
            value = value.get(name) if isinstance(value, dict) else None
            parts.append(name)
        elif index is not None:
            tp = (get_args(tp) or (Any,))[0]
            value = value[int(index)] if isinstance(value, list) and int(index) < len(value) else None
            parts.append(int(index))
        else:  # a mapping's value: msgspec does not say which key, so find the first value that fails
            item_tp = get_args(tp)[1]
            key = next((k for k, v in value.items() if not _fits(v, item_tp)), "...")
            tp, value = item_tp, value.get(key)
            parts.append(str(key))
        if (text := _description(tp)) is not None:
            described = (list(parts), value, text)
    return parts, tp, described, value


def _fits(value, tp) -> bool:
    try:
        msgspec.convert(value, tp)
        return True
    except msgspec.ValidationError:
        return False


def _bare(tp):
    """The type without its Annotated metadata and without UNSET."""
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    args = [a for a in get_args(tp) if a is not UnsetType] if _is_union(tp) else None
    if args is not None and len(args) == 1:
        return _bare(args[0])
    return tp


def _pick(tp, value):
    """The member of a union type that a value of this shape decodes as."""
    tp = _bare(tp)
    if not _is_union(tp):
        return tp
    for member in get_args(tp):
        bare = _bare(member)
        if isinstance(value, dict) and (isinstance(bare, type) and issubclass(bare, Struct) or get_origin(bare) is dict):
            return bare
        if isinstance(value, list) and get_origin(bare) is list:
            return bare
    return tp


def _struct_of(tp):
    tp = _bare(tp)
    if isinstance(tp, type) and issubclass(tp, Struct):
        return tp
    for member in get_args(tp):
        member = _bare(member)
        if isinstance(member, type) and issubclass(member, Struct):
            return member
    return SpecFile


def _description(tp) -> str | None:
    while get_origin(tp) is Annotated:
        for meta in get_args(tp)[1:]:
            if isinstance(meta, Meta) and meta.description:
                return meta.description
        tp = get_args(tp)[0]
    if _is_union(tp):
        for member in get_args(tp):
            if (text := _description(member)) is not None:
                return text
    return None


def _enum(tp) -> tuple:
    for member in (get_args(tp) if _is_union(tp) else (tp,)):
        if get_args(member) and all(isinstance(a, str) for a in get_args(member)):
            return get_args(member)
    return ()


def _render(parts) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _type_name(value) -> str:
    return {dict: "a mapping", list: "a list", str: "a string"}.get(type(value), type(value).__name__)
