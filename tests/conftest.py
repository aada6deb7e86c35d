import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
os.environ.setdefault("PYTHONPATH", str(ROOT / "src"))


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory):
    """experiments/smoke.yaml swept by the local engine, killed part-way and resumed (tests/sweep_util.py): run once,
    read by the resume tests and, as the local engine's rows, by the Ray engine's."""
    from sweep_util import killed_and_resumed_smoke

    return killed_and_resumed_smoke(tmp_path_factory)
