"""FLOPs that say when they miss (measure.flops): ops with no formula that do heavy tensor work are noted and, past a
share of the step, flag the row; nn.TransformerEncoderLayer's fused fast path is counted (with the fast path off)."""

from pathlib import Path

import pytest
import torch

from perflab import api
from perflab.measure.checks import UNCOUNTED_FLAG, uncounted_check
from perflab.measure.flops import FlopCount, count_step

ENCODER_LM = str(Path(__file__).parent / "data" / "models" / "encoder_lm.py") + ":EncoderLM"
B, L, D, F, V, N = 2, 16, 64, 128, 256, 2  # batch, sequence, width, feed-forward, vocabulary, layers of EncoderLM()


def analytic_forward_flops(b=B, seq=L, d=D, ff=F, vocab=V, layers=N) -> int:
    """2 per multiply-add: per layer the QKV and output projections, QKᵀ and AV, the two feed-forward matmuls; the head."""
    per_layer = 2 * b * seq * d * 3 * d + 2 * b * seq * d * d + 2 * 2 * b * seq * seq * d + 2 * 2 * b * seq * d * ff
    return layers * per_layer + 2 * b * seq * d * vocab


def encoder_lm():
    from perflab.models.reference import build_module

    return build_module(ENCODER_LM, {}).eval()


def test_the_fused_encoder_fast_path_is_noted_and_counted_with_the_fast_path_off():
    model = encoder_lm()
    idx = torch.randint(0, V, (B, L))
    with torch.no_grad():
        fused = count_step(lambda: model(idx), mha_fastpath=True)
        counted = count_step(lambda: model(idx))
    # the fast path: the head alone is counted; the two fused layers are noted by name, with a lower bound of their work
    assert fused.flops == 2 * B * L * D * V
    assert fused.uncounted == {"aten::_transformer_encoder_layer_fwd": N}
    assert fused.uncounted_flops_min == N * 2 * B * L * D * D  # 2 × output elements × the input's inner dimension
    check = uncounted_check(fused)
    assert check.flag == UNCOUNTED_FLAG and "aten::_transformer_encoder_layer_fwd ×2" in check.message and "at least 33%" in check.message
    # perflab's count (fast path off): every matmul, as the analytic count has it, and nothing left uncounted
    assert counted.flops == analytic_forward_flops() and counted.uncounted == {}
    assert uncounted_check(counted) is None
    assert torch.backends.mha.get_fastpath_enabled()  # restored


def test_a_custom_op_with_no_formula_is_named_and_a_small_share_is_not_flagged():
    @torch.library.custom_op("perflab_test::matmul", mutates_args=())
    def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b

    a, b = torch.randn(64, 32), torch.randn(32, 48)
    count = count_step(lambda: matmul(a, b) + (a @ b))
    assert count.flops == 2 * 64 * 32 * 48  # the plain matmul
    assert count.uncounted == {"perflab_test::matmul": 1} and count.uncounted_flops_min == 2 * 64 * 48 * 32
    assert uncounted_check(count).flag == UNCOUNTED_FLAG
    small = FlopCount(flops=10**9, uncounted={"perflab_test::matmul": 1}, uncounted_flops_min=10**6)
    assert uncounted_check(small) is None  # 0.1% of the step: noted in the row, not flagged


def test_a_users_encoder_lm_counts_what_it_runs_in_bench():
    (row,) = api.bench(model=ENCODER_LM, family="lm", workload="forward", seq_len=L, batch_size=B, device="cpu", iters=2, repeats=2,
                       warmup=0)
    assert row["status"] == "ok", row.get("message")
    assert row["gflops_per_batch"] * 1e9 == pytest.approx(analytic_forward_flops(), rel=1e-9)
    assert UNCOUNTED_FLAG not in row["flags"] and "flops_uncounted_ops" not in row
