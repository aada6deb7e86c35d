"""The KernelTable and the Trace: what every trace loader produces and every analysis consumes.

KernelTable: a pandas DataFrame, one row per GPU activity (kernel, memcpy, memset), all times integer
nanoseconds (int64) on the trace's own clock:

    name             the full (demangled) kernel name, or "Memcpy DtoH (Device -> Pinned)", "Memset (Device)"
    category         from perflab.trace.categories (gemm, attention, ..., other)
    kind             kernel | memcpy | memset
    device, stream   GPU index and stream id
    start_ns, end_ns, dur_ns
    correlation      the CUPTI correlation id linking the activity to its launch call
    launch_api       cudaLaunchKernel, cuLaunchKernelEx, cudaGraphLaunch, cudaMemcpyAsync, ... ("" if not linked)
    launch_start_ns, launch_end_ns, launch_tid    the launching call (-1 if not linked)
    range            the innermost CPU annotation enclosing the launch call on the launching thread
                     (for CUDA-graph kernels, the one enclosing the cudaGraphLaunch); "" if none
    range_id         the row of ``Trace.ranges`` that ``range`` names (-1 if none)
    grid, block      "(x, y, z)" launch dimensions where known, else ""

Text columns are pandas categoricals (a million kernels share a few hundred names).

A :class:`Trace` carries the KernelTable plus the CPU side the analyses need: ``launches`` (every CUDA
runtime/driver API call: name, tid, start_ns, end_ns, correlation), ``ranges`` (CPU annotations: name,
tid, start_ns, end_ns, depth, parent), ``steps`` (step annotations: step, name, start_ns, end_ns, tid) and
``meta`` (format, path, device properties, counts).

A trace with no GPU activity (a CPU-only program) has its top-level CPU operators as its work: one row per operator
not inside another on its thread, kind ``cpu_op``, device 0, stream = the thread; each is "launched" when it starts,
so every gap between operators is host-bound (the interpreter's time between them). ``meta["cpu_only"]`` says so.
"""

from __future__ import annotations

import re

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

KERNEL_COLUMNS = (
    "name", "category", "kind", "device", "stream", "start_ns", "end_ns", "dur_ns", "correlation",
    "launch_api", "launch_start_ns", "launch_end_ns", "launch_tid", "range", "range_id", "grid", "block",
)
INT_KERNEL_COLUMNS = (
    "device", "stream", "start_ns", "end_ns", "dur_ns", "correlation", "launch_start_ns", "launch_end_ns", "launch_tid", "range_id",
)
STEP_COLUMNS = ("step", "name", "start_ns", "end_ns", "tid")
KINDS = ("kernel", "memcpy", "memset", "cpu_op")  # cpu_op: a CPU-only trace's work (its top-level operators)
WORK_KINDS = ("kernel", "cpu_op")  # a unit of work: a GPU kernel, or in a CPU-only trace an operator
OP_COLUMNS = ("name", "pid", "tid", "start_ns", "end_ns", "depth", "parent", "input_shapes", "input_types", "concrete_inputs")
NOT_LINKED = -1


@dataclass
class Trace:
    """One loaded trace: the KernelTable and the CPU-side tables it was linked with."""

    kernels: pd.DataFrame
    launches: pd.DataFrame
    ranges: pd.DataFrame
    steps: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)
    # torch's operators (cpu_op events: name, pid, tid, start_ns, end_ns, depth and parent among the thread's operators,
    # input_shapes, input_types and concrete_inputs: record_shapes' Input Dims, Input type and Concrete Inputs decoded, a
    # tuple per operator (one shape, type or value text per input, a shape a tuple of ints, nested for a list of tensors),
    # None where not recorded), where the loader was asked for them
    ops: pd.DataFrame | None = None

    @property
    def cpu_only(self) -> bool:
        """The trace holds no GPU activity: its KernelTable is its CPU operators (kind ``cpu_op``)."""
        return bool(self.meta.get("cpu_only"))

    def __repr__(self) -> str:
        return (
            f"Trace({self.meta.get('format', '?')}: {len(self.kernels)} GPU activities, {len(self.launches)} API calls, "
            f"{len(self.ranges)} ranges, {len(self.steps)} steps)"
        )


def check_kernel_table(table: pd.DataFrame) -> None:
    """Raise AssertionError if ``table`` is not a KernelTable (column set, int64 times, end = start + dur)."""
    missing = [c for c in KERNEL_COLUMNS if c not in table.columns]
    assert not missing, f"KernelTable lacks columns {missing}"
    for column in INT_KERNEL_COLUMNS:
        assert table[column].dtype == np.int64, f"KernelTable column {column} is {table[column].dtype}, not int64"
    assert (table["end_ns"] - table["start_ns"] == table["dur_ns"]).all(), "KernelTable: end_ns - start_ns != dur_ns"


# ---------------------------------------------------------------------------------------------------
# Module ranges: the name ``trace.modules`` gives a module's forward and backward in a profile, which
# ``analysis.modules`` reads back. The rule lives here, on the capture side, so capture imports nothing from analysis.

MODULE_RANGE = re.compile(r"^module(?P<backward>_backward)?:(?P<path>\S*) \[(?P<cls>[^\]]*)\]$")
MODULE_ROOT = "."  # the path of the model itself


def module_range_name(path: str, cls: str, backward: bool = False) -> str:
    """The profiler range name of a module's forward (or backward): ``module:layers.0.attention [Attention]``."""
    return f"module{'_backward' if backward else ''}:{path or MODULE_ROOT} [{cls}]"

