"""The classify family: a seeded image batch through a ViT/DeiT (with optional token reduction), a timm model
or one of perflab's ``test:*`` models; one workload, ``forward`` (inference)."""

from __future__ import annotations

from dataclasses import replace

from perflab.errors import PerflabError
from perflab.workloads.base import Built, Implementation, image_batch


class Classify(Implementation):
    family = "classify"

    def validate(self, case):
        from perflab.models.registry import parse_model_name
        from perflab.models.vit import vit_configs

        if case.input_size < 1:
            raise PerflabError(f"input size must be positive, got {case.input_size}")
        if case.is_reference:
            if case.keep_rate or case.reduction_loc:
                raise PerflabError(f"--keep-rate/--reduction-loc configure perflab's token-reducing ViTs (topk_*, evit_*); "
                                   f"{case.model} reduces tokens, if at all, by its own code")
            if case.attn != "sdpa":
                raise PerflabError(f"--attn chooses the attention of perflab's own ViT; {case.model} runs its own attention")
            return case
        if case.model_args:
            raise PerflabError(f"--model-arg passes arguments to your own model (file.py:NAME, module:NAME, hf:DIR); {case.model} is perflab's")
        name = parse_model_name(case.model)
        for rate in case.keep_rate:
            if not (0.0 < rate <= 1.0):
                raise PerflabError(f"keep rate {rate:g} is outside (0, 1]; give the fraction of tokens to keep, e.g. 0.1")
        if name.family == "vit":
            config = vit_configs[name.base]
            patch, depth = 16, config["depth"]
            if case.input_size % patch:
                lower = case.input_size - case.input_size % patch
                raise PerflabError(f"input size {case.input_size} is not divisible by the patch size {patch}; try {lower} or {lower + patch}")
            for loc in case.reduction_loc:
                if not (0 <= loc < depth):
                    raise PerflabError(f"reduction location {loc} is beyond the depth of {name.base} ({depth} blocks: 0..{depth - 1})")
            if len(set(case.reduction_loc)) != len(case.reduction_loc):
                raise PerflabError(f"reduction locations repeat: {list(case.reduction_loc)}")
        if name.reduces_tokens:
            if not case.keep_rate or not case.reduction_loc:
                raise PerflabError(f"{case.model} needs --keep-rate and --reduction-loc (e.g. --keep-rate 0.1 --reduction-loc 3 6 9)")
            if len(case.keep_rate) not in (1, len(case.reduction_loc)):
                raise PerflabError(
                    f"give one keep rate or one per reduction location: {len(case.keep_rate)} rates for {len(case.reduction_loc)} locations"
                )
            if len(case.keep_rate) == 1:
                return replace(case, reduction_loc=tuple(sorted(case.reduction_loc)))
            pairs = sorted(zip(case.reduction_loc, case.keep_rate))
            return replace(case, reduction_loc=tuple(p[0] for p in pairs), keep_rate=tuple(p[1] for p in pairs))
        if case.keep_rate or case.reduction_loc:
            raise PerflabError(
                f"{case.model} does not reduce tokens, so --keep-rate/--reduction-loc do nothing; use topk_{case.model} or evit_{case.model}"
            )
        return case

    def build(self, case) -> Built:
        from perflab.models.registry import build_model

        if case.is_reference:
            from perflab.models.reference import build_on_device, logits_of

            model, vit_config = build_on_device(case.model, dict(case.model_args), case.device).eval(), None
            make = lambda m: (lambda: logits_of(m(x)))
        else:
            model, vit_config = build_model(case)
            make = lambda m: (lambda: m(x))
        model = model.to(case.device)
        x = image_batch(case.batch_size, case.input_size, case.device, case.seed)
        return Built(model=model, make_step=make, needs_grad=False, items_per_step=case.batch_size,
                     extra={"inputs": x, "vit_config": vit_config})

    def check(self, case, built: Built) -> dict:
        from perflab.models.registry import expected_tokens

        if case.is_reference:
            return self.check_reference(case, built)
        seen = None
        if built.extra["vit_config"] is not None:
            built.model.tokens_seen = []
            built.model(built.extra["inputs"])
            seen, built.model.tokens_seen = built.model.tokens_seen, None
        return {"tokens_expected": expected_tokens(case), "tokens_seen": seen}

    def check_reference(self, case, built: Built) -> dict:
        """A user's image model must map an image batch (B, 3, S, S) to one output per image: checked with one call."""
        import torch

        from perflab.models.reference import logits_of

        x = built.extra["inputs"]
        try:
            with torch.no_grad():
                out = logits_of(built.model(x))
        except Exception as exc:
            if "CUDA error" in str(exc):  # a failure of the device, not of the input: the case's error row (and the run's end)
                raise
            raise PerflabError(f"{case.model}: the classify family feeds an image batch of shape {tuple(x.shape)}; the model failed on it: "
                               f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}") from None
        if not torch.is_tensor(out) or out.dim() < 1 or out.shape[0] != case.batch_size:
            found = f"a tensor of shape {tuple(out.shape)}" if torch.is_tensor(out) else f"a {type(out).__name__}"
            raise PerflabError(f"{case.model}: the classify family expects one output row per image ({case.batch_size}, ...) "
                               f"(or an output with .logits); it returned {found}")
        return {"tokens_expected": None, "tokens_seen": None}

    def min_bytes(self, case, row: dict) -> float:
        """Weights plus minimal activation traffic for a ViT case (weights and input/output otherwise)."""
        from perflab.models.registry import parse_model_name, vit_config_for

        name = None if case.is_reference else parse_model_name(case.model)
        weight_bytes = 2 if case.dtype in ("bf16", "fp16") else 4
        params = int(row.get("params") or 0)
        inputs = case.batch_size * 3 * case.input_size**2
        if case.is_reference or parse_model_name(case.model).family != "vit":
            return params * weight_bytes + 4 * inputs
        cfg = vit_config_for(name, case.input_size, case.keep_rate, case.reduction_loc, case.attn)
        schedule = row.get("tokens") or [cfg.n_patches + 1]
        locations = sorted(i for i, _ in cfg.reduction)
        per_block, stage = [], 0
        for i in range(cfg.depth):
            if stage < len(locations) and i == locations[stage]:
                stage += 1
            per_block.append(schedule[min(stage, len(schedule) - 1)])
        return vit_min_bytes(params=params, weight_bytes=weight_bytes, batch=case.batch_size, tokens_per_block=per_block, dim=cfg.dim,
                             act_bytes=4, input_elems=inputs, output_elems=case.batch_size * cfg.num_classes)


def vit_min_bytes(*, params: int, weight_bytes: int, batch: int, tokens_per_block: list[int], dim: int, act_bytes: int,
                  input_elems: int, output_elems: int) -> int:
    """Weights read once, each block's residual stream read once and written once, input and logits.

    ``tokens_per_block`` holds the sequence length each block's output has. This is a floor, not an
    estimate: real kernels re-read activations (norms, attention, MLP hidden states).
    """
    activations = sum(2 * batch * n * dim * act_bytes for n in tokens_per_block)
    return params * weight_bytes + activations + 4 * (input_elems + output_elems)
