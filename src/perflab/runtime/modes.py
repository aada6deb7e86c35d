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
        step = built.make_step(torch.compile(built.model, mode=compile_mode or None))
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
