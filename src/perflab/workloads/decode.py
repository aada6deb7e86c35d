"""The decode family at the workloads floor, what its step runs; ``report/decode.py`` makes its rows' tables.

The decode family: a Llama (models/llama.py) with a static KV cache, seed 004's testbench.

Workloads (one timed step each):

- ``decode``: one new token per sequence at cache position ``context_len`` (the cache holds the context_len + 1
  positions rounded up to a multiple of 8, as gpt-fast's does: an odd length sends cuBLAS to slow kernels; the
  padding is masked);
- ``prefill``: a prompt of ``prompt_len`` tokens into an empty cache;
- ``generate``: a prefill, then decode steps until ``new_tokens`` tokens are out (the first comes from the
  prefill, as ``max_new_tokens`` counts in transformers' generate), greedy.

Weights and cache are stored in the case's dtype (bf16 weights are what a server reads every step), so the
precision context does not autocast. The cache is allocated once for the case, so compiled and graph modes
see fixed shapes; ``compile:reduce-overhead`` is gpt-fast's recipe. Tokens and cache contents are random.
"""

from __future__ import annotations

import contextlib
import statistics

import torch
from torch.profiler import record_function

from perflab.errors import PerflabError
from perflab.stats import percentile
from perflab.workloads.base import Built, Implementation, config_overrides

DEFAULT_BATCH_FACTORS = (2, 4, 8, 16)  # explain's batch fix: these multiples of the case's batch
WEIGHT_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "tf32": torch.float32}
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "tf32": 4}


def llama_config(case):
    from perflab.models.llama import LlamaConfig

    return LlamaConfig.from_name(case.model, **config_overrides(case, LlamaConfig, fixed="rope_scaling"))


def positions_needed(case) -> int:
    """Cache positions the case needs: context_len + 1 (decode), the prompt (prefill), prompt + new tokens (generate)."""
    if case.workload == "decode":
        return case.context_len + 1
    if case.workload == "prefill":
        return case.prompt_len
    return case.prompt_len + case.new_tokens


def max_positions(case) -> int | None:
    """The longest cache the case's model allows: perflab's Llama's max_seq_len, an hf: config's positions (a
    --model-arg overriding them), else None (a module perflab cannot read it from: its own setup_caches decides)."""
    return reference_max_positions(case) if case.is_reference else llama_config(case).max_seq_len


def cache_len(case) -> int:
    """The cache's length: the positions the case needs rounded up to a multiple of 8, no longer than its model
    allows (``models.llama.padded_cache_len``)."""
    from perflab.models.llama import padded_cache_len

    return padded_cache_len(positions_needed(case), max_positions(case))


