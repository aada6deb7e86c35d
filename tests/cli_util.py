"""Run the perflab CLI in a subprocess, as a user would."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args, timeout=600, cwd=None):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", "perflab", *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)


def assert_one_line_error(result, *fragments):
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert lines[0].startswith("perflab: error: ")
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
