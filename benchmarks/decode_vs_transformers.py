"""perflab's Llama decode against transformers' LlamaForCausalLM of the same shape, static cache (GPU).

    PYTHONPATH=src python benchmarks/decode_vs_transformers.py [--model llama3_8b] [--batch-sizes 1 8]
        [--prompt-len 512] [--new-tokens 64] [--out FILE.json]

Both generate greedily from the same random prompt (``--prompt-len`` tokens, batch 1 and 8), bf16 weights and
cache, random weights. The figure compared is the time per output token (TPOT) after the first token, and
tokens/s = batch ÷ TPOT:

- perflab: the ``generate`` workload in perflab's harness (CUDA events after the prefill and after each decode
  step), in eager and in ``compile:reduce-overhead`` (gpt-fast's recipe). The ``decode`` workload's step at a
  fixed context is timed in the decode sweep (experiments/decode.yaml).
- transformers: ``model.generate(..., cache_implementation="static", max_new_tokens=N, min_new_tokens=N)``, with
  a streamer that records the host clock as each token arrives (generate synchronises on every token for its
  stopping criteria, so the gaps are the per-token times). Eager is ``disable_compile=True``; compiled is what
  transformers does by itself with a static cache (torch.compile of the forward, reduce-overhead, fullgraph).

The Llama config is built from perflab's named shape (dim, layers, heads, KV heads, ffn, vocabulary, RoPE theta),
so both models have the same parameters (8,030,261,248 for llama3_8b).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time

import torch

from perflab.api import bench
from perflab.measure.ceilings import get_ceilings
from perflab.models.llama import LlamaConfig, decode_bytes
from perflab.spec import Case, validate_case


class TokenClock:
    """A transformers streamer that keeps the host time of each put (the prompt first, then each new token)."""

    def __init__(self):
        self.times: list[float] = []

    def put(self, value):
        self.times.append(time.perf_counter())

    def end(self):
        pass


def hf_model(config: LlamaConfig):
    from transformers import LlamaConfig as HFConfig
    from transformers import LlamaForCausalLM

    hf = HFConfig(vocab_size=config.vocab_size, hidden_size=config.dim, intermediate_size=config.ffn_dim,
                  num_hidden_layers=config.n_layers, num_attention_heads=config.n_heads, num_key_value_heads=config.n_kv_heads,
                  max_position_embeddings=config.max_seq_len, rms_norm_eps=config.norm_eps, rope_theta=config.rope_theta,
                  tie_word_embeddings=config.tie_embeddings, attention_bias=False, mlp_bias=False)
    hf._attn_implementation = "sdpa"
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = LlamaForCausalLM(hf)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def hf_generate(model, batch: int, prompt_len: int, new_tokens: int, compiled: bool, repeats: int = 3) -> dict:
    torch.manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (batch, prompt_len), device="cuda")
    mask = torch.ones_like(ids)
    kwargs = dict(attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                  cache_implementation="static", pad_token_id=0)
    if not compiled:
        kwargs["disable_compile"] = True
    t0 = time.perf_counter()
    with torch.inference_mode():
        for _ in range(2):  # warm-up: the compiled forward is built during these
            model.generate(ids, **kwargs)
        warm_s = time.perf_counter() - t0
        tpots, ttfts = [], []
        for _ in range(repeats):
            clock = TokenClock()
            torch.cuda.synchronize()
            start = time.perf_counter()
            out = model.generate(ids, streamer=clock, **kwargs)
            torch.cuda.synchronize()
            assert out.shape[1] == prompt_len + new_tokens, out.shape
            gaps = [(b - a) * 1000 for a, b in zip(clock.times[1:], clock.times[2:])]
            tpots.append(statistics.fmean(gaps))
            ttfts.append((clock.times[1] - start) * 1000)
    tpot = statistics.median(tpots)
    return {"tpot_ms": tpot, "ttft_ms": statistics.median(ttfts), "tokens_per_s": batch / tpot * 1000, "warmup_s": warm_s,
            "auto_compiled": hasattr(model, "_compiled_call")}


def perflab_rows(model: str, batch: int, prompt_len: int, new_tokens: int, mode: str) -> dict:
    case = Case(model, workload="generate", prompt_len=prompt_len, new_tokens=new_tokens, device="cuda", dtype="bf16",
                batch_size=batch, mode=mode, warmup=3, min_time=1.0, repeats=5)
    (row,) = bench([validate_case(case)])
    if row["status"] != "ok":
        return {"error": f"{row['status']}: {row.get('message')}"}
    return {"tpot_ms": row["tpot_ms"], "tpot_p90_ms": row["tpot_p90_ms"], "ttft_ms": row["ttft_ms"],
            "tokens_per_s": batch / row["tpot_ms"] * 1000, "generate_ms": row["median_ms"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama3_8b")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--impls", nargs="+", default=["perflab", "transformers"])
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    config = LlamaConfig.from_name(args.model)
    copy_gbps = get_ceilings()["copy_gbps"]
    results = []

    def record(row):
        if "tpot_ms" in row:
            context = args.prompt_len + args.new_tokens // 2
            moved = decode_bytes(config, row["batch"], context, 2)["total"]
            row["mbu_at_tpot"] = moved / (row["tpot_ms"] / 1000) / 1e9 / copy_gbps
        results.append(row)
        print(json.dumps(row), flush=True)

    if "perflab" in args.impls:
        for mode in ("eager", "compile:reduce-overhead"):
            for batch in args.batch_sizes:
                record({"impl": "perflab", "mode": mode, "batch": batch, **perflab_rows(args.model, batch, args.prompt_len, args.new_tokens, mode)})
                torch.cuda.empty_cache()
    if "transformers" in args.impls:
        import transformers

        model = hf_model(config)
        print(f"transformers {transformers.__version__}: {sum(p.numel() for p in model.parameters()):,} parameters", flush=True)
        for compiled in (False, True):
            for batch in args.batch_sizes:
                row = {"impl": "transformers", "mode": "compiled (static cache)" if compiled else "eager (static cache)", "batch": batch}
                try:
                    row.update(hf_generate(model, batch, args.prompt_len, args.new_tokens, compiled))
                except Exception as exc:  # one failed setting is reported, the rest still run
                    row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                record(row)
        del model
        gc.collect()
        torch.cuda.empty_cache()

    print(f"\n{args.model} generate, prompt {args.prompt_len}, {args.new_tokens} new tokens, bf16, random weights "
          f"({torch.cuda.get_device_name()}; MBU at the mean context {args.prompt_len + args.new_tokens // 2} against copy {copy_gbps:.0f} GB/s):")
    print("| implementation | mode | batch | TPOT ms | tokens/s | MBU | TTFT ms |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        if "error" in r:
            print(f"| {r['impl']} | {r['mode']} | {r['batch']} | {r['error']} | | | |")
        else:
            print(f"| {r['impl']} | {r['mode']} | {r['batch']} | {r['tpot_ms']:.2f} | {r['tokens_per_s']:.1f} | {r['mbu_at_tpot']:.1%} | {r['ttft_ms']:.1f} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
