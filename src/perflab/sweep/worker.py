"""One case in its own process: ``python -m perflab.sweep.worker --case JSON --result PATH``.

The sweep's parent starts one worker per case, so an OOM, a CUDA error or a crash cannot poison the next
case. The worker measures the case with the harness and writes the result row as JSON to PATH (through
a temporary file and a rename, so the parent never reads half a row); stages and warnings go to stderr,
which the parent keeps as the case's log. Exit status 0 means PATH holds a row, whatever its status.

With ``--together FILE`` it times several cases in this one process instead, interleaved block by block, each read
in its own model root (``perflab ab``'s blocks pairing: every version of the code in one process a round), and
writes ``{"rows": [...]}``.

If the parent dies (``kill -9``), the worker is killed too (Linux parent-death signal, with a polling
fallback elsewhere), so an orphan never keeps a GPU busy under the next sweep.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from perflab.errors import first_line


def alive_path(result_path: Path) -> Path:
    """The file a worker writes once its imports are done; its case's time limit counts from then (``sweep.runner``)."""
    return result_path.with_name(result_path.name + ".alive")


# What a case costs (P9): the worker's stages, each with the perf_counter at which it began.
COST_STAGES = {"build": "build", "check": "check", "flops": "flops", "compile": "compile", "warmup": "warmup", "timing": "timed"}
_stages: list[tuple[str, float]] = []


def main(argv: list[str] | None = None) -> int:
    from perflab.measure.sched import process_age_s

    started, now, age = time.perf_counter(), time.time(), process_age_s()
    _stages.clear()
    args = _parse_args(argv)
    if args.launched_at is not None:  # the parent's clock when it asked for this process: exact, where /proc's start is to a second
        age = max(0.0, now - args.launched_at)
    if args.parent_pid:
        exit_with_parent(args.parent_pid)

    from perflab.errors import ModelLoadError, PerflabError
    from perflab.measure import harness  # noqa: F401  the heavy imports (torch), before the case's time limit starts
    from perflab.spec import Case

    alive_path(Path(args.result)).touch()

    if args.model_root:  # relative model references are the spec's (and reach ncu's child process through the environment)
        from perflab.references import ROOT_ENV

        os.environ[ROOT_ENV] = args.model_root
    case = Case.from_dict(json.loads(args.case))
    if args.together:
        rows = _run_together(json.loads(Path(args.together).read_text()), args)
        write_result({"rows": rows, "cost_s": cost_split(_stages, started, time.perf_counter(), age)}, Path(args.result))
        return 0
    try:
        from perflab.measure.harness import run_case
        from perflab.measure.pinning import HostOptions

        if case.parallel:  # its ranks on the GPUs this worker sees (CUDA_VISIBLE_DEVICES: the scheduler's group)
            from perflab.measure.parallel import run_parallel_case

            _log_stage(f"{case.world_size} ranks")
            row = run_parallel_case(case)
        else:
            flop_cache = None
            if args.flops_cache:
                from perflab.measure.flops import FlopCache

                flop_cache = FlopCache(args.flops_cache)
            row = run_case(case, on_stage=_log_stage, host=HostOptions(pin=not args.no_pin, pin_index=args.pin_index), flop_cache=flop_cache)
        _passes(case, row, args)
    except ModelLoadError as exc:  # the user's model does not import or build here: a failure of this case, not bad input
        row = _failed_row(case, "error", str(exc))
    except PerflabError as exc:  # the parent validated the case; this is input only the worker could see
        row = _failed_row(case, "invalid", str(exc))
    except Exception as exc:  # run_case turns measurement failures into rows; this is anything around them
        traceback.print_exc()
        row = _failed_row(case, "error", f"{type(exc).__name__}: {first_line(exc)}")
    row["cost_s"] = cost_split(_stages, started, time.perf_counter(), age)
    write_result(row, Path(args.result))
    return 0


def _passes(case, row: dict, args, tag: str = "") -> None:
    """The spec's profile and ncu passes of a measured case, into its row (a capped case, max_memory, answers "would
    it fit": none)."""
    extra = row.get("status") == "ok" and case.device == "cuda" and not case.parallel and case.max_memory is None
    if args.profile_steps and extra:
        _log_stage(f"profile ({args.profile_steps} steps)")
        row["profile"] = _profile(case, row, Path(args.trace_dir), args.profile_steps, tag)
    if args.ncu_top and extra and _matches(case, json.loads(args.ncu_where)):
        _log_stage(f"ncu (top {args.ncu_top} kernels)")
        row["ncu"] = _ncu(case, Path(args.trace_dir), args.ncu_top)


