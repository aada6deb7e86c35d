"""Run the perflab CLI in a subprocess, as a user would."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args, timeout=600, cwd=None):
    # src first, and whatever the caller's PYTHONPATH holds after it (the GPU machine's carried wheels live there)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH", "")) if p),
               PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", "perflab", *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)


def assert_one_line_error(result, *fragments):
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert lines[0].startswith("perflab: error: ")
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def run_cli_here(*args, cwd=None):
    """The CLI in this process (``perflab.cli.main``), as ``run_cli`` reports it: for the many one-line-error cases,
    where a fresh interpreter per case (about 2 s of imports each on the CI VM) is what the test would time."""
    import contextlib
    import io
    import warnings

    from perflab import cli

    out, err, code = io.StringIO(), io.StringIO(), 0
    before = os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # as PYTHONWARNINGS=ignore in run_cli
            try:
                cli.main([str(a) for a in args])
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        os.chdir(before)
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def assert_progress_lines(stderr: str, command: str, total: int, unit: str) -> list[str]:
    """A command's progress in a pipe (report.progress): its last line at ``total`` done, each
    ``perflab COMMAND: DONE/TOTAL UNIT, ELAPSED elapsed[, about LEFT left]: WHAT``, the counts never going back, and
    (with PERFLAB_PROGRESS_S set short) lines before the last, one at least with the time left. Returns the lines."""
    import re

    clock = r"(?:\d+:)?\d+:\d\d"
    shape = re.compile(rf"perflab {re.escape(command)}: (\d+)/{total} {re.escape(unit)}, {clock} elapsed(, about {clock} left)?: \S.*")
    lines = [line for line in stderr.splitlines() if line.startswith(f"perflab {command}: ")]
    matches = [shape.fullmatch(line) for line in lines]
    assert lines and all(matches), lines
    done = [int(m.group(1)) for m in matches]
    assert lines[-1].endswith(": done") and done[-1] == total and done == sorted(done), lines
    assert len(lines) >= 2 and any(m.group(2) for m in matches[:-1]), lines
    return lines


def git(repo, *args) -> str:
    """``git -C repo ARGS``, its output stripped (raises on failure)."""
    return subprocess.run(["git", "-C", str(repo), *map(str, args)], check=True, capture_output=True, text=True).stdout.strip()


def new_repo(path: Path) -> Path:
    """An empty git repository at ``path`` (made), with a committer of its own: the tests' revisions are made in it."""
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q")
    git(path, "config", "user.email", "perflab@example.com")
    git(path, "config", "user.name", "perflab tests")
    return path
