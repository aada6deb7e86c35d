"""Capture the small, real Kineto traces of the lm and decode families under tests/data/traces (GPU machine).

    PYTHONPATH=src python tests/data/capture_family_traces.py OUTDIR

Each is perflab's own profile pass (perflab.trace.capture.capture_case) of a tiny case, 2 steps:
  lm_train_step_explicit   a 2-layer GPT (d_model 256), explicit attention, bf16, eager, train_step: the passes
                           forward / backward / optimizer and the attn.scores / attn.softmax / attn.final_matmul ranges
  lm_train_step_compile    the same step with the model under torch.compile (passes marked outside the compiled model)
  decode_cudagraph         a 2-layer Llama (dim 256, GQA 4:2) decode step at context 256, bf16, in a CUDA graph
"""

from __future__ import annotations

import sys
from pathlib import Path

from perflab.spec import Case, validate_case
from perflab.trace.capture import capture_case

TINY_LM = dict(model="gpt_small", layers=2, model_args={"d_model": 256, "d_ff": 1024, "n_heads": 4}, seq_len=128, batch_size=4,
               device="cuda", dtype="bf16", warmup=2)
TINY_LLAMA = dict(model="llama3_8b", layers=2, model_args={"dim": 256, "ffn_dim": 512, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 1000},
                  device="cuda", dtype="bf16", warmup=2)


def main(outdir: str) -> None:
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    cases = {
        "lm_train_step_explicit": Case(**TINY_LM, workload="train_step", attn="explicit", mode="eager"),
        "lm_train_step_compile": Case(**TINY_LM, workload="train_step", attn="sdpa", mode="compile"),
        "decode_cudagraph": Case(**TINY_LLAMA, workload="decode", context_len=256, batch_size=2, mode="cudagraph"),
    }
    only = set(sys.argv[2:])
    for name, case in cases.items():
        if only and name not in only:
            continue
        path = out / f"{name}.json.gz"
        capture_case(validate_case(case), path, steps=2)
        print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/traces")
