"""Analyses over the KernelTable (plus CPU ranges and step windows). Plain functions; never imports torch.

- accounting: wall = GPU busy + idle by cause (host-bound, kernel gap, other), exact in ns, per step
- kernels: kernel statistics, top kernels with readable names
- names: the short kernel-name rule every table uses (``short_kernel_name``, ``short_names``)
- launch: launch-API CPU time, launch-to-start delay, the launch-bound verdict
- ranges: GPU time per CPU range (annotation / NVTX)
- breakdown: GPU time by kernel category, GEMM fraction
- trace_report: all of the above in one object (``analyze_trace``)
"""

from perflab.analysis.accounting import account
from perflab.analysis.trace_report import TraceReport, analyze_trace

__all__ = ["account", "analyze_trace", "TraceReport"]
