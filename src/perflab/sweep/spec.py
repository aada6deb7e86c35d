"""Experiment specs: a YAML file → validated cases, named comparisons and break-even analyses.

A spec (loaded with ``yaml.safe_load``; nothing in it runs as code)::

    name: token_reduction                 # optional; the report's title
    description: ...                      # optional
    out: runs/token_reduction             # output dir, relative to the working directory (--out wins)
    defaults:                             # Case fields shared by every case
      device: cuda
      keep_rate: 0.1                      # keep_rate/reduction_loc apply to the token-reducing models only
      reduction_loc: [3, 6, 9]
    harness:                              # the repeats policy for every case, and the per-case time limit
      warmup: 10
      min_time: 1.0
      repeats: 20
      timeout_s: 600
      profile_steps: 3                    # optional: after timing, profile 3 steps per case (GPU) and keep the per-pass
                                          # kernel breakdown in the row (traces in OUT/traces/)
      ncu_top: 4                          # optional: then Nsight Compute on the case's top 4 kernels (DRAM %, GB/s)...
      ncu_where: {batch_size: 1}          # ...for the cases matching these fields only (a value or a list each)
      pin: false                          # optional: time unpinned (default: the timing thread on one core; not in case ids)
    grid:                                 # a product over any Case fields; or a list of such products
      model: [deit_base_patch16_224, topk_deit_base_patch16_224]
      batch_size: [1, 2, 4]
    cases:                                # explicit extra cases (Case fields over the defaults)
      - {model: deit_base_patch16_224, input_size: 384}
    across_gpus: false                    # Ray engine: every case on every GPU type of the cluster, once each
    comparisons:                          # named baseline-vs-variant pairs for the report
      tr_vs_baseline: {baseline: deit_base_patch16_224, variant: topk_deit_base_patch16_224}
      graphs: {baseline: {mode: eager}, variant: {mode: cudagraph}, labels: [eager, CUDA graph]}
    breakeven:                            # one mapping or a list; lists in batch_size/dtype/mode multiply
      model: deit_base_patch16_224
      variant: topk_deit_base_patch16_224
      input_sizes: "160:640:32"           # start:stop:step (stop included), or a list
      batch_size: 8

``gpu: H100`` (in defaults, a grid or a case) pins cases to a GPU type on a Ray cluster. It is a
scheduling field, not a Case field: a case's id is the same on every GPU, and the store tells the rows
apart by their environment key (which names the GPU).

Every mistake raises PerflabError as one line naming the file and the key
(``experiments/x.yaml: grid.batch_size: expected a list of integers, got 'abc'``).

A validated experiment serialises to JSON (``to_json``/``from_json``) without needing torch, so that
reports can be written from a store on any machine.
"""

from __future__ import annotations

import difflib
import json
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from perflab.errors import PerflabError
from perflab.spec import ATTN_IMPLS, DTYPES, MODES, Case, convert_field, expand_grid

CASE_FIELDS = tuple(f.name for f in fields(Case))
SCHEDULING_FIELDS = ("gpu",)  # where a case runs (Ray engine), not what it is: not part of its id
SPEC_CASE_FIELDS = CASE_FIELDS + SCHEDULING_FIELDS
REDUCTION_FIELDS = ("keep_rate", "reduction_loc")
HARNESS_FIELDS = ("warmup", "min_time", "iters", "repeats")
PASS_KEYS = ("timeout_s", "profile_steps", "ncu_top", "ncu_where", "pin")  # harness keys about the sweep, not the cases
TOP_KEYS = ("name", "description", "out", "defaults", "harness", "grid", "cases", "comparisons", "breakeven", "across_gpus")
COMPARISON_KEYS = ("baseline", "variant", "labels")
BREAKEVEN_KEYS = ("name", "model", "variant", "input_sizes") + tuple(f for f in CASE_FIELDS if f not in ("model", "input_size"))
BREAKEVEN_MULTI = ("batch_size", "dtype", "mode")  # lists here give one analysis per combination
DEFAULT_TIMEOUT_S = 600.0
PATCH_SIZE = 16

