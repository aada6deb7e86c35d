"""The lm family at the models floor, its GPT; ``workloads/lm.py`` runs its steps, ``report/lm.py`` makes its rows'
tables.

A decoder-only language model (the CS336-style GPT of seed 003) in the style of gpt-fast's model.py.

Pre-norm blocks: RMSNorm → causal multi-head attention with RoPE → residual; RMSNorm → SwiGLU → residual;
a final RMSNorm and an untied LM head, no biases anywhere. Parameter names follow gpt-fast
(``tok_embeddings``, ``layers.N.attention.wqkv``, ``feed_forward.w1`` ...).

RoPE rotates *interleaved* pairs of channels, (x[2i], x[2i+1]), by the angle pos · theta^(-2i/head_dim): the
convention of Meta's reference Llama code and of CS336 (Hugging Face checkpoints use the half-split one, with
the q/k weight rows permuted to match). llama.py shares RMSNorm, FeedForward and the RoPE helpers.

``param_count``, ``forward_flops`` and ``train_flops`` are pure Python, so the harness and the tests can
compare what runs against what should run.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import record_function
from torch.utils.checkpoint import checkpoint

from perflab.errors import PerflabError

ATTN_IMPLS = ("sdpa", "explicit")


@dataclass(frozen=True)
class LMConfig:
    d_model: int
    d_ff: int
    n_layers: int
    n_heads: int
    vocab_size: int = 10_000
    context_length: int = 1024
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-5
    attn: str = "sdpa"  # "sdpa" (fused, causal) or "explicit" (scores, mask, softmax, ·v: the seed's kernels)
    # Activation checkpointing: with autograd recording, each block keeps only its input and runs its forward
    # again in the backward (torch.utils.checkpoint, non-reentrant): less memory, one more forward of the blocks.
    checkpoint_activations: bool = False

    def __post_init__(self):
        for name in ("d_model", "d_ff", "n_layers", "n_heads", "vocab_size", "context_length"):
            check_positive(name, getattr(self, name))
        check_head_split("d_model", self.d_model, self.n_heads)
        if self.attn not in ATTN_IMPLS:
            raise PerflabError(f"unknown attn {self.attn!r}: use one of {', '.join(ATTN_IMPLS)}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @classmethod
    def from_name(cls, name: str, **overrides) -> "LMConfig":
        return config_from_name(cls, lm_configs, "LM config", name, overrides)


# d_model / d_ff / layers / heads of the CS336 assignment's model sizes, which seed 003 profiled.
lm_configs = {
    "gpt_small": dict(d_model=768, d_ff=3072, n_layers=12, n_heads=12),
    "gpt_medium": dict(d_model=1024, d_ff=4096, n_layers=24, n_heads=16),
    "gpt_large": dict(d_model=1280, d_ff=5120, n_layers=36, n_heads=20),
    "gpt_xl": dict(d_model=1600, d_ff=6400, n_layers=48, n_heads=25),
    "gpt_2.7b": dict(d_model=2560, d_ff=10240, n_layers=32, n_heads=32),
}


def config_from_name(cls, configs: dict, kind: str, name: str, overrides: dict):
    """``cls(**configs[name])`` with the non-None overrides, every mistake a one-line PerflabError."""
    if name not in configs:
        close = difflib.get_close_matches(name, list(configs), n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(configs)}"
        raise PerflabError(f"unknown {kind} {name!r}; {hint}")
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise PerflabError(f"unknown {cls.__name__} field {unknown[0]!r} in the overrides of {name}; fields: {', '.join(sorted(fields))}")
    values = {**configs[name], **{k: v for k, v in overrides.items() if v is not None}}
    return cls(**values)


def check_positive(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise PerflabError(f"{name} must be a positive integer, got {value!r}")


def check_head_split(dim_name: str, dim: int, n_heads: int) -> None:
    if dim % n_heads:
        raise PerflabError(f"{dim_name} {dim} is not divisible by n_heads {n_heads}: choose n_heads that divides {dim_name}")
    if (dim // n_heads) % 2:
        raise PerflabError(
            f"head_dim {dim // n_heads} ({dim_name} {dim} / n_heads {n_heads}) is odd, and RoPE rotates pairs of channels: "
            f"choose {dim_name} / n_heads even"
        )


# ---- analytic counts (pure Python) ----


def param_count(config: LMConfig) -> dict:
    """Parameters of ``GPT(config)``: dict(total=..., non_embedding=...).

    non_embedding excludes only the token embedding table (vocab_size × d_model). The LM head is untied and
    a real matmul, so it counts as non-embedding.
    """
    d, layers = config.d_model, config.n_layers
    per_layer = 4 * d * d + 3 * d * config.d_ff + 2 * d  # wqkv + wo, w1 w2 w3, two RMSNorm weights
    embedding = config.vocab_size * d
    non_embedding = layers * per_layer + d + d * config.vocab_size  # + final norm + LM head
    return dict(total=embedding + non_embedding, non_embedding=non_embedding)


def forward_flops(config: LMConfig, batch: int, seq: int) -> int:
    """Real FLOPs (2 per multiply-add) of one forward over ``batch`` sequences of ``seq`` tokens.

    Matmuls: per layer QKV (d → 3d), output projection (d → d), w1 and w3 (d → d_ff), w2 (d_ff → d); the LM
    head (d → vocab). Attention: q·kᵀ and probs·v, 2·T²·d each, so 4·T²·d per sequence per layer, counted
    over the FULL T×T including the masked (causal) half: that is what the explicit kernels and SDPA's
    kernels compute, and what torch's flop counter reports. Norms, RoPE, softmax and the embedding lookup
    are not counted (no multiply-adds worth naming, as in every FLOP convention).
    """
    d, tokens = config.d_model, batch * seq
    matmul_params = config.n_layers * (4 * d * d + 3 * d * config.d_ff) + d * config.vocab_size
    attention = config.n_layers * batch * 4 * seq * seq * d
    return 2 * matmul_params * tokens + attention


def train_flops(config: LMConfig, batch: int, seq: int) -> int:
    """Forward + backward: the backward of each matmul is two matmuls of the same size, so 3 × forward."""
    return 3 * forward_flops(config, batch, seq)


# ---- modules shared with llama.py ----


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The mean of squares in fp32: in bf16 it loses the small channels.
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) · w3 x)."""

    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def rope_frequencies(head_dim: int, theta: float) -> torch.Tensor:
    """theta^(-2i/head_dim) for the head_dim/2 channel pairs, in float64."""
    return 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)