class Decode(Implementation):
    family = "decode"

    def validate(self, case):
        if case.is_reference:
            if case.layers is not None or case.layers_only:
                raise PerflabError(f"--layers/--layers-only shape perflab's own Llama; for {case.model} pass its own arguments with --model-arg")
        else:
            llama_config(case)  # a config override perflab's Llama does not have fails here, in one line
        if case.layers is not None and case.layers < 1:
            raise PerflabError(f"--layers must be at least 1, got {case.layers}")
        if case.workload == "decode":
            if case.context_len < 0:
                raise PerflabError(f"--context-len must be 0 or more, got {case.context_len}")
            if case.prompt_len is not None or case.new_tokens is not None:
                raise PerflabError("the decode workload times one token at --context-len; --prompt-len and --new-tokens are for prefill and generate")
        else:
            if case.prompt_len is None or case.prompt_len < 1:
                raise PerflabError(f"--prompt-len must be at least 1, got {case.prompt_len}")
            if case.context_len is not None:
                raise PerflabError(f"--context-len is the position of a decode step; the {case.workload} workload starts from --prompt-len")
            if case.workload == "prefill" and case.new_tokens is not None:
                raise PerflabError("--new-tokens is for the generate workload; prefill processes the prompt only")
            if case.workload == "generate" and (case.new_tokens is None or case.new_tokens < 1):
                raise PerflabError(f"--new-tokens must be at least 1, got {case.new_tokens}")
        if case.layers_only and case.workload == "generate":
            raise PerflabError("--layers-only runs hidden states through the layers, with no head to pick tokens; generate needs the head")
        needed = positions_needed(case)
        limit, name = max_positions(case), ("max_position_embeddings" if case.is_reference else "max_seq_len")
        if limit is not None and needed > limit:
            what = {"decode": f"context {case.context_len} + 1 new token", "prefill": f"prompt {case.prompt_len}",
                    "generate": f"prompt {case.prompt_len} + {case.new_tokens} new tokens"}[case.workload]
            raise PerflabError(f"{what} = {needed} positions is longer than {case.model}'s {name} of {limit}")
        if case.attn != "sdpa":
            raise PerflabError("the decode family's attention is SDPA over the static cache; --attn explicit is for gpt_* models")
        return case

    def build(self, case) -> Built:
        from perflab.models.lm import init_weights
        from perflab.models.llama import Llama

        dtype = WEIGHT_DTYPES[case.dtype]
        if case.is_reference:
            return self.build_steps(case, *reference_decoder(case, dtype))
        config = llama_config(case)
        # Built on the meta device in the weights' dtype, then allocated and initialised where it runs: an
        # 8B model never exists in fp32 (32 GB) and its init takes seconds on a GPU, not minutes on the CPU.
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            with torch.device("meta"):
                model = Llama(config, layers_only=case.layers_only)
        finally:
            torch.set_default_dtype(previous)
        model = model.to_empty(device=case.device)
        model.apply(init_weights)
        model.eval()
        for p in model.parameters():
            p.requires_grad_(False)
        batch, length = case.batch_size, cache_len(case)
        model.setup_caches(batch, length, dtype, device=case.device)
        fill_caches(model, case.seed)

        def tokens(n, generator):
            if case.layers_only:
                return (torch.randn(batch, n, config.dim, generator=generator) * 0.5).to(device=case.device, dtype=dtype)
            return torch.randint(0, config.vocab_size, (batch, n), generator=generator).to(case.device)

        return self.build_steps(case, model, tokens, {"config": config})

    def build_steps(self, case, model, tokens, extra: dict) -> Built:
        """The step of the case's workload over ``model(x, input_pos) → logits`` with its caches set up;
        ``tokens(n, generator)`` makes a (batch, n) input."""
        batch, length = case.batch_size, cache_len(case)
        generator = torch.Generator().manual_seed(case.seed + 1)
        tokens = (lambda n, tokens=tokens: tokens(n, generator))
        extra = dict(extra, cache_len=length, token_clock=None, token_stamps=None)
        if case.workload == "decode":
            x, pos = tokens(1), torch.tensor([case.context_len], device=case.device)
            make_step = lambda m: (lambda: m(x, pos))
            items = batch
        elif case.workload == "prefill":
            x, pos = tokens(case.prompt_len), torch.arange(case.prompt_len, device=case.device)
            make_step = lambda m: (lambda: m(x, pos))
            items = batch * case.prompt_len
        else:
            prompt = tokens(case.prompt_len)
            prefill_pos = torch.arange(case.prompt_len, device=case.device)
            decode_pos = [torch.tensor([case.prompt_len + i], device=case.device) for i in range(case.new_tokens - 1)]

            def make_step(m):
                def generate():
                    stamps = extra["token_stamps"]  # a list while after_timing times the tokens
                    with phase("prefill"):
                        logits = m(prompt, prefill_pos)
                        token = logits[:, -1:].argmax(dim=-1)
                    out = [token]
                    if stamps is not None:
                        stamps.append(extra["token_clock"].stamp())
                    for pos in decode_pos:
                        with phase("decode"):
                            logits = m(token, pos)
                            token = logits[:, -1:].argmax(dim=-1)
                        out.append(token)
                        if stamps is not None:
                            stamps.append(extra["token_clock"].stamp())
                    return torch.cat(out, dim=1)

                return generate

            items = batch * case.new_tokens
        built = Built(model=model, make_step=make_step, needs_grad=False, items_per_step=items, autocast=False, extra=extra)

        def phase(name):
            """Profile passes mark generate's prefill and each decode step (explain's per-pass floors)."""
            return record_function(name) if built.annotate else contextlib.nullcontext()

        return built

    def default_fixes(self, case) -> list[str]:
        """decode and generate: larger batches (these multiples of the case's), for throughput against latency."""
        return [f"batch:{case.batch_size * k}" for k in DEFAULT_BATCH_FACTORS] if case.workload in ("decode", "generate") else []

    def after_timing(self, case, built: Built, step, row: dict) -> dict:
        """generate: time to first token, and the mean and p90 time per output token, from one more generation
        with ``perflab.clock.StepClock`` stamps after the prefill and after each decode step (CUDA events on a GPU
        case, the host clock on a CPU one, whatever else has started CUDA in the process). A CUDA graph
        replays the whole generation at once, so it has no per-token times.

        For a user's decoder, the decode step's bytes come from the built model by the rule of
        :func:`decoder_step_bytes`, for MBU."""
        if case.workload == "decode" and built.extra.get("reference"):
            return decoder_step_bytes(built.model, case.batch_size, positions=positions_needed(case), cache_positions=cache_len(case))
        if case.workload != "generate":
            return {}
        if case.mode == "cudagraph":
            return {"ttft_ms": None, "tpot_ms": None, "tpot_p90_ms": None}
        from perflab.clock import StepClock

        clock = StepClock(cuda=case.device == "cuda")
        built.extra["token_clock"], built.extra["token_stamps"] = clock, [clock.stamp()]
        try:
            step()
        finally:
            stamps, built.extra["token_stamps"] = built.extra["token_stamps"], None
        times, _ = clock.read_marks(stamps)
        per_token = times[1:]
        return {
            "ttft_ms": times[0],
            "tpot_ms": statistics.fmean(per_token) if per_token else None,
            "tpot_p90_ms": percentile(per_token, 90) if per_token else None,
        }

    def analytic(self, case) -> dict:
        from perflab.models.llama import decode_bytes, decode_flops, param_count

        if case.is_reference:
            return {"cache_len": cache_len(case)}
        config = llama_config(case)
        counts = param_count(config, layers_only=case.layers_only)
        out = {"params_total": counts["total"], "params_non_embedding": counts["non_embedding"], "cache_len": cache_len(case),
               "model_config": {k: getattr(config, k) for k in ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size", "max_seq_len")}}
        dtype_bytes = DTYPE_BYTES[case.dtype]
        if case.workload == "decode":
            moved = decode_bytes(config, case.batch_size, case.context_len, dtype_bytes, layers_only=case.layers_only)
            out.update(bytes_per_step=moved["total"], bytes_weights=moved["weights"], bytes_kv_read=moved["kv_read"],
                       bytes_kv_write=moved["kv_write"],
                       flops_analytic=decode_flops(config, case.batch_size, case.context_len, layers_only=case.layers_only))
            out["arithmetic_intensity"] = out["flops_analytic"] / out["bytes_per_step"]  # FLOP per byte moved
        elif case.workload == "prefill":
            # Weights read once; the prompt's K and V written once and read once by the attention.
            moved = decode_bytes(config, case.batch_size, 0, dtype_bytes, layers_only=case.layers_only)
            kv_token = moved["kv_write"]
            out.update(bytes_per_step=moved["weights"] + 2 * case.prompt_len * kv_token, bytes_weights=moved["weights"])
        return out

    def pass_costs(self, case, row: dict) -> dict | None:
        """generate: the prefill (forward FLOPs over the static cache; weights once, the prompt's K and V written
        and read once) and the decode steps together (each: FLOPs over the static cache, as they run; least bytes
        as the decode workload counts them at that step's position)."""
        from perflab.models.llama import decode_bytes, forward_flops

        if case.workload != "generate":
            return None
        config, batch, lo = llama_config(case), case.batch_size, case.layers_only
        dtype_bytes, cache = DTYPE_BYTES[case.dtype], cache_len(case)
        first = decode_bytes(config, batch, 0, dtype_bytes, layers_only=lo)
        prefill = {"flops": forward_flops(config, batch, case.prompt_len, cache, lo),
                   "bytes": first["weights"] + 2 * case.prompt_len * first["kv_write"]}
        positions = range(case.prompt_len, case.prompt_len + case.new_tokens - 1)
        decode = {"flops": len(positions) * forward_flops(config, batch, 1, cache, lo),
                  "bytes": sum(decode_bytes(config, batch, p, dtype_bytes, layers_only=lo)["total"] for p in positions)}
        return {"prefill": prefill, "decode": decode}

    def min_bytes(self, case, row: dict) -> float:
        return float(row.get("bytes_per_step") or self.analytic(case).get("bytes_per_step") or
                     int(row.get("params") or 0) * DTYPE_BYTES[case.dtype])


def reference_max_positions(case) -> int | None:
    """The positions an hf: decoder's config allows (``max_position_embeddings``, a --model-arg overriding it), else
    None (a module perflab cannot read it from: its own setup_caches decides)."""
    from perflab.references import hf_config_json, parse_reference

    ref = parse_reference(case.model)
    if ref.kind != "hf":
        return None
    value = dict(case.model_args).get("max_position_embeddings", (hf_config_json(ref) or {}).get("max_position_embeddings"))
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _positions_dim(t: torch.Tensor, cache_positions: int | None) -> int | None:
    """Which dimension of a cache tensor holds its positions: the one as long as the cache allocated
    (``cache_positions``; dimension 2 where several are), else dimension 2 of a 4-D tensor (gpt-fast's and perflab's
    (batch, heads, positions, head_dim)); None where neither tells."""
    dims = [d for d in range(t.dim()) if cache_positions and t.shape[d] == cache_positions]
    if len(dims) > 1 and 2 in dims:
        return 2
    if dims:
        return dims[0]
    return 2 if t.dim() == 4 and t.shape[2] else None


def decoder_step_bytes(model: torch.nn.Module, batch: int, positions: int | None = None, cache_positions: int | None = None) -> dict:
    """The bytes one decode step of a user's decoder must move, by perflab's Llama rule (``models.llama.decode_bytes``):

    - every weight the step reads in full, once (a tensor shared by two modules, as a tied head and embedding, once);
    - of an embedding table (``nn.Embedding``), only the rows the step gathers: one per sequence; a table tied to
      the head is read in full by the head, and its gathered rows are counted besides, as for perflab's Llama;
    - the KV cache: the ``positions`` the step attends over read (context_len + 1; all of the cache where not
      given), not the masked padding beyond them (perflab rounds a cache up to a multiple of 8 positions, as
      gpt-fast rounds its own), and the new token's K and V written (one position of it). A cache tensor's
      positions are its dimension as long as the ``cache_positions`` allocated (any layout: (batch, positions,
      heads, head_dim), or layers stacked in a fifth dimension), else dimension 2 of a 4-D tensor; a tensor where
      neither tells is counted whole, with no write.

    Buffers that are not the cache (RoPE tables, causal masks) are not counted: a step reads a row of them."""
    owners: dict[int, list[torch.nn.Module]] = {}
    tensors: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for param in module.parameters(recurse=False):
            owners.setdefault(id(param), []).append(module)
            tensors[id(param)] = param
    weights = 0
    for key, param in tensors.items():
        size = param.numel() * param.element_size()
        embedding = [m for m in owners[key] if isinstance(m, torch.nn.Embedding)]
        if not embedding:
            weights += size
            continue
        rows = batch * param.shape[-1] * param.element_size()  # one row per sequence
        weights += rows + (size if len(embedding) < len(owners[key]) else 0)  # tied to a head: read in full there too
    caches = model.cache_tensors() if hasattr(model, "cache_tensors") else [
        b for n, b in model.named_buffers() if n.endswith(("k_cache", "v_cache"))]
    # One position of each cache tensor, from the tensors' own lengths (padded or not).
    dims = [(t, _positions_dim(t, cache_positions)) for t in caches]
    per_position = [(t.numel() * t.element_size() // t.shape[d], t.shape[d]) for t, d in dims if d is not None]
    write = sum(size for size, _ in per_position)
    cache = sum(t.numel() * t.element_size() for t, d in dims if d is None)
    cache += sum(size * (length if positions is None else min(positions, length)) for size, length in per_position)
    return {"bytes_per_step": weights + cache + write, "bytes_weights": weights, "bytes_kv_read": cache, "bytes_kv_write": write}


def fill_caches(model, seed: int) -> None:
    """A filled context: random K and V in every ``*k_cache``/``*v_cache`` buffer (the values do not change the
    work, but zeros are not realistic), drawn in place on the buffer's device by a generator seeded there. (They were
    drawn on the CPU in fp32 and copied: llama3_8b's build at batch 64 and context 4096, a cache of 17 G values, took
    113–133 s on an H100 host against 2 s at batch 1; ``benchmarks/kv_fill.py`` times the two ways.)"""
    generators: dict = {}
    for name, buffer in model.named_buffers():
        if name.endswith(("k_cache", "v_cache")):
            if buffer.device not in generators:
                generators[buffer.device] = torch.Generator(device=buffer.device).manual_seed(seed)
            buffer.normal_(0.0, 0.5, generator=generators[buffer.device])


class HFStaticDecoder(torch.nn.Module):
    """A transformers causal LM with its own static KV cache, as ``forward(idx, input_pos) → logits`` (gpt-fast's
    convention). The cache (transformers' StaticCache) is sized to the case, so every step attends over all of it,
    as perflab's Llama does."""

    def __init__(self, model, max_batch_size: int, max_seq_length: int, dtype, device):
        super().__init__()
        from transformers import StaticCache

        self.model = model
        try:  # transformers ≥ 5: sized lazily by the first update
            self.cache = StaticCache(config=model.config, max_cache_len=max_seq_length)
        except TypeError:  # transformers 4.x
            self.cache = StaticCache(config=model.config, max_batch_size=max_batch_size, max_cache_len=max_seq_length, device=device, dtype=dtype)

    def forward(self, idx, input_pos):
        self._write_at(input_pos)
        out = self.model(input_ids=idx, past_key_values=self.cache, cache_position=input_pos, use_cache=True)
        return out.logits

    def _write_at(self, input_pos):
        """Make the cache write this step's K and V at ``input_pos``. transformers 5's static layers ignore the
        cache_position they are given and write at a running count of the tokens they have seen
        (``cumulative_length``), which a benchmark that repeats one step pushes past the cache's end: an
        ``index_copy_`` out of bounds (a device-side assert on CUDA, IndexError on the CPU) after as many steps as
        the cache has positions. Setting the count to the step's position first writes where the step says, in
        every mode (an in-place copy on the device: no synchronisation, captured by a CUDA graph)."""
        for layer in getattr(self.cache, "layers", ()) or ():
            count = getattr(layer, "cumulative_length", None)
            if not torch.is_tensor(count):
                continue
            if count.device == input_pos.device:
                count.copy_(input_pos[0])
            else:  # not initialised yet (the first call allocates it on the device): set it on the host once
                count.fill_(int(input_pos[0]))

    def cache_tensors(self) -> list:
        """The static cache's key and value tensors, (batch, kv heads, positions, head_dim) each."""
        tensors = []
        for layer in getattr(self.cache, "layers", ()) or ():
            tensors += [getattr(layer, "keys", None), getattr(layer, "values", None)]
        tensors += list(getattr(self.cache, "key_cache", ()) or ()) + list(getattr(self.cache, "value_cache", ()) or ())
        return [t for t in tensors if torch.is_tensor(t)]


def reference_decoder(case, dtype):
    """A user's decoder for the decode workloads: an hf: causal LM behind transformers' static cache, or a module
    that follows gpt-fast's convention (``setup_caches(max_batch_size, max_seq_length)``, ``forward(idx, input_pos)``).
    Returns (model, tokens(n, generator), extra)."""
    import inspect

    from perflab.models.reference import build_on_device, vocab_size_of
    from perflab.references import parse_reference

    batch, length = case.batch_size, cache_len(case)
    model = build_on_device(case.model, dict(case.model_args), case.device, dtype=dtype).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    vocab = vocab_size_of(model, case.model)
    if parse_reference(case.model).kind == "hf":
        model = HFStaticDecoder(model, batch, length, dtype, case.device)
    elif callable(getattr(model, "setup_caches", None)):
        with torch.device(case.device):
            model.setup_caches(batch, length)
        fill_caches(model, case.seed)
    else:
        try:
            found = f"forward{inspect.signature(model.forward)}"
        except (TypeError, ValueError):
            found = "no forward signature"
        raise PerflabError(f"{case.model}: the decode family runs gpt-fast's convention, setup_caches(max_batch_size, max_seq_length) and "
                           f"forward(idx, input_pos), or an hf: causal LM; it has no setup_caches method ({found})")

    def tokens(n, generator):
        return torch.randint(0, vocab, (batch, n), generator=generator).to(case.device)

    return model, tokens, {"config": None, "vocab_size": vocab, "reference": True}
