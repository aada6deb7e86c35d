"""A decode testbench in the manner of seed 004's ``minimal_llama.py``: Llama-shaped layers (RMSNorm, multi-head
attention over a static KV cache, a SwiGLU MLP) decoding one token at a time, warmed up, then each timed decode step
inside an NVTX range named BENCHMARK, as the seed marked the step nsys and ncu were to capture.

    python benchmarks/programs/decode_nvtx.py --decode [--compiled]
    python -m perflab run --step-range BENCHMARK --skip 0 --steps 30 -- python benchmarks/programs/decode_nvtx.py --decode --compiled
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--decode", action="store_true")
parser.add_argument("--compiled", action="store_true")
parser.add_argument("--layers", type=int, default=4)
parser.add_argument("--batch", type=int, default=1)
parser.add_argument("--context", type=int, default=512)
parser.add_argument("--runs", type=int, default=60)
args = parser.parse_args()

DIM, HEADS, HIDDEN, CACHE = 4096, 32, 14336, 1024
HEAD = DIM // HEADS


class RMSNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5).type_as(x) * self.weight


class Layer(nn.Module):
    def __init__(self, batch):
        super().__init__()
        self.attn_norm, self.mlp_norm = RMSNorm(DIM), RMSNorm(DIM)
        self.wqkv = nn.Linear(DIM, 3 * DIM, bias=False)
        self.wo = nn.Linear(DIM, DIM, bias=False)
        self.w13 = nn.Linear(DIM, 2 * HIDDEN, bias=False)
        self.w2 = nn.Linear(HIDDEN, DIM, bias=False)
        self.register_buffer("k_cache", torch.zeros(batch, HEADS, CACHE, HEAD))
        self.register_buffer("v_cache", torch.zeros(batch, HEADS, CACHE, HEAD))

    def forward(self, x, pos, mask):
        b = x.shape[0]
        q, k, v = self.wqkv(self.attn_norm(x)).view(b, 1, 3, HEADS, HEAD).permute(2, 0, 3, 1, 4)
        self.k_cache.index_copy_(2, pos, k)
        self.v_cache.index_copy_(2, pos, v)
        a = F.scaled_dot_product_attention(q, self.k_cache, self.v_cache, attn_mask=mask)
        x = x + self.wo(a.transpose(1, 2).reshape(b, 1, DIM))
        gate, up = self.w13(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.w2(F.silu(gate) * up)


class Model(nn.Module):
    def __init__(self, layers, batch):
        super().__init__()
        self.layers = nn.ModuleList(Layer(batch) for _ in range(layers))

    def forward(self, x, pos, mask):
        for layer in self.layers:
            x = layer(x, pos, mask)
        return x


torch.manual_seed(0)
model = Model(args.layers, args.batch).cuda().to(torch.bfloat16)
x = torch.randn(args.batch, 1, DIM, device="cuda", dtype=torch.bfloat16)
pos = torch.tensor([args.context], device="cuda")
mask = (torch.arange(CACHE, device="cuda") <= args.context).view(1, 1, 1, CACHE)


@torch.no_grad()
def decode_one_token(x):
    return model(x, pos, mask)


step = torch.compile(decode_one_token, mode="max-autotune") if args.compiled else decode_one_token
for _ in range(20):  # warm-up, as the seed's 20 runs before the ranges
    step(x)
torch.cuda.synchronize()
for _ in range(args.runs):
    torch.cuda.nvtx.range_push("BENCHMARK")
    step(x)
    torch.cuda.nvtx.range_pop()
torch.cuda.synchronize()
print("decoded", args.runs, "steps")
