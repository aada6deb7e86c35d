"""Token reduction by CLS attention: top-k (drop the rest) and EViT (fuse the rest into one token).

The score of a patch token is the CLS row of the post-softmax attention, averaged over heads. A reducing
block keeps ceil(r·(N−1)) patch tokens with ``topk`` + ``gather``. Kept tokens come out in score order
(the CLS output does not depend on token order), so ``topk`` runs unsorted.
"""

from __future__ import annotations

import math

import torch


def reduce_tokens(x: torch.Tensor, cls_scores: torch.Tensor, keep_rate: float, fuse_dropped: bool) -> torch.Tensor:
    """Keep the CLS token and the best-scored patch tokens; with ``fuse_dropped`` add one fused token.

    x: (B, N, C) with the CLS token first. cls_scores: (B, N-1), the CLS attention to each patch token.
    """
    B, N, C = x.shape
    n_keep = max(1, math.ceil(keep_rate * (N - 1)))
    if n_keep >= N - 1:
        return x
    idx = cls_scores.topk(n_keep, dim=1, largest=True, sorted=False).indices
    patches = x[:, 1:]
    kept = patches.gather(1, idx.unsqueeze(-1).expand(-1, -1, C))
    if not fuse_dropped:
        return torch.cat([x[:, :1], kept], dim=1)
    # EViT: the dropped tokens, weighted by their CLS attention, summed into one extra token.
    dropped_weights = cls_scores.scatter(1, idx, 0.0).to(patches.dtype)
    fused = (patches * dropped_weights.unsqueeze(-1)).sum(dim=1, keepdim=True)
    return torch.cat([x[:, :1], kept, fused], dim=1)
