"""What to measure at the sweep floor, an experiment file of cases; ``spec.py`` is one case.

Experiment specs: a YAML file → validated cases, named comparisons and break-even analyses.

A spec (loaded with ``perflab.yaml_files.read_yaml``, safe tags only; nothing in it runs as code)::

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

The file is decoded once by its typed schema (``perflab.spec_schema``: types, key names, each value's meaning, the
key path of a mistake); this module reads it (``read_spec``) and expands the decoded spec into validated cases
(``expand``). Every mistake raises PerflabError as one line naming the file and the key
(``experiments/x.yaml: grid.batch_size: expected a list of integers, got 'abc'``).
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from perflab import spec_schema as schema
from perflab.errors import PerflabError, show
from perflab.spec import Case, expand_grid, validate_case
from perflab.sweep.experiment import (DEFAULT_TIMEOUT_S, REDUCTION_FIELDS, Breakeven, ComparisonSpec,  # noqa: F401 (re-exported)
                                     Experiment)
from perflab.yaml_files import read_yaml

DEFAULT_MAX_CASES = 10_000


def read_experiment(path, max_cases: int | None = None) -> Experiment:
    """Read, check and expand a spec file; PerflabError (one line naming file and key) on any mistake.
    A spec of more than ``max_cases`` cases is refused before its grid is expanded."""
    from perflab.references import using_model_root

    data, text = read_spec(path)
    root = str(Path(path).resolve().parent)
    with using_model_root(root):  # file.py:NAME and hf:DIR in a spec are relative to the spec
        experiment = parse_experiment(data, str(path), text=text, default_name=Path(path).stem, max_cases=max_cases)
    return replace(experiment, model_root=root)


def read_spec(path) -> tuple[Any, str]:
    """A spec file's YAML as plain data, and its text. A key given twice in one mapping is an error naming its path
    (YAML's loaders keep the last silently: two ``grid:`` keys would run the second alone)."""
    return read_yaml(path, "spec file", on_node=_refuse_duplicate_keys)


def _refuse_duplicate_keys(source: str, root) -> None:
    """PerflabError naming the key path of the first key a mapping gives twice. Each node is visited once, so an
    alias used many times (or an alias bomb) costs its size in the file, not its expanded size."""
    import yaml

    seen, stack = set(), [(root, "")]
    while stack:
        node, path = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first: dict = {}
            children = []
            for key_node, value_node in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # << merges defaults in; the mapping's own keys win, as meant
                    continue
                key = key_node.value if isinstance(key_node, yaml.ScalarNode) else show(key_node.value)
                where = f"{path}.{key}" if path else str(key)
                if key in first:
                    raise PerflabError(f"{source}: {where}: key given twice (lines {first[key] + 1} and {key_node.start_mark.line + 1}); "
                                       "YAML would keep the last silently, so give it once")
                first[key] = key_node.start_mark.line
                children.append((value_node, where))
            stack += reversed(children)
        elif isinstance(node, yaml.SequenceNode):
            stack += reversed([(item, f"{path}[{i}]") for i, item in enumerate(node.value)])


def parse_experiment(data: Any, source: str, text: str = "", default_name: str = "experiment", max_cases: int | None = None) -> Experiment:
    """Check and expand a spec already read into plain data (from YAML, or built in code)."""
    return expand(schema.decode(data, source), source, text=text, default_name=default_name, max_cases=max_cases)


def expand(spec: schema.Spec, source: str, text: str = "", default_name: str = "experiment", max_cases: int | None = None) -> Experiment:
    """A decoded spec (its values checked) → the Experiment: its grids expanded, its cases validated."""
    at, doc = _Where(source, spec.reducing), spec.file
    harness = doc.harness or schema.Harness()
    if not (0 < harness.timeout_s < float("inf")):
        at.fail("harness.timeout_s", f"expected a positive number of seconds, got {harness.timeout_s:g}")
    base = dict(spec.harness)
    at.origin.update(dict.fromkeys(spec.harness, "harness"))
    for key, value in spec.defaults.items():
        if key in base:
            at.fail(f"defaults.{key}", "also set under harness; give it once")
        base[key] = value
        at.origin[key] = "defaults"
    base = _resolve_device(base)
    for key, grid in spec.grids:
        if not grid:
            at.fail(key, "empty grid; give at least one key with a list of values" if key == "grid"
                    else "expected a non-empty mapping of case fields to value lists, got {}")
    if max_cases is not None:
        count = len(spec.cases) + sum(math.prod(len(v) for v in grid.values()) for _, grid in spec.grids)
        if count > max_cases:
            at.fail("grid", f"{count:,} cases, over --max-cases {max_cases:,}; split the grid, or raise --max-cases")
    sourced: list[tuple[str, dict]] = []  # (key the case came from, case fields)
    for key, grid in spec.grids:
        sourced += _expand_block(at, key, grid, base)
    sourced += [_explicit_case(at, key, entry, base) for key, entry in spec.cases]
    breakevens = []
    for key, entry in spec.breakevens:
        for b, b_sourced in _breakeven(at, key, entry, base):
            breakevens.append(b)
            sourced += b_sourced

    if not sourced:
        at.fail("", "no cases: give a grid, cases or a breakeven section")
    if any(f in base for f in REDUCTION_FIELDS) and not any(at.reduces(d["model"]) for _, d in sourced):
        field = next(f for f in REDUCTION_FIELDS if f in base)
        at.fail(f"defaults.{field}", "no model in this spec reduces tokens, so keep rates do nothing; add a topk_/evit_ model or remove it")
    cases, pins = _validate_all(at, sourced)
    # Validation normalises fields (sorted locations), so re-derive the break-evens' cases to get the stored ids.
    breakevens = [Breakeven(b.name, tuple(map(validate_case, b.baseline)), tuple(map(validate_case, b.variant)), b.patch_size)
                  for b in breakevens]
    comparisons = [_comparison(at, *entry, cases) for entry in spec.comparisons]
    if doc.across_gpus and not any(c.device == "cuda" for c in cases):
        at.fail("across_gpus", "the spec's cases run on the CPU; across_gpus runs CUDA cases on each GPU type")
    name = default_name if doc.name is schema.UNSET else doc.name
    return Experiment(source, name, doc.description or "", doc.out, float(harness.timeout_s), tuple(cases), tuple(comparisons),
                      tuple(breakevens), text, harness.profile_steps, harness.ncu_top, spec.ncu_where, tuple(pins), doc.across_gpus,
                      harness.pin)


class _Where:
    """Which key set what, to name it in a message: the file, each section's fields, the base's sources."""

    def __init__(self, source: str, reducing: frozenset):
        self.source, self.reducing = source, reducing
        self.given: dict[str, set] = {}  # section key → the case fields it sets (to blame the right key)
        self.origin: dict[str, str] = {}  # case field → "defaults" or "harness", where the base sets it

    def fail(self, key: str, message: str):
        raise PerflabError(f"{self.source}: {key}: {message}" if key else f"{self.source}: {message}")

    def reduces(self, model: str) -> bool:
        return model in self.reducing

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


def _expand_block(at: _Where, key: str, grid: dict, base: dict) -> list[tuple[str, dict]]:
    at.given[key] = set(grid)
    grid = dict(grid)
    if "device" in grid:
        grid["device"] = [_resolve_device({"device": v})["device"] for v in grid["device"]]
    models = grid.get("model") or ([base["model"]] if "model" in base else [])
    if not models:
        at.fail(f"{key}.model", "no model: give model in the grid or under defaults")
    # As api.make_cases: keep rates in a grid apply to its token-reducing models; with none, they stay
    # (and validation says they do nothing).
    block_reducing = any(at.reduces(m) for m in models)
    own_reduction = {f: grid.pop(f) for f in REDUCTION_FIELDS if f in grid}
    out = []
    for d in expand_grid(_without_reduction(base), grid):
        reducing = at.reduces(d["model"])
        if reducing:
            d.update({f: base[f] for f in REDUCTION_FIELDS if f in base})
        out_dicts = expand_grid(d, own_reduction) if own_reduction and (reducing or not block_reducing) else [d]
        out += [(key, x) for x in out_dicts]
    return out


def _explicit_case(at: _Where, key: str, entry: dict, base: dict) -> tuple[str, dict]:
    at.given[key] = set(entry)
    d = dict(_without_reduction(base)) | entry
    if "model" not in d:
        at.fail(f"{key}.model", "no model: give model in the case or under defaults")
    d = _resolve_device(d)
    if at.reduces(d["model"]):
        d.update({f: base[f] for f in REDUCTION_FIELDS if f not in entry and f in base})
    return key, d


def _breakeven(at: _Where, key: str, entry: dict, base: dict):
    at.given[key] = {"input_size" if f == "input_sizes" else f for f in entry} | {"model"}
    model, variant = entry["model"], entry["variant"]
    try:
        sizes = sorted(set(parse_input_sizes(entry["input_sizes"], f"{key}.input_sizes")))
    except PerflabError as exc:
        at.fail("", str(exc))
    if len(sizes) < 3:
        at.fail(f"{key}.input_sizes", f"a quadratic cost fit needs at least 3 input sizes, got {sizes}")
    common = dict(_without_reduction(base))
    reduction = {f: base[f] for f in REDUCTION_FIELDS if f in base}
    multi = {}
    for field, value in entry.items():
        if field in ("name", "model", "variant", "input_sizes"):
            continue
        if field in schema.BREAKEVEN_MULTI and isinstance(value, list):
            multi[field] = value
        elif field in REDUCTION_FIELDS:
            reduction[field] = value
        else:
            common[field] = value
    common = _resolve_device(common)
    gpu = common.pop("gpu", None)  # a scheduling field: kept beside the cases, not in them
    results = []
    for d in expand_grid(common, multi):
        base_cases = [dict(d, model=model, input_size=s) for s in sizes]
        var_cases = [dict(d, model=variant, input_size=s, **(reduction if at.reduces(variant) else {})) for s in sizes]
        if at.reduces(model):
            base_cases = [dict(c, **reduction) for c in base_cases]
        label = entry.get("name") or f"{variant} vs {model}, bs{d.get('batch_size', 1)}, {d.get('dtype', 'fp32')}, {d.get('mode', 'eager')}"
        if entry.get("name") and multi:
            label += " (" + ", ".join(f"{k} {d[k]}" for k in multi) + ")"
        b = Breakeven(str(label), tuple(Case(**c) for c in base_cases), tuple(Case(**c) for c in var_cases))
        results.append((b, [(key, dict(c, gpu=gpu) if gpu else c) for c in base_cases + var_cases]))
    return results


def _validate_all(at: _Where, sourced: list[tuple[str, dict]]) -> tuple[list[Case], list[tuple[str, str]]]:
    """The distinct cases, and the (case id, GPU type) pins of those given a ``gpu``."""
    cases, seen, pins = [], set(), []
    for key, d in sourced:
        d = dict(d)
        gpu = d.pop("gpu", None)
        case = Case(**d)
        try:
            case = validate_case(case)
        except PerflabError as exc:
            at.fail(at.blame(key, str(exc)), f"{case.label()}: {exc}")
        if gpu is not None:
            if case.device != "cuda":
                at.fail(f"{key}.gpu" if "gpu" in at.given.get(key, ()) else "defaults.gpu",
                        f"{case.label()} runs on the {case.device}; gpu: pins CUDA cases to a GPU type")
            if (case.id, gpu) not in pins:
                pins.append((case.id, gpu))
        if case.id not in seen:  # the same case from two places runs once
            seen.add(case.id)
            cases.append(case)
    return cases, pins


def _comparison(at: _Where, name: str, baseline: dict, variant: dict, labels, cases: list[Case]) -> ComparisonSpec:
    key = f"comparisons.{name}"
    if baseline == variant:
        at.fail(key, "baseline and variant are the same")
    labels = tuple(labels) if labels is not None else _default_labels(at, baseline, variant)
    comparison = ComparisonSpec(str(name), baseline, variant, labels)
    if not comparison.pairs([{"case": c.to_dict()} for c in cases]):
        at.fail(key, "no case matches both sides at the same point (same sizes, dtype, mode, ...); check the filters against the grid")
    return comparison


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
    raise PerflabError(f"{where}: expected start:stop:step (e.g. 160:640:32) or a list of integers, got {show(value)}")


# Words in validate_case's messages → the case field they are about.
_MESSAGE_FIELDS = (
    (("world size", "ranks need a data-parallel", "needs at least 2 ranks"), "world_size"), (("--parallel",), "parallel"),
    (("input size",), "input_size"), (("batch size",), "batch_size"), (("keep rate", "--keep-rate", "keep rates"), "keep_rate"),
    (("reduction location",), "reduction_loc"), (("warmup",), "warmup"), (("repeats",), "repeats"), (("iters",), "iters"),
    (("min-time",), "min_time"), (("cudagraph needs", "cannot run the"), "mode"), (("sequence length",), "seq_len"),
    (("context", "cache position"), "context_len"), (("--prompt-len", "prompt length"), "prompt_len"),
    (("--new-tokens", "new tokens"), "new_tokens"), (("--layers",), "layers"), (("--model-arg",), "model_args"),
    (("has no workload",), "workload"),
)


def _default_labels(at: _Where, baseline: dict, variant: dict) -> tuple[str, str]:
    if set(baseline) == set(variant) == {"model"} and at.reduces(variant["model"]) and not at.reduces(baseline["model"]):
        return ("Baseline", "TR")
    return tuple(", ".join(str(v) if not isinstance(v, list) else "/".join(map(str, v)) for v in f.values()) for f in (baseline, variant))


def _without_reduction(d: dict) -> dict:
    return {k: v for k, v in d.items() if k not in REDUCTION_FIELDS}


def _resolve_device(d: dict) -> dict:
    """``device: auto`` → cuda where a GPU is usable, else cpu (as ``bench --device auto``)."""
    if d.get("device") == "auto":
        from perflab.runtime.device import resolve_device

        d = dict(d, device=resolve_device("auto"))
    return d
