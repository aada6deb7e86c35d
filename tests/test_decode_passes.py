"""generate's passes: the prefill and decode steps are marked in profile passes, and their per-pass costs are
the prefill workload's and the decode workload's, summed over the steps exactly."""

import torch

from perflab.runtime.modes import make_step
from perflab.runtime.workload import build, step_context
from perflab.spec import Case, validate_case
from perflab.workloads.decode import Decode

TINY = dict(model="llama3_8b", layers=2, model_args={"dim": 256, "ffn_dim": 512, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 1000},
            dtype="fp32", device="cpu", batch_size=2)


def test_generate_pass_costs_are_the_prefill_and_decode_workloads_summed():
    case = validate_case(Case(**TINY, workload="generate", prompt_len=16, new_tokens=5))
    costs = Decode().pass_costs(case, {})
    assert list(costs) == ["prefill", "decode"]
    prefill = validate_case(Case(**TINY, workload="prefill", prompt_len=16))
    assert costs["prefill"]["bytes"] == Decode().analytic(prefill)["bytes_per_step"]
    steps = [validate_case(Case(**TINY, workload="decode", context_len=16 + i)) for i in range(4)]  # 5 tokens: 1 from the prefill + 4 steps
    assert costs["decode"]["bytes"] == sum(Decode().analytic(s)["bytes_per_step"] for s in steps)
    # FLOPs over the static cache of 21 positions, as they run: the decode workload's step at context 20 has a cache of 21
    assert costs["decode"]["flops"] == 4 * Decode().analytic(validate_case(Case(**TINY, workload="decode", context_len=20)))["flops_analytic"]
    assert Decode().pass_costs(validate_case(Case(**TINY, workload="decode")), {}) is None


def test_generate_marks_prefill_and_each_decode_step_when_annotating():
    case = validate_case(Case(**TINY, workload="generate", prompt_len=8, new_tokens=4, warmup=0))
    built = build(case)
    built.set_annotate(model_ranges=False, passes=True)
    with step_context(case, built), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        make_step(built, "eager")()
    names = [e.name for e in prof.events() if e.name in ("prefill", "decode")]
    assert names.count("prefill") == 1 and names.count("decode") == 3


def test_a_cpu_generate_case_times_its_tokens_on_the_host_clock_even_where_cuda_is_up(monkeypatch):
    """The clock follows the case's device, not whether something else started CUDA in the process (a sweep's GPU case
    before this one): CUDA events there timed the GPU's idle stream and could not be read as host times."""
    case = validate_case(Case(**TINY, workload="generate", prompt_len=8, new_tokens=4, warmup=0))
    built = build(case)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with step_context(case, built):
        out = Decode().after_timing(case, built, make_step(built, "eager"), {})
    assert out["ttft_ms"] > 0 and out["tpot_ms"] > 0 and out["tpot_p90_ms"] > 0
    assert built.extra["token_stamps"] is None
