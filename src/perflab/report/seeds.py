"""The seeds' own figures (``study_figures.yaml`` beside this file, copied from the seed texts with their source),
for the lm report (seed 003's tables (a), (b)'s shares, (d), (e) and its OOM cells) and the decode report (seed
004's eager-vs-compiled finding). Values are numbers, "OOM" or "N/A" as the seed printed them. Torch-free."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

PATH = Path(__file__).with_name("study_figures.yaml")
PASSES_B = ("inference forward", "training forward", "training backward")  # the columns of seed 003's table (b)


@lru_cache(maxsize=1)
def figures() -> dict:
    from perflab.yaml_files import read_yaml

    return read_yaml(PATH, "figures file")[0]


def seed003() -> dict:
    return figures()["seed_003"]


def seed004() -> dict:
    return figures()["seed_004"]


def cell(table: str, model: str, seq: int, index: int | None = None):
    """Seed 003's value of ``table`` for (model, seq): a number, "OOM", "N/A", or None where the seed has no such model
    or length. ``index`` picks the column of a table with several per length ((b): PASSES_B; (d): inference, training)."""
    fig = seed003()
    seqs = fig["seq_lens"]
    values = fig[table].get(model)
    if values is None or seq not in seqs:
        return None
    value = values[seqs.index(seq)]
    return value[index] if index is not None and isinstance(value, list) else value


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def seed_oom(model: str, seq: int) -> dict:
    """Seed 003's OOM marks of a (model, seq) cell: {"inference": bool | None, "training": bool | None} from tables (a)
    and (d) (None: the seed has no figure there)."""
    inference = cell("forward_ms", model, seq)
    training = cell("gemm_fraction_pct", model, seq, 1)
    return {"inference": None if inference in (None, "N/A") else inference == "OOM",
            "training": None if training in (None, "N/A") else training == "OOM"}
