"""Execution modes. Each turns a built workload into a no-argument step that runs one timed step.

- eager: the step as written.
- compile, compile:<mode>: the model under torch.compile (default, reduce-overhead or max-autotune); the
  step around it (loss, backward, optimizer) stays as written; the first call compiles.
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
        step = built.make_step(torch.compile(built.model, mode=compile_mode or None, dynamic=False))
        if compile_mode in ("reduce-overhead", "max-autotune"):
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
