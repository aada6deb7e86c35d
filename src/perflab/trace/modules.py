"""Module ranges at the trace floor, recorded in a profile pass; ``analysis/modules.py`` attributes the kernels to them.

Module ranges for a profile pass: each ``nn.Module``'s forward (and backward) inside a profiler range.

Hooks only open and close ``record_function`` ranges named ``module:<path> [<Class>]`` (forward) and
``module_backward:<path> [<Class>]`` (backward); they time nothing and never synchronise, so the kernels run as
they would (the profiler's own cost is what ``inflation`` reports). ``analysis.modules`` attributes each kernel
to the innermost of these ranges around its launch.

Backward ranges come from full backward hooks (``register_full_backward_pre_hook`` / ``register_full_backward_hook``),
which run on autograd's thread around each module's gradient computation. A module whose forward modifies its
input in place cannot take them; then the backward is left unattributed per module, and ``skipped`` says why.
"""

from __future__ import annotations

import threading

import torch
from torch.autograd.profiler import record_function

from perflab.trace.schema import module_range_name


class ModuleRanges:
    """Hooks on every module of ``model``; ``close_open()`` ends any range a hook left open (call it after a step)."""

    def __init__(self, model: torch.nn.Module, backward: bool):
        import warnings

        # A model whose inputs need no gradient (token ids) fires its own backward hook at its output: said once here.
        warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are computed with respect to module outputs")
        self.backward = backward
        self.handles = []
        self.open: dict[tuple[int, int, bool], list] = {}  # (thread, module id, backward) → stack of open ranges
        self.lock = threading.Lock()
        self.skipped: str | None = None
        for path, module in model.named_modules():
            name_fwd = module_range_name(path, type(module).__name__)
            name_bwd = module_range_name(path, type(module).__name__, backward=True)
            self.handles.append(module.register_forward_pre_hook(self._opener(module, name_fwd, False)))
            self.handles.append(module.register_forward_hook(self._closer(module, False), always_call=True))
            if backward:
                self.handles.append(module.register_full_backward_pre_hook(self._opener(module, name_bwd, True)))
                self.handles.append(module.register_full_backward_hook(self._closer(module, True)))

    def _opener(self, module, name: str, backward: bool):
        key_module = id(module)

        def hook(*_):
            rf = record_function(name)
            rf.__enter__()
            with self.lock:
                self.open.setdefault((threading.get_ident(), key_module, backward), []).append(rf)

        return hook

    def _closer(self, module, backward: bool):
        key_module = id(module)

        def hook(*_):
            with self.lock:
                stack = self.open.get((threading.get_ident(), key_module, backward))
                rf = stack.pop() if stack else None
            if rf is not None:
                rf.__exit__(None, None, None)

        return hook

    def close_open(self) -> None:
        with self.lock:
            left = [rf for stack in self.open.values() for rf in stack]
            self.open.clear()
        for rf in reversed(left):
            rf.__exit__(None, None, None)

    def remove(self) -> None:
        self.close_open()
        for handle in self.handles:
            handle.remove()
        self.handles.clear()


def with_module_ranges(step, model: torch.nn.Module, backward: bool):
    """``step`` wrapped so that each call runs under module ranges (the hooks are installed here, once; ``.remove()``
    takes them off, ``.state["hooks"].skipped`` says why backward ranges were dropped): a step whose modules cannot
    take backward hooks is retried with forward ranges only."""
    state = {"hooks": ModuleRanges(model, backward)}

    def run():
        hooks = state["hooks"]
        try:
            return step()
        except RuntimeError as exc:
            if not hooks.backward or "BackwardHook" not in str(exc) and "inplace" not in str(exc):
                raise
            hooks.remove()
            state["hooks"] = ModuleRanges(model, backward=False)
            state["hooks"].skipped = f"backward ranges off: {str(exc).strip().splitlines()[0]}"
            return step()
        finally:
            state["hooks"].close_open()

    def remove():
        state["hooks"].remove()

    run.remove = remove
    run.state = state
    return run
