"""Edges a new user hits, each one line on stderr, exit status 2, and nothing measured lost:
an unwritable bench --out, a sweep grid too large to list, make demo inside a virtualenv that has torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_util import ROOT, assert_one_line_error, run_cli_here

BENCH = ["bench", "--model", "test:tiny", "--device", "cpu", "--input-size", "32", "--iters", "2", "--warmup", "1", "--format", "json"]


@pytest.mark.parametrize("where", ["parent_is_a_file", "proc"])
def test_bench_refuses_an_unwritable_out_before_measuring(tmp_path, where):
    if where == "proc":
        if not Path("/proc").is_dir():
            pytest.skip("no /proc")
        target = Path("/proc/x.json")
    else:
        (tmp_path / "afile").write_text("not a directory")
        target = tmp_path / "afile" / "x.json"
    r = run_cli_here(*BENCH, "--out", target)
    assert_one_line_error(r, str(target))
    assert r.stdout == ""  # refused before anything was measured
    assert not target.exists()


def test_bench_prints_the_results_when_writing_fails_after_measuring(tmp_path, monkeypatch, capsys):
    from perflab import cli
    from perflab.report import export

    def fail(rows, path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export, "write_rows", fail)
    target = tmp_path / "rows.json"
    with pytest.raises(SystemExit) as exit_:
        cli.main([*BENCH, "--out", str(target)])
    captured = capsys.readouterr()
    assert exit_.value.code == 2
    rows = [json.loads(line) for line in captured.out.splitlines()]
    assert len(rows) == 1 and rows[0]["status"] == "ok" and rows[0]["median_ms"] > 0  # the measurement is not lost
    errors = [line for line in captured.err.splitlines() if line.startswith("perflab: error: ")]
    assert errors == [f"perflab: error: {target}: could not write the results (No space left on device); they are printed above"]


def test_sweep_list_refuses_a_huge_grid_without_expanding_it(tmp_path):
    spec = tmp_path / "huge.yaml"
    sizes = ", ".join(str(32 * i) for i in range(1, 201))  # 200 × 200 × 300 = 12,000,000 cases
    batches = ", ".join(str(i) for i in range(1, 201))
    seeds = ", ".join(str(i) for i in range(300))
    spec.write_text(f"name: huge\ndefaults: {{model: test:tiny, device: cpu}}\n"
                    f"grid:\n  input_size: [{sizes}]\n  batch_size: [{batches}]\n  seed: [{seeds}]\n")
    t = time.perf_counter()
    r = run_cli_here("sweep", spec, "--list")
    assert time.perf_counter() - t < 30
    assert_one_line_error(r, "12,000,000 cases", "--max-cases")
    assert r.stdout == ""
    r = run_cli_here("sweep", spec, "--list", "--max-cases", "5")
    assert_one_line_error(r, "12,000,000 cases", "over --max-cases 5")


def test_make_reuses_the_torch_of_a_virtualenv_python(tmp_path):
    """python3 is a virtualenv with torch (uv, the GPU machine): make builds .venv that imports that torch,
    and never reaches pip (offline: PIP_NO_INDEX, and a pip that would fail)."""
    import shutil

    if shutil.which("make") is None:
        pytest.skip("no make")
    base = getattr(sys, "_base_executable", sys.executable)
    parent = tmp_path / "parent"
    subprocess.run([base, "-m", "venv", "--without-pip", str(parent)], check=True, timeout=120)
    site = next(parent.glob("lib*/python*/site-packages"))
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text("__version__ = '9.9.9+fake'\n")
    venv = tmp_path / ".venv"
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    done = subprocess.run(["make", "-C", str(ROOT), "venv", f"PYTHON={parent / 'bin' / 'python'}", f"VENV={venv}"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr  # (pip, offline with PIP_NO_INDEX, would have failed)
    assert "also sees" in done.stdout
    probe = subprocess.run([str(venv / "bin" / "python"), "-c", "import torch, sys; print(torch.__version__, torch.__file__, sys.prefix)"],
                           capture_output=True, text=True, timeout=60)
    version, where, prefix = probe.stdout.split()
    assert version == "9.9.9+fake" and where.startswith(str(site))
    assert prefix == str(venv)  # .venv is its own environment (what perflab installs goes there), seeing the parent's torch


def test_a_childs_environment_puts_this_perflab_first_on_pythonpath_once():
    import os

    from perflab.paths import SRC, child_env

    env = child_env({"PYTHONPATH": os.pathsep.join(["src", SRC, "/x"]), "OTHER": "1"})
    assert env["PYTHONPATH"].split(os.pathsep) == [SRC, "src", "/x"] and env["OTHER"] == "1"
    assert child_env({})["PYTHONPATH"] == SRC and (Path(SRC) / "perflab" / "__init__.py").is_file()
