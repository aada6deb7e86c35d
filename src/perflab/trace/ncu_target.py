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

    from perflab.models.registry import build_model
    from perflab.runtime.inputs import image_batch
    from perflab.runtime.modes import make_step
    from perflab.runtime.precision import precision

    torch.manual_seed(case.seed)
    model, _ = build_model(case)
    model = model.to(case.device)
    x = image_batch(case.batch_size, case.input_size, case.device, case.seed)
    with torch.no_grad(), precision(case.dtype, case.device):
        step = make_step(model, x, case.mode)
        for _ in range(case.warmup + 1):
            step()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push(NVTX_RANGE)
        for _ in range(args.steps):
            step()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()


if __name__ == "__main__":
    main()
