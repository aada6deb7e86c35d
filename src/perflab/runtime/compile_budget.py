"""A time limit on a compiled case's compile, set by the user: the compile runs first in a child process with that
limit, which fills inductor's on-disk caches (the FX graph cache and the autotuning results); the case then compiles
in the measuring process from those caches, in seconds. A compile that does not finish within the limit is stopped
(the child's whole process group, inductor's compile workers included) and the case is a ``timeout`` row that says
so, instead of an unbounded wait (on an H100, compile:max-autotune of llama3_8b's decode step did not finish within
a 10-minute call).

torch.compile itself has no time limit, and none of inductor's options bounds a whole compile: the ones that exist
bound single pieces (``precompilation_timeout_seconds``: the Triton templates' precompilation;
``max_autotune_subproc_result_timeout_seconds``: one benchmark in a subprocess), or shrink the search
(``max_autotune_gemm_search_space``, ``coordinate_descent_tuning``; perflab's ``compile:max-autotune-gemm`` tunes
only the matmuls). A child process is the one bound on the whole.

Run as ``python -m perflab.runtime.compile_budget CASE_JSON``: builds the case, compiles it and takes one step, and
prints ``{"compile_s": ...}`` on its last line.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time


def compile_in_child(case, budget_s: float) -> dict:
    """Compile ``case`` in a child process within ``budget_s`` seconds. Returns ``status`` (ok, timeout or error),
    ``compile_s`` (the child's seconds from the build to its first step done: the cold compile), ``wall_s`` (the
    child's whole life, its imports included) and ``message``."""
    from perflab.paths import child_env

    env = child_env()
    started = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "perflab.runtime.compile_budget", json.dumps(case.to_dict())], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        out, err = child.communicate(timeout=budget_s)
    except subprocess.TimeoutExpired:
        _kill_group(child)
        child.communicate()
        return {"status": "timeout", "compile_s": None, "wall_s": time.perf_counter() - started,
                "message": f"{case.mode} did not compile within the {budget_s:g} s budget (--compile-budget; the compile ran in a child "
                           "process, stopped at the limit)"}
    wall = time.perf_counter() - started
    lines = [line for line in out.splitlines() if line.strip()]
    if child.returncode == 0 and lines:
        try:
            return {"status": "ok", "compile_s": float(json.loads(lines[-1])["compile_s"]), "wall_s": wall, "message": None}
        except (ValueError, KeyError, TypeError):
            pass
    last = [line for line in err.splitlines() if line.strip()]
    return {"status": "error", "compile_s": None, "wall_s": wall,
            "message": f"the compile in a child process failed (exit {child.returncode}): {last[-1] if last else 'no message'}"}


def _kill_group(child) -> None:
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        child.kill()


def _main(argv) -> int:
    from perflab.runtime.device import synchronize
    from perflab.runtime.modes import make_step
    from perflab.runtime.workload import build, step_context
    from perflab.spec import Case, validate_case

    case = validate_case(Case.from_dict(json.loads(argv[0])))
    started = time.perf_counter()
    built = build(case)
    with step_context(case, built):
        step = make_step(built, case.mode)
        step()
        synchronize(case.device)
    print(json.dumps({"compile_s": time.perf_counter() - started}))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
