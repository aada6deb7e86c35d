"""Model names → builders.

Names:
  <vit name>            a plain ViT/DeiT (``deit_base_patch16_224``, ...; see ``vit_configs``)
  topk_<vit name>       top-k token reduction (drop the rest)
  evit_<vit name>       EViT token reduction (fuse the rest into one token)
  gpt_<size>            a GPT language model (models/lm.py: gpt_small ... gpt_2.7b), the lm family
  llama<...>            a Llama with a static KV cache (models/llama.py: llama2_7b, llama3_8b, ...), the decode family
  timm:<timm name>      any timm model, where timm is importable
  test:<name>           small models that plant faults, for perflab's own tests (models/testing.py)
  file.py:NAME, package.module:NAME, hf:DIR_OR_ID
                        a user's own model (perflab.references, models/reference.py), built by its workload family
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from perflab.errors import PerflabError
from perflab.models.vit import ViTConfig, VisionTransformer, token_schedule, vit_configs

METHODS = {"topk": False, "evit": True}  # method -> fuses dropped tokens



@dataclass(frozen=True)
class ModelName:
    name: str  # as given
    family: str  # "vit", "timm", "test", "lm", "llama" or "reference" (a user's model: perflab.references)
    base: str  # the ViT config name, timm model name, or test model name
    method: str  # "baseline", "topk" or "evit"

    @property
    def reduces_tokens(self) -> bool:
        return self.method in METHODS


def model_names() -> list[str]:
    from perflab.models.llama import llama_configs
    from perflab.models.lm import lm_configs

    names = list(vit_configs)
    names += [f"{m}_{v}" for m in METHODS for v in vit_configs]
    return names + list(lm_configs) + list(llama_configs)


def parse_model_name(name: str) -> ModelName:
    from perflab.references import is_reference, parse_reference

    if is_reference(name):
        parse_reference(name)
        return ModelName(name, "reference", name, "baseline")
    if name.startswith("timm:"):
        base = name[len("timm:") :]
        if not base:
            raise PerflabError("empty timm model name: use timm:<name>, for example timm:deit_base_patch16_224")
        return ModelName(name, "timm", base, "baseline")
    if name.startswith("test:"):
        from perflab.models.testing import TEST_MODELS

        base = name[len("test:") :]
        if base not in TEST_MODELS:
            raise PerflabError(f"unknown test model {name!r}; known: {', '.join('test:' + n for n in TEST_MODELS)}")
        return ModelName(name, "test", base, "baseline")
    if name in vit_configs:
        return ModelName(name, "vit", name, "baseline")
    own = _language_model_configs(name)
    if own is not None:
        kind, configs, what = own
        if name in configs:
            return ModelName(name, kind, name, "baseline")
        close = difflib.get_close_matches(name, list(configs), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else f"; known: {', '.join(configs)}"
        raise PerflabError(f"unknown {what} config {name!r}{hint}")
    method, _, base = name.partition("_")
    if method in METHODS and base in vit_configs:
        return ModelName(name, "vit", base, method)
    close = difflib.get_close_matches(name, model_names(), n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else f"; {known_models()}"
    raise PerflabError(f"unknown model {name!r}{hint}")


def known_models() -> str:
    """Every family's models in one line, for an unknown name (``perflab models`` gives them with their dimensions)."""
    from perflab.models.llama import llama_configs
    from perflab.models.lm import lm_configs

    return (f"known models: image {', '.join(vit_configs)} (prefix topk_ or evit_ for token reduction) or timm:<name>; "
            f"language {', '.join(lm_configs)}; decode {', '.join(llama_configs)}; or your own, file.py:NAME, package.module:NAME or "
            "hf:DIR (perflab models lists them all)")


def vit_config_for(name: ModelName, input_size: int, keep_rate: tuple[float, ...], reduction_loc: tuple[int, ...], attn: str) -> ViTConfig:
    rates = keep_rate if len(keep_rate) != 1 else keep_rate * len(reduction_loc)
    return ViTConfig.from_name(
        name.base,
        img_size=input_size,
        attn=attn,
        reduction=tuple(zip(reduction_loc, rates)) if name.reduces_tokens else (),
        fuse_dropped=METHODS.get(name.method, False),
    )


def build_model(case) -> tuple[object, ViTConfig | None]:
    """Build the model a case names, on the CPU, in eval mode. Returns (model, ViT config or None)."""
    name = parse_model_name(case.model)
    if name.family == "test":
        from perflab.models.testing import TEST_MODELS

        return TEST_MODELS[name.base]().eval(), None
    if name.family == "timm":
        return build_timm_model(name.base, case.input_size), None
    if name.family in ("lm", "llama", "reference"):
        raise ValueError(f"{case.model} is built by its workload family (perflab.workloads), not by build_model")
    config = vit_config_for(name, case.input_size, case.keep_rate, case.reduction_loc, case.attn)
    return VisionTransformer(config).eval(), config


def build_timm_model(timm_name: str, input_size: int):
    try:
        import timm
    except ModuleNotFoundError as exc:
        if exc.name != "timm":  # timm pulls in torchvision, which can fail for its own reasons
            raise PerflabError(f"timm models need timm, which cannot be imported here ({type(exc).__name__}: {exc}); "
                               "pip install timm torchvision (a torchvision built for this torch)") from None
        raise PerflabError("timm models need timm, which is not installed: pip install timm (or pip install 'perflab[timm]')") from None
    except Exception as exc:
        raise PerflabError(f"timm models need timm, which cannot be imported here ({type(exc).__name__}: {exc}); "
                           "pip install timm torchvision (a torchvision built for this torch)") from None
    if timm_name.split(".")[0] not in timm.list_models():
        close = difflib.get_close_matches(timm_name, timm.list_models(), n=3)
        raise PerflabError(f"unknown timm model {timm_name!r}" + (f"; did you mean {', '.join(close)}?" if close else ""))
    try:
        model = timm.create_model(timm_name, pretrained=False, img_size=input_size)
    except TypeError:  # models without an img_size argument (CNNs) take any input size
        model = timm.create_model(timm_name, pretrained=False)
    return model.eval()


def expected_tokens(case) -> list[int] | None:
    name = parse_model_name(case.model)
    if name.family != "vit":
        return None
    return token_schedule(vit_config_for(name, case.input_size, case.keep_rate, case.reduction_loc, case.attn))


def _language_model_configs(name: str):
    """(kind, configs, what to call one) of perflab's own language-model configs that a name's prefix points at
    (``gpt_*``: models/lm.py, ``llama*``: models/llama.py; the prefixes ``workloads.family_of`` reads too), or None."""
    if name.startswith("gpt_"):
        from perflab.models.lm import lm_configs

        return "lm", lm_configs, "language model"
    if name.startswith("llama"):
        from perflab.models.llama import llama_configs

        return "llama", llama_configs, "Llama"
    return None
