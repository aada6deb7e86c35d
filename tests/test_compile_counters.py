"""What compiling did, from dynamo's counters: frames, graphs, backend graphs, graph breaks and their reasons; and the
lines explain --parallel prints from them."""

from types import SimpleNamespace

import torch

from perflab.report.explain_parallel import compile_lines
from perflab.runtime.modes import compile_counters, compile_stats


def _two_graphs(x):
    y = x.sin()
    torch._dynamo.graph_break()  # one break: two graphs, the second in a resume frame
    return y.cos()


def test_compile_stats_count_one_break_two_graphs_and_nothing_on_the_second_call():
    before = compile_counters()
    compiled = torch.compile(_two_graphs, backend="aot_eager")
    x = torch.randn(8)
    assert torch.allclose(compiled(x), x.sin().cos())
    first = compile_counters()
    compiled(x)
    second = compile_counters()
    stats = compile_stats(before, first)
    assert stats["graphs"] == 2 and stats["backend_graphs"] == 2 and stats["frames"] == 2  # the function and its resume
    assert stats["graph_breaks"] == 1 and len(stats["break_reasons"]) == 1 and stats["break_reasons"][0]["count"] == 1
    assert "\n" not in stats["break_reasons"][0]["reason"]  # the reason's first line
    assert compile_stats(first, second) == {"frames": 0, "graphs": 0, "backend_graphs": 0, "graph_breaks": 0, "break_reasons": []}


def test_compile_lines_name_the_base_and_each_compiled_fix():
    stats = {"frames": 53, "graphs": 1, "backend_graphs": 4, "graph_breaks": 3, "frames_compiled_while_timed": 2,
             "break_reasons": [{"reason": "Attempted to call function marked as skipped", "count": 2}]}
    e = SimpleNamespace(row={"compile": None}, fix_results=[SimpleNamespace(name="compile", measured={"compile": stats}),
                                                            SimpleNamespace(name="fsdp", measured={})])
    (line,) = compile_lines(e)
    assert line == ("Compile, `compile` (rank 0): 53 frame(s) compiled, 1 dynamo graph(s), 4 compiled by the backend (DDPOptimizer "
                    "splits a DDP model's graph at its buckets), 3 graph break(s): Attempted to call function marked as skipped ×2; "
                    "2 frame(s) compiled again while timed (the timed steps include compilation).")
