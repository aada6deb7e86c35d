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


def test_one_gpu_explain_says_what_compiling_did_in_each_compiled_mode_and_fix():
    from perflab.report.explain_rows import compile_lines as one_gpu_lines

    stats = {"frames": 2, "graphs": 1, "backend_graphs": 1, "graph_breaks": 0, "frames_compiled_while_timed": 0, "break_reasons": []}
    ce = SimpleNamespace(measured={"eager": {}, "compile": {"compile": stats}, "cudagraph": {"status": "ok"}},
                         fix_results=[SimpleNamespace(name="mode=compile:max-autotune", measured={"compile": dict(stats, frames=3)}),
                                      SimpleNamespace(name="batch=8", measured=None)])
    assert one_gpu_lines(ce) == [
        "Compile, `compile`: 2 frame(s) compiled, 1 dynamo graph(s), 1 compiled by the backend, 0 graph break(s); "
        "0 frame(s) compiled again while timed.",
        "Compile, fix `mode=compile:max-autotune`: 3 frame(s) compiled, 1 dynamo graph(s), 1 compiled by the backend, "
        "0 graph break(s); 0 frame(s) compiled again while timed."]


def test_a_compiled_case_row_says_what_compiling_did_alone_and_timed_together():
    from perflab.measure.harness import run_case, run_cases
    from perflab.spec import Case

    fast = dict(device="cpu", input_size=32, warmup=1, iters=5, repeats=5)
    alone = run_case(Case("test:tiny", mode="compile", **fast))
    assert alone["status"] == "ok", alone.get("message")
    c = alone["compile"]
    # test:tiny traces as one graph, compiled by inductor through AOTAutograd, nothing compiled again while timed
    assert c["graphs"] == 1 and c["backend_graphs"] == 1 and c["graph_breaks"] == 0 and c["break_reasons"] == []
    assert c["frames"] >= 1 and c["frames_compiled_while_timed"] == 0
    eager, compiled = run_cases([Case("test:tiny", **fast), Case("test:tiny", mode="compile", batch_size=2, **fast)])
    assert "compile" not in eager and compiled["compile"]["graphs"] >= 1 and compiled["compile"]["frames_compiled_while_timed"] == 0
    assert compiled["session"] == eager["session"] and compiled["sample_rounds"]  # timed together, interleaved


def test_compile_checks_warn_of_a_recompile_while_timed_and_of_graph_breaks():
    from perflab.measure.checks import compile_checks

    assert compile_checks(None) == [] and compile_checks({"frames_compiled_while_timed": 0, "graph_breaks": 0}) == []
    checks = compile_checks({"frames_compiled_while_timed": 2, "graph_breaks": 3, "graphs": 4,
                             "break_reasons": [{"reason": "Unsupported method call", "count": 3}]})
    assert [c.flag for c in checks] == ["compiled_while_timed", "graph_breaks"]
    assert "compiled 2 frame(s) during the timed steps" in checks[0].message
    assert checks[1].message == "compile: 3 graph break(s) in 4 graph(s) (Unsupported method call ×3); the step runs eagerly between them"
