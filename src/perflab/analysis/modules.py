"""Module ranges at the analysis floor, each kernel attributed to a module; ``trace/modules.py`` records the ranges.

Where the GPU time goes, module by module: every kernel attributed to the innermost ``nn.Module`` that launched it.

A profile pass with ``--by-module`` (``perflab.trace.modules``) opens a CPU range around each module's forward
(``module:<path> [<Class>]``) and, for steps with a backward, around each module's backward
(``module_backward:<path> [<Class>]``) from hooks that only open and close profiler ranges: nothing is timed or
synchronised by them. A GPU activity belongs to the innermost module range enclosing its launch call on the
launching thread (autograd's backward thread has its own ranges). Its *pass* is the module range's direction;
an activity outside every module range keeps the pass of ``analysis.passes`` (forward, backward, optimizer) or
none, and counts as that pass's *unattributed* time.

Per pass, exactly (integer ns over the recorded steps): Σ exclusive time of its modules + its unattributed
time = the kernel time of the pass (Σ durations of its activities). A module's inclusive time is its exclusive
time plus its descendants'. Torch-free, like every analysis.
"""

from __future__ import annotations


import numpy as np
import pandas as pd

from perflab.analysis.passes import PASSES, kernel_passes
from perflab.trace.schema import MODULE_RANGE, MODULE_ROOT

ROOT = MODULE_ROOT
UNATTRIBUTED = "(unattributed)"
NO_PASS = "(no pass)"
COLUMNS = ["pass", "module", "class", "depth", "exclusive_ns", "inclusive_ns", "kernels", "kernels_inclusive",
           "share_exclusive", "share_inclusive"]


def has_module_ranges(ranges: pd.DataFrame) -> bool:
    if len(ranges) == 0:
        return False
    return any(MODULE_RANGE.match(str(n)) for n in ranges["name"].cat.categories) if hasattr(ranges["name"], "cat") else \
        any(MODULE_RANGE.match(str(n)) for n in set(ranges["name"]))


def kernel_modules(kernels: pd.DataFrame, ranges: pd.DataFrame) -> pd.DataFrame:
    """Per row of the KernelTable: ``module`` (path, "" outside every module range), ``class``, and ``pass``
    (forward/backward from the module range; else the pass of analysis.passes; else "")."""
    n = len(kernels)
    module = np.full(n, "", dtype=object)
    cls = np.full(n, "", dtype=object)
    passes = kernel_passes(kernels, ranges) if n else np.full(0, "", dtype=object)
    if n and len(ranges):
        names = ranges["name"].astype(str).to_numpy()
        parsed = [MODULE_RANGE.match(x) for x in names]
        is_module = np.array([m is not None for m in parsed], dtype=bool)
        parent = ranges["parent"].to_numpy().astype(np.int64)
        depth = ranges["depth"].to_numpy().astype(np.int64)
        # The innermost module range at or above each range, level by level (a parent is one level up).
        owner = np.full(len(ranges), -1, dtype=np.int64)
        for level in range(int(depth.max()) + 1 if len(depth) else 0):
            rows = np.flatnonzero(depth == level)
            inherited = np.where(parent[rows] >= 0, owner[np.maximum(parent[rows], 0)], -1)
            owner[rows] = np.where(is_module[rows], rows, inherited)
        range_id = kernels["range_id"].to_numpy()
        linked = range_id >= 0
        owned = np.full(n, -1, dtype=np.int64)
        owned[linked] = owner[range_id[linked]]
        for r in np.unique(owned[owned >= 0]):
            match = parsed[r]
            rows = owned == r
            module[rows] = match.group("path")
            cls[rows] = match.group("cls")
            passes[rows] = "backward" if match.group("backward") else "forward"
    return pd.DataFrame({"module": module, "class": cls, "pass": passes})


