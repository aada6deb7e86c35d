"""The lm family at the workloads floor, what its step runs; ``models/lm.py`` is its model, ``report/lm.py`` its tables.

The lm family: a batch of random token ids through a GPT (models/lm.py), seed 003's study.

Workloads (one timed step each):

- ``forward``: inference, under no_grad;
- ``train_forward``: the forward with autograd recording (what a training step's forward costs);
- ``forward_backward``: forward, cross-entropy loss against random targets, backward (gradients accumulate);
- ``train_step``: forward, backward, AdamW step, zero_grad.

Mixed precision (bf16/fp16) enters autocast once per step around forward and loss, as a training loop does:
a cast cache held across optimizer steps would feed later steps stale weights. (Inference enters it once
around the whole loop, so its weight casts are made once, as a serving loop would.)
In an eager profile pass the step marks its passes ``forward``, ``backward`` and ``optimizer``, and explicit
attention marks ``attn.scores``, ``attn.softmax`` and ``attn.final_matmul``.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch.profiler import record_function

from perflab.errors import PerflabError
from perflab.workloads.base import AUTOCAST_DTYPES, Built, Implementation, config_overrides

TRAINING = ("train_forward", "forward_backward", "train_step")


def lm_config(case):
    from perflab.models.lm import LMConfig

    # attn is the case's own field (--attn), not a dimension to override
    return LMConfig.from_name(case.model, attn=case.attn, checkpoint_activations=case.checkpoint_activations,
                              **config_overrides(case, LMConfig, fixed=("attn", "checkpoint_activations")))


class LM(Implementation):
    family = "lm"
    modes_invalid = {"train_forward": {"cudagraph": "a replayed graph records no autograd graph, so it is not a forward with autograd; "
                                                    "use compile modes or eager"}}

    def validate(self, case):
        self.check_variants(case)
        if case.is_reference:
            return self.validate_reference(case)
        config = lm_config(case)
        if case.seq_len < 1:
            raise PerflabError(f"sequence length must be at least 1, got {case.seq_len}")
        if case.seq_len > config.context_length:
            raise PerflabError(f"sequence length {case.seq_len} is longer than {case.model}'s context of {config.context_length} tokens; "
                               f"use --seq-len {config.context_length} or less, or --model-arg context_length={case.seq_len}")
        if case.layers is not None and case.layers < 1:
            raise PerflabError(f"--layers must be at least 1, got {case.layers}")
        self.check_mode(case)
        return replace(case, model_args=tuple(sorted(case.model_args)))

    def check_variants(self, case) -> None:
        """--optimizer (train_step) and --checkpoint-activations (workloads with a backward; perflab's GPT only)."""
        from perflab.workloads import OPTIMIZERS

        if case.optimizer is not None:
            if case.optimizer not in OPTIMIZERS:
                raise PerflabError(f"unknown optimizer {case.optimizer!r}; choose one of {', '.join(OPTIMIZERS)}")
            if case.workload != "train_step":
                raise PerflabError(f"--optimizer applies to the train_step workload of language models, not {case.model} {case.workload}")
        if case.checkpoint_activations:
            if case.workload not in ("forward_backward", "train_step"):
                raise PerflabError(f"--checkpoint-activations applies to the forward_backward and train_step workloads of language models, "
                                   f"not {case.model} {case.workload}")
            if case.is_reference:
                raise PerflabError(f"--checkpoint-activations wraps the blocks of perflab's GPT; {case.model} is your own model: "
                                   "apply torch.utils.checkpoint in its code and compare the two with perflab compare")

    def validate_reference(self, case):
        """A user's model: the shape is the case's; the dimensions are the model's own (--model-arg)."""
        if case.seq_len < 1:
            raise PerflabError(f"sequence length must be at least 1, got {case.seq_len}")
        if case.layers is not None:
            raise PerflabError(f"--layers sets the depth of perflab's own models; for {case.model} pass its own argument with --model-arg")
        if case.attn != "sdpa":
            raise PerflabError(f"--attn chooses the attention of perflab's own GPT; {case.model} runs its own attention")
        self.check_mode(case)
        return case

    def trains(self, case) -> bool:
        return case.workload in TRAINING

    def build(self, case, model=None, shard=None) -> Built:
        """``model``: another module with the same contract (token ids [B, T] → logits [B, T, vocab]) to run in
        this workload instead of perflab's GPT, e.g. to compare with transformers' Llama of the same shape.
        A case that names a reference (a file, a module path, hf:) builds the user's model. ``shard``: called on
        the model on its device before the optimizer is made (FSDP replaces the parameters with shards).

        The step factory's ``micro=True`` gives the step without the optimizer (a gradient-accumulation micro-batch)."""
        from perflab.models.lm import GPT
        from perflab.models.reference import build_on_device, logits_of, vocab_size_of

        config = None
        if case.is_reference:
            model = build_on_device(case.model, dict(case.model_args), case.device)
            refuse_decode_convention(model, case)
            vocab_size = vocab_size_of(model, case.model)
        else:
            config = lm_config(case)
            vocab_size = config.vocab_size
            if model is None:
                with torch.device(case.device):  # initialised where it runs: seconds, not minutes, for billions of parameters
                    model = GPT(config)
        model = model.to(case.device)
        if shard is not None:
            shard(model)
        generator = torch.Generator().manual_seed(case.seed)
        idx = torch.randint(0, vocab_size, (case.batch_size, case.seq_len), generator=generator).to(case.device)
        targets = torch.randint(0, vocab_size, (case.batch_size, case.seq_len), generator=generator).to(case.device)
        training = case.workload in TRAINING
        model.train(training)
        autocast_dtype = AUTOCAST_DTYPES.get(case.dtype) if training else None
        # A graph replays the gradients' memory in place, so the step keeps them (zero, not None) between steps.
        set_to_none = case.mode != "cudagraph"
        optimizer = make_optimizer(case, model, set_to_none) if case.workload == "train_step" else None
        built = Built(model=model, make_step=lambda m: None, needs_grad=training, items_per_step=case.batch_size * case.seq_len,
                      batch_of=lambda out: int(out[1]) if isinstance(out, tuple) else int(out.shape[0]),
                      optimizer=optimizer, has_backward=case.workload in ("forward_backward", "train_step"),
                      autocast=not training, extra={"config": config, "inputs": idx, "targets": targets, "vocab_size": vocab_size})

        def phase(name):
            return record_function(name) if built.annotate else contextlib.nullcontext()

        def autocast():
            return torch.autocast(case.device, dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext()

        def make_step(m, micro=False):
            if case.workload in ("forward", "train_forward"):
                def forward():
                    with phase("forward"), autocast():
                        return logits_of(m(idx))

                return forward

            def step():
                with phase("forward"), autocast():
                    logits = logits_of(m(idx))
                    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))  # fp32 under autocast
                with phase("backward"):
                    loss.backward()
                if optimizer is not None and not micro:
                    with phase("optimizer"):
                        optimizer.step()
                        optimizer.zero_grad(set_to_none=set_to_none)
                return loss, logits.shape[0]

            return step

        built.make_step = make_step
        return built

    def check(self, case, built: Built) -> dict:
        """A user's model must map token ids (B, T) to logits (B, T, vocab): checked with one forward."""
        if not case.is_reference:
            return {}
        from perflab.models.reference import logits_of

        with torch.no_grad():
            out = logits_of(built.model(built.extra["inputs"]))
        expected = (case.batch_size, case.seq_len, built.extra["vocab_size"])
        if not torch.is_tensor(out) or tuple(out.shape) != expected:
            found = f"a tensor of shape {tuple(out.shape)}" if torch.is_tensor(out) else f"a {type(out).__name__}"
            raise PerflabError(f"{case.model}: the lm family expects logits (batch, seq, vocab) = {expected} (or an output with .logits) "
                               f"from token ids of shape {tuple(built.extra['inputs'].shape)}; it returned {found}")
        return {}

    def default_fixes(self, case) -> list[str]:
        """train_step: the other AdamW implementations, and activation checkpointing (perflab's GPT only: it
        wraps its blocks); forward_backward: checkpointing."""
        from perflab.workloads import OPTIMIZERS

        checkpoint = [] if case.checkpoint_activations or case.is_reference else ["checkpoint"]
        if case.workload == "train_step":
            current = current_optimizer(case)
            return [f"optimizer:{name}" for name in OPTIMIZERS if name != current] + checkpoint
        return checkpoint if case.workload == "forward_backward" else []

    def analytic(self, case) -> dict:
        from perflab.models.lm import forward_flops, param_count

        passes = {"forward": 1, "train_forward": 1, "forward_backward": 3, "train_step": 3}[case.workload]
        if case.is_reference:
            return reference_analytic(case, passes)
        config = lm_config(case)
        counts = param_count(config)
        forward = forward_flops(config, case.batch_size, case.seq_len)
        return {
            "params_total": counts["total"],
            "params_non_embedding": counts["non_embedding"],
            "flops_analytic": forward * passes,
            "model_config": {k: getattr(config, k) for k in ("d_model", "d_ff", "n_layers", "n_heads", "vocab_size", "context_length")},
        }

    def pass_costs(self, case, row: dict) -> dict | None:
        return lm_pass_costs(case, row)

    def min_bytes(self, case, row: dict) -> float:
        """A lower bound on a step's DRAM traffic, activations left out: P parameters read once per pass in the
        compute dtype (forward 1, backward 2), fp32 gradients written once, and AdamW reading p, g, m, v and
        writing p, m, v (7 × 4 bytes per parameter)."""
        weight_bytes = 2 if case.dtype in ("bf16", "fp16") else 4
        params = int(row.get("params") or 0)
        if case.workload in ("forward", "train_forward"):
            return params * weight_bytes
        per_param = 3 * weight_bytes + 4 + (28 if case.workload == "train_step" else 0)
        return params * per_param


