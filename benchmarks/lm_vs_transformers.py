"""perflab's GPT against transformers' LlamaForCausalLM of the same shape, in the same workload and harness (GPU).

    PYTHONPATH=src python benchmarks/lm_vs_transformers.py [--model gpt_large] [--seq-len 512] [--batch-size 4] [--out FILE.json]

Both models run in perflab's lm workload (the same random token batch, bf16 autocast per training step, fused
AdamW, the same timing loop: CUDA events, warm-up, median of block means), so the only difference is the
module. The Llama is built from a LlamaConfig with perflab's dimensions (hidden, intermediate, layers, heads,
vocabulary 10,000, untied head, SDPA attention, no KV cache), with random weights. MFU is of each model's counted FLOPs
(torch's counter on one real step, as the harness counts them: one FLOP count per row); the formula's count (the same
for both: their matmuls are the GPT's) stands beside it, with the ratio counted ÷ formula (a train step counts ½ × the
forward's attention more: the fused attention's backward recomputes the scores). Modes: eager, compile and
compile:max-autotune. A case's
``--optimizer`` applies to both models; ``checkpoint_activations`` turns on transformers' gradient checkpointing
(per decoder layer, non-reentrant), as perflab's checkpoints each block (benchmarks/explain_training.py uses this).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from perflab.measure.ceilings import get_ceilings
from perflab.measure.flops import count_flops
from perflab.stats import summarize
from perflab.measure.timing import estimate_step_s, plan_timing, time_step
from perflab.runtime.modes import make_step
from perflab.runtime.workload import step_context
from perflab.spec import Case, validate_case
from perflab.workloads.lm import LM, lm_config


class HFLogits(torch.nn.Module):
    """transformers' causal LM as token ids → logits (no cache)."""

    def __init__(self, config):
        super().__init__()
        from transformers import LlamaConfig, LlamaForCausalLM

        hf = LlamaConfig(vocab_size=config.vocab_size, hidden_size=config.d_model, intermediate_size=config.d_ff,
                         num_hidden_layers=config.n_layers, num_attention_heads=config.n_heads, num_key_value_heads=config.n_heads,
                         max_position_embeddings=config.context_length, rms_norm_eps=config.norm_eps, rope_theta=config.rope_theta,
                         tie_word_embeddings=False, attention_bias=False, mlp_bias=False)
        hf._attn_implementation = "sdpa"
        self.inner = LlamaForCausalLM(hf)

    def forward(self, idx):
        return self.inner(input_ids=idx, use_cache=False).logits


def measure(case: Case, impl: str) -> dict:
    lm = LM()
    torch.manual_seed(case.seed)
    model = None
    if impl == "transformers":
        with torch.device("cuda"):
            model = HFLogits(lm_config(case))
        if case.checkpoint_activations:  # the same fix as perflab's --checkpoint-activations: per decoder layer, non-reentrant
            model.inner.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    built = lm.build(case, model=model)  # the case's --optimizer applies to either model
    params = sum(p.numel() for p in built.model.parameters())
    formula = lm.analytic(case)["flops_analytic"]
    with step_context(case, built):
        flops = count_flops(built.make_step(built.model))  # one eager step, before timing (as the harness counts)
    t0 = time.perf_counter()
    with step_context(case, built):
        step = make_step(built, case.mode)
        for _ in range(case.warmup + 1):
            step()
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - t0
        plan = plan_timing(estimate_step_s(step, "cuda"), case.repeats, case.min_time, 10, None)
        timing = time_step(step, plan, "cuda")
    s = summarize(timing.samples_ms)
    peak = get_ceilings()["matmul_tflops"][case.dtype]
    achieved = flops / (s.median / 1000) / 1e12
    del built, step, model
    torch.cuda.empty_cache()
    return {"impl": impl, "workload": case.workload, "mode": case.mode, "median_ms": s.median, "ci95_ms": [s.within_low, s.within_high],
            "params": params, "tflops": achieved, "mfu": achieved / peak, "peak_tflops": peak, "warmup_compile_s": compile_s,
            "flops_counted": flops, "flops_analytic": formula, "flops_counted_over_analytic": flops / formula,
            "mfu_analytic": formula / (s.median / 1000) / 1e12 / peak}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt_large")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--modes", nargs="+", default=["eager", "compile", "compile:max-autotune"])
    parser.add_argument("--workloads", nargs="+", default=["forward", "train_step"])
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    results = []
    for workload in args.workloads:
        for mode in args.modes:
            for impl in ("perflab", "transformers"):
                case = validate_case(Case(args.model, workload=workload, seq_len=args.seq_len, batch_size=args.batch_size, dtype="bf16",
                                          mode=mode, device="cuda", warmup=5, min_time=1.0, repeats=10))
                try:
                    row = measure(case, impl)
                except Exception as exc:  # one failed setting is reported, the rest still run
                    row = {"impl": impl, "workload": workload, "mode": mode, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
                    torch.cuda.empty_cache()
                results.append(row)
                print(json.dumps(row), flush=True)
    print(f"\n{args.model}, seq {args.seq_len}, batch {args.batch_size}, bf16 ({torch.cuda.get_device_name()}). MFU of each model's counted "
          "FLOPs and of the measured peak; the formula's MFU beside it, with counted ÷ formula:")
    print("| workload | mode | perflab ms | transformers ms | transformers ÷ perflab | perflab MFU | transformers MFU | "
          "perflab MFU (formula) | transformers MFU (formula) | counted ÷ formula (perflab / transformers) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for workload in args.workloads:
        for mode in args.modes:
            a = next(r for r in results if r["impl"] == "perflab" and r["workload"] == workload and r["mode"] == mode)
            b = next(r for r in results if r["impl"] == "transformers" and r["workload"] == workload and r["mode"] == mode)
            if "error" in a or "error" in b:
                print(f"| {workload} | {mode} | {a.get('error') or round(a['median_ms'], 2)} | {b.get('error') or round(b['median_ms'], 2)} |"
                      + " – |" * 6)
                continue
            print(f"| {workload} | {mode} | {a['median_ms']:.2f} | {b['median_ms']:.2f} | {b['median_ms'] / a['median_ms']:.3f} | "
                  f"{a['mfu']:.1%} | {b['mfu']:.1%} | {a['mfu_analytic']:.1%} | {b['mfu_analytic']:.1%} | "
                  f"{a['flops_counted_over_analytic']:.4f} / {b['flops_counted_over_analytic']:.4f} |")
    for workload in args.workloads:
        best = {impl: min((r for r in results if r["impl"] == impl and r["workload"] == workload and "error" not in r),
                          key=lambda r: r["median_ms"], default=None) for impl in ("perflab", "transformers")}
        if best["perflab"] and best["transformers"]:
            print(f"best mode, {workload}: perflab {best['perflab']['mode']} {best['perflab']['median_ms']:.2f} ms, transformers "
                  f"{best['transformers']['mode']} {best['transformers']['median_ms']:.2f} ms, ratio {best['transformers']['median_ms'] / best['perflab']['median_ms']:.3f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
