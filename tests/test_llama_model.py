"""Llama for decode: the KV cache against a full forward, GQA against references, RoPE and its llama3 scaling,
the named shapes' parameter counts, and the analytic bytes and FLOPs of a decode step."""

import math

import pytest
import torch
from test_lm_model import reference_frequencies, reference_rope

from perflab.errors import PerflabError
from perflab.measure.flops import count_flops
from perflab.spec import Case, validate_case
from perflab.models.lm import apply_rope
from perflab.models.llama import (
    Attention,
    KVCache,
    Llama,
    LlamaConfig,
    decode_bytes,
    decode_flops,
    llama3_scaled_frequencies,
    llama_configs,
    llama_rope_tables,
    param_count,
)

TINY = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=97, ffn_dim=96, max_seq_len=64)


def tiny(name: str = "llama3_8b", **overrides) -> LlamaConfig:
    return LlamaConfig.from_name(name, **{**TINY, **overrides})


def generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize(
    "name, layers_only",
    [("llama3_8b", False), ("llama3.2_1b", False), ("llama3_8b", True)],  # untied; tied + llama3 RoPE; testbench
)
def test_decode_with_the_kv_cache_equals_a_full_forward(name, layers_only):
    torch.manual_seed(0)
    cfg = tiny(name)
    model = Llama(cfg, layers_only=layers_only).eval()
    batch, prompt, total = 2, 7, 19
    if layers_only:
        x = torch.randn(batch, total, cfg.dim, generator=generator())
    else:
        x = torch.randint(0, cfg.vocab_size, (batch, total), generator=generator())
    with torch.no_grad():
        model.setup_caches(batch, total, torch.float32)
        full = model(x, torch.arange(total))
        model.setup_caches(batch, total, torch.float32)  # a fresh cache
        steps = [model(x[:, :prompt], torch.arange(prompt))]
        steps += [model(x[:, t : t + 1], torch.tensor([t])) for t in range(prompt, total)]
    # fp32, the same math summed in another order: differences ~1e-7 of O(1) outputs.
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)


def reference_attention(x, wqkv, wo, n_heads, n_kv_heads, frequencies) -> torch.Tensor:
    """Causal attention written out head by head, in float64: query head h reads KV head h // (n_heads / n_kv_heads)."""
    B, T, dim = x.shape
    hd = dim // n_heads
    q_w, k_w, v_w = wqkv.double().split([n_heads * hd, n_kv_heads * hd, n_kv_heads * hd])
    q = (x.double() @ q_w.T).view(B, T, n_heads, hd).transpose(1, 2)
    k = (x.double() @ k_w.T).view(B, T, n_kv_heads, hd).transpose(1, 2)
    v = (x.double() @ v_w.T).view(B, T, n_kv_heads, hd).transpose(1, 2)
    q, k = reference_rope(q, frequencies), reference_rope(k, frequencies)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    heads = []
    for h in range(n_heads):
        kv = h // (n_heads // n_kv_heads)
        scores = (q[:, h] @ k[:, kv].transpose(-2, -1)) / math.sqrt(hd)
        heads.append(scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v[:, kv])
    return torch.cat(heads, dim=-1) @ wo.double().T  # heads concatenated in order, as wo expects


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])  # plain multi-head attention, GQA, multi-query
def test_attention_equals_a_head_by_head_reference(n_kv_heads):
    cfg = tiny(n_kv_heads=n_kv_heads)
    attention = Attention(cfg)
    T = 9
    attention.kv_cache = KVCache(2, n_kv_heads, T, cfg.head_dim, torch.float32)
    x = torch.randn(2, T, cfg.dim, generator=generator(1))
    cos, sin = llama_rope_tables(cfg, T)
    input_pos = torch.arange(T)
    mask = torch.arange(T)[None, :] <= input_pos[:, None]
    with torch.no_grad():
        out = attention(x, cos, sin, mask, input_pos)
    expected = reference_attention(x, attention.wqkv.weight, attention.wo.weight, cfg.n_heads, n_kv_heads, reference_frequencies(cfg.head_dim, cfg.rope_theta))
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