def module_tree(kernels: pd.DataFrame, ranges: pd.DataFrame, steps: int = 1) -> pd.DataFrame:
    """The module tree, one row per (pass, module) that launched GPU work, plus each pass's unattributed row.

    Columns: pass, module (dotted path; "." is the model; "(unattributed)"), class, depth, exclusive_ns and
    inclusive_ns (totals over the recorded steps, exact), kernels (exclusive count), kernels_inclusive, and shares
    of the pass's kernel time. Sorted by pass, then in tree order (children after their parent, by position).
    ``steps`` is only recorded in ``attrs`` for per-step figures (totals ÷ steps)."""
    attributed = kernel_modules(kernels, ranges)
    dur = kernels["dur_ns"].to_numpy().astype(np.int64)
    frame = attributed.assign(dur_ns=dur)
    class_of = _classes(ranges)
    frame["pass"] = frame["pass"].where(frame["pass"] != "", NO_PASS)
    rows = []
    for pass_name in _pass_order(frame["pass"].unique()):
        part = frame[frame["pass"] == pass_name]
        pass_total = int(part["dur_ns"].sum())
        exclusive = part.groupby("module", sort=False)["dur_ns"].agg(["sum", "count"])
        paths = [p for p in exclusive.index if p != ""]
        # Every ancestor of a module that launched work appears in the tree (it may launch nothing itself).
        known = set(paths)
        for path in list(paths):
            for ancestor in _ancestors(path):
                if ancestor not in known:
                    known.add(ancestor)
        excl = {p: int(exclusive.loc[p, "sum"]) if p in exclusive.index else 0 for p in known}
        count = {p: int(exclusive.loc[p, "count"]) if p in exclusive.index else 0 for p in known}
        incl = dict(excl)
        incl_count = dict(count)
        for path in known:
            for ancestor in _ancestors(path):
                incl[ancestor] += excl[path]
                incl_count[ancestor] += count[path]
        for path in sorted(known, key=_tree_key):
            rows.append({"pass": pass_name, "module": path, "class": class_of.get(path, ""), "depth": _depth(path),
                         "exclusive_ns": excl[path], "inclusive_ns": incl[path], "kernels": count[path],
                         "kernels_inclusive": incl_count[path]})
        if "" in exclusive.index:
            rows.append({"pass": pass_name, "module": UNATTRIBUTED, "class": "", "depth": 0,
                         "exclusive_ns": int(exclusive.loc["", "sum"]), "inclusive_ns": int(exclusive.loc["", "sum"]),
                         "kernels": int(exclusive.loc["", "count"]), "kernels_inclusive": int(exclusive.loc["", "count"])})
        for row in rows:
            if row["pass"] == pass_name:
                row["share_exclusive"] = row["exclusive_ns"] / pass_total if pass_total else 0.0
                row["share_inclusive"] = row["inclusive_ns"] / pass_total if pass_total else 0.0
    table = pd.DataFrame(rows, columns=COLUMNS)
    table.attrs["steps"] = max(int(steps), 1)
    return table


def pass_closure(tree: pd.DataFrame, kernels: pd.DataFrame, ranges: pd.DataFrame) -> dict[str, int]:
    """Per pass: (Σ exclusive + unattributed) − the pass's kernel time, in ns (0 when the attribution is exact)."""
    attributed = kernel_modules(kernels, ranges)
    passes = attributed["pass"].where(attributed["pass"] != "", NO_PASS).to_numpy()
    dur = kernels["dur_ns"].to_numpy().astype(np.int64)
    out = {}
    for pass_name, part in tree.groupby("pass", sort=False):
        out[str(pass_name)] = int(part["exclusive_ns"].sum()) - int(dur[passes == pass_name].sum())
    return out


