"""References to a user's own model (torch-free part): parsing, the model root, hf: config.json.

    path/to/file.py:NAME        NAME in that file (``Transformer.from_name``: a dotted attribute)
    package.module:NAME         NAME in an importable module
    hf:DIR_OR_ID                a transformers model built from a config (a directory holding config.json, or a
                                hub id where the hub can be reached), random weights, nothing downloaded
    object:NAME                 a module or factory handed to ``perflab.bench(model=...)`` in this process

NAME is an ``nn.Module`` subclass or a callable that returns one; the case's ``model_args`` become its keyword
arguments (for ``hf:``, overrides of the config's attributes). A relative path is read against the model root:
``$PERFLAB_MODEL_ROOT`` (a sweep sets it to its spec's directory), else the working directory.

This module never imports torch, so cases and stored rows that name references can be read anywhere; building
them (torch, the user's code) is ``perflab.models.reference``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from perflab.errors import PerflabError

ROOT_ENV = "PERFLAB_MODEL_ROOT"
BUILTIN_PREFIXES = ("timm", "test")  # timm:<name>, test:<name> are perflab's own model names
_MODULE_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_OBJECTS: dict[str, object] = {}  # object:NAME → module or factory (perflab.bench(model=...))


@dataclass(frozen=True)
class Reference:
    text: str  # as given (this is what a case stores)
    kind: str  # "file", "module", "hf" or "object"
    target: str  # the file path, module path, hf directory or id, or object name
    attr: str  # NAME (dotted); "" for hf and object


def is_reference(name) -> bool:
    """Whether a model name is a reference to a user's model (not one of perflab's own names)."""
    if not isinstance(name, str) or ":" not in name:
        return False
    head = name.split(":", 1)[0]
    if head in ("hf", "object"):
        return True
    if head in BUILTIN_PREFIXES:
        return False
    before = name.rsplit(":", 1)[0]
    return before.endswith(".py") or bool(_MODULE_PATH.match(before))


def parse_reference(text: str) -> Reference:
    if text.startswith("hf:"):
        target = text[3:]
        if not target:
            raise PerflabError("hf: needs a directory holding config.json or a hub id, e.g. hf:./tiny-llama or hf:meta-llama/Llama-3.2-1B")
        return Reference(text, "hf", target, "")
    if text.startswith("object:"):
        return Reference(text, "object", text[7:], "")
    target, _, attr = text.rpartition(":")
    if not target or not attr:
        raise PerflabError(f"model reference {text!r}: expected path/to/file.py:NAME, package.module:NAME or hf:DIR")
    if not all(part.isidentifier() for part in attr.split(".")):
        raise PerflabError(f"model reference {text!r}: {attr!r} is not an attribute name (NAME or Class.method)")
    return Reference(text, "file" if target.endswith(".py") else "module", target, attr)


def model_root() -> Path:
    return Path(os.environ.get(ROOT_ENV) or os.getcwd())


@contextlib.contextmanager
def using_model_root(path):
    """Read relative references against ``path`` inside the block (a sweep spec's directory); None: unchanged."""
    if path is None:
        yield
        return
    previous = os.environ.get(ROOT_ENV)
    os.environ[ROOT_ENV] = str(path)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(ROOT_ENV, None)
        else:
            os.environ[ROOT_ENV] = previous


class ModelScope:
    """One version's model code in a process that holds several (``perflab ab``'s blocks pairing): a reusable context
    manager. Inside it, relative references are read against ``root`` (the version's worktree), and the modules
    imported from under ``root`` (a model file's sibling modules, a ``package.module:NAME`` reference's package) are in
    ``sys.modules``; outside it they are kept aside, with ``root``'s folders off ``sys.path``. So revision A's
    ``model.py`` and its ``layers.py``, then revision B's, import under the names their code gives them, side by
    side, each version's code seeing its own modules; a model built inside the scope keeps running its own code
    outside it (its functions hold their module's globals). Scopes are entered one at a time, never nested."""

    def __init__(self, root):
        self.root = Path(root).resolve()
        self.modules: dict[str, object] = {}  # name → module imported from under root, while outside the scope
        self._outer = None

    def __enter__(self) -> "ModelScope":
        import sys

        self._outer = (os.environ.get(ROOT_ENV), set(sys.modules))
        os.environ[ROOT_ENV] = str(self.root)
        sys.modules.update(self.modules)
        return self

    def __exit__(self, *exc) -> None:
        import sys

        previous, before = self._outer
        for name in (set(sys.modules) - before) | set(self.modules):
            module = sys.modules.get(name)
            if module is not None and self._owns(module):
                self.modules[name] = sys.modules.pop(name)
        sys.path[:] = [p for p in sys.path if not self._under(p)]
        if previous is None:
            os.environ.pop(ROOT_ENV, None)
        else:
            os.environ[ROOT_ENV] = previous

    def _under(self, path) -> bool:
        try:
            return bool(path) and Path(path).resolve().is_relative_to(self.root)
        except (OSError, ValueError, TypeError):
            return False

    def _owns(self, module) -> bool:
        try:  # a module's __file__, or a package's __path__ (a namespace package has no file); some modules are odd objects
            places = [getattr(module, "__file__", None)] + list(getattr(module, "__path__", None) or [])
        except Exception:
            return False
        return any(self._under(p) for p in places if isinstance(p, str))


def resolve_file(ref: Reference) -> Path:
    """The reference's path (a file, or an hf: directory), read against the model root when relative."""
    path = Path(ref.target).expanduser()
    return path if path.is_absolute() else model_root() / path


# ---------------------------------------------------------------------------------------------------
# hf: configs (torch-free)


def hf_dir(ref: Reference) -> Path | None:
    """The local directory of an hf: reference, or None for a hub id."""
    path = resolve_file(ref)
    if path.is_dir():
        return path
    # a path, not a hub id ("org/name"): it names a file, starts like a path, or lies in a folder that exists
    if path.suffix == ".json" or ref.target.startswith((".", "/", "~")) or (os.sep in ref.target and path.parent.exists()):
        raise PerflabError(f"{ref.text}: {path} is not a directory holding config.json")
    return None


def hf_config_json(ref: Reference) -> dict | None:
    """config.json of a local hf: directory (None for a hub id); one clear error when it is missing or broken."""
    directory = hf_dir(ref)
    if directory is None:
        return None
    path = directory / "config.json"
    if not path.is_file():
        raise PerflabError(f"{ref.text}: no config.json in {directory}")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise PerflabError(f"{ref.text}: {path} is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise PerflabError(f"{ref.text}: {path} does not hold a JSON object")
    return data


def family_of_architectures(architectures) -> str | None:
    for arch in architectures or ():
        if str(arch).endswith("ForCausalLM"):
            return "lm"
        if str(arch).endswith("ForImageClassification"):
            return "classify"
    return None


def declared_family(text: str) -> str | None:
    """The family a reference states without importing anything: an hf: directory's architectures; else None."""
    ref = parse_reference(text)
    if ref.kind != "hf":
        return None
    data = hf_config_json(ref)
    return family_of_architectures(data.get("architectures")) if data else None



def register_object(obj, name: str | None = None) -> str:
    """Register a module or factory for this process; returns its model name ``object:NAME``."""
    base = name or getattr(obj, "__name__", None) or type(obj).__name__
    key = base
    n = 1
    while key in _OBJECTS and _OBJECTS[key] is not obj:
        n += 1
        key = f"{base}_{n}"
    _OBJECTS[key] = obj
    return f"object:{key}"
