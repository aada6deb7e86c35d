"""Execution modes. Each turns (model, static input) into a no-argument step that runs one forward.

- eager: the module as written.
- compile, compile:<mode>: torch.compile (default, reduce-overhead or max-autotune); the first call compiles.
- cudagraph: the forward captured once in a CUDA graph and replayed (static input and output).

Steps are built and called inside the caller's no_grad and precision contexts.
"""

from __future__ import annotations

from typing import Callable

import torch


def make_step(model: torch.nn.Module, x: torch.Tensor, mode: str, capture_warmup: int = 3) -> Callable[[], torch.Tensor]:
    if mode == "eager":
        return lambda: model(x)
    if mode.startswith("compile"):
        _, _, compile_mode = mode.partition(":")
        compiled = torch.compile(model, mode=compile_mode or None)
        if compile_mode in ("reduce-overhead", "max-autotune"):
            # These modes use CUDA graph trees; marking each step lets a new replay reuse the last
            # one's output memory instead of treating the call as a new, unrelated run.
            def step():
                torch.compiler.cudagraph_mark_step_begin()
                return compiled(x)

            return step
        return lambda: compiled(x)
    if mode == "cudagraph":
        return _capture(model, x, capture_warmup)
    raise ValueError(f"unknown mode {mode!r}")


def _capture(model: torch.nn.Module, x: torch.Tensor, warmup: int) -> Callable[[], torch.Tensor]:
    # Warm up on a side stream (as torch.cuda.graphs recommends) so lazy init and autotuning stay out of the graph.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            model(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = model(x)

    def step():
        graph.replay()
        return static_out

    step.graph = graph  # keep the graph (and its memory pool) alive with the step
    return step