def refuse_decode_convention(model, case) -> None:
    """A module in gpt-fast's decode convention (``setup_caches`` and ``forward(idx, input_pos)``) keeps its KV cache
    inside and cannot run a plain ``forward(idx)``: say so in one line instead of failing inside the model."""
    import inspect

    if not callable(getattr(model, "setup_caches", None)):
        return
    try:
        takes_pos = "input_pos" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        takes_pos = False
    if takes_pos:
        raise PerflabError(f"{case.model} follows gpt-fast's decode convention (setup_caches and forward(idx, input_pos)), whose KV cache "
                           f"must be set up before a forward: measure it with --family decode (workloads decode, prefill, generate), "
                           f"not the lm workload {case.workload}")


def reference_analytic(case, passes: int) -> dict:
    """What is known of a user's model without running it: for an hf: config of a Llama-like architecture, the
    parameter count and the forward FLOPs of perflab's Llama formulas (attention over the full T × T, as the
    kernels compute it); nothing otherwise (its FLOPs are counted, never assumed)."""
    from perflab.models import llama
    from perflab.models.reference import hf_llama_config

    config = hf_llama_config(case.model, dict(case.model_args))
    if config is None:
        return {}
    counts = llama.param_count(config)
    forward = llama.forward_flops(config, case.batch_size, case.seq_len, case.seq_len)
    return {"params_total": counts["total"], "params_non_embedding": counts["non_embedding"], "flops_analytic": forward * passes,
            "model_config": {"dim": config.dim, "n_layers": config.n_layers, "n_heads": config.n_heads, "n_kv_heads": config.n_kv_heads,
                             "ffn_dim": config.ffn_dim, "vocab_size": config.vocab_size}}
