"""The GPT of models/lm.py: analytic counts against what runs, attention variants, RoPE, causality, ranges."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils import flop_counter

from perflab.errors import PerflabError
from perflab.measure.flops import _extra_formulas, count_flops
from perflab.models.lm import GPT, LMConfig, apply_rope, forward_flops, lm_configs, param_count, rope_frequencies, rope_tables, train_flops

TINY = dict(d_model=64, d_ff=96, n_layers=2, n_heads=4, vocab_size=97, context_length=32)


def tiny(attn: str = "sdpa", **overrides) -> LMConfig:
    return LMConfig.from_name("gpt_small", **{**TINY, "attn": attn, **overrides})


def tokens(batch: int, seq: int, vocab: int = TINY["vocab_size"], seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", list(lm_configs))
def test_param_count_equals_a_meta_device_build(name):
    cfg = LMConfig.from_name(name)
    with torch.device("meta"):
        model = GPT(cfg)
    total = sum(p.numel() for p in model.parameters())
    embedding = model.tok_embeddings.weight.numel()
    assert param_count(cfg) == dict(total=total, non_embedding=total - embedding)


def test_named_config_shapes():
    cfg = LMConfig.from_name("gpt_xl")
    assert (cfg.d_model, cfg.d_ff, cfg.n_layers, cfg.n_heads, cfg.head_dim) == (1600, 6400, 48, 25, 64)
    assert (cfg.vocab_size, cfg.context_length) == (10_000, 1024)
    assert LMConfig.from_name("gpt_2.7b", n_layers=None).n_layers == 32  # None overrides are ignored


def _cpu_sdpa_backward_flops(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return flop_counter.sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


def _counted(run_once) -> int:
    # count_flops covers the CPU's fused SDPA forward; its backward has no formula in torch's registry
    # either, so the test gives it the one the CUDA kernels have.
    mapping = {}
    cpu_backward = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    if cpu_backward is not None and cpu_backward not in flop_counter.flop_registry:
        mapping[cpu_backward] = _cpu_sdpa_backward_flops
    with flop_counter.FlopCounterMode(display=False, custom_mapping={**_extra_formulas(), **mapping}) as counter:
        run_once()
    return int(counter.get_total_flops())


@pytest.mark.parametrize("attn", ["sdpa", "explicit"])
def test_forward_flops_equal_the_counted_flops(attn):
    cfg = tiny(attn)
    model = GPT(cfg)
    idx = tokens(3, 24)
    with torch.no_grad():
        assert count_flops(lambda: model(idx)) == forward_flops(cfg, 3, 24)


@pytest.mark.parametrize("attn", ["sdpa", "explicit"])
def test_forward_backward_flops_are_three_forwards(attn):
    cfg = tiny(attn)
    model = GPT(cfg)
    idx = tokens(2, 16)

    def forward_backward():
        logits = model(idx)
        F.cross_entropy(logits.flatten(0, 1), idx.flatten()).backward()

    counted = _counted(forward_backward)
    assert counted == pytest.approx(train_flops(cfg, 2, 16), rel=0.01)
    assert train_flops(cfg, 2, 16) == 3 * forward_flops(cfg, 2, 16)


def test_sdpa_and_explicit_give_the_same_logits():
    sdpa = GPT(tiny("sdpa"))
    explicit = GPT(tiny("explicit"))
    explicit.load_state_dict(sdpa.state_dict())
    idx = tokens(2, 20)
    with torch.no_grad():
        # fp32, the same math in another order: agreement to ~1e-6 relative; 1e-5 leaves room.
        torch.testing.assert_close(explicit(idx), sdpa(idx), rtol=1e-5, atol=1e-5)


def reference_frequencies(head_dim: int, theta: float) -> list[float]:
    return [theta ** (-2 * i / head_dim) for i in range(head_dim // 2)]


def reference_rope(x: torch.Tensor, frequencies: list[float]) -> torch.Tensor:
    """The published formula, element by element: pair (2i, 2i+1) of position p turns by p · frequencies[i]."""
    *lead, T, d = x.shape
    flat = x.double().reshape(-1, T, d)
    out = torch.empty_like(flat)
    for p in range(T):
        for i, frequency in enumerate(frequencies):
            c, s = math.cos(p * frequency), math.sin(p * frequency)
            a, b = flat[:, p, 2 * i], flat[:, p, 2 * i + 1]
            out[:, p, 2 * i] = a * c - b * s
            out[:, p, 2 * i + 1] = a * s + b * c
    return out.reshape(x.shape)


def test_rope_matches_the_reference_formula():
    x = torch.randn(2, 3, 17, 8, generator=torch.Generator().manual_seed(1))
    cos, sin = rope_tables(rope_frequencies(8, 10_000.0), 17)
    torch.testing.assert_close(apply_rope(x, cos, sin).double(), reference_rope(x, reference_frequencies(8, 10_000.0)), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("attn", ["sdpa", "explicit"])
def test_causal(attn):
    model = GPT(tiny(attn))
    idx = tokens(1, 16)
    changed = idx.clone()
    changed[0, 9] = (idx[0, 9] + 1) % TINY["vocab_size"]
    with torch.no_grad():
        before, after = model(idx), model(changed)
    torch.testing.assert_close(after[:, :9], before[:, :9], rtol=0, atol=0)
    assert not torch.allclose(after[:, 9:], before[:, 9:])


def _range_names(model, idx) -> set[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof, torch.no_grad():
        model(idx)
    return {event.name for event in prof.events()}


def test_explicit_attention_ranges_only_when_annotated():
    model = GPT(tiny("explicit"))
    idx = tokens(1, 8)
    ranges = {"attn.scores", "attn.softmax", "attn.final_matmul"}
    assert not ranges & _range_names(model, idx)
    model.annotate = True
    assert ranges <= _range_names(model, idx)


def test_unannotated_forward_compiles_as_one_graph():
    # A context manager in forward, even a no-op one, once cost 9 graph breaks here.
    model = GPT(tiny("explicit"))
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(tokens(1, 8))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)


def test_adamw_steps_lower_a_finite_loss():
    torch.manual_seed(0)
    model = GPT(tiny("sdpa"))
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    idx = tokens(4, 16)  # the same batch each step, so the loss must fall
    losses = []
    for _ in range(5):
        loss = F.cross_entropy(model(idx).flatten(0, 1), idx.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0]
    assert losses[0] == pytest.approx(math.log(TINY["vocab_size"]), rel=0.05)  # small init: near uniform
    assert all(not torch.equal(before[name], p) for name, p in model.named_parameters())


def test_bf16_autocast_loss_is_finite():
    model = GPT(tiny("explicit"))
    idx = tokens(2, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(idx).flatten(0, 1).float(), idx.flatten())
    assert math.isfinite(loss.item())


@pytest.mark.parametrize(
    "name, overrides, message",
    [
        ("gpt_smal", {}, "did you mean gpt_small"),
        ("gpt_small", dict(n_heads=5), "not divisible by n_heads 5"),
        ("gpt_small", dict(d_model=60, n_heads=4), "head_dim 15"),
        ("gpt_small", dict(d_ff=0), "d_ff must be a positive integer"),
        ("gpt_small", dict(attn="flash"), "unknown attn 'flash'"),
        ("gpt_small", dict(dmodel=64), "unknown LMConfig field 'dmodel'"),
    ],
)
def test_config_errors(name, overrides, message):
    with pytest.raises(PerflabError, match=message):
        LMConfig.from_name(name, **overrides)


def test_sequence_longer_than_the_context_is_an_error():
    model = GPT(tiny(context_length=8))
    with pytest.raises(PerflabError, match="exceeds context_length 8"):
        model(tokens(1, 9))
