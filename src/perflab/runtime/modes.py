"""Execution modes. Each turns a built workload into a no-argument step that runs one timed step.

- eager: the step as written.
- compile, compile:<mode>: the model under torch.compile (default, reduce-overhead or max-autotune); the
  step around it (loss, backward, optimizer) stays as written; the first call compiles.
- compile:max-autotune-gemm: max-autotune bounded to the shapes that dominate a transformer step, the matmuls:
  inductor's ``max_autotune_gemm`` (GEMM templates benchmarked against cuBLAS, prologue and epilogue fusion into
  them) with CUDA graphs, without what else ``max-autotune`` turns on (``max_autotune_pointwise`` and
  ``coordinate_descent_tuning``: every pointwise and reduction kernel tuned, config by config). Its options are
  checked against the installed torch (``compile_options``).
- cudagraph: the whole step captured once in a CUDA graph and replayed (static inputs and outputs; a
  training step's optimizer must be capturable, which the family sets up for this mode).

Steps are built and called inside the caller's grad and precision contexts.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable

import torch

from perflab.errors import first_line
from perflab.spec import AUTOTUNE_MODES


def make_step(built, mode: str, capture_warmup: int = 3) -> Callable[[], Any]:
    """The step of ``built`` (a workloads.base.Built) in ``mode``."""
    if mode == "eager":
        return built.make_step(built.model)
    if mode.startswith("compile"):
        _, _, compile_mode = mode.partition(":")
        allow_recompiles()
        # dynamic=False: each case is compiled for its own shapes. Left to dynamo, the second shape of one model
        # class in a process (a bench grid, cases timed together) is compiled with dynamic dimensions, and another
        # graph is measured than one process per case measures.
        step = built.make_step(torch.compile(built.model, dynamic=False, **compile_kwargs(compile_mode)))
        if compile_mode in GRAPHED_COMPILE_MODES:
            # These modes use CUDA graph trees; marking each step lets a new replay reuse the last
            # one's output memory instead of treating the call as a new, unrelated run.
            def marked():
                torch.compiler.cudagraph_mark_step_begin()
                return step()

            return marked
        return step
    if mode == "cudagraph":
        return capture(built.make_step(built.model), capture_warmup)
    raise ValueError(f"unknown mode {mode!r}")


# Inductor options of perflab's own compile modes (torch.compile's mode= names the others).
COMPILE_OPTIONS = {"max-autotune-gemm": {"max_autotune_gemm": True, "triton.cudagraphs": True}}
GRAPHED_COMPILE_MODES = ("reduce-overhead", "max-autotune", "max-autotune-gemm")  # CUDA graph trees: mark each step


def compile_kwargs(compile_mode: str) -> dict:
    """torch.compile's keywords for ``compile:<compile_mode>``: ``mode=`` for torch's own modes, ``options=`` for
    perflab's (``COMPILE_OPTIONS``), each option checked against this torch's inductor config."""
    if compile_mode not in COMPILE_OPTIONS:
        return {"mode": compile_mode or None}
    options = COMPILE_OPTIONS[compile_mode]
    missing = [name for name in options if not has_inductor_option(name)]
    if missing:
        from perflab.errors import PerflabError

        raise PerflabError(f"compile:{compile_mode} needs inductor option(s) {', '.join(missing)}, which torch {torch.__version__} does not have; "
                           "use compile:max-autotune")
    return {"options": dict(options)}


def has_inductor_option(name: str) -> bool:
    """Whether ``torch._inductor.config`` has the (dotted) option ``name``."""
    import torch._inductor.config as config

    node = config
    for part in name.split("."):
        if not hasattr(node, part):
            return False
        node = getattr(node, part)
    return True


RECOMPILE_LIMIT = 256  # compiled graphs per code object in one process (dynamo's default: 8)


def allow_recompiles() -> None:
    """Let one process compile a model's forward for many cases. dynamo keeps 8 graphs per code object by default
    and then runs that code *eagerly*, without a word: the ninth compiled case of one model class in a bench grid
    (or of several timed together) was measured as eager (an hf: decoder's bs8 compile rows read the eager time
    on an H100, 2026-11-23)."""
    import torch._dynamo.config as config

    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), RECOMPILE_LIMIT))
    if hasattr(config, "accumulated_recompile_limit"):
        config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, 4 * RECOMPILE_LIMIT)


def compile_counters() -> dict:
    """dynamo's process-wide counters now: frames compiled, dynamo graphs, graphs handed to AOTAutograd (a DDP-wrapped
    model's graph is split at its buckets by DDPOptimizer, each piece compiled on its own), graph breaks with their
    reasons. ``compile_stats(before, after)`` gives what happened between two of these."""
    from torch._dynamo.utils import counters

    return {"frames": int(counters["frames"]["total"]), "graphs": int(counters["stats"]["unique_graphs"]),
            "backend_graphs": int(counters["aot_autograd"]["total"]), "breaks": dict(counters["graph_break"])}


def compile_stats(before: dict, after: dict, top: int = 3) -> dict:
    """What compiling did between two ``compile_counters()``: frames, graphs, backend graphs and graph breaks, and the
    ``top`` break reasons by count (each reason's first line)."""
    breaks = {reason: n - before["breaks"].get(reason, 0) for reason, n in after["breaks"].items()}
    breaks = {reason: n for reason, n in breaks.items() if n > 0}
    reasons = sorted(breaks.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    return {"frames": after["frames"] - before["frames"], "graphs": after["graphs"] - before["graphs"],
            "backend_graphs": after["backend_graphs"] - before["backend_graphs"], "graph_breaks": sum(breaks.values()),
            "break_reasons": [{"reason": first_line(reason), "count": n} for reason, n in reasons]}


def compiled_while_timed(cases, since: dict | None = None) -> None:
    """Each compiled case's ``frames_compiled_while_timed`` (``cases``: each with its ``compile_stats``, None where it is
    not compiled, and ``compile_after``, the counters when it was warm: ``measure.harness.Prepared``): frames dynamo
    compiled from ``since`` (the counters when the timed loop began; default: when the case was warm) to now. Cases
    timed together share one count, the session's."""
    compiled = [c for c in cases if c.compile_stats is not None]
    if not compiled:
        return
    now = compile_counters()
    for c in compiled:
        c.compile_stats["frames_compiled_while_timed"] = compile_stats(since or c.compile_after, now)["frames"]


def capture(step: Callable[[], Any], warmup: int) -> Callable[[], Any]:
    # Warm up on a side stream (as torch.cuda.graphs recommends) so lazy init, autotuning and the
    # optimizer's state allocation stay out of the graph.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = step()

    def replay():
        graph.replay()
        return static_out

    replay.graph = graph  # keep the graph (and its memory pool) alive with the step
    return replay


# ---------------------------------------------------------------------------------------------------
# What max-autotune chose. inductor benchmarks each tuned op's candidate kernels (select_algorithm: cuBLAS against Triton
# GEMM templates and their configs, ...) while it lowers the graph, and calls its feedback savers with every candidate's
# time (``torch._inductor.select_algorithm.add_feedback_saver``: torch 2.3 and later, 2.11 and 2.13 included). A choice
# read from inductor's autotuning cache comes through them too; a graph served whole from the FX graph cache does not
# (the counters say so, and its kernels are those of the compile that filled the cache).

_RECORDING: list["AutotuneRecord"] = []  # the records collecting now (one per case being compiled)


class AutotuneRecord:
    """inductor's autotuning decisions while ``record_autotune`` is active: per tuned op and input shapes, the kernel it
    kept, its time, the runner-up's and how many candidates were benchmarked."""

    def __init__(self):
        self.ops: dict[tuple, dict] = {}
        self.problem: str | None = None
        self.cache0 = _fx_cache_counters()

    def add(self, timings: dict, name: str, input_nodes) -> None:
        ranked = sorted(((t, _choice_label(c)) for c, t in timings.items() if t == t and t != float("inf")), key=lambda x: x[0])
        if not ranked:
            return
        shapes = tuple(_shape(node) for node in input_nodes)
        entry = self.ops.setdefault((str(name), shapes), {"op": str(name), "shapes": [list(s) for s in shapes], "calls": 0})
        entry.update(calls=entry["calls"] + 1, candidates=len(timings), chosen=ranked[0][1], chosen_ms=float(ranked[0][0]))
        if len(ranked) > 1:
            entry.update(runner_up=ranked[1][1], runner_up_ms=float(ranked[1][0]), margin=float(ranked[1][0] / ranked[0][0] - 1.0)
                         if ranked[0][0] > 0 else None)

    def result(self) -> dict:
        """The row's ``autotune``: the ops in the order first tuned, a signature of the choices (equal signatures, equal
        kernels), the closest call, and what the FX graph cache served."""
        import hashlib
        import json

        ops = list(self.ops.values())
        chosen = sorted((o["op"], json.dumps(o["shapes"]), o["chosen"]) for o in ops)
        cache = {k: v - self.cache0.get(k, 0) for k, v in _fx_cache_counters().items()}
        out = {"ops": ops, "signature": hashlib.sha1(json.dumps(chosen).encode()).hexdigest()[:12] if ops else None,
               "fx_graph_cache": cache, "cache_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR")}
        margins = [o["margin"] for o in ops if o.get("margin") is not None]
        if margins:
            out["closest_margin"] = min(margins)  # the runner-up was this much slower: a call a few % apart can flip
        if not ops:
            out["note"] = ("no autotuning in this process: the FX graph cache served the compiled graph, whose kernels are those "
                           "its compile chose" if cache.get("hit") else "inductor benchmarked no op with more than one candidate")
        if self.problem:
            out["problem"] = self.problem
        return out


@contextlib.contextmanager
def record_autotune(mode: str):
    """An ``AutotuneRecord`` of the autotuning done inside, for the modes that autotune (``AUTOTUNE_MODES``); None for
    the others. Where this torch has no feedback savers, the record says so and stays empty."""
    if mode not in AUTOTUNE_MODES:
        yield None
        return
    record = AutotuneRecord()
    try:
        _register_saver()
    except Exception as exc:  # an inductor without feedback savers: the row says so, the case runs
        record.problem = f"cannot record autotuning on torch {torch.__version__} ({type(exc).__name__}: {exc})"
    _RECORDING.append(record)
    try:
        yield record
    finally:
        _RECORDING.remove(record)


def _register_saver() -> None:
    """perflab's one feedback saver on inductor's algorithm selector (again if that selector was made anew)."""
    from torch._inductor import select_algorithm

    cache = getattr(select_algorithm, "_ALGORITHM_SELECTOR_CACHE", None)
    if cache is None or _feedback not in getattr(cache, "feedback_saver_fns", ()):
        select_algorithm.add_feedback_saver(_feedback)


def _feedback(timings, name, input_nodes, choices, *rest) -> None:
    for record in _RECORDING:
        try:
            record.add(timings, name, input_nodes)
        except Exception as exc:  # a format another torch gives: said in the row, never a failed compile
            record.problem = f"an autotuning result could not be read ({type(exc).__name__}: {exc})"


def _choice_label(choice) -> str:
    """A candidate as the same kernel is named in every process: its kind (``triton_mm``, ``mm``: the name without the
    per-process counter) and its description (a template's block sizes, stages and warps)."""
    import re

    kind = re.sub(r"_\d+$", "", str(getattr(choice, "name", type(choice).__name__)))
    description = " ".join(str(getattr(choice, "description", "") or "").split())
    return f"{kind} ({description})" if description else kind


def _shape(node) -> tuple:
    try:
        return tuple(int(s) if str(s).lstrip("-").isdigit() else str(s) for s in node.get_size())
    except Exception:
        return ()


def _fx_cache_counters() -> dict:
    from torch._dynamo.utils import counters

    return {k: int(counters["inductor"].get(f"fxgraph_cache_{k}", 0)) for k in ("hit", "miss", "bypass")}
