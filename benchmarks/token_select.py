"""Cost of the token-reduction step on the GPU, per implementation (replayed from CUDA graphs).

    PYTHONPATH=src python benchmarks/token_select.py

Times, for DeiT-B shapes at 224 and 448 px and batch 1 and 64, the pieces a reducing block adds:
CLS-row scoring (three formulations that compute the same scores) and selection (topk unsorted,
topk sorted, sort + slice). Each variant is captured 50 times in one CUDA graph; µs per call.
"""

from __future__ import annotations

import torch

H, HD = 12, 64
D = H * HD


def scores_matmul(qkv, B, N):
    q, k, _ = qkv.view(B, N, 3, H, HD).permute(2, 0, 3, 1, 4).unbind(0)
    a = ((q[:, :, :1] * HD**-0.5) @ k.transpose(-2, -1)).softmax(dim=-1)
    return a[:, :, 0, 1:].mean(dim=1)


def scores_elementwise(qkv, B, N):
    q, k, _ = qkv.view(B, N, 3, H, HD).permute(2, 0, 3, 1, 4).unbind(0)
    a = (k * (q[:, :, :1] * HD**-0.5)).sum(-1).softmax(dim=-1)  # B, H, N
    return a[:, :, 1:].mean(dim=1)


def scores_strided_bmm(qkv, B, N):
    # K straight from the qkv output (row stride 3D, no copy) times a block-diagonal Q (scale folded in).
    k = qkv[:, :, D : 2 * D]
    q_cls = qkv[:, 0, :D].view(B, H, HD, 1)
    q_diag = (q_cls * (torch.eye(H, device=qkv.device, dtype=qkv.dtype) * HD**-0.5).view(1, H, 1, H)).reshape(B, D, H)
    a = torch.bmm(k, q_diag).softmax(dim=1)  # B, N, H
    return a[:, 1:].mean(dim=-1)


def select_topk(scores, k):
    return scores.topk(k, dim=1, sorted=False).indices


def select_topk_sorted(scores, k):
    return scores.topk(k, dim=1, sorted=True).indices


def select_sort(scores, k):
    return scores.sort(dim=1, descending=True).indices[:, :k]


def time_graph(fn, reps=50) -> float:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        g.replay()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) * 1000 / reps)
    return sorted(times)[len(times) // 2]


def main() -> None:
    torch.manual_seed(0)
    print(f"{'shape':>16} " + " ".join(f"{n:>14}" for n in ["matmul", "elementwise", "strided_bmm", "topk", "topk_sorted", "sort"]))
    for B, N in [(1, 197), (64, 197), (1, 785), (64, 785)]:
        k = -(-(N - 1) // 10)
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            qkv = torch.randn(B, N, 3 * D, device="cuda", dtype=torch.bfloat16)
            ref = scores_matmul(qkv, B, N).float()
            for f in (scores_elementwise, scores_strided_bmm):
                err = (f(qkv, B, N).float() - ref).abs().max().item()
                assert err < 1e-2, f"{f.__name__} differs by {err}"
            s = ref.contiguous()
            row = [time_graph(lambda f=f: f(qkv, B, N)) for f in (scores_matmul, scores_elementwise, scores_strided_bmm)]
            row += [time_graph(lambda f=f: f(s, k)) for f in (select_topk, select_topk_sorted, select_sort)]
        print(f"{f'B={B} N={N} k={k}':>16} " + " ".join(f"{t:14.2f}" for t in row), flush=True)


if __name__ == "__main__":
    main()