def reference_llama3_frequencies(head_dim, theta, factor, low_freq_factor, high_freq_factor, old_context) -> list[float]:
    """Llama 3.1's published apply_scaling, one frequency at a time."""
    scaled = []
    for frequency in reference_frequencies(head_dim, theta):
        wavelength = 2 * math.pi / frequency
        if wavelength < old_context / high_freq_factor:
            scaled.append(frequency)
        elif wavelength > old_context / low_freq_factor:
            scaled.append(frequency / factor)
        else:
            smooth = (old_context / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
            scaled.append((1 - smooth) * frequency / factor + smooth * frequency)
    return scaled


def test_llama3_rope_scaling_matches_the_published_formula():
    cfg = LlamaConfig.from_name("llama3.2_1b")
    s = cfg.rope_scaling
    expected = reference_llama3_frequencies(cfg.head_dim, cfg.rope_theta, s.factor, s.low_freq_factor, s.high_freq_factor, s.original_max_position_embeddings)
    unscaled = reference_frequencies(cfg.head_dim, cfg.rope_theta)
    got = llama3_scaled_frequencies(torch.tensor(unscaled, dtype=torch.float64), s).tolist()
    assert got == pytest.approx(expected, rel=1e-12)
    # All three bands occur at head_dim 64, theta 5e5: kept, blended, divided by the factor.
    kinds = {"kept" if e == u else "divided" if e == pytest.approx(u / s.factor) else "blended" for e, u in zip(expected, unscaled)}
    assert kinds == {"kept", "blended", "divided"}


@pytest.mark.parametrize("name", ["llama3_8b", "llama3.2_1b"])
def test_rope_matches_the_reference_formula(name):
    cfg = tiny(name, dim=32, n_heads=2, n_kv_heads=1)
    x = torch.randn(1, 2, 13, cfg.head_dim, generator=generator(2))
    cos, sin = llama_rope_tables(cfg, 13)
    if cfg.rope_scaling is None:
        frequencies = reference_frequencies(cfg.head_dim, cfg.rope_theta)
    else:
        s = cfg.rope_scaling
        frequencies = reference_llama3_frequencies(cfg.head_dim, cfg.rope_theta, s.factor, s.low_freq_factor, s.high_freq_factor, s.original_max_position_embeddings)
    torch.testing.assert_close(apply_rope(x, cos, sin).double(), reference_rope(x, frequencies), rtol=1e-6, atol=1e-6)


def meta_build(cfg: LlamaConfig, layers_only: bool = False) -> Llama:
    with torch.device("meta"):
        return Llama(cfg, layers_only=layers_only)


@pytest.mark.parametrize("name", list(llama_configs))
@pytest.mark.parametrize("layers_only", [False, True])
def test_param_count_equals_a_meta_device_build(name, layers_only):
    cfg = LlamaConfig.from_name(name)
    model = meta_build(cfg, layers_only)
    total = sum(p.numel() for p in model.parameters())  # a tied head is one parameter, counted once
    embedding = 0 if layers_only else model.tok_embeddings.weight.numel()
    assert param_count(cfg, layers_only) == dict(total=total, non_embedding=total - embedding)


def test_known_parameter_totals():
    assert param_count(LlamaConfig.from_name("llama3_8b"))["total"] == 8_030_261_248
    assert param_count(LlamaConfig.from_name("llama2_7b"))["total"] == 6_738_415_616


def test_named_shapes():
    shapes = {n: (c.dim, c.n_layers, c.n_heads, c.n_kv_heads, c.ffn_dim, c.vocab_size, c.tie_embeddings) for n, c in ((n, LlamaConfig.from_name(n)) for n in llama_configs)}
    assert shapes == {
        "llama2_7b": (4096, 32, 32, 32, 11008, 32000, False),
        "llama3_8b": (4096, 32, 32, 8, 14336, 128256, False),
        "llama3.2_1b": (2048, 16, 32, 8, 8192, 128256, True),
        "llama3.2_3b": (3072, 28, 24, 8, 8192, 128256, True),
    }
    assert LlamaConfig.from_name("llama3_8b", n_layers=1).n_layers == 1


def bytes_from_the_model(model: Llama, batch: int, context_len: int, dtype_bytes: int) -> dict:
    """What a decode step reads and writes, from the built model's tensors (not the config formula)."""
    weights = 0
    for name, p in model.named_parameters():  # a tied head appears once, as tok_embeddings.weight
        weights += batch * p.shape[1] if name == "tok_embeddings.weight" else p.numel()
    if not model.layers_only and model.config.tie_embeddings:
        weights += model.output.weight.numel()  # the head still reads the whole shared matrix
    kv_write = 0
    for layer in model.layers:
        _, k_size, v_size = layer.attention.split_sizes  # n_kv_heads · head_dim
        kv_write += batch * (k_size + v_size)
    return dict(
        weights=weights * dtype_bytes,
        kv_read=kv_write * (context_len + 1) * dtype_bytes,
        kv_write=kv_write * dtype_bytes,
        total=(weights + kv_write * (context_len + 2)) * dtype_bytes,
    )


@pytest.mark.parametrize("name, layers_only", [("llama3_8b", False), ("llama3.2_1b", False), ("llama3_8b", True), ("llama2_7b", False)])
def test_decode_bytes_equal_a_count_from_the_model(name, layers_only):
    cfg = LlamaConfig.from_name(name, n_layers=2)
    expected = bytes_from_the_model(meta_build(cfg, layers_only), batch=8, context_len=511, dtype_bytes=2)
    assert decode_bytes(cfg, 8, 511, 2, layers_only) == expected


def test_llama3_8b_bf16_bs1_decode_bytes():
    b = decode_bytes(LlamaConfig.from_name("llama3_8b"), 1, 4095, 2)
    # Weights: all parameters but the 128256-row embedding table, of which one row is read.
    assert b["weights"] == 2 * (8_030_261_248 - 128256 * 4096 + 4096)
    assert b["kv_read"] == 2 * 32 * 4096 * 8 * 128 * 2  # 512 MiB of K and V at 4096 positions
    assert b["kv_write"] == 2 * 32 * 8 * 128 * 2


@pytest.mark.parametrize("layers_only", [False, True])
def test_decode_flops_equal_the_counted_flops(layers_only):
    cfg = tiny()
    model = Llama(cfg, layers_only=layers_only).eval()
    batch, context_len = 3, 10
    model.setup_caches(batch, 16, torch.float32)  # 11 positions rounded up to 16, as the decode family allocates them
    x = torch.randn(batch, 1, cfg.dim) if layers_only else torch.randint(0, cfg.vocab_size, (batch, 1))
    with torch.no_grad():
        counted = count_flops(lambda: model(x, torch.tensor([context_len])))
    assert counted == decode_flops(cfg, batch, context_len, layers_only)


def test_the_cache_is_rounded_up_to_a_multiple_of_8_positions_within_max_seq_len():
    # An odd cache length (4097 at context 4096) left every score row unaligned: cuBLAS fell back to magma_sgemmEx on
    # an H100 (llama3_8b layer, batch 64: 1176 µs against 193 µs at 4104). gpt-fast rounds the same way.
    from perflab.models.llama import padded_cache_len
    from perflab.workloads.decode import cache_len, positions_needed

    assert [padded_cache_len(n) for n in (1, 8, 9, 513, 4097, 4104)] == [8, 8, 16, 520, 4104, 4104]
    assert padded_cache_len(8190, limit=8192) == 8192 and padded_cache_len(4095, limit=4095) == 4095  # never past the model's max
    assert padded_cache_len(4097, limit=4096) == 4097  # never shorter than needed (validation refuses that case first)
    case = validate_case(Case(model="llama3_8b", workload="decode", context_len=4096, batch_size=1, device="cpu"))
    assert (positions_needed(case), cache_len(case)) == (4097, 4104)  # within llama3_8b's max_seq_len of 8192
    short = validate_case(Case(model="llama3_8b", workload="decode", context_len=4096, batch_size=1, device="cpu",
                               model_args={"max_seq_len": 4100}))
    assert cache_len(short) == 4100  # rounded up no further than the model allows
    generate = validate_case(Case(model="llama3_8b", workload="generate", prompt_len=500, new_tokens=13, device="cpu"))
    assert (positions_needed(generate), cache_len(generate)) == (513, 520)


def test_a_decode_case_builds_a_padded_cache_and_its_bytes_count_the_positions_it_reads():
    from perflab.runtime.workload import build

    case = validate_case(Case(model="llama3_8b", workload="decode", context_len=12, batch_size=2, layers=1, layers_only=True,
                              dtype="fp32", device="cpu", model_args=(("dim", 64), ("n_heads", 4), ("n_kv_heads", 2), ("ffn_dim", 96))))
    built = build(case)
    caches = [b for n, b in built.model.named_buffers() if n.endswith("k_cache")]
    assert [c.shape[2] for c in caches] == [16] and built.extra["cache_len"] == 16
    per_position = 2 * 2 * 2 * 16 * 4  # K and V · batch · kv heads · head dim · fp32
    assert decode_bytes(built.extra["config"], 2, 12, 4, layers_only=True)["kv_read"] == 13 * per_position  # 13 read, 3 padding


def test_decode_step_compiles_as_one_graph():
    # The static cache is for this: a decode step is one graph with no break (no host sync, no Python branches on values).
    model = Llama(tiny()).eval()
    model.setup_caches(1, 16, torch.float32)
    torch._dynamo.reset()
    with torch.no_grad():
        explained = torch._dynamo.explain(model)(torch.tensor([[3]]), torch.tensor([5]))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)


