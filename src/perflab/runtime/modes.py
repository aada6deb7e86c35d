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

from typing import Any, Callable

import torch


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
            "break_reasons": [{"reason": reason.strip().splitlines()[0] if reason.strip() else "", "count": n} for reason, n in reasons]}


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
