"""The lm and decode families from the command line and through their workloads, on the CPU (issue must-shows):
a bench row's parameters, FLOPs and bytes against formulas written out here, a training step that trains, an
explicit-attention profile pass with its three ranges, and one-line errors with exit status 2."""

import json
import math

import pytest
import torch

from cli_util import assert_one_line_error, run_cli_here
from perflab.runtime.modes import make_step
from perflab.runtime.workload import step_context
from perflab.spec import Case, validate_case
from perflab.workloads.implementations import implementation

# gpt_small: d_model 768, d_ff 3072, 12 layers, 12 heads, vocabulary 10,000 (seed 003's course config)
D, DFF, L, V = 768, 3072, 12, 10_000


def _json_rows(result):
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def test_must_show_gpt_small_forward_on_the_cpu():
    r = run_cli_here("bench", "--model", "gpt_small", "--workload", "forward", "--seq-len", "128", "--batch-size", "4", "--device", "cpu",
                "--iters", "2", "--warmup", "1", "--format", "json")
    (row,) = _json_rows(r)
    assert row["status"] == "ok" and row["tokens_per_s"] > 0
    params = V * D + L * (4 * D * D + 3 * D * DFF + 2 * D) + D + D * V  # embedding, layers (+2 norms), final norm, untied head
    assert row["params_m"] * 1e6 == pytest.approx(params, rel=1e-3)
    batch, seq = 4, 128
    matmuls = 2 * batch * seq * (L * (4 * D * D + 3 * D * DFF) + D * V)  # 2 FLOPs per multiply-add, per token
    attention = L * batch * 4 * seq * seq * D  # q·kᵀ and probs·v over the full T×T (the causal half included)
    assert row["gflops"] * batch * 1e9 == pytest.approx(matmuls + attention, rel=0.01)  # gflops is per sequence
    assert row["flops_analytic"] == matmuls + attention
    assert row["tokens_per_s"] == pytest.approx(batch * seq * 1000 / row["median_ms"])


def test_must_show_llama3_8b_two_layer_decode_on_the_cpu():
    r = run_cli_here("bench", "--model", "llama3_8b", "--layers", "2", "--workload", "decode", "--context-len", "128", "--batch-size", "1",
                "--device", "cpu", "--iters", "2", "--warmup", "1", "--format", "json")
    (row,) = _json_rows(r)
    assert row["status"] == "ok" and row["tokens_per_s"] > 0
    dim, layers, heads, kv_heads, ffn, vocab, fp32 = 4096, 2, 32, 8, 14336, 128256, 4
    head_dim = dim // heads
    layer_params = dim * (heads + 2 * kv_heads) * head_dim + heads * head_dim * dim + 3 * dim * ffn + 2 * dim
    # every weight read once (of the embedding table only the batch's row), the cache read at positions 0..128,
    # the new token's K and V written
    weights = (layers * layer_params + dim + vocab * dim + 1 * dim) * fp32
    kv_per_token = layers * 2 * kv_heads * head_dim * fp32
    assert row["bytes_per_step"] == weights + kv_per_token * (128 + 1) + kv_per_token
    assert row["arithmetic_intensity"] == pytest.approx(row["flops_analytic"] / row["bytes_per_step"])
    assert row["tokens_per_s"] == pytest.approx(1000 / row["median_ms"])


def _tiny_lm(**fields):
    return validate_case(Case("gpt_small", layers=2, model_args={"d_model": 64, "d_ff": 128, "n_heads": 4}, seq_len=16, batch_size=2,
                              device="cpu", **fields))


def test_a_train_step_changes_the_weights_and_lowers_a_finite_loss():
    case = _tiny_lm(workload="train_step")
    built = implementation(case).build(case)
    before = {n: p.detach().clone() for n, p in built.model.named_parameters()}
    with step_context(case, built):
        step = make_step(built, "eager")
        losses = [float(step()[0].detach()) for _ in range(5)]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]  # the same batch: AdamW fits it
    changed = [n for n, p in built.model.named_parameters() if not torch.equal(p, before[n])]
    assert len(changed) == len(before)  # every parameter moved
    assert all(p.grad is None for p in built.model.parameters())  # zero_grad(set_to_none) after the step


def test_an_explicit_attention_profile_pass_on_the_cpu_has_the_three_attention_ranges(tmp_path):
    from perflab import api

    case = _tiny_lm(workload="forward_backward", attn="explicit")
    built = implementation(case).build(case)
    built.set_annotate(model_ranges=True, passes=True)
    with step_context(case, built):
        step = make_step(built, "eager")
        with api.profile(steps=2, warmup=1, out=tmp_path / "cpu.json") as prof:
            for _ in range(3):
                step()
                prof.step()
    path = str(prof.trace_path)
    opener = __import__("gzip").open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    count = {name: sum(1 for e in events if e.get("ph") == "X" and e.get("name") == name)
             for name in ("attn.scores", "attn.softmax", "attn.final_matmul", "forward", "backward")}
    # 2 profiled steps: each attention range once per layer (2 layers) per step, each pass once per step
    assert count == {"attn.scores": 4, "attn.softmax": 4, "attn.final_matmul": 4, "forward": 2, "backward": 2}


@pytest.mark.parametrize("args, fragment", [
    (["--model", "gpt_tiny"], "unknown"),
    (["--model", "gpt_small", "--seq-len", "0"], "sequence length must be at least 1"),
    (["--model", "gpt_small", "--seq-len", "100000"], "longer than gpt_small's context"),
    (["--model", "gpt_small", "--workload", "decode"], "decode"),
    (["--model", "gpt_small", "--keep-rate", "0.5", "--reduction-loc", "3"], "keep"),
    (["--model", "llama3_8b", "--layers", "1", "--workload", "decode", "--context-len", "9000"], "longer than llama3_8b's max_seq_len of 8192"),
    (["--model", "llama3_8b", "--layers", "1", "--model-arg", "n_kv_heads=5"], "n_heads 32 is not divisible by n_kv_heads 5"),
    (["--model", "llama3_8b", "--layers", "1", "--workload", "generate", "--prompt-len", "8", "--new-tokens", "0"], "--new-tokens must be at least 1"),
    (["--model", "deit_tiny_patch16_224", "--workload", "decode"], "decode"),
], ids=["unknown-lm", "seq-0", "seq-too-long", "lm-decode-workload", "lm-keep-rate", "context-too-long", "gqa-split", "new-tokens-0",
        "vit-decode"])
def test_bad_family_input_is_one_line_and_exit_2(args, fragment, tmp_path):
    out = tmp_path / "rows.json"
    out.write_text("kept\n")
    r = run_cli_here("bench", *args, "--device", "cpu", "--iters", "1", "--warmup", "0", "--out", out)
    assert_one_line_error(r, fragment)
    assert r.stdout == "" and out.read_text() == "kept\n"  # nothing measured, nothing stored overwritten
