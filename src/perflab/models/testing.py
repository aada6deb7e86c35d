"""Small models that plant faults, for perflab's own tests (names ``test:<name>``).

They live in the package, not in tests/, because sweeps run each case in a fresh subprocess that must
be able to build them too.
"""

from __future__ import annotations

import os
import random
import time

import torch
import torch.nn as nn


class Tiny(nn.Module):
    """A small patch MLP: fast on any device, real matmuls."""

    def __init__(self, dim: int = 32, classes: int = 10):
        super().__init__()
        self.proj = nn.Conv2d(3, dim, 16, stride=16)
        self.fc = nn.Linear(dim, classes)

    def forward(self, x):
        return self.fc(self.proj(x).flatten(2).mean(-1))


class DropsBatch(Tiny):
    """Processes only the first image of each batch: the seed harness's fault."""

    def forward(self, x):
        return super().forward(x[:1])


class Jitter(Tiny):
    """Sleeps a random 0–4 ms per step, so timing samples vary far beyond 5%."""

    def forward(self, x):
        time.sleep(random.uniform(0.0, 0.004))
        return super().forward(x)


class Oom(Tiny):
    def forward(self, x):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (planted by test:oom)")


class Fails(Tiny):
    def forward(self, x):
        raise RuntimeError("planted failure (test:fails)")


class Crashes(Tiny):
    """Kills its own process, as a segfault or a CUDA abort would."""

    def forward(self, x):
        os._exit(134)


class Hangs(Tiny):
    def forward(self, x):
        time.sleep(3600)
        return super().forward(x)


class Slow(Tiny):
    """Takes 50 ms per step: a case that is still running when a sweep is killed."""

    def forward(self, x):
        time.sleep(0.05)
        return super().forward(x)


class Affinity(Tiny):
    """Records, at every step, the calling thread's CPU affinity, torch's intra-op threads and whether the
    garbage collector is on (in ``Affinity.seen``): what the harness set around the step."""

    seen: list[tuple[frozenset, int, bool]] = []

    def forward(self, x):
        import gc

        Affinity.seen.append((frozenset(os.sched_getaffinity(0)), torch.get_num_threads(), gc.isenabled()))
        return super().forward(x)


TEST_MODELS = {
    "tiny": Tiny,
    "drops_batch": DropsBatch,
    "jitter": Jitter,
    "oom": Oom,
    "fails": Fails,
    "crashes": Crashes,
    "hangs": Hangs,
    "slow": Slow,
    "affinity": Affinity,
}
