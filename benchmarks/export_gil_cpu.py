"""Does torch.profiler's trace export let the program's thread run? (issue 55: could perflab write its trace from a
thread of its own, off the program's steps?) A CPU profiler session records a small loop of matmuls; its export then
runs in a thread while the main thread counts how often it gets to run (``time.sleep(0)`` yields the GIL, as Python
code does between bytecodes), against how often it runs in the same time with no export::

    PYTHONPATH=src python benchmarks/export_gil_cpu.py
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile


def spins(until) -> int:
    """How many times this thread ran until ``until()``."""
    n = 0
    while not until():
        n += 1
        time.sleep(0)
    return n


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", type=int, default=20000, help="matmuls recorded (the trace's size)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    x = torch.randn(64, 64)
    prof = profile(activities=[ProfilerActivity.CPU])
    prof.start()
    for _ in range(args.ops):
        x = torch.mm(x, x).tanh()
    prof.stop()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        done = threading.Event()
        thread = threading.Thread(target=lambda: (prof.export_chrome_trace(str(path)), done.set()))
        t0 = time.perf_counter()
        thread.start()
        during = spins(done.is_set)
        export_s = time.perf_counter() - t0
        thread.join()
        mb = path.stat().st_size / 1e6
    t0 = time.perf_counter()
    alone = spins(lambda: time.perf_counter() - t0 >= export_s)
    print(json.dumps({"export_ms": round(export_s * 1e3, 1), "trace_mb": round(mb, 1), "main_thread_runs_during_export": during,
                      "main_thread_runs_in_as_long_alone": alone}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
