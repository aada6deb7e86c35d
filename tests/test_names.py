"""Names that say one thing (issue 53, item 5). A room is a top-level module or package of perflab (``analysis``,
``api``, ``cli``, ...: tests/test_layers.py gives each its floor). No two rooms define the same public top-level name
(a function or class not ``_``-prefixed), and no two rooms hold a file of the same name unless it is one concept at
two floors, which each of those files says on its docstring's first line by naming its twins (``program/loop.py``).

Two kinds of shared name are allowed, and held to what makes them one thing:

- ``main``: each one a process's entry point (``python -m perflab``, the sweep's launcher and worker, ncu's target),
  so the module that defines it runs it under ``if __name__ == "__main__":``.
- a command of the command line named as the API call it wraps: the CLI is thin (``perflab X`` calls ``api.X``; see
  cli.py's docstring), so the name is a command of ``cli.py`` (``@app.command``) and ``cli.py`` calls ``api.X``.

Torch-free: an AST scan of the source, as tests/test_layers.py's.
"""

from __future__ import annotations

import ast
import collections
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "perflab"

# The file names that two or more rooms hold, each one concept at two (or three) floors; each file's docstring's first
# line names the others. A new one is either that (and added here) or renamed.
SHARED_FILE_NAMES = {
    "decode.py": ["report/decode.py", "workloads/decode.py"],
    "explain_parallel.py": ["diagnosis/explain_parallel.py", "report/explain_parallel.py"],
    "lm.py": ["models/lm.py", "report/lm.py", "workloads/lm.py"],
    "loop.py": ["analysis/loop.py", "program/loop.py"],
    "modules.py": ["analysis/modules.py", "trace/modules.py"],
    "parallel.py": ["measure/parallel.py", "report/parallel.py", "runtime/parallel.py"],
    "program.py": ["analysis/program.py", "report/program.py"],
    "ranks.py": ["analysis/ranks.py", "program/ranks.py"],
    "spec.py": ["spec.py", "sweep/spec.py"],
    "versions.py": ["report/versions.py", "sweep/versions.py"],
}


def sources(root: Path):
    """(path relative to root, parsed module) of every source file; the child interpreters' startup hook is not
    perflab's (it runs before perflab is a package at all)."""
    for path in sorted(root.rglob("*.py")):
        if "startup" in path.relative_to(root).parts:
            continue
        yield path.relative_to(root).as_posix(), ast.parse(path.read_text(), str(path))


def room_of(rel: str) -> str:
    return rel.split("/")[0].removesuffix(".py")


def _runs_main(tree: ast.Module) -> bool:
    """Whether the module calls its ``main`` under ``if __name__ == "__main__":``."""
    for node in tree.body:
        if (isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and isinstance(node.test.left, ast.Name)
                and node.test.left.id == "__name__"):
            return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "main"
                       for stmt in node.body for n in ast.walk(stmt))
    return False


def _commands_wrapping_api(tree: ast.Module) -> set[str]:
    """cli.py's command functions (``@app.command``) whose name is an ``api.`` call cli.py makes."""
    called = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "api"}
    commands = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and any(
                isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr == "command" for d in node.decorator_list):
            commands.add(node.name)
    return commands & called


def shared_names(root: Path) -> list[str]:
    """``name: files`` for every public top-level name that two rooms define, less the allowed ones."""
    defs = collections.defaultdict(set)
    trees = {}
    for rel, tree in sources(root):
        trees[rel] = tree
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
                defs[node.name].add(rel)
    wrapped = _commands_wrapping_api(trees["cli.py"]) if "cli.py" in trees else set()
    found = []
    for name, files in sorted(defs.items()):
        if len({room_of(f) for f in files}) < 2:
            continue
        if name == "main" and all(_runs_main(trees[f]) for f in files):
            continue
        if files == {"api.py", "cli.py"} and name in wrapped:
            continue
        found.append(f"{name}: {', '.join(sorted(files))}")
    return found


def shared_file_names(root: Path) -> dict[str, list[str]]:
    """File name → the files of that name, for every name that two rooms hold (``__init__.py`` aside)."""
    by_name = collections.defaultdict(list)
    for rel, _ in sources(root):
        if not rel.endswith("/__init__.py"):
            by_name[rel.split("/")[-1]].append(rel)
    return {name: sorted(files) for name, files in sorted(by_name.items()) if len({room_of(f) for f in files}) > 1}


def twins_unnamed(root: Path) -> list[str]:
    """``file: twin`` for every file of a shared name whose docstring's first line does not name that twin."""
    docs = {rel: (ast.get_docstring(tree) or "").split("\n")[0] for rel, tree in sources(root)}
    return [f"{f}: {twin}" for files in shared_file_names(root).values() for f in files for twin in files
            if twin != f and f"``{twin}``" not in docs[f]]


def test_no_two_rooms_define_one_name():
    assert shared_names(SRC) == []


def test_the_files_two_rooms_share_are_these():
    assert shared_file_names(SRC) == SHARED_FILE_NAMES


def test_each_shared_file_names_its_twins_on_its_docstrings_first_line():
    assert twins_unnamed(SRC) == []


def test_a_planted_duplicate_is_found(tmp_path):
    root = tmp_path / "perflab"
    for room in ("analysis", "report", "sweep"):
        (root / room).mkdir(parents=True)
        (root / room / "__init__.py").write_text("")
    (root / "analysis" / "fixes.py").write_text("def predict(x):\n    return x\n\n\ndef _own():\n    pass\n")
    (root / "report" / "lm.py").write_text("def predict(row):\n    return row\n\n\ndef _own():\n    pass\n")
    (root / "sweep" / "worker.py").write_text("def main():\n    pass\n\n\nif __name__ == '__main__':\n    main()\n")
    (root / "report" / "tool.py").write_text("def main():\n    pass\n")  # a main no process runs: not an entry point
    (root / "api.py").write_text("def bench():\n    pass\n\n\ndef run():\n    pass\n")
    (root / "cli.py").write_text("from perflab import api\n\n\n@app.command()\ndef bench():\n    api.bench()\n\n\n"
                                 "@app.command()\ndef run():\n    api.bench()\n")
    assert shared_names(root) == ["main: report/tool.py, sweep/worker.py", "predict: analysis/fixes.py, report/lm.py",
                                  "run: api.py, cli.py"]


def test_a_planted_shared_file_without_its_twin_named_is_found(tmp_path):
    root = tmp_path / "perflab"
    for room in ("analysis", "program", "report"):
        (root / room).mkdir(parents=True)
        (root / room / "__init__.py").write_text("")
    (root / "analysis" / "loop.py").write_text('"""The loop at the analysis floor; ``program/loop.py`` watches it."""\n')
    (root / "program" / "loop.py").write_text('"""The loop, watched.\n\nSee ``analysis/loop.py``."""\n')
    (root / "analysis" / "launch.py").write_text('"""Launch-bound steps."""\n')
    (root / "program" / "launch.py").write_text('"""Starting torchrun."""\n')
    (root / "report" / "notes.py").write_text("")
    assert shared_file_names(root) == {"launch.py": ["analysis/launch.py", "program/launch.py"],
                                       "loop.py": ["analysis/loop.py", "program/loop.py"]}
    assert twins_unnamed(root) == ["analysis/launch.py: program/launch.py", "program/launch.py: analysis/launch.py",
                                   "program/loop.py: analysis/loop.py"]
