"""Record real /proc samples for the host-contention parsers' tests (Linux).

    python tests/data/proc/record.py [--seconds 1.0] [--out tests/data/proc]

Two scenarios, each a busy loop of ``--seconds`` in this thread, pinned to the last CPU of its affinity set:

- ``idle``: nothing else started;
- ``contended``: a busy-looping subprocess pinned to the same CPU for the length of the loop (killed after).

For each it writes ``<scenario>/schedstat_before``, ``schedstat_after`` (``/proc/thread-self/schedstat``),
``stat_before``, ``stat_after`` (``/proc/stat``) and ``meta.json`` (wall seconds between the reads, the CPU,
USER_HZ), verbatim. The tests parse these files and assert the fractions they imply.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HOG = "import time\nt = time.perf_counter()\nwhile time.perf_counter() - t < {seconds}: pass\n"


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def scenario(out: Path, seconds: float, cpu: int, contended: bool) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    hog = None
    if contended:
        hog = subprocess.Popen([sys.executable, "-c", HOG.format(seconds=seconds + 1.0)],
                               preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
        time.sleep(0.2)  # let it start spinning
    try:
        sched0, stat0, t0 = read("/proc/thread-self/schedstat"), read("/proc/stat"), time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            pass
        t1 = time.perf_counter()
        sched1, stat1 = read("/proc/thread-self/schedstat"), read("/proc/stat")
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    for name, text in (("schedstat_before", sched0), ("schedstat_after", sched1), ("stat_before", stat0), ("stat_after", stat1)):
        (out / name).write_text(text)
    meta = {"wall_s": t1 - t0, "cpu": cpu, "user_hz": os.sysconf("SC_CLK_TCK"), "contended": contended,
            "recorded": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "kernel": os.uname().release}
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    args = parser.parse_args()
    cpu = sorted(os.sched_getaffinity(0))[-1]
    os.sched_setaffinity(0, {cpu})
    for name, contended in (("idle", False), ("contended", True)):
        print(name, scenario(args.out / name, args.seconds, cpu, contended))


if __name__ == "__main__":
    main()
