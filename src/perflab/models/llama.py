"""Llama for decode (seed 004's testbench, done fully) in the style of gpt-fast's model.py.

RMSNorm, RoPE (with Llama 3.1/3.2's "llama3" frequency scaling), grouped-query attention and SwiGLU, over a
static KV cache allocated once by ``setup_caches``: every step, prefill or decode, writes its keys and values
into the cache at ``input_pos`` and attends over the WHOLE cache with a mask built from ``input_pos``, so
torch.compile and CUDA graphs see the same shapes at every position.

Conventions are Meta's reference code's: parameter names (``tok_embeddings``, ``layers.N.attention.wq``,
``feed_forward.w1`` ..., with wq/wk/wv fused into ``wqkv`` on load, as gpt-fast does) and RoPE on interleaved
channel pairs (x[2i], x[2i+1]). Hugging Face checkpoints rename these and permute the q/k rows for their
half-split RoPE, so they load only after that conversion.

``layers_only=True`` builds the decoder layers alone (no embedding, final norm or head): the input and
the output are hidden states [B, T, dim]. With ``n_layers=1`` that is seed 004's one-layer testbench.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from perflab.errors import PerflabError
from perflab.models.lm import (
    FeedForward,
    RMSNorm,
    apply_rope,
    check_head_split,
    check_positive,
    config_from_name,
    init_weights,
    rope_frequencies,
    rope_tables,
)


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3.1/3.2's "llama3" RoPE scaling, as in their config.json's ``rope_scaling``."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class LlamaConfig:
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    ffn_dim: int  # the SwiGLU's intermediate size
    norm_eps: float = 1e-5
    rope_theta: float = 10_000.0
    max_seq_len: int = 4096
    tie_embeddings: bool = False
    rope_scaling: RopeScaling | None = None

    def __post_init__(self):
        if isinstance(self.rope_scaling, dict):  # as written in a spec or a config.json
            keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
            object.__setattr__(self, "rope_scaling", RopeScaling(**{k: self.rope_scaling[k] for k in keys}))
        for name in ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "ffn_dim", "max_seq_len"):
            check_positive(name, getattr(self, name))
        if self.n_heads % self.n_kv_heads:
            raise PerflabError(
                f"n_heads {self.n_heads} is not divisible by n_kv_heads {self.n_kv_heads}: "
                "each KV head serves a whole group of query heads, so choose n_kv_heads that divides n_heads"
            )
        check_head_split("dim", self.dim, self.n_heads)

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @classmethod
    def from_name(cls, name: str, **overrides) -> "LlamaConfig":
        return config_from_name(cls, llama_configs, "Llama config", name, overrides)


# Every number is from the model's config.json as Meta publishes it on the Hugging Face Hub (hidden_size,
# num_hidden_layers, num_attention_heads, num_key_value_heads, vocab_size, intermediate_size, rms_norm_eps,
# rope_theta, max_position_embeddings, tie_word_embeddings, rope_scaling), cross-checked against the
# printed module shapes of LlamaForCausalLM and the 8,030,261,248 parameters of Llama 3 8B.
llama_configs = {
    # meta-llama/Llama-2-7b-hf: no GQA (32 KV heads), the 32k SentencePiece vocabulary, 4k context.
    "llama2_7b": dict(
        dim=4096, n_layers=32, n_heads=32, n_kv_heads=32, vocab_size=32000, ffn_dim=11008,
        norm_eps=1e-5, rope_theta=10_000.0, max_seq_len=4096, tie_embeddings=False,
    ),
    # meta-llama/Meta-Llama-3-8B: 8 KV heads, the 128k tiktoken vocabulary, 8k context, no RoPE scaling.
    "llama3_8b": dict(
        dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, vocab_size=128256, ffn_dim=14336,
        norm_eps=1e-5, rope_theta=500_000.0, max_seq_len=8192, tie_embeddings=False,
    ),
    # meta-llama/Llama-3.2-1B: head_dim 64, tied embeddings, 131072 positions through llama3 RoPE scaling.
    "llama3.2_1b": dict(
        dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, vocab_size=128256, ffn_dim=8192,
        norm_eps=1e-5, rope_theta=500_000.0, max_seq_len=131072, tie_embeddings=True,
        rope_scaling=RopeScaling(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192),
    ),
    # meta-llama/Llama-3.2-3B: 24 heads of 128, tied embeddings, the same RoPE scaling as the 1B.
    "llama3.2_3b": dict(
        dim=3072, n_layers=28, n_heads=24, n_kv_heads=8, vocab_size=128256, ffn_dim=8192,
        norm_eps=1e-5, rope_theta=500_000.0, max_seq_len=131072, tie_embeddings=True,
        rope_scaling=RopeScaling(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192),
    ),
}


# ---- analytic counts (pure Python) ----


def _layer_matmul_params(c: LlamaConfig) -> int:
    attention = c.dim * (c.n_heads + 2 * c.n_kv_heads) * c.head_dim + c.n_heads * c.head_dim * c.dim  # wqkv, wo
    return attention + 3 * c.dim * c.ffn_dim  # w1, w3, w2


def _layer_params(c: LlamaConfig) -> int:
    return _layer_matmul_params(c) + 2 * c.dim  # + attention_norm, ffn_norm


def param_count(config: LlamaConfig, layers_only: bool = False) -> dict:
    """Parameters of ``Llama(config, layers_only)``: dict(total=..., non_embedding=...).

    non_embedding = total − the token embedding table (vocab_size × dim). An untied head counts as
    non-embedding (it is a matmul); a tied head is the embedding table itself, so it is excluded with it.
    With layers_only there is no embedding: both are the layers' parameters.
    """
    layers = config.n_layers * _layer_params(config)
    if layers_only:
        return dict(total=layers, non_embedding=layers)
    embedding = config.vocab_size * config.dim
    head = 0 if config.tie_embeddings else config.vocab_size * config.dim
    total = embedding + layers + config.dim + head  # + final norm
    return dict(total=total, non_embedding=total - embedding)


def decode_bytes(config: LlamaConfig, batch: int, context_len: int, dtype_bytes: int, layers_only: bool = False) -> dict:
    """Bytes one decode step must move from and to memory, at cache position ``context_len``.

    The step writes the new token's keys and values at position context_len and attends over positions 0 to
    context_len: those context_len + 1 positions are what it must read. (The cache is that rounded up to a multiple
    of 8, ``padded_cache_len``; its up to 7 masked positions are read too, and not counted here: they are padding,
    0.2% of the KV read at context 4096.) With b = dtype_bytes, L = n_layers:

      weights  = b · (L · (wqkv + wo + w1 + w2 + w3 + 2 norms)                every layer weight, read once
                      + dim + vocab·dim + batch·dim)                          final norm, head, embedding rows
      kv_read  = b · 2 · L · batch · (context_len + 1) · n_kv_heads · head_dim   K and V of positions 0..context_len
      kv_write = b · 2 · L · batch · n_kv_heads · head_dim                     the new token's K and V
      total    = weights + kv_read + kv_write

    The embedding lookup reads only ``batch`` rows of the table; the head reads its whole matrix once, the
    same vocab·dim whether or not it is tied to the embedding. With layers_only the weights are the layer
    terms alone. Activations, logits and the RoPE tables are not counted: at decode they are a few
    vectors per sequence against matrices (the logits, batch · vocab, are ~0.1% of llama3_8b's weights at bs1).
    """
    weights = config.n_layers * _layer_params(config)
    if not layers_only:
        weights += config.dim + config.vocab_size * config.dim + batch * config.dim
    kv_per_position = 2 * config.n_layers * batch * config.n_kv_heads * config.head_dim
    result = dict(
        weights=weights * dtype_bytes,
        kv_read=kv_per_position * (context_len + 1) * dtype_bytes,
        kv_write=kv_per_position * dtype_bytes,
    )
    result["total"] = sum(result.values())
    return result


def forward_flops(config: LlamaConfig, batch: int, seq: int, cache_len: int, layers_only: bool = False) -> int:
    """Real FLOPs (2 per multiply-add) of one step of ``seq`` new tokens per sequence over a cache of ``cache_len``.

    2 · (matmul parameters: wqkv, wo, w1, w2, w3 per layer, and the head) · batch · seq, plus attention's
    q·kᵀ and probs·v over the whole static cache, masked positions included (that is what runs):
    4 · batch · seq · cache_len · n_heads · head_dim per layer. The embedding lookup is not a matmul.
    """
    matmul_params = config.n_layers * _layer_matmul_params(config) + (0 if layers_only else config.vocab_size * config.dim)
    attention = config.n_layers * 4 * batch * seq * cache_len * config.n_heads * config.head_dim
    return 2 * matmul_params * batch * seq + attention


def decode_flops(config: LlamaConfig, batch: int, context_len: int, layers_only: bool = False) -> int:
    """FLOPs of one decode step at cache position context_len: one token per sequence against the whole cache, the
    context_len + 1 positions it needs rounded up as ``padded_cache_len`` allocates them."""
    return forward_flops(config, batch, 1, padded_cache_len(context_len + 1, config.max_seq_len), layers_only)


CACHE_MULTIPLE = 8


def padded_cache_len(positions: int, limit: int | None = None) -> int:
    """The KV cache's length for ``positions`` positions: rounded up to a multiple of 8, as gpt-fast's setup_caches
    rounds max_seq_length, and no longer than ``limit`` (the model's max_seq_len) where that is shorter.

    With an odd length (a decode step at context 4096 needs 4097 positions) every row of the attention's scores is
    unaligned, and cuBLAS falls back to slow kernels: on an H100, one llama3_8b layer at batch 64 and context 4096
    spent 1176 µs in ``magma_sgemmEx_kernel`` and 413 µs in an align-1 CUTLASS kernel with a cache of 4097 positions
    (the attention's matmuls: the only GEMMs whose shapes hold the cache length); with 4104 neither ran, the two
    largest kernels were nvjet GEMMs of 193 and 192 µs, and the step (CUDA events around single calls) went 2.96 →
    1.53 ms eager, 2.30 → 1.01 ms compiled (``benchmarks/decode_cache_probe.py``)."""
    padded = -(-positions // CACHE_MULTIPLE) * CACHE_MULTIPLE
    return padded if limit is None else max(positions, min(padded, limit))


# ---- modules ----


def llama3_scaled_frequencies(frequencies: torch.Tensor, scaling: RopeScaling) -> torch.Tensor:
    """Llama 3.1's RoPE scaling: slow rotations (long wavelengths) slow down by ``factor``, fast ones keep
    their frequency, and the band between blends the two linearly in (original context / wavelength)."""
    old_context = scaling.original_max_position_embeddings
    wavelengths = 2 * math.pi / frequencies
    smooth = (old_context / wavelengths - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    blended = (1 - smooth) * frequencies / scaling.factor + smooth * frequencies
    scaled = torch.where(wavelengths > old_context / scaling.low_freq_factor, frequencies / scaling.factor, blended)
    return torch.where(wavelengths < old_context / scaling.high_freq_factor, frequencies, scaled)


def llama_rope_tables(config: LlamaConfig, n_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    frequencies = rope_frequencies(config.head_dim, config.rope_theta)
    if config.rope_scaling is not None:
        frequencies = llama3_scaled_frequencies(frequencies, config.rope_scaling)
    return rope_tables(frequencies, n_positions)


class KVCache(nn.Module):
    """Keys and values of every position so far, [max_batch, n_kv_heads, cache_len, head_dim], allocated once."""

    def __init__(self, max_batch_size: int, n_kv_heads: int, cache_len: int, head_dim: int, dtype, device=None):
        super().__init__()
        shape = (max_batch_size, n_kv_heads, cache_len, head_dim)
        # Non-persistent: the cache is state of a run, not of the model.
        self.register_buffer("k_cache", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def update(self, input_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v [B, n_kv_heads, T, head_dim] at positions input_pos [T]; return the caches of those B sequences."""
        batch = k.shape[0]
        # In place, at positions held in a tensor: the shapes do not change with the position, so one
        # compiled graph or one CUDA graph serves every decode step.
        k_out, v_out = self.k_cache[:batch], self.v_cache[:batch]
        k_out.index_copy_(2, input_pos, k)
        v_out.index_copy_(2, input_pos, v)
        return k_out, v_out


def _fuse_wq_wk_wv(module, state_dict, prefix, *args) -> None:
    # Meta's checkpoints keep wq, wk, wv apart; one fused matmul reads the same bytes in one launch.
    names = [prefix + f"{n}.weight" for n in ("wq", "wk", "wv")]
    if all(name in state_dict for name in names):
        state_dict[prefix + "wqkv.weight"] = torch.cat([state_dict.pop(name) for name in names])


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = config.n_heads, config.n_kv_heads, config.head_dim
        q_size, kv_size = config.n_heads * config.head_dim, config.n_kv_heads * config.head_dim
        self.split_sizes = (q_size, kv_size, kv_size)
        self.wqkv = nn.Linear(config.dim, q_size + 2 * kv_size, bias=False)
        self.wo = nn.Linear(q_size, config.dim, bias=False)
        self.kv_cache: KVCache | None = None
        self.register_load_state_dict_pre_hook(_fuse_wq_wk_wv)

    def forward(self, x, cos, sin, mask, input_pos) -> torch.Tensor:
        """x [B, T, dim]; cos/sin [T, head_dim/2] at input_pos [T]; mask [T, cache_len], True where a query may look."""
        B, T, _ = x.shape
        q, k, v = self.wqkv(x).split(self.split_sizes, dim=-1)
        q = q.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = k.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k, v = self.kv_cache.update(input_pos, k, v)
        group = self.n_heads // self.n_kv_heads
        if group > 1:
            # Query head h reads KV head h // group (Meta's repeat_kv), without copying the cache: the group's
            # queries are stacked along the sequence axis, [B, n_kv, group·T, hd], each row keeping its mask
            # row, so attention reads every cached key and value once. (Repeating k/v instead would write
            # and read the whole cache group times over every step: decode is bound by those bytes.)
            q = q.reshape(B, self.n_kv_heads, group * T, self.head_dim)
            mask = mask.repeat(group, 1)
        if T == 1:
            # A decode step: a handful of query rows against the cache. Two small matmuls and a softmax read the
            # cache once at full bandwidth; a fused attention kernel launches too few blocks for so few rows
            # (measured on an H100, Llama-3-8B at context 512: 27 µs per layer in cuDNN's flash kernel).
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
            scores = scores.masked_fill(~mask, float("-inf"))
            y = scores.float().softmax(dim=-1).to(v.dtype) @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        y = y.view(B, self.n_heads, T, self.head_dim)
        return self.wo(y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))


class TransformerBlock(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.attention_norm = RMSNorm(config.dim, config.norm_eps)
        self.attention = Attention(config)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps)
        self.feed_forward = FeedForward(config.dim, config.ffn_dim)

    def forward(self, x, cos, sin, mask, input_pos) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin, mask, input_pos)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, config: LlamaConfig, layers_only: bool = False):
        super().__init__()
        self.config = config
        self.layers_only = layers_only
        if not layers_only:
            self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(TransformerBlock(config) for _ in range(config.n_layers))
        if not layers_only:
            self.norm = RMSNorm(config.dim, config.norm_eps)
            self.output = nn.Linear(config.dim, config.vocab_size, bias=False)
            if config.tie_embeddings:
                self.output.weight = self.tok_embeddings.weight
        # Made by setup_caches, for the cache's length and on its device.
        self.register_buffer("rope_cos", None, persistent=False)
        self.register_buffer("rope_sin", None, persistent=False)
        self.register_buffer("cache_positions", None, persistent=False)
        self.max_batch_size = 0
        self.apply(init_weights)

    def setup_caches(self, max_batch_size: int, cache_len: int, dtype: torch.dtype, device=None) -> None:
        """Allocate a KV cache of ``cache_len`` positions per layer for up to ``max_batch_size`` sequences
        (zeros: a fresh cache), and the RoPE tables for those positions, in fp32 whatever ``dtype`` is."""
        check_positive("max_batch_size", max_batch_size)
        check_positive("cache_len", cache_len)
        if cache_len > self.config.max_seq_len:
            raise PerflabError(
                f"cache length {cache_len} exceeds max_seq_len {self.config.max_seq_len} of this model: "
                "use a shorter context (prompt or context length plus new tokens) or override max_seq_len"
            )
        if device is None:
            device = next(self.parameters()).device
        config = self.config
        for layer in self.layers:
            layer.attention.kv_cache = KVCache(max_batch_size, config.n_kv_heads, cache_len, config.head_dim, dtype, device)
        cos, sin = llama_rope_tables(config, cache_len)
        self.rope_cos, self.rope_sin = cos.to(device), sin.to(device)
        self.cache_positions = torch.arange(cache_len, device=device)
        self.max_batch_size = max_batch_size

    def forward(self, x: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        """x: token ids [B, T] (hidden states [B, T, dim] when layers_only); input_pos: the positions [T] of
        these tokens in the cache. Returns logits [B, T, vocab] (hidden states when layers_only)."""
        self._check_step(x, input_pos)
        # Static shapes: every query sees the whole cache, masked to the positions written so far.
        mask = self.cache_positions[None, :] <= input_pos[:, None]
        cos, sin = self.rope_cos[input_pos], self.rope_sin[input_pos]
        if not self.layers_only:
            x = self.tok_embeddings(x)
        for layer in self.layers:
            x = layer(x, cos, sin, mask, input_pos)
        if self.layers_only:
            return x
        return self.output(self.norm(x))

    def _check_step(self, x: torch.Tensor, input_pos: torch.Tensor) -> None:
        if self.cache_positions is None:
            raise PerflabError("call setup_caches(max_batch_size, cache_len, dtype) before forward: Llama decodes over a static KV cache")
        cache_len = self.cache_positions.shape[0]
        batch, steps = x.shape[0], input_pos.shape[0]
        if batch > self.max_batch_size:
            raise PerflabError(f"batch {batch} exceeds the max_batch_size {self.max_batch_size} of setup_caches: set up larger caches")
        if x.shape[1] != steps:
            raise PerflabError(f"input has {x.shape[1]} positions but input_pos has {steps}: give one position per token")
        if steps > cache_len:
            raise PerflabError(f"{steps} tokens do not fit a cache of {cache_len} positions: set up a longer cache (at most max_seq_len {self.config.max_seq_len})")
        # Reading a value costs a device sync, and compile/CUDA graphs cannot have one: positions are
        # checked where they live on the CPU; elsewhere the workload checks its shape parameters.
        if input_pos.device.type == "cpu" and not torch.compiler.is_compiling() and steps:
            last = int(input_pos.max())
            if last >= cache_len or int(input_pos.min()) < 0:
                raise PerflabError(
                    f"position {last} is outside the cache of {cache_len} positions (max_seq_len {self.config.max_seq_len}): "
                    "set up a longer cache or decode at an earlier position"
                )