def rope_tables(frequencies: torch.Tensor, n_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of pos · frequency, [n_positions, head_dim/2], fp32."""
    # Angles in float64: at position 10⁵ fp32 would already be off by ~0.01 rad.
    angles = torch.outer(torch.arange(n_positions, dtype=torch.float64), frequencies)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs (x[2i], x[2i+1]) of x [B, H, T, head_dim] by the angles of cos/sin [T, head_dim/2]."""
    pairs = x.float().unflatten(-1, (-1, 2))
    x0, x1 = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    return rotated.flatten(-2).type_as(x)


def init_weights(module: nn.Module, std: float = 0.02) -> None:
    # Small normal weights keep the residual stream and the logits O(1), so bf16 losses stay finite.
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=std)
    elif isinstance(module, RMSNorm):
        nn.init.ones_(module.weight)


# ---- the GPT ----


class Attention(nn.Module):
    def __init__(self, config: LMConfig):
        super().__init__()
        self.n_heads = config.n_heads
        self.head_dim = config.head_dim
        self.impl = config.attn
        # One fused projection: one GEMM instead of three, the same FLOPs.
        self.wqkv = nn.Linear(config.d_model, 3 * config.d_model, bias=False)
        self.wo = nn.Linear(config.d_model, config.d_model, bias=False)

    def forward(self, x, cos, sin, causal_mask, annotate: bool) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.wqkv(x).view(B, T, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.impl == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif annotate:
            # Only profile passes get here: record_function is a graph break for torch.compile, so the
            # timed path (below) has no context manager at all, not even a no-op one.
            with record_function("attn.scores"):
                scores = self.masked_scores(q, k, causal_mask)
            with record_function("attn.softmax"):
                probs = scores.softmax(dim=-1)
            with record_function("attn.final_matmul"):
                y = probs @ v
        else:
            y = self.masked_scores(q, k, causal_mask).softmax(dim=-1) @ v
        return self.wo(y.transpose(1, 2).reshape(B, T, C))

    def masked_scores(self, q, k, causal_mask) -> torch.Tensor:
        # Softmax stays in the input dtype, as the seed's kernels ran it.
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        return scores.masked_fill(causal_mask, float("-inf"))


class Block(nn.Module):
    def __init__(self, config: LMConfig):
        super().__init__()
        self.attention_norm = RMSNorm(config.d_model, config.norm_eps)
        self.attention = Attention(config)
        self.ffn_norm = RMSNorm(config.d_model, config.norm_eps)
        self.feed_forward = FeedForward(config.d_model, config.d_ff)

    def forward(self, x, cos, sin, causal_mask, annotate: bool) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin, causal_mask, annotate)
        return x + self.feed_forward(self.ffn_norm(x))


class GPT(nn.Module):
    def __init__(self, config: LMConfig):
        super().__init__()
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.d_model)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.output = nn.Linear(config.d_model, config.vocab_size, bias=False)
        # Non-persistent: derived from the config, so they stay out of state dicts. Casting the module
        # (model.to(torch.bfloat16)) casts the tables too; autocast leaves them fp32.
        cos, sin = rope_tables(rope_frequencies(config.head_dim, config.rope_theta), config.context_length)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        # True above the diagonal: the future keys each query must not see. Only explicit attention reads
        # it (one buffer for all layers); SDPA masks inside its kernel.
        mask = None
        if config.attn == "explicit":
            mask = torch.ones(config.context_length, config.context_length, dtype=torch.bool).triu(1)
        self.register_buffer("causal_mask", mask, persistent=False)
        # Profile passes set this to wrap explicit attention's steps in attn.scores / attn.softmax /
        # attn.final_matmul ranges; timed passes leave it off so that forward has no context managers.
        self.annotate = False
        self.apply(init_weights)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        B, T = idx.shape
        if T > self.config.context_length:
            raise PerflabError(
                f"sequence length {T} exceeds context_length {self.config.context_length}: "
                "use a shorter sequence or override context_length"
            )
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        causal_mask = self.causal_mask[:T, :T] if self.causal_mask is not None else None
        annotate = self.annotate
        x = self.tok_embeddings(idx)
        recompute = self.config.checkpoint_activations and torch.is_grad_enabled()
        for layer in self.layers:
            if recompute:
                x = checkpoint(layer, x, cos, sin, causal_mask, annotate, use_reentrant=False)
            else:
                x = layer(x, cos, sin, causal_mask, annotate)
        return self.output(self.norm(x))