# What each Case field holds, as said in error messages.
_KIND = {
    "model": "a model name", "input_size": "an integer", "batch_size": "an integer", "warmup": "an integer",
    "repeats": "an integer", "seed": "an integer", "iters": "an integer or null", "min_time": "a number",
    "keep_rate": "a number or a list of numbers", "reduction_loc": "a list of integers", "attn": "a string",
    "dtype": "a string", "mode": "a string", "device": "a string", "workload": "a workload name", "seq_len": "an integer",
    "prompt_len": "an integer", "context_len": "an integer", "new_tokens": "an integer", "layers": "an integer",
    "layers_only": "true or false", "model_args": "a mapping of dimensions to numbers", "max_memory": "a size such as 24GiB",
    "gpu": "a GPU type, e.g. H100",
}
_PLURAL = {
    "model": "model names", "input_size": "integers", "batch_size": "integers", "warmup": "integers",
    "repeats": "integers", "seed": "integers", "iters": "integers", "min_time": "numbers",
    "keep_rate": "keep rates (numbers, or lists of numbers)", "reduction_loc": "location lists, e.g. [[3, 6, 9]]",
    "attn": "strings", "dtype": "strings", "mode": "strings", "device": "strings", "workload": "workload names",
    "seq_len": "integers", "prompt_len": "integers", "context_len": "integers", "new_tokens": "integers", "layers": "integers",
    "layers_only": "booleans", "model_args": "mappings", "max_memory": "sizes", "gpu": "GPU types, e.g. [H100, H200]",
}
_CHOICES = {"dtype": DTYPES, "mode": MODES, "attn": ATTN_IMPLS, "device": ("cuda", "cpu", "auto")}


@dataclass(frozen=True)
class Comparison:
    """A baseline and a variant, each a filter over case fields; rows pair where all other fields agree."""

    name: str
    baseline: dict
    variant: dict
    labels: tuple[str, str] = ("Baseline", "Variant")

    @property
    def named_fields(self) -> set[str]:
        return set(self.baseline) | set(self.variant)

    def side(self, row: dict) -> str | None:
        case = case_fields(row)
        if _matches(case, self.baseline):
            return "baseline"
        if _matches(case, self.variant):
            return "variant"
        return None

    def pair_key(self, row: dict) -> tuple:
        """The fields a baseline and its variant must share: all but the named ones and the harness policy.

        When the model is what differs, its keep rate and reduction locations differ with it.
        """
        ignored = self.named_fields | set(HARNESS_FIELDS)
        if "model" in ignored:
            ignored |= set(REDUCTION_FIELDS)
        case = case_fields(row)
        return tuple((k, _hashable(case.get(k))) for k in CASE_FIELDS if k not in ignored)

    def pairs(self, rows: list[dict]) -> list[tuple[dict, dict]]:
        """(baseline row, variant row) for each variant row that has a baseline at the same point."""
        baselines = {}
        for row in rows:
            if self.side(row) == "baseline":
                baselines.setdefault(self.pair_key(row), row)
        out = []
        for row in rows:
            if self.side(row) == "variant" and self.pair_key(row) in baselines:
                out.append((baselines[self.pair_key(row)], row))
        return out

    def to_json(self) -> dict:
        return {"name": self.name, "baseline": self.baseline, "variant": self.variant, "labels": list(self.labels)}

    @classmethod
    def from_json(cls, data: dict) -> "Comparison":
        return cls(data["name"], dict(data["baseline"]), dict(data["variant"]), tuple(data.get("labels") or ("Baseline", "Variant")))


@dataclass(frozen=True)
class Breakeven:
    """A break-even analysis: the baseline and the variant at each input size (ascending), all else fixed."""

    name: str
    baseline: tuple[Case, ...]
    variant: tuple[Case, ...]
    patch_size: int = PATCH_SIZE

    @property
    def cases(self) -> tuple[Case, ...]:
        return self.baseline + self.variant

    def to_json(self) -> dict:
        return {
            "name": self.name, "patch_size": self.patch_size,
            "baseline": [c.to_dict() for c in self.baseline], "variant": [c.to_dict() for c in self.variant],
        }

    @classmethod
    def from_json(cls, data: dict) -> "Breakeven":
        return cls(
            data["name"], tuple(_case_from_json(c) for c in data["baseline"]),
            tuple(_case_from_json(c) for c in data["variant"]), int(data.get("patch_size", PATCH_SIZE)),
        )


