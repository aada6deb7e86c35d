"""Where the stop of perflab's pass with shapes spends its time, on the host-bound compiled loop of
benchmarks/programs/compiled_gpt_sync.py (GPT-2 small, ``torch.compile``, fused AdamW, bf16 autocast, ``loss.item()``
each step): the profiler's stop lands in the program's step that follows the pass, and on an H200 that step read
×2.22 its neighbours' median (37.3 ms of stop against steps of about 37 ms).

Each variant is a torch.profiler session over ``--steps`` steps of the loop after warm steps; the stop is split into
torch's own parts where torch exposes them (``_disable_profiler``, the Python parse of its events, the device
synchronisation), and the events it holds are counted after, by kind, with their recorded input shapes::

    PYTHONPATH=src python benchmarks/shapes_stop_gpu.py --out shapes_stop.json [--only NAME...]

Results and what they ruled out: docs/performance/run.md, "The pass with shapes' stop, taken apart". Keep ``--only``'s
words free of quotes: inductor writes the process's arguments into the code it generates (an apostrophe there failed
the compile with a SyntaxError).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.autograd.profiler as autograd_profiler
from torch.profiler import ProfilerActivity, profile

from profiler_costs_gpu import workload  # the loop's model (benchmarks/ is the script's folder)

CPU, CUDA = ProfilerActivity.CPU, ProfilerActivity.CUDA
VARIANTS = {  # name: (activities, record_shapes, steps, extra)
    "cuda only, 1 step": ([CUDA], False, 1, None),
    "cuda only, 5 steps": ([CUDA], False, 5, None),
    "cpu+cuda, shapes, 0 steps": ([CPU, CUDA], True, 0, None),
    "cpu+cuda, shapes, 1 step (perflab's pass)": ([CPU, CUDA], True, 1, None),
    "cpu+cuda, no shapes, 1 step": ([CPU, CUDA], False, 1, None),
    "cpu only, shapes, 1 step": ([CPU], True, 1, None),
    "cpu+cuda, shapes, 1 step, trace_only": ([CPU, CUDA], True, 1, "trace_only"),
    "cpu+cuda, shapes, 1 step, toggled off, stop a step later": ([CPU, CUDA], True, 1, "toggle"),
    "cpu+cuda, shapes, 1 step, record_function off, stop a step later": ([CPU, CUDA], True, 1, "rf_off"),
    "cpu+cuda, shapes, 1 step, record_function and cuda off, stop a step later": ([CPU, CUDA], True, 1, "rf_cuda_off"),
    "cpu+cuda, shapes, 1 step, concrete inputs off": ([CPU, CUDA], True, 1, "concrete_off"),
    "cpu+cuda, shapes, 1 step, external correlation off": ([CPU, CUDA], True, 1, "no_external"),
    "cpu+cuda, shapes, 1 step, fwd-bwd links off": ([CPU, CUDA], True, 1, "fwd_bwd_off"),
    "cpu+cuda, shapes, 1 step, no inductor launch ranges": ([CPU, CUDA], True, 1, "no_launch_ranges"),
}


class Parts:
    """torch's stop timed in its parts, by wrapping the module-level names its ``__exit__`` looks up."""

    def __init__(self):
        self.ms: dict[str, float] = {}
        self._disable = autograd_profiler._disable_profiler
        self._parse = autograd_profiler.profile._parse_kineto_results

    def __enter__(self):
        parts = self

        def disable():
            t0 = time.perf_counter()
            try:
                return parts._disable()
            finally:
                parts.ms["_disable_profiler"] = parts.ms.get("_disable_profiler", 0) + (time.perf_counter() - t0) * 1e3

        def parse(prof, *a, **k):
            t0 = time.perf_counter()
            try:
                return parts._parse(prof, *a, **k)
            finally:
                parts.ms["parse_kineto_results"] = parts.ms.get("parse_kineto_results", 0) + (time.perf_counter() - t0) * 1e3

        autograd_profiler._disable_profiler = disable
        autograd_profiler.profile._parse_kineto_results = parse
        return self

    def __exit__(self, *exc):
        autograd_profiler._disable_profiler = self._disable
        autograd_profiler.profile._parse_kineto_results = self._parse
        return False


