"""A course-style Transformer LM (CS336 assignment 1 shapes), written the way a student writes it: its own
modules, nothing from perflab. perflab's tests measure it as a user's model (``course_lm.py:TransformerLM``) and
check it against perflab's built-in ``gpt_small`` at the same dimensions: the same parameter count, and FLOPs
that the flop counter finds within 2% of the analytic formula."""


import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, d_model: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x):
        rms = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (x.float() * rms).type_as(x) * self.weight


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff, bias=False)
        self.w2 = nn.Linear(d_ff, d_model, bias=False)
        self.w3 = nn.Linear(d_model, d_ff, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def rope_tables(head_dim: int, context_length: int, theta: float):
    """cos and sin of position · theta^(-2i/head_dim), (context_length, head_dim / 2), computed once."""
    freqs = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.arange(context_length, dtype=torch.float32)[:, None] * freqs[None, :]
    return angles.cos(), angles.sin()


def rope(x, cos, sin):
    """Rotate interleaved channel pairs of (B, H, T, D) by the tables' angles."""
    B, H, T, D = x.shape
    pairs = x.float().reshape(B, H, T, D // 2, 2)
    a, b = pairs[..., 0], pairs[..., 1]
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).reshape(B, H, T, D).type_as(x)


class MultiHeadSelfAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.qkv_proj = nn.Linear(d_model, 3 * d_model, bias=False)  # q, k and v in one matmul
        self.output_proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        q, k, v = self.qkv_proj(x).view(B, T, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4).unbind(0)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.output_proj(y.transpose(1, 2).reshape(B, T, C))


class TransformerBlock(nn.Module):
    def __init__(self, d_model: int, num_heads: int, d_ff: int):
        super().__init__()
        self.ln1 = RMSNorm(d_model)
        self.attn = MultiHeadSelfAttention(d_model, num_heads)
        self.ln2 = RMSNorm(d_model)
        self.ffn = SwiGLU(d_model, d_ff)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.ln1(x), cos, sin)
        return x + self.ffn(self.ln2(x))


class TransformerLM(nn.Module):
    def __init__(self, vocab_size: int = 10_000, context_length: int = 1024, d_model: int = 768, num_layers: int = 12,
                 num_heads: int = 12, d_ff: int = 3072, rope_theta: float = 10_000.0):
        super().__init__()
        self.context_length = context_length
        self.token_embeddings = nn.Embedding(vocab_size, d_model)
        self.layers = nn.ModuleList(TransformerBlock(d_model, num_heads, d_ff) for _ in range(num_layers))
        self.ln_final = RMSNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.trunc_normal_(module.weight, std=0.02, a=-0.06, b=0.06)
        cos, sin = rope_tables(d_model // num_heads, context_length, rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, token_ids):
        T = token_ids.shape[1]
        assert T <= self.context_length, "sequence longer than the context"
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        x = self.token_embeddings(token_ids)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.ln_final(x))


def small(**overrides):
    """gpt_small's shape (d_model 768, 12 layers, 12 heads, d_ff 3072), any of it overridden."""
    return TransformerLM(**{"d_model": 768, "num_layers": 12, "num_heads": 12, "d_ff": 3072, **overrides})


def large(**overrides):
    """gpt_large's shape (d_model 1280, 36 layers, 20 heads, d_ff 5120)."""
    return TransformerLM(**{"d_model": 1280, "num_layers": 36, "num_heads": 20, "d_ff": 5120, **overrides})


def broken(**kwargs):
    raise ValueError("this factory always fails\nwith its reason on the last line")


NOT_A_MODEL = 42


def not_a_module():
    return "a string"
