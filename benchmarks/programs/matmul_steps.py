"""A toy training loop for perflab ab and track of a program (tests/test_program_ab.py, benchmarks/program_ab_cpu.py):
each step (the function ``step``, ``perflab run --step step``) is WORK 512-wide matmuls forward, their backward and an
update, about 8 ms each on one CPU thread (so the step's fixed cost, a fraction of a millisecond, leaves the step's
ratio near the work's). WORK comes from ``work.py`` beside it (a commit changes it) or from the
first argument; an argument ``fail`` makes it raise before its first step. No optimizer: no dynamo to import."""
import sys

import torch

from work import WORK

work = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else WORK
if "fail" in sys.argv:
    raise RuntimeError("told to fail")


def step(x, w):
    loss = sum((x @ w).sum() for _ in range(work))  # WORK matmuls forward, WORK backward: the work is WORK times one's
    loss.backward()
    with torch.no_grad():
        w -= 1e-9 * w.grad
    w.grad = None


torch.manual_seed(0)
x = torch.randn(512, 512)
w = (torch.randn(512, 512) * 0.01).requires_grad_()
for _ in range(60):
    step(x, w)
