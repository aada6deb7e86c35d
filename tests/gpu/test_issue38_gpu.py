"""On a GPU: the encoder model's FLOPs (the fused fast path counted), and the GPU demo's tables at 100 columns."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/: cli_util, test_flops_uncounted
from cli_util import run_cli  # noqa: E402

ENCODER_LM = str(Path(__file__).parents[1] / "data" / "models" / "encoder_lm.py") + ":EncoderLM"


def test_a_users_encoder_lm_counts_its_fused_layers_on_the_gpu():
    from perflab import api
    from test_flops_uncounted import B, L, analytic_forward_flops

    for dtype in ("fp32", "bf16"):
        (row,) = api.bench(model=ENCODER_LM, family="lm", workload="forward", seq_len=L, batch_size=B, device="cuda", dtype=dtype,
                           iters=20, repeats=5, warmup=2)
        assert row["status"] == "ok", row.get("message")
        assert row["gflops_per_batch"] * 1e9 == pytest.approx(analytic_forward_flops(), rel=1e-9), dtype
        assert "flops_uncounted" not in row["flags"] and row["mfu"] is not None


def test_the_gpu_bench_of_two_models_fits_100_columns_with_its_comparison():
    done = run_cli("bench", "--model", "deit_tiny_patch16_224", "deit_small_patch16_224", "--batch-size", "1", "64", "--dtype", "bf16",
                   "--mode", "eager", "cudagraph", "--min-time", "0.3", "--repeats", "10", "--warmup", "3", timeout=900)
    assert done.returncode == 0, done.stderr
    lines = (done.stdout + done.stderr).splitlines()
    assert max(len(line) for line in lines) <= 100  # run_cli pipes: 100 columns
    assert "…" not in done.stdout
    for title in ("Paired comparison: model", "Paired comparison: batch size", "Paired comparison: mode"):
        assert title in done.stdout
    assert "tiny = deit_tiny_patch16_224; small = deit_small_patch16_224" in done.stdout
