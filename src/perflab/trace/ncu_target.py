"""The program ncu runs: a case warmed up outside any range, then ``--steps`` steps inside the NVTX range
``perflab_ncu`` (so ncu profiles only those). Used by perflab.trace.ncu; not for direct use."""

from __future__ import annotations

import argparse
import json

import torch

from perflab.spec import Case, validate_case
from perflab.trace.ncu import NVTX_RANGE


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("case_json")
    parser.add_argument("--steps", type=int, default=1)
    args = parser.parse_args()
    case = validate_case(Case.from_dict(json.loads(args.case_json)))

    from perflab.runtime.workload import warm_workload

    with warm_workload(case) as work:
        torch.cuda.nvtx.range_push(NVTX_RANGE)
        for _ in range(args.steps):
            work.step()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()


if __name__ == "__main__":
    main()