def _run_together(entries: list[dict], args) -> list[dict]:
    """Several cases timed together in this process (``perflab ab``'s blocks pairing): each entry is a case with the
    directory its model references are read in (``model_root``: its version's worktree) and a ``group`` (the cases
    compared, the versions of one case: adjacent in every round of the interleaved order, their order balanced over
    the rounds). Each case is built in its own ``ModelScope``, so two revisions of one model file import side by side;
    a built-in model is built once per entry. Returns their rows in the entries' order, each with this process's id
    (``worker_pid``).

    A case whose own input fails here (its model does not import or build at its version, a field only this process
    can check) gets its own failed row, and the others are timed without it: one version's broken model must not stand
    in for another's row. A failure no one case raised (a lost CUDA context, a crash of the session) fails every row."""
    from perflab.errors import CudaContextLost, ModelLoadError, PerflabError
    from perflab.measure.harness import run_cases
    from perflab.measure.pinning import HostOptions
    from perflab.references import ModelScope
    from perflab.spec import Case

    cases = [Case.from_dict(e["case"]) for e in entries]
    scopes = [_CaseScope(k, ModelScope(e["model_root"]) if e.get("model_root") else None) for k, e in enumerate(entries)]
    rows: list[dict | None] = [None] * len(cases)
    remaining = list(range(len(cases)))
    while remaining:
        try:
            timed = run_cases([cases[k] for k in remaining], host=HostOptions(pin=not args.no_pin, pin_index=args.pin_index),
                              seed=args.seed, groups=[entries[k]["group"] for k in remaining], scopes=[scopes[k] for k in remaining],
                              on_case=lambda i, case, stage: _log_stage(stage), balanced=True, drawn=args.order == "random")
            for k, row in zip(remaining, timed):
                with scopes[k]:
                    _passes(cases[k], row, args, tag=f"-{k}")
                rows[k] = row
            break
        except PerflabError as exc:  # input only this process could see, or a lost CUDA context
            status = "error" if isinstance(exc, (ModelLoadError, CudaContextLost)) else "invalid"
            culprit = getattr(exc, _CASE_ATTR, None)
            if isinstance(exc, CudaContextLost) or culprit not in remaining:  # no one case's: every row says so
                for k in remaining:
                    rows[k] = _failed_row(cases[k], status, str(exc))
                break
            _log_stage(f"case {culprit} failed ({first_line(exc)}); timing the others without it")
            rows[culprit] = _failed_row(cases[culprit], status, str(exc))
            remaining.remove(culprit)
            _release_built()
        except Exception as exc:
            traceback.print_exc()
            for k in remaining:
                rows[k] = _failed_row(cases[k], "error", f"{type(exc).__name__}: {first_line(exc)}")
            break
    for row in rows:
        row["worker_pid"] = os.getpid()
    return rows


def _release_built() -> None:
    """What the failed attempt built (its models, held in reference cycles) freed before the others are built again."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


_CASE_ATTR = "perflab_together_case"  # the index of the together entry whose own work raised a PerflabError


class _CaseScope:
    """Entry ``index``'s scope (its ``ModelScope``, or none), reusable as ``run_cases`` enters it around each piece of
    that case's own work: a PerflabError raised inside it is marked as this entry's (the innermost scope marks it)."""

    def __init__(self, index: int, scope):
        self.index = index
        self.scope = scope

    def __enter__(self):
        if self.scope is not None:
            self.scope.__enter__()
        return self

    def __exit__(self, kind, exc, tb):
        from perflab.errors import PerflabError

        if isinstance(exc, PerflabError) and not hasattr(exc, _CASE_ATTR):
            setattr(exc, _CASE_ATTR, self.index)
        return self.scope.__exit__(kind, exc, tb) if self.scope is not None else False


def cost_split(stages: list[tuple[str, float]], started: float, ended: float, age_at_start: float | None) -> dict:
    """Seconds of the case's wall time by stage: ``start_and_imports`` (from the parent's request for the process, or
    the process's start, to the harness's first stage: the interpreter or the fork, torch's import where not
    preloaded), ``build``, ``check`` (the family's checking call), ``flops`` (the FLOP count: one eager step under
    torch's counter, or none where the sweep counted the same step before; rows before issue 23's cut have the two
    together as ``check_and_flops``), ``ranks`` (a data-parallel case: its rank processes from launch to their
    rows), ``compile`` (the mode's first call), ``warmup`` (warm-up, the step estimates,
    host and GPU times apart, the canary), ``timed`` (the timed loop and what follows it in the harness), ``profile``
    and ``ncu`` passes, and ``total``. A stage that ran twice (warm-up is named again after the first call) adds up."""
    from perflab.sweep.store import cost_stage

    out: dict[str, float] = {}
    first = stages[0][1] if stages else ended
    out["start_and_imports"] = (first - started) + (age_at_start or 0.0)
    marks = stages + [("end", ended)]
    for (name, t0), (_, t1) in zip(marks, marks[1:]):
        key = COST_STAGES.get(name) or ("profile" if name.startswith("profile") else "ncu" if name.startswith("ncu") else cost_stage(name))
        out[key] = out.get(key, 0.0) + (t1 - t0)
    out["total"] = sum(out.values())
    return out


def _profile(case, row: dict, trace_dir: Path, steps: int, tag: str = "") -> dict:
    """The case's profile pass, summarised for the row; a failure of the pass is recorded, and the timing kept."""
    from perflab.diagnosis.profiling import profile_summary
    from perflab.trace.capture import capture_case

    try:
        trace_path = trace_dir / f"{case.id}{tag}.trace.json.gz"
        trace_dir.mkdir(parents=True, exist_ok=True)
        capture_case(case, trace_path, steps=steps)
        return profile_summary(trace_path, row["median_ms"])
    except Exception as exc:  # an OOM under the profiler's own memory, say: the untraced row still stands
        traceback.print_exc()
        return {"error": f"{type(exc).__name__}: {first_line(exc)}"}


