"""A CPU rank's Kineto trace (gloo, ``perflab profile|explain --parallel --device cpu``) as the per-rank accounting
reads a GPU rank's kernels: one row an activity, ``name``, integer-ns ``start_ns``/``end_ns``, and ``comm``.

On the CPU there are no kernels. A rank computes on its main thread, inside torch's operators (``cpu_op`` events of
the thread that runs the step), and gloo runs each collective on a thread of its own (a ``gloo:all_reduce``,
``gloo:broadcast``, ... range). So compute = the main thread's operators, communication = gloo's ranges; the
main thread waiting for a bucket (DDP's end of backward) is in no operator, and the communication it waits on is
exposed. The pass ranges (``forward``, ``backward``, ``optimizer``: perflab's lm step marks them in a profiled
pass) come back apart. The trace is read by ``trace.kineto.load_kineto`` with its operators (``Trace.ops``: every
thread's, with its tid; ``Trace.ranges``: the ``user_annotation`` ranges), so times are the reader's exact ns.

Never imports torch.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from perflab.trace.kineto import load_kineto

PASS_NAMES = ("forward", "backward", "optimizer")
COLUMNS = ["name", "start_ns", "end_ns", "comm"]


def cpu_rank_activities(path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(activities: the main thread's operators and gloo's collectives, with ``comm``, by start (at one start: operators
    before collectives, each in the trace's order); the main thread's pass ranges)."""
    trace = load_kineto(path, ops=True)
    ops, ranges = trace.ops, trace.ranges
    main = _main_thread(ops["tid"].to_numpy())
    range_names = ranges["name"].astype(str)
    compute = ops[ops["tid"].to_numpy() == main]
    comm = ranges[range_names.str.startswith("gloo:").to_numpy()]
    passes = ranges[(range_names.isin(PASS_NAMES) & (ranges["tid"] == main)).to_numpy()]
    table = pd.DataFrame({
        "name": np.concatenate([compute["name"].astype(str).to_numpy(object), comm["name"].astype(str).to_numpy(object)]),
        "start_ns": np.concatenate([compute["start_ns"].to_numpy(), comm["start_ns"].to_numpy()]),
        "end_ns": np.concatenate([compute["end_ns"].to_numpy(), comm["end_ns"].to_numpy()]),
        "comm": np.repeat([False, True], [len(compute), len(comm)]),
    }, columns=COLUMNS).astype({"start_ns": "int64", "end_ns": "int64", "comm": bool})
    passes = pd.DataFrame({"name": passes["name"].astype(str).to_numpy(object), "start_ns": passes["start_ns"].to_numpy(),
                           "end_ns": passes["end_ns"].to_numpy()})
    return table.sort_values("start_ns", kind="stable").reset_index(drop=True), passes


def _main_thread(tids: np.ndarray) -> int | None:
    """The thread that ran the step: the one with the most operators (the first met, of equals)."""
    if not len(tids):
        return None
    values, first, counts = np.unique(tids, return_index=True, return_counts=True)
    busiest = np.flatnonzero(counts == counts.max())
    return int(values[busiest[np.argmin(first[busiest])]])
