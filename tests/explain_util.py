"""The CPU run of `perflab explain --parallel` that several test files read (conftest's ``explain_ddp_run``)."""

import json

TINY = ["gpt_small", "--workload", "train_step", "--layers", "1", "--model-arg", "d_model=64", "--model-arg", "n_heads=2", "--model-arg",
        "d_ff=128", "--model-arg", "vocab_size=256", "--seq-len", "16", "--batch-size", "2", "--dtype", "fp32", "--device", "cpu"]
FAST = ["--iters", "4", "--repeats", "2", "--warmup", "1", "--steps", "2"]


def run_explain_parallel(tmp):
    """(its JSON, its markdown, its stderr: a pipe, with a progress line every 0.5 s)."""
    import pytest

    from cli_util import run_cli_here

    md = tmp / "explain.md"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PERFLAB_PROGRESS_S", "0.5")
        result = run_cli_here("explain", *TINY, "--parallel", "ddp:bucket_cap_mb=0.1", "--world-size", "2", *FAST, "--fixes",
                              "fsdp:reshard=false", "--out", tmp / "traces", "--json", "--markdown", md)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), md.read_text(), result.stderr