@dataclass(frozen=True)
class Experiment:
    source: str  # the spec file, as given (or a description of where the spec came from)
    name: str
    description: str
    out: str | None
    timeout_s: float
    cases: tuple[Case, ...]
    comparisons: tuple[Comparison, ...] = ()
    breakevens: tuple[Breakeven, ...] = ()
    text: str = ""  # the spec as written, for the report
    profile_steps: int = 0  # profile pass per case after timing (0: none)
    ncu_top: int = 0  # ncu on this many top kernels per case after timing (0: none)
    ncu_where: tuple[tuple[str, tuple], ...] = ()  # (Case field, allowed values): the cases that get the ncu pass
    gpu_pins: tuple[tuple[str, str], ...] = ()  # (case id, GPU type): run that case on that GPU type (Ray engine)
    across_gpus: bool = False  # run each case not pinned on every GPU type of the cluster (Ray engine)
    pin: bool = True  # pin each worker's timing thread to one core (measure.pinning); a run option, not in case ids
    model_root: str = ""  # the spec's directory: relative model references (file.py:NAME, hf:DIR) are read against it

    @property
    def names_references(self) -> bool:
        """Whether a case names a user's model (workers must then import it, from ``model_root``)."""
        return any(c.is_reference for c in self.cases)

    def wants_ncu(self, case: Case) -> bool:
        """Whether ``case`` gets the spec's ncu pass."""
        return bool(self.ncu_top) and all(_plain(getattr(case, k)) in [_plain(x) for x in v] for k, v in self.ncu_where)

    def pins(self, case: Case) -> list[str]:
        """The GPU types ``case`` is pinned to (empty: any GPU)."""
        return [gpu for case_id, gpu in self.gpu_pins if case_id == case.id]

    def to_json(self) -> dict:
        return {
            "source": self.source, "name": self.name, "description": self.description, "out": self.out,
            "timeout_s": self.timeout_s, "profile_steps": self.profile_steps,
            "ncu_top": self.ncu_top, "ncu_where": {k: list(v) for k, v in self.ncu_where}, "cases": [c.to_dict() for c in self.cases],
            "comparisons": [c.to_json() for c in self.comparisons], "breakeven": [b.to_json() for b in self.breakevens],
            "gpu_pins": [list(p) for p in self.gpu_pins], "across_gpus": self.across_gpus, "pin": self.pin, "model_root": self.model_root,
        }

    @classmethod
    def from_json(cls, data: dict, text: str = "") -> "Experiment":
        return cls(
            source=data.get("source", ""), name=data.get("name", ""), description=data.get("description", ""),
            out=data.get("out"), timeout_s=float(data.get("timeout_s", DEFAULT_TIMEOUT_S)),
            cases=tuple(_case_from_json(c) for c in data.get("cases", [])),
            comparisons=tuple(Comparison.from_json(c) for c in data.get("comparisons", [])),
            breakevens=tuple(Breakeven.from_json(b) for b in data.get("breakeven", [])),
            text=text, profile_steps=int(data.get("profile_steps", 0)), ncu_top=int(data.get("ncu_top", 0)),
            ncu_where=tuple((k, tuple(v)) for k, v in (data.get("ncu_where") or {}).items()),
            gpu_pins=tuple((str(c), str(g)) for c, g in data.get("gpu_pins", [])),
            across_gpus=bool(data.get("across_gpus", False)), pin=bool(data.get("pin", True)), model_root=str(data.get("model_root") or ""),
        )


def _plain(value):
    return list(value) if isinstance(value, tuple) else value


def case_fields(row: dict) -> dict:
    """The case fields of a result row (rows carry them under ``case``; bare rows have them at the top)."""
    return row.get("case") or row


def _case_from_json(data: dict) -> Case:
    data = dict(data)
    for key in REDUCTION_FIELDS:
        data[key] = tuple(data.get(key) or ())
    return Case(**data)


def _hashable(value):
    return tuple(value) if isinstance(value, list) else value


def _matches(case: dict, filt: dict) -> bool:
    return all(_hashable(case.get(k)) == _hashable(v) for k, v in filt.items())


# ---------------------------------------------------------------------------------------------------
# Loading


DEFAULT_MAX_CASES = 10_000


