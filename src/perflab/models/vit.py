"""A Vision Transformer in the style of gpt-fast's model.py.

Parameter names match timm's ``VisionTransformer`` (``patch_embed.proj``, ``blocks.N.attn.qkv`` ...), so a
timm DeiT/ViT state dict loads with ``strict=True``. Token reduction (top-k / EViT) is a per-block option:
a reducing block runs attention on all tokens, then drops tokens, then runs its MLP on the kept set, as
the TokenReductionPT code the seeds measured.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field, replace

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import record_function

from perflab.models.token_reduction import reduce_tokens


@dataclass(frozen=True)
class ViTConfig:
    img_size: int = 224
    patch_size: int = 16
    in_chans: int = 3
    num_classes: int = 1000
    dim: int = 768
    depth: int = 12
    n_heads: int = 12
    mlp_ratio: float = 4.0
    norm_eps: float = 1e-6
    attn: str = "sdpa"  # "sdpa" (fused) or "explicit" (q·kᵀ, softmax, ·v)
    # Token reduction: block index -> keep rate, and whether dropped tokens are fused into one (EViT).
    reduction: tuple[tuple[int, float], ...] = field(default_factory=tuple)
    fuse_dropped: bool = False

    @property
    def grid(self) -> int:
        return self.img_size // self.patch_size

    @property
    def n_patches(self) -> int:
        return self.grid * self.grid

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def hidden_dim(self) -> int:
        return int(self.dim * self.mlp_ratio)

    @classmethod
    def from_name(cls, name: str, **overrides) -> "ViTConfig":
        return replace(cls(**vit_configs[name]), **overrides)


vit_configs = {
    "deit_tiny_patch16_224": dict(dim=192, depth=12, n_heads=3),
    "deit_small_patch16_224": dict(dim=384, depth=12, n_heads=6),
    "deit_base_patch16_224": dict(dim=768, depth=12, n_heads=12),
    "vit_base_patch16_224": dict(dim=768, depth=12, n_heads=12),
    "vit_large_patch16_224": dict(dim=1024, depth=24, n_heads=16),
}


def token_schedule(config: ViTConfig) -> list[int]:
    """Sequence length (CLS included) at the input and after each reduction location.

    Keep rates compound: each applies to the tokens present at that point. 0.1 at blocks 3, 6, 9 on a
    224 input gives [197, 21, 3, 2].
    """
    n = config.n_patches + 1
    tokens = [n]
    for _, keep_rate in sorted(config.reduction):
        n = tokens_after_reduction(n, keep_rate, config.fuse_dropped)
        tokens.append(n)
    return tokens


def tokens_after_reduction(n: int, keep_rate: float, fuse_dropped: bool) -> int:
    kept = kept_patch_tokens(n, keep_rate)
    if kept >= n - 1:
        return n
    return 1 + kept + (1 if fuse_dropped else 0)


def kept_patch_tokens(n: int, keep_rate: float) -> int:
    # The same rule as EViT and TokenReductionPT: ceil(r * (N - 1)) of the non-CLS tokens.
    return max(1, math.ceil(keep_rate * (n - 1)))


class PatchEmbed(nn.Module):
    def __init__(self, config: ViTConfig):
        super().__init__()
        self.proj = nn.Conv2d(config.in_chans, config.dim, config.patch_size, stride=config.patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)  # B, N, C


class Attention(nn.Module):
    def __init__(self, config: ViTConfig):
        super().__init__()
        self.n_heads = config.n_heads
        self.head_dim = config.head_dim
        self.scale = self.head_dim**-0.5
        self.impl = config.attn
        self.qkv = nn.Linear(config.dim, 3 * config.dim)
        self.proj = nn.Linear(config.dim, config.dim)

    def forward(self, x: torch.Tensor, want_cls_scores: bool = False):
        B, N, C = x.shape
        q, k, v = self.qkv(x).view(B, N, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        cls_scores = None
        if self.impl == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v)
            if want_cls_scores:
                # Only the CLS row is needed to score tokens: q_cls·Kᵀ is N dot products per head,
                # so the block keeps the fused attention kernel.
                cls_attn = ((q[:, :, :1] * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
                cls_scores = cls_attn[:, :, 0, 1:].mean(dim=1)
        else:
            attn = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
            y = attn @ v
            if want_cls_scores:
                cls_scores = attn[:, :, 0, 1:].mean(dim=1)
        y = y.transpose(1, 2).reshape(B, N, C)
        return self.proj(y), cls_scores


class Mlp(nn.Module):
    def __init__(self, config: ViTConfig):
        super().__init__()
        self.fc1 = nn.Linear(config.dim, config.hidden_dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(config.hidden_dim, config.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, config: ViTConfig, index: int, keep_rate: float = 1.0):
        super().__init__()
        self.index = index
        self.keep_rate = keep_rate
        self.fuse_dropped = config.fuse_dropped
        self.norm1 = nn.LayerNorm(config.dim, eps=config.norm_eps)
        self.attn = Attention(config)
        self.norm2 = nn.LayerNorm(config.dim, eps=config.norm_eps)
        self.mlp = Mlp(config)

    @property
    def reduces(self) -> bool:
        return self.keep_rate < 1.0

    def forward(self, x: torch.Tensor, annotate: bool = False) -> torch.Tensor:
        with _range(annotate, f"block{self.index}.attn"):
            y, cls_scores = self.attn(self.norm1(x), want_cls_scores=self.reduces)
            x = x + y
        if self.reduces:
            with _range(annotate, f"block{self.index}.reduce"):
                x = reduce_tokens(x, cls_scores, self.keep_rate, self.fuse_dropped)
        with _range(annotate, f"block{self.index}.mlp"):
            x = x + self.mlp(self.norm2(x))
        return x


class VisionTransformer(nn.Module):
    def __init__(self, config: ViTConfig):
        super().__init__()
        self.config = config
        keep_rates = dict(config.reduction)
        self.patch_embed = PatchEmbed(config)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, config.dim))
        self.pos_embed = nn.Parameter(torch.randn(1, config.n_patches + 1, config.dim) * 0.02)
        self.blocks = nn.ModuleList(Block(config, i, keep_rates.get(i, 1.0)) for i in range(config.depth))
        self.norm = nn.LayerNorm(config.dim, eps=config.norm_eps)
        self.head = nn.Linear(config.dim, config.num_classes)
        # Profiling passes set this to wrap model stages in named ranges (block3.attn, ...); timed
        # passes leave it off so that record_function costs nothing there.
        self.annotate = False
        # When set, forward() appends the sequence length after each reduction (a check, not timed).
        self.tokens_seen: list[int] | None = None
        self.apply(_init_weights)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        annotate = self.annotate
        with _range(annotate, "patch_embed"):
            x = self.patch_embed(x)
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        if self.tokens_seen is not None:
            self.tokens_seen.append(x.shape[1])
        for block in self.blocks:
            x = block(x, annotate)
            if block.reduces and self.tokens_seen is not None:
                self.tokens_seen.append(x.shape[1])
        with _range(annotate, "head"):
            return self.head(self.norm(x)[:, 0])

    def token_schedule(self) -> list[int]:
        return token_schedule(self.config)


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, nn.Linear):
        nn.init.trunc_normal_(module.weight, std=0.02)
        nn.init.zeros_(module.bias)


def _range(annotate: bool, name: str):
    # nullcontext, not a hand-written no-op class: torch.compile traces through it without a graph break.
    return record_function(name) if annotate else contextlib.nullcontext()


def resample_pos_embed(pos_embed: torch.Tensor, n_patches: int) -> torch.Tensor:
    """Resize a (1, 1 + g*g, C) position embedding to another grid (bicubic, as timm does)."""
    cls_pos, patch_pos = pos_embed[:, :1], pos_embed[:, 1:]
    old_grid, new_grid = math.isqrt(patch_pos.shape[1]), math.isqrt(n_patches)
    if old_grid == new_grid:
        return pos_embed
    c = patch_pos.shape[-1]
    grid = patch_pos.reshape(1, old_grid, old_grid, c).permute(0, 3, 1, 2).float()
    grid = F.interpolate(grid, size=(new_grid, new_grid), mode="bicubic", antialias=True, align_corners=False)
    patch_pos = grid.permute(0, 2, 3, 1).reshape(1, new_grid * new_grid, c).to(pos_embed.dtype)
    return torch.cat([cls_pos, patch_pos], dim=1)


def load_timm_state_dict(model: VisionTransformer, state_dict: dict) -> None:
    """Load a timm ViT/DeiT state dict with strict=True, resizing pos_embed if it was made for another size."""
    state_dict = dict(state_dict)
    if "pos_embed" in state_dict:
        state_dict["pos_embed"] = resample_pos_embed(state_dict["pos_embed"], model.config.n_patches)
    model.load_state_dict(state_dict, strict=True)