# ---- training variants: --optimizer and the per-pass costs of explain's floors ----

ADAMW_LR = 1e-4


def current_optimizer(case) -> str:
    """The AdamW implementation a train_step case runs (its default: fused on the GPU, the for-loop one on the CPU)."""
    return case.optimizer or ("fused" if case.device == "cuda" else "plain")


def make_optimizer(case, model, set_to_none: bool):
    """The train_step's AdamW, as ``case.optimizer`` says (capturable for CUDA graph capture):

    - None (the default, as before the option existed): fused on the GPU (one kernel per group of tensors),
      the for-loop implementation on the CPU;
    - ``fused``, ``foreach``: torch.optim.AdamW with that implementation;
    - ``in_backward``: one AdamW per parameter, stepped from the parameter's post-accumulate-grad hook as soon
      as its gradient is complete (PyTorch's "optimizer step in backward" recipe), which frees each gradient
      early; the step's ``optimizer.step()`` then only waits for the updates;
    - ``in_backward_stream``: the same, the updates on a side CUDA stream so they can overlap the rest of the
      backward (on the CPU, the same as in_backward).
    """
    gpu = case.device == "cuda"
    capturable = gpu and case.mode == "cudagraph"
    kind = case.optimizer
    if kind is None:
        return torch.optim.AdamW(model.parameters(), lr=ADAMW_LR, fused=gpu, capturable=capturable)
    if kind in ("fused", "foreach"):
        return torch.optim.AdamW(model.parameters(), lr=ADAMW_LR, fused=kind == "fused", foreach=kind == "foreach", capturable=capturable)
    return InBackwardAdamW(model.parameters(), fused=gpu, capturable=capturable, set_to_none=set_to_none,
                           side_stream=kind == "in_backward_stream" and gpu)


