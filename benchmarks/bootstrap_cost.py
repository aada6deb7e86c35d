"""What --bootstrap's replicates cost and buy: find_breakeven on 4 + 4 synthetic cases of 20 samples each (a
123-127-token crossover), its time, peak memory (tracemalloc) and CI at each replicate count (docs/robustness.md).

    PYTHONPATH=src python3 benchmarks/bootstrap_cost.py [2000 100000 ...]
"""

import sys
import time
import tracemalloc

import numpy as np

from perflab.analysis.breakeven import find_breakeven

rng = np.random.default_rng(0)
n = [64, 128, 256, 512]
base = [list(1 + 0.01 * x + 1e-5 * x * x + rng.normal(0, 0.02, 20)) for x in n]
variant = [list(1.5 + 0.006 * x + 1e-5 * x * x + rng.normal(0, 0.02, 20)) for x in n]
for n_boot in [int(a) for a in sys.argv[1:]] or [2000, 100_000]:
    tracemalloc.start()
    start = time.perf_counter()
    result = find_breakeven(n, base, n, variant, n_boot=n_boot)
    took, peak = time.perf_counter() - start, tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    lo, hi = result.crossover_ci
    print(f"{n_boot:>9,} replicates: {took:6.2f} s, {peak / 1e6:5.0f} MB peak, 95% CI {lo:.2f}-{hi:.2f} tokens")
