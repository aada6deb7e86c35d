import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
os.environ.setdefault("PYTHONPATH", str(ROOT / "src"))
# one intra-op thread per test process (and the programs it starts): make test runs two workers on as many cores, and
# torch's OpenMP threads, one per core in each, spin against each other's; a test that wants more sets its own
os.environ.setdefault("OMP_NUM_THREADS", "1")


import pytest  # noqa: E402


# make test runs two pytest-xdist workers (--dist loadgroup): each test file is one group, so its module fixtures are
# made once, and files that share a session fixture are one group, so it is made once too
SHARED_FIXTURE_GROUPS = {"test_sweep_resume": "smoke_run", "test_sweep_ray": "smoke_run",
                         "test_explain_parallel": "explain_ddp_run", "test_parallel_fsdp": "explain_ddp_run"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = item.path.stem
        item.add_marker(pytest.mark.xdist_group(SHARED_FIXTURE_GROUPS.get(module, module)))


@pytest.fixture(autouse=True)
def _no_inherited_columns(monkeypatch):
    """Tables fit COLUMNS where it is set; a test that wants a width sets its own. (pytest-xdist's workers are given
    COLUMNS=80, which narrowed every table the tests read.)"""
    monkeypatch.delenv("COLUMNS", raising=False)


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory):
    """experiments/smoke.yaml swept by the local engine, killed part-way and resumed (tests/sweep_util.py): run once,
    read by the resume tests and, as the local engine's rows, by the Ray engine's."""
    from sweep_util import killed_and_resumed_smoke

    return killed_and_resumed_smoke(tmp_path_factory)


@pytest.fixture(scope="session")
def explain_ddp_run(tmp_path_factory):
    """`perflab explain --parallel ddp:bucket_cap_mb=0.1 --fixes fsdp:reshard=false` of a tiny GPT on two gloo ranks of the
    CPU, in this process (tests/test_explain_parallel.py): its JSON and markdown. Two launches, the base's and the fix's;
    the fix's row is also tests/test_parallel_fsdp.py's FSDP run."""
    from explain_util import run_explain_parallel

    return run_explain_parallel(tmp_path_factory.mktemp("explain_parallel"))
