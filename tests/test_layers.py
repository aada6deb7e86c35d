"""The import floors, held: every import of a perflab module points down (or across one floor), never back up the
flow (DESIGN.md's "Records at the bottom": stats/clock/errors → records → models/workloads/spec → trace → analysis →
measure → diagnosis → program, sweep → report → api → cli). Imports inside functions count too: a lazy import that runs
back up is still a stage reaching into the one above it."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "perflab"

# floor → the top-level modules and packages of perflab on it, bottom up
FLOORS = {
    0: ("stats", "clock", "errors", "host_flags", "version", "paths", "yaml_files", "references", "units"),
    1: ("records",),
    2: ("models",),
    3: ("workloads",),
    4: ("spec",),
    5: ("runtime", "spec_schema", "cli_argv"),
    6: ("trace", "cli_flags"),
    7: ("analysis",),
    8: ("measure",),
    9: ("diagnosis",),
    10: ("program", "sweep"),
    11: ("report",),
    12: ("api",),
    13: ("cli", "__init__", "__main__"),
}
FLOOR = {room: floor for floor, rooms in FLOORS.items() for room in rooms}


def room_of(path: Path, root: Path) -> str:
    """A source file's room: its top-level module or package under perflab/ (perflab/__init__.py is ``__init__``)."""
    parts = path.relative_to(root).with_suffix("").parts
    return parts[0]


def back_up_imports(root: Path) -> list[str]:
    """``file:line imports perflab.X`` for every import that runs from a lower floor to a higher one, and every room
    without a floor (a new module must be given one)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.parent.name == "startup":
            continue  # the child interpreters' startup hook: runs before perflab is a package at all
        room = room_of(path, root)
        if room not in FLOOR:
            found.append(f"{path.relative_to(root)}: room {room!r} has no floor in tests/test_layers.py")
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [node.module] + ([f"perflab.{alias.name}" for alias in node.names] if node.module == "perflab" else [])
            else:
                continue
            for target in targets:
                parts = target.split(".")
                if parts[0] != "perflab" or len(parts) < 2:
                    continue
                other = parts[1]
                if FLOOR.get(other, -1) > FLOOR[room]:
                    found.append(f"{path.relative_to(root)}:{node.lineno} imports {target} (floor {FLOOR[other]} {other}, above {room}'s {FLOOR[room]})")
    return found


def test_no_import_runs_back_up_the_floors():
    assert back_up_imports(SRC) == []


def test_a_planted_import_back_up_is_found(tmp_path):
    root = tmp_path / "perflab"
    for room in ("analysis", "measure"):
        (root / room).mkdir(parents=True)
        (root / room / "__init__.py").write_text("")
    (root / "measure" / "row.py").write_text("def row_version(row):\n    return {}\n")
    (root / "analysis" / "regressions.py").write_text('"""A reader."""\n\n\ndef read(row):\n    from perflab.measure.row import row_version\n\n'
                                                     "    return row_version(row)\n")
    (root / "newroom.py").write_text("")
    assert back_up_imports(root) == [
        "analysis/regressions.py:5 imports perflab.measure.row (floor 8 measure, above analysis's 7)",
        "newroom.py: room 'newroom' has no floor in tests/test_layers.py",
    ]
