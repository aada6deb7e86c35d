"""A small language model built the quickest way: torch's own nn.TransformerEncoderLayer stacked, with an
embedding and a head. In inference (eval, no grad) each layer runs torch's fused fast path, one op per layer
(aten::_transformer_encoder_layer_fwd) that torch's FLOP counter has no formula for: perflab's tests check that
its FLOPs are counted all the same."""

import torch
import torch.nn as nn


class EncoderLM(nn.Module):
    def __init__(self, vocab_size: int = 256, d_model: int = 64, n_heads: int = 4, n_layers: int = 2, d_ff: int = 128, max_len: int = 64):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Parameter(torch.zeros(max_len, d_model))
        layer = nn.TransformerEncoderLayer(d_model, n_heads, d_ff, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, idx):
        x = self.embed(idx) + self.pos[: idx.shape[1]]
        return self.head(self.encoder(x))
