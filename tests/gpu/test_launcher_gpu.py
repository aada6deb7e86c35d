"""The sweep's launcher on a GPU host (issue 23, P9): its imports leave the driver closed, so it forks, and a forked
case measures on the GPU. Run in fresh interpreters: this pytest process has asked CUDA for its devices already."""

import subprocess
import sys

from perflab import api

CHECK = (
    "import os, numpy, torch\n"
    "from perflab.sweep.launcher import PRELOAD, PRELOAD_COMPILER, fork_hazard, native_threads, driver_files\n"
    "baseline = native_threads()\n"
    "for name in PRELOAD + PRELOAD_COMPILER: __import__(name)\n"
    "print('mapped', 'libcuda.so' in open('/proc/self/maps').read())\n"
    "print('hazard', fork_hazard(baseline))\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    os._exit(0 if float(torch.ones(64, device='cuda').sum()) == 64.0 else 1)\n"
    "print('child', os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n"
    "torch.cuda.device_count()\n"
    "print('after', fork_hazard(None))\n"
)


def test_the_launchers_imports_leave_the_driver_closed_and_a_forked_child_runs_cuda():
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in out.stdout.strip().splitlines())
    assert lines["hazard"] == "None"  # whether or not torch mapped libcuda.so (a CUDA 13 build does)
    assert lines["child"] == "0"
    assert lines["after"].startswith("the imports opened the GPU driver (/dev/nvidia")  # cuInit, in the parent


def test_a_gpu_sweep_forks_its_cases(tmp_path, capsys):
    spec = {"defaults": {"device": "cuda", "input_size": 32, "warmup": 1, "iters": 5, "repeats": 3},
            "cases": [{"model": "test:tiny"}, {"model": "test:tiny", "batch_size": 2}]}
    summary = api.sweep(spec, tmp_path, launcher="fork")
    assert summary.counts == {"ok": 2}
    assert "will not fork" not in capsys.readouterr().err
    rows = api.results(tmp_path)
    for row in rows:
        log = (tmp_path / "logs" / f"{row['case_id']}.log").read_text()
        assert "forked by the sweep's launcher" in log
        assert row["device"] == "cuda"
    assert min(r["cost_s"]["start_and_imports"] for r in rows) < 1.0
