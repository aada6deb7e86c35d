"""Issue 39: a command that has finished ends its process, even where a teardown would hang (runtime.exit_watch)."""

import subprocess
import sys
import time
from pathlib import Path

from cli_util import ROOT

STUCK = """
import atexit, threading, time
from perflab.runtime.exit_watch import arm
threading.Thread(target=time.sleep, args=(3600,), name="left-behind").start()  # a non-daemon thread joined at exit
arm(3, grace_s=0.5)
"""


def test_a_process_whose_teardown_hangs_ends_with_the_commands_status_and_says_where(tmp_path):
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", STUCK], capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(ROOT / "src"), "TMPDIR": str(tmp_path)})
    took = time.monotonic() - started
    assert proc.returncode == 3 and took < 30  # the command's status, not a hang until the thread's 3600 s
    (line,) = proc.stderr.splitlines()
    assert line.startswith("perflab: note: the command finished 0.5 s ago but the process had not exited "
                           "(non-daemon threads: left-behind; child processes: none); the stacks are in ")
    stacks = Path(line.split("the stacks are in ")[1].removesuffix("; ending it"))
    assert stacks.parent == tmp_path and "in _shutdown" in stacks.read_text()  # the main thread, joining the left-behind one


def test_a_process_that_exits_in_time_never_hears_from_it():
    proc = subprocess.run([sys.executable, "-c", "from perflab.runtime.exit_watch import arm; arm(0, grace_s=30)"],
                          capture_output=True, text=True, timeout=60, env={"PYTHONPATH": str(ROOT / "src")})
    assert (proc.returncode, proc.stderr) == (0, "")
