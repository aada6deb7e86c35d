"""Where a program's steps begin and end, found without editing it.

Each source calls ``on_start()`` when a step begins and ``on_end()`` when it ends:

- ``OptimizerSteps`` (the default): torch's global optimizer step post-hook. A step ends when the optimizer has
  stepped, and the next begins at once (a step is boundary to boundary: data loading, forward, backward, the
  optimizer). With several optimizers, the first one to step counts the steps (a GAN's two optimizers are one step).
- ``FunctionSteps`` (``--step QUALNAME`` or ``FILE:QUALNAME``): each call of that function is one step, from its first
  instruction to its return; recursive calls count once. Found by its code object's qualified name (and file), so a
  function that ``torch.compile`` wraps counts too (dynamo's transformed code keeps the name). On Python 3.12+ through
  ``sys.monitoring`` (each other function is disabled after its first call: no cost once the program is warm); on
  older Pythons through ``sys.setprofile``, which costs a little on every Python call.
- ``RangeSteps`` (``--step-range NAME``): an NVTX range (``torch.cuda.nvtx.range_push``/``range_pop``/``range``/
  ``range_start``/``range_end``) or a ``record_function`` range whose name starts with NAME is one step.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

from perflab.errors import PerflabError


class StepSource:
    kind = "boundary"  # "boundary": a step ends where the next begins; "call": a step is one call, gaps between are not timed
    description = ""

    def __init__(self):
        self.on_start: Callable[[], None] = lambda: None
        self.on_end: Callable[[], None] = lambda: None
        self.seen = 0  # steps ended

    def install(self) -> None:
        raise NotImplementedError

    def remove(self) -> None:
        raise NotImplementedError

    def _ended(self) -> None:
        self.seen += 1
        self.on_end()


class OptimizerSteps(StepSource):
    kind = "boundary"
    description = "every optimizer step (torch's global optimizer step hook)"

    def __init__(self):
        super().__init__()
        self._handle = None
        self.optimizers: list[str] = []  # the classes of the optimizers seen stepping
        self._first_id: int | None = None

    def install(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._handle = register_optimizer_step_post_hook(self._hook)

    def _hook(self, optimizer, args, kwargs) -> None:
        if self._first_id is None:
            self._first_id = id(optimizer)
        if id(optimizer) != self._first_id:
            name = type(optimizer).__name__
            if len(self.optimizers) < 2 or name not in self.optimizers:
                self.optimizers.append(name)
            return
        if not self.optimizers:
            self.optimizers.append(type(optimizer).__name__)
        self._ended()
        self.on_start()

    def remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None


def parse_step_function(text: str) -> tuple[str | None, str]:
    """``QUALNAME`` or ``FILE:QUALNAME`` (``model.py:Model.decode_one_token``): (file or None, qualified name)."""
    file, sep, qualname = text.rpartition(":")
    if not sep:
        file, qualname = None, text
    if not qualname or not all(part.isidentifier() or part == "<locals>" for part in qualname.split(".")):
        raise PerflabError(f"--step {text}: give a function's qualified name (decode_one_token, Model.forward) or FILE:QUALNAME")
    return (file or None), qualname


class FunctionSteps(StepSource):
    kind = "call"

    def __init__(self, spec: str):
        super().__init__()
        self.file, self.qualname = parse_step_function(spec)
        self.description = f"each call of {spec}"
        self._depth = 0
        self._tool = None
        self._old_profile = None

    def matches(self, code) -> bool:
        if getattr(code, "co_qualname", code.co_name) != self.qualname and code.co_name != self.qualname:
            return False
        return self.file is None or Path(code.co_filename).name == Path(self.file).name and (
            Path(code.co_filename).resolve() == Path(self.file).resolve() or not Path(self.file).is_absolute())

    def _begin(self) -> None:
        self._depth += 1
        if self._depth == 1:
            self.on_start()

    def _finish(self) -> None:
        if self._depth == 0:
            return
        self._depth -= 1
        if self._depth == 0:
            self._ended()

    def install(self) -> None:
        monitoring = getattr(sys, "monitoring", None)
        if monitoring is not None:
            self._install_monitoring(monitoring)
        else:
            self._install_profile()

    def _install_monitoring(self, monitoring) -> None:
        for tool in (monitoring.PROFILER_ID, monitoring.OPTIMIZER_ID, 4, 3):
            if monitoring.get_tool(tool) is None:
                self._tool = tool
                break
        else:
            raise PerflabError("--step: every sys.monitoring tool id is taken (a debugger or coverage tool is running); use --step-range")
        monitoring.use_tool_id(self._tool, "perflab")
        events = monitoring.events
        disable = monitoring.DISABLE

        def start(code, offset):
            if not self.matches(code):
                return disable
            self._begin()

        def finish(code, offset, value):
            if not self.matches(code):
                return disable
            self._finish()

        monitoring.register_callback(self._tool, events.PY_START, start)
        monitoring.register_callback(self._tool, events.PY_RETURN, finish)
        monitoring.set_events(self._tool, events.PY_START | events.PY_RETURN)

    def _install_profile(self) -> None:
        self._old_profile = sys.getprofile()
        matches, begin, finish = self.matches, self._begin, self._finish

        def profile(frame, event, arg):
            if event == "call":
                if matches(frame.f_code):
                    begin()
            elif event == "return" and matches(frame.f_code):
                finish()

        sys.setprofile(profile)

    def remove(self) -> None:
        monitoring = getattr(sys, "monitoring", None)
        if self._tool is not None and monitoring is not None:
            monitoring.set_events(self._tool, 0)
            monitoring.register_callback(self._tool, monitoring.events.PY_START, None)
            monitoring.register_callback(self._tool, monitoring.events.PY_RETURN, None)
            monitoring.free_tool_id(self._tool)
            self._tool = None
        elif monitoring is None:
            sys.setprofile(self._old_profile)


class RangeSteps(StepSource):
    kind = "call"

    def __init__(self, prefix: str):
        super().__init__()
        if not prefix:
            raise PerflabError("--step-range needs a range name (or its start), e.g. --step-range BENCHMARK")
        self.prefix = prefix
        self.description = f"each NVTX or record_function range whose name starts with {prefix!r}"
        self._nvtx_stack: list[bool] = []  # one entry per pushed NVTX range: is it a step?
        self._started: set[int] = set()  # range_start ids that are steps
        self._saved: dict = {}
        self._inside = 0
        self.internal = False  # set while perflab opens its own ranges

    def _open(self, name) -> bool:
        is_step = not self.internal and isinstance(name, str) and name.startswith(self.prefix)
        if is_step:
            self._inside += 1
            if self._inside == 1:
                self.on_start()
        return is_step

    def _close(self) -> None:
        self._inside -= 1
        if self._inside == 0:
            self._ended()

    def install(self) -> None:
        import torch.cuda.nvtx as nvtx
        from torch.autograd import profiler

        source = self
        push, pop, start, end = nvtx.range_push, nvtx.range_pop, nvtx.range_start, nvtx.range_end
        enter, leave = profiler.record_function.__enter__, profiler.record_function.__exit__
        self._saved = {"range_push": push, "range_pop": pop, "range_start": start, "range_end": end, "enter": enter, "exit": leave}

        def range_push(msg):
            result = push(msg)
            source._nvtx_stack.append(source._open(msg))
            return result

        def range_pop():
            result = pop()
            if source._nvtx_stack and source._nvtx_stack.pop():
                source._close()
            return result

        def range_start(msg):
            handle = start(msg)
            if source._open(msg):
                source._started.add(handle)
            return handle

        def range_end(handle):
            end(handle)
            if handle in source._started:
                source._started.discard(handle)
                source._close()

        def rf_enter(self_):
            result = enter(self_)
            self_._perflab_step = source._open(self_.name)
            return result

        def rf_exit(self_, *exc):
            result = leave(self_, *exc)
            if getattr(self_, "_perflab_step", False):
                self_._perflab_step = False
                source._close()
            return result

        nvtx.range_push, nvtx.range_pop, nvtx.range_start, nvtx.range_end = range_push, range_pop, range_start, range_end
        profiler.record_function.__enter__, profiler.record_function.__exit__ = rf_enter, rf_exit

    def remove(self) -> None:
        if not self._saved:
            return
        import torch.cuda.nvtx as nvtx
        from torch.autograd import profiler

        nvtx.range_push, nvtx.range_pop = self._saved["range_push"], self._saved["range_pop"]
        nvtx.range_start, nvtx.range_end = self._saved["range_start"], self._saved["range_end"]
        profiler.record_function.__enter__, profiler.record_function.__exit__ = self._saved["enter"], self._saved["exit"]
        self._saved = {}


def make_source(step: str | None, step_range: str | None) -> StepSource:
    if step and step_range:
        raise PerflabError("give one of --step and --step-range, not both")
    if step:
        return FunctionSteps(step)
    if step_range is not None:
        return RangeSteps(step_range)
    return OptimizerSteps()