def load_experiment(path, max_cases: int | None = None) -> Experiment:
    """Read, check and expand a spec file; PerflabError (one line naming file and key) on any mistake.
    A spec of more than ``max_cases`` cases is refused before its grid is expanded."""
    import yaml

    source = str(path)
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise PerflabError(f"{source}: no such spec file") from None
    except OSError as exc:
        raise PerflabError(f"{source}: cannot read the spec ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise PerflabError(f"{source}: not a text file (a spec is UTF-8 YAML)") from None
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise PerflabError(f"{source}: YAML syntax error{where}: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise PerflabError(f"{source}: YAML error: {' '.join(str(exc).split())}") from None
    from dataclasses import replace

    from perflab.references import using_model_root

    root = str(Path(path).resolve().parent)
    with using_model_root(root):  # file.py:NAME and hf:DIR in a spec are relative to the spec
        experiment = parse_experiment(data, source, text=text, default_name=Path(path).stem, max_cases=max_cases)
    return replace(experiment, model_root=root)


def _check_case_count(p: "_Parser", data: dict, max_cases: int) -> None:
    """Refuse a spec whose grids and cases come to more than ``max_cases``, counted, not expanded (a grid
    of three long lists can be millions of cases: expanding it first takes minutes and gigabytes)."""
    count = len(data["cases"]) if isinstance(data.get("cases"), list) else 0
    for _, block in p.grid_blocks(data.get("grid")):
        product = 1
        for value in block.values():
            product *= len(value) if isinstance(value, list) and value else 1
        count += product
    if count > max_cases:
        p.fail("grid", f"{count:,} cases, over --max-cases {max_cases:,}; split the grid, or raise --max-cases")


def parse_experiment(data: Any, source: str, text: str = "", default_name: str = "experiment", max_cases: int | None = None) -> Experiment:
    """Check and expand a spec already read into plain data (from YAML, or built in code)."""
    p = _Parser(source)
    if data is None:
        p.fail("", "the spec is empty; give at least a grid, cases or a breakeven section")
    if not isinstance(data, dict):
        p.fail("", f"the spec must be a mapping of keys ({', '.join(TOP_KEYS)}), got {_type_name(data)}")
    p.check_keys("", data, TOP_KEYS)
    name = p.string("name", data.get("name", default_name))
    description = p.string("description", data.get("description", "") or "")
    out = p.string("out", data["out"]) if data.get("out") is not None else None
    harness = p.mapping("harness", data.get("harness", {}))
    p.check_keys("harness", harness, HARNESS_FIELDS + PASS_KEYS)
    timeout_s = p.positive_number("harness.timeout_s", harness.get("timeout_s", DEFAULT_TIMEOUT_S))
    profile_steps = harness.get("profile_steps", 0)
    if isinstance(profile_steps, bool) or not isinstance(profile_steps, int) or profile_steps < 0:
        p.fail("harness.profile_steps", f"expected a whole number of steps (0 for no profile pass), got {_show(profile_steps)}")
    ncu_top = harness.get("ncu_top", 0)
    if isinstance(ncu_top, bool) or not isinstance(ncu_top, int) or ncu_top < 0:
        p.fail("harness.ncu_top", f"expected a whole number of kernels (0 for no ncu pass), got {_show(ncu_top)}")
    pin = harness.get("pin", True)
    if not isinstance(pin, bool):
        p.fail("harness.pin", f"expected true or false, got {_show(pin)}")
    ncu_where = p.mapping("harness.ncu_where", harness.get("ncu_where") or {})
    p.check_keys("harness.ncu_where", ncu_where, CASE_FIELDS)
    ncu_where = tuple((k, tuple(p.value(f"harness.ncu_where.{k}", k, x) for x in (v if isinstance(v, list) else [v])))
                      for k, v in ncu_where.items())
    defaults = p.mapping("defaults", data.get("defaults", {}))
    p.check_keys("defaults", defaults, SPEC_CASE_FIELDS)
    base = {}
    for key, value in harness.items():
        if key not in PASS_KEYS:
            base[key] = p.value(f"harness.{key}", key, value)
            p.origin[key] = "harness"
    for key, value in defaults.items():
        if key in base:
            p.fail(f"defaults.{key}", "also set under harness; give it once")
        base[key] = p.value(f"defaults.{key}", key, value)
        p.origin[key] = "defaults"
    base = p.resolve_device(base)

    sourced: list[tuple[str, dict]] = []  # (key the case came from, case fields)
    if max_cases is not None:
        _check_case_count(p, data, max_cases)
    for key, block in p.grid_blocks(data.get("grid")):
        sourced += p.expand_block(key, block, base)
    for i, entry in enumerate(p.sequence("cases", data.get("cases", []))):
        sourced.append(p.explicit_case(f"cases[{i}]", entry, base))
    breakevens = []
    for key, entry in p.breakeven_entries(data.get("breakeven")):
        for b, b_sourced in p.breakeven(key, entry, base):
            breakevens.append(b)
            sourced += b_sourced

    if not sourced:
        p.fail("", "no cases: give a grid, cases or a breakeven section")
    p.check_defaults_reduction(base, sourced)
    cases, pins = p.validate_all(sourced)
    breakevens = [p.validated_breakeven(b) for b in breakevens]
    comparisons = p.comparisons(data.get("comparisons"), cases)
    across = data.get("across_gpus", False)
    if not isinstance(across, bool):
        p.fail("across_gpus", f"expected true or false, got {_show(across)}")
    if across and not any(c.device == "cuda" for c in cases):
        p.fail("across_gpus", "the spec's cases run on the CPU; across_gpus runs CUDA cases on each GPU type")
    return Experiment(source, name, description, out, timeout_s, tuple(cases), tuple(comparisons), tuple(breakevens), text,
                      profile_steps, ncu_top, ncu_where, tuple(pins), across, pin)


def parse_input_sizes(value, where: str = "input_sizes") -> list[int]:
    """``"160:640:32"`` (start:stop:step, stop included), ``"224,448"``, an integer, or a list of integers."""
    if isinstance(value, str):
        text = value.strip()
        if ":" in text:
            parts = text.split(":")
            if len(parts) != 3 or not all(s.strip().lstrip("-").isdigit() for s in parts):
                raise PerflabError(f"{where}: expected start:stop:step (e.g. 160:640:32), got {value!r}")
            start, stop, step = (int(s) for s in parts)
            if step <= 0 or start > stop or start <= 0:
                raise PerflabError(f"{where}: expected 0 < start <= stop and step > 0, got {value!r}")
            return list(range(start, stop + 1, step))
        items = [s for s in text.replace(",", " ").split() if s]
        if not items or not all(s.isdigit() for s in items):
            raise PerflabError(f"{where}: expected start:stop:step or a list of integers, got {value!r}")
        return [int(s) for s in items]
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return list(value)
    raise PerflabError(f"{where}: expected start:stop:step (e.g. 160:640:32) or a list of integers, got {value!r}")


def default_comparisons(rows: list[dict]) -> list[Comparison]:
    """Without named comparisons: each token-reducing model (topk_X, evit_X) against X, where both ran."""
    models = {case_fields(r).get("model") for r in rows}
    out = []
    for model in sorted(m for m in models if m):
        method, _, base = model.partition("_")
        if method in ("topk", "evit") and base in models:
            out.append(Comparison(f"{model} vs {base}", {"model": base}, {"model": model}, ("Baseline", "TR")))
    return out


class _Parser:
    """Checks pieces of a spec; every failure names the file and the key."""

    def __init__(self, source: str):
        self.source = source
        self.given: dict[str, set] = {}  # section key → the case fields it sets (to blame the right key)
        self.origin: dict[str, str] = {}  # case field → "defaults" or "harness", where the base sets it

    def fail(self, key: str, message: str):
        where = f"{self.source}: {key}: " if key else f"{self.source}: "
        raise PerflabError(where + message)

    def check_keys(self, key: str, mapping: dict, known) -> None:
        for name in mapping:
            if name not in known:
                close = difflib.get_close_matches(str(name), list(known), n=1)
                hint = f"; did you mean {close[0]}?" if close else f"; known keys: {', '.join(known)}"
                self.fail(f"{key}.{name}" if key else str(name), f"unknown key{hint}")

    def mapping(self, key: str, value) -> dict:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.fail(key, f"expected a mapping of keys to values, got {_show(value)}")
        return value

    def sequence(self, key: str, value) -> list:
        if value is None:
            return []
        if not isinstance(value, list):
            self.fail(key, f"expected a list, got {_show(value)}")
        return value

    def string(self, key: str, value) -> str:
        if not isinstance(value, str):
            self.fail(key, f"expected a string, got {_show(value)}")
        return value

    def positive_number(self, key: str, value) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value > 0 and math.isfinite(value)):
            self.fail(key, f"expected a positive number of seconds, got {_show(value)}")
        return float(value)

    # -- values of Case fields

    def value(self, key: str, field: str, value):
        """One value of a Case field, type-checked by msgspec (Case.from_dict's rules) and normalised."""
        if field in ("model", "workload") or field in _CHOICES:
            if not isinstance(value, str):
                self.fail(key, f"expected {_KIND[field]}, got {_show(value)}")
            if field == "model":
                self.check_model(key, value)
            elif field in _CHOICES and value not in _CHOICES[field]:
                self.fail(key, f"unknown {field} {value!r}; choose one of {', '.join(_CHOICES[field])}")
            return value
        if field == "gpu":
            if not isinstance(value, str) or not value.strip():
                self.fail(key, f"expected {_KIND[field]}, got {_show(value)}")
            return value.strip()
        if field in ("keep_rate", "reduction_loc") and value == []:
            self.fail(key, f"expected {_KIND[field]}, got {_show(value)}")
        try:
            return convert_field(field, value)
        except PerflabError as exc:
            detail = str(exc) if field in ("model_args", "max_memory") else f"expected {_KIND[field]}, got {_show(value)}"
            self.fail(key, detail.removeprefix(f"{field}: "))

    def values(self, key: str, field: str, value) -> list:
        """The value list of a grid key. A single value of the right type counts as a list of one."""
        if field == "reduction_loc":
            if not isinstance(value, list) or not value or not all(isinstance(v, list) for v in value):
                self.fail(key, f"expected a list of {_PLURAL[field]}, got {_show(value)} (one schedule for every case: put it under defaults)")
        if not isinstance(value, list):
            if isinstance(value, type(None)) or (isinstance(value, dict) and field != "model_args") or (
                    field not in ("model", "attn", "dtype", "mode", "device", "workload", "max_memory", "gpu") and isinstance(value, str)):
                self.fail(key, f"expected a list of {_PLURAL[field]}, got {_show(value)}")
            value = [value]
        if not value:
            self.fail(key, "empty list; give at least one value")
        out = []
        for v in value:
            try:
                out.append(self.value(key, field, v))
            except PerflabError:
                if field in ("model", "attn", "dtype", "mode", "device", "workload", "max_memory", "model_args"):
                    raise  # the specific message (unknown model, did you mean ...) says more
                self.fail(key, f"expected a list of {_PLURAL[field]}, got {_show(value)}")
        return out

    def check_model(self, key: str, name: str) -> None:
        from perflab.models.registry import parse_model_name

        try:
            parse_model_name(name)
        except PerflabError as exc:
            self.fail(key, str(exc))

    def resolve_device(self, d: dict) -> dict:
        """``device: auto`` → cuda where a GPU is usable, else cpu (as ``bench --device auto``)."""
        if d.get("device") == "auto":
            from perflab.runtime.device import resolve_device

            d = dict(d, device=resolve_device("auto"))
        return d

    # -- sections

    def grid_blocks(self, grid) -> list[tuple[str, dict]]:
        if grid is None:
            return []
        if isinstance(grid, dict):
            if not grid:
                self.fail("grid", "empty grid; give at least one key with a list of values")
            return [("grid", grid)]
        if isinstance(grid, list):
            if not grid:
                self.fail("grid", "empty list of grids")
            blocks = []
            for i, block in enumerate(grid):
                if not isinstance(block, dict) or not block:
                    self.fail(f"grid[{i}]", f"expected a non-empty mapping of case fields to value lists, got {_show(block)}")
                blocks.append((f"grid[{i}]", block))
            return blocks
        self.fail("grid", f"expected a mapping of case fields to value lists (or a list of such mappings), got {_show(grid)}")

    def expand_block(self, key: str, block: dict, base: dict) -> list[tuple[str, dict]]:
        self.check_keys(key, block, SPEC_CASE_FIELDS)
        self.given[key] = set(block)
        grid = {field: self.values(f"{key}.{field}", field, value) for field, value in block.items()}
        if "device" in grid:
            grid["device"] = [self.resolve_device({"device": v})["device"] for v in grid["device"]]
        models = grid.get("model") or ([base["model"]] if "model" in base else [])
        if not models:
            self.fail(f"{key}.model", "no model: give model in the grid or under defaults")
        # As api.make_cases: keep rates in a grid apply to its token-reducing models; with none, they stay
        # (and validation says they do nothing).
        block_reducing = any(_reduces(m) for m in models)
        own_reduction = {f: grid.pop(f) for f in REDUCTION_FIELDS if f in grid}
        out = []
        for d in expand_grid(_without_reduction(base), grid):
            reducing = _reduces(d["model"])
            if reducing:
                d.update({f: base[f] for f in REDUCTION_FIELDS if f in base})
            out_dicts = [d]
            if own_reduction and (reducing or not block_reducing):
                out_dicts = expand_grid(d, own_reduction)
            out += [(key, x) for x in out_dicts]
        return out

    def explicit_case(self, key: str, entry, base: dict) -> tuple[str, dict]:
        entry = self.mapping(key, entry)
        self.check_keys(key, entry, SPEC_CASE_FIELDS)
        self.given[key] = set(entry)
        d = dict(_without_reduction(base))
        d.update({field: self.value(f"{key}.{field}", field, value) for field, value in entry.items()})
        if "model" not in d:
            self.fail(f"{key}.model", "no model: give model in the case or under defaults")
        d = self.resolve_device(d)
        if _reduces(d["model"]):
            for f in REDUCTION_FIELDS:
                if f not in entry and f in base:
                    d[f] = base[f]
        return key, d

    def check_defaults_reduction(self, base: dict, sourced: list[tuple[str, dict]]) -> None:
        if any(f in base for f in REDUCTION_FIELDS) and not any(_reduces(d["model"]) for _, d in sourced):
            field = next(f for f in REDUCTION_FIELDS if f in base)
            self.fail(f"defaults.{field}", "no model in this spec reduces tokens, so keep rates do nothing; add a topk_/evit_ model or remove it")

    def validate_all(self, sourced: list[tuple[str, dict]]) -> tuple[list[Case], list[tuple[str, str]]]:
        """The distinct cases, and the (case id, GPU type) pins of those given a ``gpu``."""
        cases, seen, pins = [], set(), []
        for key, d in sourced:
            d = dict(d)
            gpu = d.pop("gpu", None)
            case = self.validated(key, d)
            if gpu is not None:
                if case.device != "cuda":
                    self.fail(f"{key}.gpu" if "gpu" in self.given.get(key, ()) else "defaults.gpu",
                              f"{case.label()} runs on the {case.device}; gpu: pins CUDA cases to a GPU type")
                if (case.id, gpu) not in pins:
                    pins.append((case.id, gpu))
            if case.id not in seen:  # the same case from two places runs once
                seen.add(case.id)
                cases.append(case)
        return cases, pins

    def validated(self, key: str, d: dict) -> Case:
        from perflab.spec import validate_case

        case = Case(**d)
        try:
            return validate_case(case)
        except PerflabError as exc:
            self.fail(self.blame(key, str(exc)), f"{case.label()}: {exc}")

    def blame(self, key: str, message: str) -> str:
        """The key that most likely set the field a validation message is about."""
        field = next((f for words, f in _MESSAGE_FIELDS if any(w in message for w in words)), None)
        if field is None:
            return key
        if field in self.given.get(key, ()):
            return f"{key}.{field}" if not key.startswith("breakeven") or field != "input_size" else f"{key}.input_sizes"
        if field in self.origin:
            return f"{self.origin[field]}.{field}"
        return key

    def breakeven_entries(self, section) -> list[tuple[str, dict]]:
        if section is None:
            return []
        if isinstance(section, dict):
            return [("breakeven", section)]
        if isinstance(section, list) and section:
            return [(f"breakeven[{i}]", self.mapping(f"breakeven[{i}]", e)) for i, e in enumerate(section)]
        self.fail("breakeven", f"expected a mapping (or a non-empty list of mappings) with model, variant, input_sizes and batch_size, got {_show(section)}")

    def breakeven(self, key: str, entry: dict, base: dict):
        self.check_keys(key, entry, BREAKEVEN_KEYS)
        self.given[key] = {"input_size" if f == "input_sizes" else f for f in entry} | {"model"}
        for required in ("model", "variant", "input_sizes"):
            if required not in entry:
                self.fail(f"{key}.{required}", "missing; a break-even needs model, variant and input_sizes")
        model = self.value(f"{key}.model", "model", entry["model"])
        variant = self.value(f"{key}.variant", "model", entry["variant"])
        try:
            sizes = sorted(set(parse_input_sizes(entry["input_sizes"], f"{key}.input_sizes")))
        except PerflabError as exc:
            self.fail("", str(exc))
        if len(sizes) < 3:
            self.fail(f"{key}.input_sizes", f"a quadratic cost fit needs at least 3 input sizes, got {sizes}")
        common = dict(_without_reduction(base))
        reduction = {f: base[f] for f in REDUCTION_FIELDS if f in base}
        multi = {}
        for field, value in entry.items():
            if field in ("name", "model", "variant", "input_sizes"):
                continue
            if field in BREAKEVEN_MULTI and isinstance(value, list):
                multi[field] = self.values(f"{key}.{field}", field, value)
            elif field in REDUCTION_FIELDS:
                reduction[field] = self.value(f"{key}.{field}", field, value)
            else:
                common[field] = self.value(f"{key}.{field}", field, value)
        common = self.resolve_device(common)
        gpu = common.pop("gpu", None)  # a scheduling field: kept beside the cases, not in them
        results = []
        for d in expand_grid(common, multi):
            base_cases = [dict(d, model=model, input_size=s) for s in sizes]
            var_cases = [dict(d, model=variant, input_size=s, **(reduction if _reduces(variant) else {})) for s in sizes]
            if _reduces(model):
                base_cases = [dict(c, **reduction) for c in base_cases]
            label = entry.get("name") or f"{variant} vs {model}, bs{d.get('batch_size', 1)}, {d.get('dtype', 'fp32')}, {d.get('mode', 'eager')}"
            if entry.get("name") and multi:
                label += " (" + ", ".join(f"{k} {d[k]}" for k in multi) + ")"
            b = Breakeven(str(label), tuple(Case(**c) for c in base_cases), tuple(Case(**c) for c in var_cases))
            results.append((b, [(key, dict(c, gpu=gpu) if gpu else c) for c in base_cases + var_cases]))
        return results

    def validated_breakeven(self, b: Breakeven) -> Breakeven:
        # Validation normalises fields (sorted locations), so re-derive the cases to get the stored ids.
        from perflab.spec import validate_case

        return Breakeven(b.name, tuple(validate_case(c) for c in b.baseline), tuple(validate_case(c) for c in b.variant), b.patch_size)

    def comparisons(self, section, cases: list[Case]) -> list[Comparison]:
        if section is None:
            return []
        section = self.mapping("comparisons", section)
        rows = [{"case": c.to_dict()} for c in cases]
        out = []
        for name, entry in section.items():
            key = f"comparisons.{name}"
            entry = self.mapping(key, entry)
            self.check_keys(key, entry, COMPARISON_KEYS)
            for side in ("baseline", "variant"):
                if side not in entry:
                    self.fail(f"{key}.{side}", "missing; give a model name or a mapping of case fields")
            baseline = self.filter(f"{key}.baseline", entry["baseline"])
            variant = self.filter(f"{key}.variant", entry["variant"])
            if baseline == variant:
                self.fail(key, "baseline and variant are the same")
            labels = entry.get("labels")
            if labels is None:
                labels = _default_labels(baseline, variant)
            elif not (isinstance(labels, list) and len(labels) == 2 and all(isinstance(x, str) for x in labels)):
                self.fail(f"{key}.labels", f"expected two strings [baseline label, variant label], got {_show(labels)}")
            comparison = Comparison(str(name), baseline, variant, tuple(labels))
            if not comparison.pairs(rows):
                self.fail(key, "no case matches both sides at the same point (same sizes, dtype, mode, ...); check the filters against the grid")
            out.append(comparison)
        return out

    def filter(self, key: str, value) -> dict:
        if isinstance(value, str):
            value = {"model": value}
        value = self.mapping(key, value)
        if not value:
            self.fail(key, "empty filter; give a model name or case fields")
        self.check_keys(key, value, CASE_FIELDS)
        out = {}
        for field, v in value.items():
            v = self.value(f"{key}.{field}", field, v)
            out[field] = list(v) if isinstance(v, tuple) else v
        return out


# Words in validate_case's messages → the case field they are about.
_MESSAGE_FIELDS = (
    (("input size",), "input_size"),
    (("batch size",), "batch_size"),
    (("keep rate", "--keep-rate", "keep rates"), "keep_rate"),
    (("reduction location",), "reduction_loc"),
    (("warmup",), "warmup"),
    (("repeats",), "repeats"),
    (("iters",), "iters"),
    (("min-time",), "min_time"),
    (("cudagraph needs", "cannot run the"), "mode"),
    (("sequence length",), "seq_len"),
    (("context", "cache position"), "context_len"),
    (("--prompt-len", "prompt length"), "prompt_len"),
    (("--new-tokens", "new tokens"), "new_tokens"),
    (("--layers",), "layers"),
    (("--model-arg",), "model_args"),
    (("has no workload",), "workload"),
)


def _default_labels(baseline: dict, variant: dict) -> tuple[str, str]:
    if set(baseline) == set(variant) == {"model"} and _reduces(variant["model"]) and not _reduces(baseline["model"]):
        return ("Baseline", "TR")
    return (_filter_label(baseline), _filter_label(variant))


def _filter_label(filt: dict) -> str:
    return ", ".join(str(v) if not isinstance(v, list) else "/".join(map(str, v)) for v in filt.values())


def _without_reduction(d: dict) -> dict:
    return {k: v for k, v in d.items() if k not in REDUCTION_FIELDS}


def _reduces(model: str) -> bool:
    from perflab.models.registry import parse_model_name

    return parse_model_name(model).reduces_tokens


def _type_name(value) -> str:
    return {dict: "a mapping", list: "a list", str: "a string"}.get(type(value), type(value).__name__)


def _show(value) -> str:
    text = json.dumps(value) if isinstance(value, (list, dict)) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