def kinds(events) -> dict:
    """The events by kind: inductor's kernel launches (``triton_*``), ATen operators, CUDA's API calls, the GPU's
    own activity, the rest; with the number of recorded input shapes (record_shapes) each kind holds."""
    out: dict = {}
    for e in events:
        name = e.name()
        gpu = str(e.device_type()).endswith("CUDA")
        kind = ("gpu" if gpu else "triton launch" if name.startswith("triton_") else "aten" if name.startswith("aten::")
                else "cuda api" if name.startswith("cuda") else "other")
        n, shapes = out.get(kind, (0, 0))
        try:
            shapes += len(e.shapes())
        except Exception:
            pass
        out[kind] = (n + 1, shapes)
    return {k: {"events": n, "input_shapes": sh} for k, (n, sh) in out.items()}


def ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1e3, 3)


def session(step, activities, shapes: bool, steps: int, extra) -> dict:
    out: dict = {}
    kwargs = {}
    if extra == "trace_only":
        try:
            kwargs["experimental_config"] = torch._C._profiler._ExperimentalConfig(trace_only=True)
        except TypeError as e:
            return {"unsupported": str(e).splitlines()[0]}
    if extra == "no_external":
        kwargs["experimental_config"] = torch._C._profiler._ExperimentalConfig(disable_external_correlation=True)
    if extra == "concrete_off":
        torch._C._profiler._set_record_concrete_inputs_enabled_val(False)
    if extra == "fwd_bwd_off":
        torch._C._profiler._set_fwd_bwd_enabled_val(False)
    t0 = time.perf_counter()
    prof = profile(activities=activities, record_shapes=shapes, **kwargs)
    prof.start()
    out["start_ms"] = ms(t0)
    if extra == "no_launch_ranges":  # for the count only: inductor opens a range per kernel launch while this flag is up
        autograd_profiler._is_profiler_enabled = False
    out["steps_ms"] = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        out["steps_ms"].append(ms(t0))
    if extra == "toggle":
        t0 = time.perf_counter()
        prof.toggle_collection_dynamic(False, activities)
        out["toggle_ms"] = ms(t0)
        t0 = time.perf_counter()
        step()
        out["step_after_toggle_ms"] = ms(t0)
    if extra in ("rf_off", "rf_cuda_off"):  # the program's thread records no operator from here; CUDA's activity goes on
        t0 = time.perf_counter()
        torch._C._autograd._enable_record_function(False)
        if extra == "rf_cuda_off":  # and CUDA's activity is paused
            prof.toggle_collection_dynamic(False, [CUDA])
        out["rf_off_ms"] = ms(t0)
        t0 = time.perf_counter()
        step()
        out["step_after_rf_off_ms"] = ms(t0)
    with Parts() as parts:
        t0 = time.perf_counter()
        prof.stop()
        out["stop_ms"] = ms(t0)
    if extra in ("rf_off", "rf_cuda_off"):
        torch._C._autograd._enable_record_function(True)
    torch._C._profiler._set_record_concrete_inputs_enabled_val(True)
    torch._C._profiler._set_fwd_bwd_enabled_val(True)
    out["stop_parts_ms"] = {k: round(v, 3) for k, v in parts.ms.items()}
    t0 = time.perf_counter()
    try:
        events = prof.profiler.kineto_results.events()
        out["events"] = len(events)
        out["count_ms"] = ms(t0)
        out["kinds"] = kinds(events)
    except Exception as e:  # trace_only keeps no event list for Python
        out["events"] = f"not counted: {type(e).__name__}"
    t0 = time.perf_counter()
    step()
    out["step_after_stop_ms"] = ms(t0)
    prof.profiler = None
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--only", nargs="*", default=None, help="run the variants whose names hold one of these")
    args = parser.parse_args()
    step = workload(compiled=True, sync=True)
    for _ in range(5):  # the compile, then warm steps
        step()
    plain = []
    for _ in range(20):
        t0 = time.perf_counter()
        step()
        plain.append(ms(t0))
    lazy = hasattr(autograd_profiler.profile, "_ensure_function_events")
    result = {"torch": torch.__version__, "lazy_function_events": lazy, "plain_steps_ms": plain, "variants": {}}
    print("torch", torch.__version__, "lazy parse:", lazy, "plain step median", sorted(plain)[10], file=sys.stderr, flush=True)
    # the first CUDA session's start-up is paid once a process (perflab pays it in a session of its own)
    warm = profile(activities=[CUDA])
    warm.start()
    warm.stop()
    warm.profiler = None
    for r in range(args.rounds):
        for name, (acts, shapes, steps, extra) in VARIANTS.items():
            if args.only and not any(o in name for o in args.only):
                continue
            costs = session(step, acts, shapes, steps, extra)
            result["variants"].setdefault(name, []).append(costs)
            print(r, name, costs, file=sys.stderr, flush=True)
    text = json.dumps(result, indent=1)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