class InBackwardAdamW:
    """AdamW applied per parameter from its post-accumulate-grad hook. ``step()`` joins the side stream (if
    any) so the next forward sees the updated weights; ``zero_grad`` does nothing (each hook clears its own
    gradient); ``state`` gathers the per-parameter optimizers' states (the harness's memory breakdown reads it)."""

    def __init__(self, params, *, fused: bool, capturable: bool, set_to_none: bool, side_stream: bool):
        self.side = torch.cuda.Stream() if side_stream else None
        self.optimizers = {}
        self.handles = []
        for p in params:
            if not p.requires_grad:
                continue
            self.optimizers[p] = torch.optim.AdamW([p], lr=ADAMW_LR, fused=fused, capturable=capturable)
            self.handles.append(p.register_post_accumulate_grad_hook(self._make_hook(set_to_none)))

    def _make_hook(self, set_to_none: bool):
        def hook(p):
            opt = self.optimizers[p]
            if self.side is None:
                opt.step()
                opt.zero_grad(set_to_none=set_to_none)
                return
            self.side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.side):
                opt.step()
                if set_to_none:
                    p.grad.record_stream(self.side)  # its memory goes back to the backward's stream: not before the update ran
                opt.zero_grad(set_to_none=set_to_none)

        return hook

    @property
    def state(self) -> dict:
        out = {}
        for opt in self.optimizers.values():
            out.update(opt.state)
        return out

    def step(self) -> None:
        if self.side is not None:
            torch.cuda.current_stream().wait_stream(self.side)

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass


def lm_pass_costs(case, row: dict) -> dict | None:
    """FLOPs and least DRAM bytes of each pass of a step with a backward, in step order (explain's per-pass
    floors; the byte split adds up to ``LM.min_bytes``): with F the analytic forward FLOPs, P the parameters
    and w the compute dtype's bytes, forward F and P·w (weights read once); backward 2F and 2·P·w + 4·P
    (weights read twice, fp32 gradients written); optimizer 0 FLOPs and 28·P (AdamW reads p, g, m, v and
    writes p, m, v in fp32; with --optimizer in_backward* these bytes move inside the backward).
    With --checkpoint-activations the backward also recomputes the forward: + F and + P·w."""
    from perflab.models.lm import forward_flops, param_count

    if case.workload not in ("forward_backward", "train_step"):
        return None
    if case.is_reference:  # your own model: F from the step's counted FLOPs (forward + a backward of twice it)
        f = float(row.get("gflops_per_batch") or 0.0) * 1e9 / 3
        params = int(row.get("params") or 0)
    else:
        config = lm_config(case)
        f = forward_flops(config, case.batch_size, case.seq_len)
        params = int(row.get("params") or param_count(config)["total"])
    w = 2 if case.dtype in ("bf16", "fp16") else 4
    recompute = 1 if case.checkpoint_activations else 0
    costs = {"forward": {"flops": f, "bytes": params * w},
             "backward": {"flops": (2 + recompute) * f, "bytes": (2 + recompute) * params * w + 4 * params}}
    if case.workload == "train_step":
        if case.optimizer in ("in_backward", "in_backward_stream"):
            costs["backward"]["bytes"] += 28 * params
        else:
            costs["optimizer"] = {"flops": 0, "bytes": 28 * params}
    return costs
