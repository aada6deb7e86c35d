"""Traces → the KernelTable: Kineto JSON and nsys SQLite loaders, and the kernel-category rule table.

    from perflab.trace import load_trace
    trace = load_trace("tests/data/traces/eager_vit.json.gz")
    trace.kernels            # the KernelTable (see perflab.trace.schema)

Never imports torch (trace analysis must run where torch is absent); capture lives elsewhere.
"""

from perflab.trace.load import load_trace
from perflab.trace.schema import KERNEL_COLUMNS, Trace

__all__ = ["load_trace", "Trace", "KERNEL_COLUMNS"]