def _matches(case, where: dict) -> bool:
    """Whether the case's fields take one of the allowed values of each field in ``where`` (the spec's ncu_where)."""
    plain = lambda v: list(v) if isinstance(v, tuple) else v
    return all(plain(getattr(case, field)) in [plain(v) for v in values] for field, values in where.items())


def _ncu(case, trace_dir: Path, top: int) -> dict:
    """Nsight Compute on the case's top kernels, summarised for the row; without ncu, or when it fails, the
    reason is recorded and the timing kept."""
    from perflab.diagnosis.profiling import ncu_case
    from perflab.errors import PerflabError
    from perflab.trace.ncu import ncu_summary

    try:
        table, _ = ncu_case(case, top=top, out_dir=trace_dir)
        return ncu_summary(table)
    except Exception as exc:
        if not isinstance(exc, PerflabError):
            traceback.print_exc()
        return {"error": f"{type(exc).__name__}: {first_line(exc)}"}


def write_result(row: dict, path: Path) -> None:
    from perflab.sweep.store import dumps

    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(dumps(row))
    os.replace(tmp, path)


def _failed_row(case, status: str, message: str) -> dict:
    from perflab.measure.harness import failed_row

    return failed_row(case, status, message, env={"device": case.device})


def _log_stage(stage: str) -> None:
    _stages.append((stage.split(" ")[0] if stage.startswith(("profile", "ncu", "timing")) else stage, time.perf_counter()))
    print(f"[{time.strftime('%H:%M:%S')}] stage: {stage}", file=sys.stderr, flush=True)


def exit_with_parent(parent_pid: int) -> None:
    """Die when the sweep's parent dies, so no orphan keeps measuring."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            PR_SET_PDEATHSIG = 1
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != parent_pid:  # the parent died before the signal was armed
                os._exit(1)
            return
        except (OSError, AttributeError):
            pass
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()


def _watch_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(1.0)
    os._exit(1)


def _parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m perflab.sweep.worker", description=__doc__.splitlines()[0])
    parser.add_argument("--case", required=True, help="the case, as JSON (Case.to_dict())")
    parser.add_argument("--result", required=True, help="where to write the result row (JSON)")
    parser.add_argument("--parent-pid", type=int, default=0, help="exit when this process dies")
    parser.add_argument("--launched-at", type=float, default=None,
                        help="time.time() when the parent asked for this process: the start of its start_and_imports")
    parser.add_argument("--profile-steps", type=int, default=0, help="after timing, profile this many steps (GPU cases)")
    parser.add_argument("--ncu-top", type=int, default=0, help="after timing, run ncu on this many top kernels (GPU cases)")
    parser.add_argument("--ncu-where", default="{}", help="JSON {field: [values]}: only cases matching these get the ncu pass")
    parser.add_argument("--trace-dir", default="traces", help="where the profile pass writes its trace")
    parser.add_argument("--model-root", default="", help="the directory relative model references (file.py:NAME, hf:DIR) are read against")
    parser.add_argument("--flops-cache", default="", help="a directory of FLOP counts shared by a sweep's workers (measure.flops.FlopCache)")
    parser.add_argument("--no-pin", action="store_true", help="time with the timing thread unpinned")
    parser.add_argument("--pin-index", type=int, default=0, help="pin to this core counted from the end of the affinity set")
    parser.add_argument("--together", default="", help="a JSON file of cases to time together, interleaved, instead of --case alone: "
                        "[{case, model_root, group}]; the result is {rows: [...]} in its order")
    parser.add_argument("--seed", type=int, default=0, help="--together: the seed of the interleaved order")
    parser.add_argument("--order", choices=("alternate", "random"), default="alternate",
                        help="--together: a group's cases take turns (alternate) or each pair of rounds' order is drawn (random)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
