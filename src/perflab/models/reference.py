"""Building a user's model from a reference (imports torch and the user's code); the references themselves
(syntax, model root, hf: config.json) are parsed torch-free in ``perflab.references``.

Naming a file runs it, as ``python file.py`` would; nothing that a case does not name is imported.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import re
import sys
from pathlib import Path

from perflab.errors import ModelLoadError, PerflabError
from perflab.references import (_OBJECTS, Reference, declared_family, family_of_architectures, hf_config_json, hf_dir,
                                model_root, parse_reference, resolve_file)


# ---------------------------------------------------------------------------------------------------
# Loading and building (imports the user's code and torch)


def _import_file(path: Path):
    if not path.is_file():
        raise ModelLoadError(f"model file {path} not found")
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:10]
    name = f"perflab_user_{re.sub(r'[^0-9A-Za-z_]', '_', path.stem)}_{digest}"
    mtime = path.stat().st_mtime_ns
    cached = sys.modules.get(name)
    if cached is not None and getattr(cached, "__perflab_mtime__", None) == mtime:
        return cached
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    module.__perflab_mtime__ = mtime
    folder = str(path.resolve().parent)
    if folder not in sys.path:  # as `python file.py` would: the file's own folder is importable (its sibling modules)
        sys.path.insert(0, folder)
    sys.modules[name] = module  # dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:
        sys.modules.pop(name, None)
        raise ModelLoadError(f"importing {path} failed: {_last_line(exc)}") from None
    return module


def _import_module(target: str):
    root = str(model_root())
    if root not in sys.path:
        sys.path.insert(0, root)
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as exc:
        if exc.name and target.startswith(exc.name):
            raise ModelLoadError(f"no module named {target!r} (looked in the model root {root} and on the Python path)") from None
        raise ModelLoadError(f"importing {target} failed: {_last_line(exc)}") from None
    except BaseException as exc:
        raise ModelLoadError(f"importing {target} failed: {_last_line(exc)}") from None


def load_factory(ref: Reference):
    """The object NAME refers to (a module class, a factory, or an nn.Module instance)."""
    if ref.kind == "object":
        if ref.target not in _OBJECTS:
            raise PerflabError(f"{ref.text}: no such object in this process (objects are registered by perflab.bench(model=...))")
        return _OBJECTS[ref.target]
    module = _import_file(resolve_file(ref)) if ref.kind == "file" else _import_module(ref.target)
    obj = module
    where = str(resolve_file(ref)) if ref.kind == "file" else ref.target
    for i, part in enumerate(ref.attr.split(".")):
        if not hasattr(obj, part):
            done = ".".join(ref.attr.split(".")[:i])
            owner = f"{where}:{done}" if done else where
            raise ModelLoadError(f"{owner} has no attribute {part!r}" + _candidates(obj))
        obj = getattr(obj, part)
    return obj


def _candidates(obj) -> str:
    import torch.nn as nn

    names = []
    for key, value in vars(obj).items() if hasattr(obj, "__dict__") else ():
        if key.startswith("_"):
            continue
        if inspect.isclass(value) and issubclass(value, nn.Module) and value.__module__ == getattr(obj, "__name__", None):
            names.append(key)
        elif inspect.isfunction(value) and value.__module__ == getattr(obj, "__name__", None):
            names.append(key)
    return f"; it defines {', '.join(sorted(names))}" if names else ""


def factory_kwargs(factory, model_args: dict, what: str) -> dict:
    """The model_args as keyword arguments of ``factory``, checked against its signature."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return dict(model_args)
    params = signature.parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(model_args)
    accepted = [n for n, p in params.items() if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    for key in model_args:
        if key not in accepted:
            takes = f"it takes {', '.join(accepted)}" if accepted else "it takes no arguments"
            raise PerflabError(f"--model-arg {key}: {what} has no argument {key!r}; {takes}")
    missing = [n for n, p in params.items() if p.default is inspect.Parameter.empty and n not in model_args
               and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    if missing:
        raise PerflabError(f"{what} needs {', '.join(missing)}: give --model-arg {missing[0]}=VALUE")
    return dict(model_args)


def build_module(text: str, model_args: dict):
    """The nn.Module a reference names, built with model_args (on the current default device and dtype)."""
    import torch.nn as nn

    ref = parse_reference(text)
    if ref.kind == "hf":
        return build_hf(ref, model_args)
    obj = load_factory(ref)
    if isinstance(obj, nn.Module):
        if model_args:
            raise PerflabError(f"--model-arg: {text} is a module instance, already built; its arguments cannot change")
        return obj
    if not callable(obj):
        raise PerflabError(f"{text} is a {type(obj).__name__}, not an nn.Module subclass or a function that returns one")
    kwargs = factory_kwargs(obj, model_args, text)
    try:
        module = obj(**kwargs)
    except PerflabError:
        raise
    except Exception as exc:
        raise ModelLoadError(f"{text}({_kwargs_text(kwargs)}) raised {_last_line(exc)}") from None
    if not isinstance(module, nn.Module):
        raise PerflabError(f"{text}({_kwargs_text(kwargs)}) returned a {type(module).__name__}, not an nn.Module")
    return module


def hf_config(ref: Reference, model_args: dict):
    """transformers' config of an hf: reference with model_args set on it (each must be an attribute it has)."""
    transformers = import_transformers()
    directory = hf_dir(ref)
    source = str(directory) if directory is not None else ref.target
    if directory is not None:
        hf_config_json(ref)  # the clear error for a missing or broken config.json
    try:
        config = transformers.AutoConfig.from_pretrained(source, local_files_only=directory is not None)
    except Exception as exc:
        where = "" if directory is not None else " (a hub id needs the hub; give a local directory holding config.json)"
        raise PerflabError(f"{ref.text}: transformers could not read the config{where}: {_last_line(exc)}") from None
    for key, value in model_args.items():
        if not hasattr(config, key):
            raise PerflabError(f"--model-arg {key}: {ref.text}'s {type(config).__name__} has no attribute {key!r}")
        if is_size_key(key) and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise PerflabError(f"--model-arg {key}: a size must be a whole number, 1 or more, got {value!r}")
        setattr(config, key, value)
    return config


def is_size_key(key: str) -> bool:
    """A config attribute that sizes the model (layers, heads, widths, vocabulary, positions): 1 or more."""
    return key.startswith(("num_", "n_")) or key.endswith(("_size", "_layers", "_heads", "_dim", "_embeddings")) or key in (
        "hidden_size", "intermediate_size", "vocab_size", "head_dim", "max_position_embeddings")


def build_hf(ref: Reference, model_args: dict):
    transformers = import_transformers()
    config = hf_config(ref, model_args)
    family = family_of_architectures(getattr(config, "architectures", None))
    auto = {"lm": transformers.AutoModelForCausalLM, "classify": transformers.AutoModelForImageClassification}.get(family)
    if auto is None:
        raise PerflabError(f"{ref.text}: architectures {getattr(config, 'architectures', None)} is neither *ForCausalLM nor "
                           "*ForImageClassification, so perflab does not know which inputs it takes")
    try:
        model = auto.from_config(config, attn_implementation="sdpa")
    except Exception as exc:
        raise ModelLoadError(f"{ref.text}: transformers could not build the model: {_last_line(exc)}") from None
    if hasattr(model.config, "use_cache"):
        model.config.use_cache = False  # the lm workloads run without a cache; decode passes its own static cache
    return model


def import_transformers():
    try:
        import transformers
    except Exception as exc:
        raise PerflabError(f"hf: models need transformers, which cannot be imported here ({type(exc).__name__}); "
                           "install it with pip install 'perflab[hf]'") from None
    return transformers


def source_info(text: str) -> dict:
    """Where a reference's code or config comes from, and its SHA-1 (stored in the row, so a changed file shows)."""
    ref = parse_reference(text)
    path = None
    if ref.kind == "file":
        path = resolve_file(ref)
    elif ref.kind == "hf":
        directory = hf_dir(ref)
        path = directory / "config.json" if directory is not None else None
    elif ref.kind == "module":
        module = sys.modules.get(ref.target)
        path = Path(module.__file__) if getattr(module, "__file__", None) else None
    if path is None or not path.is_file():
        return {"reference": text}
    return {"reference": text, "path": str(path), "sha1": hashlib.sha1(path.read_bytes()).hexdigest()}


def infer_family(text: str, model_args: dict, workload: str | None = None) -> str:
    """Which family's inputs a reference takes: stated (hf: architectures), else by what is built: a
    ``setup_caches`` method (gpt-fast's decode convention) → decode; an nn.Embedding as the first module → lm;
    a 3-channel Conv2d first (a patch or stem convolution) → classify. Otherwise one line asking for --family."""
    declared = declared_family(text)
    if declared is not None:
        if declared == "lm" and workload in ("decode", "prefill", "generate"):
            return "decode"
        return declared
    import torch
    import torch.nn as nn

    try:
        with torch.device("meta"):  # no memory, no init time: only the structure is looked at
            module = build_module(text, model_args)
    except ModelLoadError:  # an __init__ that needs real data (.item(), a file): build it on the CPU instead
        module = build_module(text, model_args)
    if callable(getattr(module, "setup_caches", None)):
        return "decode"
    first = first_leaf(module)
    if isinstance(first, nn.Embedding):
        return "lm"
    if isinstance(first, nn.Conv2d) and first.in_channels == 3:
        return "classify"
    found = type(first).__name__ if first is not None else "no submodules"
    raise PerflabError(f"{text}: cannot tell which inputs it takes (its first module is {found}; perflab looks for an nn.Embedding "
                       "(token ids), a 3-channel Conv2d (images) or a setup_caches method (decode)); give --family classify, lm or decode")


def first_leaf(module):
    """The module's first submodule without children (its first layer), or None."""
    return next((m for _, m in module.named_modules() if not list(m.children())), None)


def first_embedding(module):
    import torch.nn as nn

    return next((m for m in module.modules() if isinstance(m, nn.Embedding)), None)


def vocab_size_of(module, text: str) -> int:
    """The token-id bound of an lm reference: the config's vocab_size, else the first nn.Embedding's size."""
    config = getattr(module, "config", None)
    size = getattr(config, "vocab_size", None)
    if isinstance(size, int) and size > 0:
        return size
    embedding = first_embedding(module)
    if embedding is None:
        first = type(first_leaf(module)).__name__ if first_leaf(module) is not None else "nothing"
        raise PerflabError(f"{text}: the lm family feeds token ids below the vocabulary size, read from the first nn.Embedding, "
                           f"but the module has none (its first module is {first}); give --family classify for images")
    return int(embedding.num_embeddings)


def logits_of(out):
    """A model's logits: the output itself, its ``.logits``, or the first element of a tuple."""
    if hasattr(out, "logits"):
        return out.logits
    if isinstance(out, (tuple, list)) and out:
        return out[0]
    return out


def _kwargs_text(kwargs: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items())


def _last_line(exc: BaseException) -> str:
    text = str(exc).strip()
    line = text.splitlines()[-1].strip() if text else ""
    return f"{type(exc).__name__}: {line}" if line else type(exc).__name__


def build_on_device(text: str, model_args: dict, device: str, dtype=None):
    """Build a reference where it runs (initialised on the device: seconds, not minutes, for a large model), in
    ``dtype`` when given (the decode family keeps weights in the case's dtype)."""
    import torch

    previous = torch.get_default_dtype()
    if dtype is not None:
        torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            module = build_module(text, model_args)
    finally:
        torch.set_default_dtype(previous)
    module = module.to(device)
    return module.to(dtype) if dtype is not None else module


LLAMA_LIKE = ("llama", "mistral")


def hf_llama_config(text: str, model_args: dict):
    """perflab's LlamaConfig of an hf: reference whose architecture is Llama-like (model_type llama or mistral, no
    biases, head_dim = hidden_size / heads), for the analytic FLOPs and parameter count; None otherwise."""
    ref = parse_reference(text)
    if ref.kind != "hf":
        return None
    data = dict(hf_config_json(ref) or {})
    data.update(model_args)
    if data.get("model_type") not in LLAMA_LIKE or data.get("attention_bias") or data.get("mlp_bias"):
        return None
    from perflab.models.llama import LlamaConfig

    try:
        dim, heads = int(data["hidden_size"]), int(data["num_attention_heads"])
        if data.get("head_dim") not in (None, dim // heads):
            return None
        return LlamaConfig(dim=dim, n_layers=int(data["num_hidden_layers"]), n_heads=heads,
                           n_kv_heads=int(data.get("num_key_value_heads") or heads), vocab_size=int(data["vocab_size"]),
                           ffn_dim=int(data["intermediate_size"]), max_seq_len=int(data.get("max_position_embeddings") or 4096),
                           tie_embeddings=bool(data.get("tie_word_embeddings", False)))
    except (KeyError, TypeError, ValueError, PerflabError):
        return None