def test_meta_checkpoint_names_load():
    cfg = tiny()
    source = Llama(cfg)
    state = source.state_dict()
    for i in range(cfg.n_layers):  # split wqkv into Meta's wq, wk, wv
        prefix = f"layers.{i}.attention."
        wq, wk, wv = state.pop(prefix + "wqkv.weight").split(source.layers[i].attention.split_sizes)
        state.update({prefix + "wq.weight": wq, prefix + "wk.weight": wk, prefix + "wv.weight": wv})
    target = Llama(cfg)
    target.load_state_dict(state, strict=True)
    assert all(torch.equal(a, b) for a, b in zip(source.parameters(), target.parameters()))


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(n_kv_heads=5, n_heads=32, dim=4096), "n_heads 32 is not divisible by n_kv_heads 5"),
        (dict(n_heads=5, n_kv_heads=1), "dim 64 is not divisible by n_heads 5"),
        (dict(ffn_dim=-1), "ffn_dim must be a positive integer"),
    ],
)
def test_config_errors(overrides, message):
    with pytest.raises(PerflabError, match=message):
        tiny(**overrides)


def test_unknown_name_is_an_error():
    with pytest.raises(PerflabError, match="did you mean llama3_8b"):
        LlamaConfig.from_name("llama3-8b")