def module_deltas(tree_a: pd.DataFrame, tree_b: pd.DataFrame, top: int = 10) -> pd.DataFrame:
    """Which modules changed between two runs: inclusive GPU time per step in A and B (same pass and path; each
    tree's totals ÷ the steps it recorded, ``attrs["steps"]``), the difference and its ratio; modules in one run
    only count 0 in the other. The ``top`` largest changes."""
    def per_step(tree):
        if tree is None or len(tree) == 0:
            return pd.Series(dtype=float)
        return tree.set_index(["pass", "module"])["inclusive_ns"] / max(int(tree.attrs.get("steps", 1)), 1)

    a, b = per_step(tree_a), per_step(tree_b)
    index = a.index.union(b.index)
    a, b = a.reindex(index, fill_value=0.0), b.reindex(index, fill_value=0.0)
    frame = pd.DataFrame({"a_ns": a, "b_ns": b}).reset_index()
    frame["delta_ns"] = frame["b_ns"] - frame["a_ns"]
    frame["ratio"] = np.where(frame["a_ns"] > 0, frame["b_ns"] / frame["a_ns"].where(frame["a_ns"] > 0, 1), np.nan)
    frame = frame[frame["delta_ns"] != 0]
    order = frame["delta_ns"].abs().sort_values(ascending=False, kind="stable").index
    return frame.loc[order].head(top).reset_index(drop=True)


def _classes(ranges: pd.DataFrame) -> dict[str, str]:
    """Module path → class name, from every module range recorded (a module that launched nothing itself too)."""
    names = ranges["name"].cat.categories if hasattr(ranges["name"], "cat") else set(ranges["name"])
    out = {}
    for name in names:
        match = MODULE_RANGE.match(str(name))
        if match:
            out[match.group("path")] = match.group("cls")
    return out


def _ancestors(path: str) -> list[str]:
    if path == ROOT:
        return []
    parts = path.split(".")
    return [".".join(parts[:i]) for i in range(len(parts) - 1, 0, -1)] + [ROOT]


def _depth(path: str) -> int:
    return 0 if path == ROOT else path.count(".") + 1


def _tree_key(path: str):
    if path == ROOT:
        return ()
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in path.split("."))


def _pass_order(names) -> list[str]:
    """Step order (analysis.passes.PASSES), then any other name, then activities outside every pass."""
    order = {name: i for i, name in enumerate(PASSES)} | {NO_PASS: len(PASSES) + 1}
    return sorted((str(n) for n in names), key=lambda n: (order.get(n, len(PASSES)), n))


def fold_repeats(tree: pd.DataFrame) -> pd.DataFrame:
    """The module tree with runs of numbered siblings of one class (``layers.0`` … ``layers.11``, each a Block) folded
    into one row each, ``layers.0–11``, and their descendants by their path below it (``layers.0–11.attention``): times,
    kernels and shares summed over the instances (so the tree still closes), ``instances`` how many were folded (1 for
    every other row). A model of N identical layers then reads as one layer's tree, not N."""
    if tree is None or tree.empty:
        return tree
    rows = []
    for pass_name, part in tree.groupby("pass", sort=False):
        classes = dict(zip(part["module"], part["class"]))
        siblings: dict[str, list[int]] = {}
        for path in part["module"]:
            parent, _, last = path.rpartition(".")
            if last.isdigit() and parent:
                siblings.setdefault(parent, []).append(int(last))
        folded = {}  # "parent.k" → "parent.a–b", for runs of two or more numbered siblings of one class
        for parent, numbers in siblings.items():
            numbers = sorted(set(numbers))
            if len(numbers) > 1 and len({classes.get(f"{parent}.{n}") for n in numbers}) == 1:
                label = f"{parent}.{numbers[0]}–{numbers[-1]}"
                folded.update({f"{parent}.{n}": label for n in numbers})
        order: dict[str, dict] = {}
        for row in part.to_dict("records"):
            parts = row["module"].split(".")
            # each component that ends a folded sibling's path becomes its run (an outer run and an inner one both fold)
            path = ".".join(folded[".".join(parts[:i + 1])].rsplit(".", 1)[-1] if ".".join(parts[:i + 1]) in folded else part
                            for i, part in enumerate(parts))
            if path in order:
                acc = order[path]
                for key in ("exclusive_ns", "inclusive_ns", "kernels", "kernels_inclusive", "share_exclusive", "share_inclusive"):
                    acc[key] += row[key]
                acc["instances"] += 1
            else:
                order[path] = dict(row, module=path, instances=1)
        rows += list(order.values())
    out = pd.DataFrame(rows, columns=[*COLUMNS, "instances"])
    out.attrs.update(tree.attrs)
    return out
