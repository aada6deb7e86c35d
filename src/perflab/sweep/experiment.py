"""What a validated experiment spec is: its cases, named comparisons and break-even analyses.

An experiment serialises to JSON (``to_json``/``from_json``) without needing torch, so that reports can be
written from a store on any machine. ``perflab.sweep.spec`` reads a spec file into one.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from perflab.spec import Case

CASE_FIELDS = tuple(f.name for f in fields(Case))
REDUCTION_FIELDS = ("keep_rate", "reduction_loc")
HARNESS_FIELDS = ("warmup", "min_time", "iters", "repeats")
DEFAULT_TIMEOUT_S = 600.0
PATCH_SIZE = 16


@dataclass(frozen=True)
class ComparisonSpec:
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
    def from_json(cls, data: dict) -> "ComparisonSpec":
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
    comparisons: tuple[ComparisonSpec, ...] = ()
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
            comparisons=tuple(ComparisonSpec.from_json(c) for c in data.get("comparisons", [])),
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


def default_comparisons(rows: list[dict]) -> list[ComparisonSpec]:
    """Without named comparisons: each token-reducing model (topk_X, evit_X) against X, where both ran."""
    models = {case_fields(r).get("model") for r in rows}
    out = []
    for model in sorted(m for m in models if m):
        method, _, base = model.partition("_")
        if method in ("topk", "evit") and base in models:
            out.append(ComparisonSpec(f"{model} vs {base}", {"model": base}, {"model": model}, ("Baseline", "TR")))
    return out
