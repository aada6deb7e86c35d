"""A CPU rank's Kineto trace (gloo, ``perflab profile|explain --parallel --device cpu``) as the per-rank accounting
reads a GPU rank's kernels: one row an activity, ``name``, integer-ns ``start_ns``/``end_ns``, and ``comm``.

On the CPU there are no kernels. A rank computes on its main thread, inside torch's operators (``cpu_op`` events of
the thread that runs the step), and gloo runs each collective on a thread of its own (a ``gloo:all_reduce``,
``gloo:broadcast``, ... range). So compute = the main thread's operators, communication = gloo's ranges; the
main thread waiting for a bucket (DDP's end of backward) is in no operator, and the communication it waits on is
exposed. The pass ranges (``forward``, ``backward``, ``optimizer``: perflab's lm step marks them in a profiled
pass) come back apart. Times are exact: the JSON's µs decimals are read as decimals, ns rounded half to even
(``trace.kineto.us_text_to_ns``, as the kernel reader converts them).

Never imports torch.
"""

from __future__ import annotations

import collections
import gzip
import json
from decimal import Decimal
from pathlib import Path

import pandas as pd

from perflab.trace.kineto import us_text_to_ns

PASS_NAMES = ("forward", "backward", "optimizer")
COLUMNS = ["name", "start_ns", "end_ns", "comm"]


def cpu_rank_activities(path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(activities: the main thread's operators and gloo's collectives, with ``comm``; the main thread's pass ranges)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        events = json.load(f, parse_float=Decimal)["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X" and "ts" in e and "dur" in e]
    ops = collections.Counter(e.get("tid") for e in spans if e.get("cat") == "cpu_op")
    main = max(ops, key=ops.get) if ops else None  # the thread that ran the step: most operators
    rows, passes = [], []
    for e in spans:
        name, start = str(e.get("name", "")), us_text_to_ns(e["ts"], path)
        end = start + us_text_to_ns(e["dur"], path)
        if e.get("cat") == "cpu_op" and e.get("tid") == main:
            rows.append((name, start, end, False))
        elif e.get("cat") == "user_annotation" and name.startswith("gloo:"):
            rows.append((name, start, end, True))
        elif e.get("cat") == "user_annotation" and name in PASS_NAMES and e.get("tid") == main:
            passes.append((name, start, end))
    table = pd.DataFrame(rows, columns=COLUMNS).astype({"start_ns": "int64", "end_ns": "int64", "comm": bool})
    return table.sort_values("start_ns", kind="stable").reset_index(drop=True), pd.DataFrame(passes, columns=["name", "start_ns", "end_ns"])
