"""max-autotune within a bound the user sets: compile:max-autotune-gemm (the matmuls only, its inductor options checked
against this torch) and --compile-budget (a compile in a child process within a time limit, or a timeout row)."""

import time

import pytest

from perflab.errors import PerflabError
from perflab.spec import Case, validate_case


def test_max_autotune_gemm_uses_options_this_torch_has():
    from perflab.runtime.modes import COMPILE_OPTIONS, compile_kwargs, has_inductor_option

    assert compile_kwargs("max-autotune") == {"mode": "max-autotune"} and compile_kwargs("") == {"mode": None}
    kwargs = compile_kwargs("max-autotune-gemm")
    assert kwargs == {"options": {"max_autotune_gemm": True, "triton.cudagraphs": True}}
    # max-autotune's own options, against which the bounded mode is defined, exist here too
    import torch._inductor as inductor

    full = inductor.list_mode_options("max-autotune")
    assert full == {"max_autotune": True, "triton.cudagraphs": True, "coordinate_descent_tuning": True}
    assert all(has_inductor_option(name) for name in list(full) + list(COMPILE_OPTIONS["max-autotune-gemm"]))
    assert not has_inductor_option("triton.no_such_option")


def test_a_missing_inductor_option_is_one_line(monkeypatch):
    from perflab.runtime import modes

    monkeypatch.setitem(modes.COMPILE_OPTIONS, "max-autotune-gemm", {"max_autotune_gemm": True, "not_in_this_torch": 1})
    with pytest.raises(PerflabError, match="needs inductor option\\(s\\) not_in_this_torch, which torch .* does not have"):
        modes.compile_kwargs("max-autotune-gemm")


def test_the_bounded_mode_is_a_mode_and_a_fix():
    from perflab.diagnosis.explanation import parse_fix

    assert validate_case(Case("gpt_small", workload="train_step", device="cpu", mode="compile:max-autotune-gemm")).mode == "compile:max-autotune-gemm"
    assert parse_fix("compile:max-autotune-gemm") == {"mode": "compile:max-autotune-gemm"}


def test_a_compile_past_its_budget_is_stopped():
    """The child (a case whose step would sleep an hour) gets 0.3 s: stopped at the limit, the case a timeout."""
    from perflab.runtime.compile_budget import compile_in_child

    case = validate_case(Case("test:hangs", device="cpu", mode="compile"))
    started = time.perf_counter()
    result = compile_in_child(case, 0.3)
    assert result["status"] == "timeout" and result["compile_s"] is None
    assert "did not compile within the 0.3 s budget" in result["message"]
    assert time.perf_counter() - started < 10


def test_a_child_that_finishes_reports_its_compile_time():
    """An eager CPU case needs no compiler: the child builds it, takes a step and prints its seconds."""
    from perflab.runtime.compile_budget import compile_in_child

    result = compile_in_child(validate_case(Case("test:tiny", device="cpu")), 120)
    assert result["status"] == "ok" and 0 < result["compile_s"] < result["wall_s"], result


def test_run_within_budget_times_only_the_cases_that_compiled_in_time():
    from perflab.diagnosis.explanation import run_within_budget

    eager = validate_case(Case("gpt_small", workload="train_step", device="cpu"))
    fast = validate_case(Case("gpt_small", workload="train_step", device="cpu", mode="compile:reduce-overhead"))
    slow = validate_case(Case("gpt_small", workload="train_step", device="cpu", mode="compile:max-autotune"))
    children, timed = [], []

    def child(case, budget):
        children.append(case.mode)
        if case.mode == "compile:max-autotune":
            return {"status": "timeout", "compile_s": None, "message": f"{case.mode} did not compile within the {budget:g} s budget"}
        return {"status": "ok", "compile_s": 42.0, "message": None}

    def run(cases):
        timed.append([c.mode for c in cases])
        return [{"status": "ok", "median_ms": 1.0, "first_step_s": 3.0} for _ in cases]

    cold = {}
    rows = run_within_budget([eager, fast, slow], run, 60.0, compile_in_child=child, cold=cold)
    assert timed == [["eager", "compile:reduce-overhead"]] and children == ["compile:reduce-overhead", "compile:max-autotune"]
    assert "compile_cold_s" not in rows[0] and rows[1]["compile_cold_s"] == 42.0
    assert rows[2]["status"] == "timeout" and "within the 60 s budget" in rows[2]["message"]
    run_within_budget([eager, fast], run, 60.0, compile_in_child=child, cold=cold)
    assert len(children) == 2  # compiled once per case id

    from perflab.report.explain_rows import first_step

    assert first_step(rows[1]) == "3.0 (cold 42.0)" and first_step(rows[0]) == "3.0"


def test_compile_budget_must_be_positive():
    from perflab.diagnosis.explanation import explanation_of

    with pytest.raises(PerflabError, match="--compile-budget must be a positive number of seconds"):
        explanation_of(validate_case(Case("gpt_small", workload="train_step", device="cpu")), None, "unused", compile_budget_s=0)