def test_context_beyond_max_seq_len_is_an_error():
    model = Llama(tiny(max_seq_len=16))
    with pytest.raises(PerflabError, match="exceeds max_seq_len 16"):
        model.setup_caches(1, 17, torch.float32)


def test_steps_outside_the_cache_are_errors():
    model = Llama(tiny())
    token = torch.tensor([[1]])
    with pytest.raises(PerflabError, match="setup_caches"):
        model(token, torch.tensor([0]))
    model.setup_caches(1, 8, torch.float32)
    with pytest.raises(PerflabError, match="position 8 is outside the cache of 8"):
        model(token, torch.tensor([8]))
    with pytest.raises(PerflabError, match="do not fit a cache of 8"):
        model(torch.ones(1, 9, dtype=torch.long), torch.arange(9))
    with pytest.raises(PerflabError, match="max_batch_size 1"):
        model(torch.tensor([[1], [2]]), torch.tensor([0]))


def test_the_decode_context_is_filled_in_place_on_its_device_and_seeded():
    """fill_caches draws every layer's K and V in place (no CPU tensor the size of the cache, which at llama3_8b
    batch 64 context 4096 is 17 G values), with std 0.5, the same for the same seed; nothing else changes."""
    from perflab.workloads.decode import fill_caches

    def filled(seed):
        model = Llama(tiny())
        model.setup_caches(4, 64, torch.bfloat16)
        rope = {n: b.clone() for n, b in model.named_buffers() if not n.endswith(("k_cache", "v_cache"))}
        fill_caches(model, seed)
        for n, b in model.named_buffers():
            if n in rope:
                assert torch.equal(b, rope[n]), n
        return [b for n, b in model.named_buffers() if n.endswith(("k_cache", "v_cache"))]

    first, again, other = filled(0), filled(0), filled(1)
    assert len(first) == 2 * TINY["n_layers"]
    for a, b, c in zip(first, again, other):
        assert a.dtype == torch.bfloat16 and torch.equal(a, b) and not torch.equal(a, c)
        assert abs(float(a.float().std()) - 0.5) < 0.01 and abs(float(a.float().mean())) < 0.03  # 4·2·64·16 = 8192 values: 5 s.e.
