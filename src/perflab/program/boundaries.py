"""Where a program's steps begin and end, found without editing it.

Each source calls ``on_start()`` when a step begins and ``on_end()`` when it ends:

- ``OptimizerSteps`` (the default): torch's global optimizer step post-hook. A step ends when the optimizer has
  stepped, and the next begins at once (a step is boundary to boundary: data loading, forward, backward, the
  optimizer). With several optimizers, the first one to step counts the steps (a GAN's two optimizers are one step).
- ``FunctionSteps`` (``--step QUALNAME`` or ``FILE:QUALNAME``): each call of that function begins a step, which ends
  where the next call begins: the period between the starts of successive calls, what the program's own per-batch
  clock sees (the call's own duration, start to return, is measured beside it: ``on_call_end``); recursive calls
  count once. Found by its code object's qualified name (and file), so a
  function that ``torch.compile`` wraps counts too (dynamo's transformed code keeps the name). On Python 3.12+ through
  ``sys.monitoring`` (each other function is disabled after its first call: no cost once the program is warm); on
  older Pythons through ``sys.setprofile``, which costs a little on every Python call.
- ``RangeSteps`` (``--step-range NAME``): an NVTX range (``torch.cuda.nvtx.range_push``/``range_pop``/``range``/
  ``range_start``/``range_end``) or a ``record_function`` range whose name starts with NAME is one step.

Only the process that installed a source records (``guard.Guard.owner``: a forked child's steps are its own); a hook of perflab's that fails
stops the recording and is said after the program, never raised into it. After the recorder is done the source keeps
counting the program's steps where that costs nothing (an optimizer hook, ``sys.monitoring``, the wrapped range
functions), so messages give the program's own step numbers. With ``--step`` or ``--step-range``, the optimizer steps are
counted too: a name that never matched is told what the program did instead.
"""

from __future__ import annotations

import difflib
import sys
import threading
from pathlib import Path
from typing import Callable

from perflab.errors import PerflabError
from perflab.program.guard import Guard


class StepSource:
    kind = "boundary"  # "boundary": a step ends where the next begins; "call": a step is one call, gaps between are not timed
    description = ""
    starts_at_first_call = False  # a boundary source whose first boundary begins the first step and ends none (--step)

    def __init__(self):
        self.on_start: Callable[[], None] = lambda: None
        self.on_end: Callable[[], None] = lambda: None
        self.on_call_end: Callable[[], None] = lambda: None  # --step: the call that began the step returned
        self.seen = 0  # steps ended: the program's own step numbers, also after the recorder detached where counting is free
        self.counting_after = True  # does ``seen`` go on counting after ``detach``?
        self.failure: str | None = None  # perflab's own hook failed: it stopped recording there, the program went on
        self.gave_way: str | None = None  # the program took over what this source relies on
        self.optimizer_steps = 0  # every optimizer's steps, for the line that says what happened when no step matched
        self.optimizer_names: list[str] = []
        self._optimizer_handle = None
        self._attached = False
        self._guard = Guard()  # its owner: the process whose steps are the run's
        self._disabled: dict = {}  # each hook, wrapped for dynamo to skip

    def install(self, guard: Guard | None = None) -> None:
        """Arm the source: from here its steps call ``on_start``/``on_end``, in ``guard``'s process only (default: this
        one; a forked child's steps are not the run's)."""
        self._guard = guard or Guard()
        self._attached = True
        self._install()

    def detach(self) -> None:
        """Stop calling the recorder; where counting costs nothing, go on counting the program's steps."""
        self._attached = False
        if not self.counting_after:
            self.close()

    def close(self) -> None:
        """Everything off: the program runs untouched."""
        self._attached = False
        self._remove()
        if self._optimizer_handle is not None:
            self._optimizer_handle.remove()
            self._optimizer_handle = None

    def _install(self) -> None:
        raise NotImplementedError

    def _remove(self) -> None:
        raise NotImplementedError

    def _began(self) -> None:
        if self._attached and self._guard.owner:
            self._guarded(self.on_start)

    def _ended(self) -> None:
        if not self._guard.owner:
            return
        self.seen += 1
        if self._attached:
            self._guarded(self.on_end)

    @property
    def matched(self) -> bool:
        """Did the program reach a step boundary at all?"""
        return self.seen > 0

    def _call_returned(self) -> None:
        if self._attached and self._guard.owner:
            self._guarded(self.on_call_end)

    def _guarded(self, hook: Callable[[], None]) -> None:
        """perflab's own failure inside a hook stops its recording there and is said after the program; it is never
        raised into the program (``StopProgram``, Ctrl-C and SIGTERM, not ``Exception``s, pass)."""
        try:
            if "torch._dynamo" in sys.modules:
                hook = self._outside_dynamo(hook)
            hook()
        except Exception as exc:
            self._attached = False
            self.failure = f"{type(exc).__name__}: {exc}"

    def _outside_dynamo(self, hook: Callable[[], None]) -> Callable[[], None]:
        """The hook as code dynamo skips: called from inside a compiled function (at its return, in a range it opens),
        dynamo would otherwise trace perflab's own code as part of the program's."""
        wrapped = self._disabled.get(hook)
        if wrapped is None:
            import torch._dynamo

            wrapped = self._disabled[hook] = torch._dynamo.disable(hook, recursive=True)
        return wrapped

    def _count_optimizer_steps(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        def count(optimizer, args, kwargs):
            self.optimizer_steps += 1
            name = type(optimizer).__name__
            if name not in self.optimizer_names:
                self.optimizer_names.append(name)

        self._optimizer_handle = register_optimizer_step_post_hook(count)

    def what_happened(self) -> str:
        """For a program whose steps never matched: what it did instead."""
        if not self.optimizer_steps:
            return "no torch optimizer stepped"
        return f"{self.optimizer_steps} optimizer step(s) were seen ({', '.join(self.optimizer_names)}): without --step/--step-range they are the steps"

    def never_matched(self) -> str:
        """One line for a run in which no step was seen: what the program did instead."""
        raise NotImplementedError


class OptimizerSteps(StepSource):
    kind = "boundary"
    description = "every optimizer step (torch's global optimizer step hook)"

    def __init__(self):
        super().__init__()
        self._handle = None
        self.optimizers: list[str] = []  # the classes of the optimizers seen stepping
        self._first_id: int | None = None

    def _install(self) -> None:
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
        self._began()

    def _remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def never_matched(self) -> str:
        return ("no step boundary was seen: the program stepped no torch optimizer; name its step function with --step QUALNAME "
                "(or FILE:QUALNAME), or an NVTX / record_function range with --step-range NAME")


def parse_step_function(text: str) -> tuple[str | None, str]:
    """``QUALNAME`` or ``FILE:QUALNAME`` (``model.py:Model.decode_one_token``): (file or None, qualified name)."""
    file, sep, qualname = text.rpartition(":")
    if not sep:
        file, qualname = None, text
    if not qualname or not all(part.isidentifier() or part == "<locals>" for part in qualname.split(".")):
        raise PerflabError(f"--step {text!r}: give a function's qualified name (decode_one_token, Model.forward) or FILE:QUALNAME")
    return (file or None), qualname


class FunctionSteps(StepSource):
    kind = "boundary"
    starts_at_first_call = True

    def __init__(self, spec: str):
        super().__init__()
        self.file, self.qualname = parse_step_function(spec)
        self.description = f"the period between the starts of successive calls of {spec}"
        self._depth = 0
        self.calls = 0
        self._tool = None
        self._old_profile = None
        self._real = None
        self._called: set = set()

    def matches(self, code) -> bool:
        if getattr(code, "co_qualname", code.co_name) != self.qualname and code.co_name != self.qualname:
            return False
        return self.file is None or Path(code.co_filename).name == Path(self.file).name and (
            Path(code.co_filename).resolve() == Path(self.file).resolve() or not Path(self.file).is_absolute())

    @property
    def matched(self) -> bool:
        return self.calls > 0

    def _begin(self) -> None:
        self._depth += 1
        if self._depth == 1:
            if self._guard.owner:
                self.calls += 1
            if self.calls > 1:  # the step the last call began ends here, where the next one begins
                self._ended()
            self._began()

    def _finish(self) -> None:
        if self._depth == 0:
            return
        self._depth -= 1
        if self._depth == 0:
            self._call_returned()

    def _install(self) -> None:
        self._called = set()  # code objects of the functions called (for the line when none matched)
        self._count_optimizer_steps()
        monitoring = getattr(sys, "monitoring", None)
        if monitoring is not None:
            self._install_monitoring(monitoring)
        else:
            self.counting_after = False  # sys.setprofile costs on every call: off once the recorder is done
            self._install_profile()

    def _install_monitoring(self, monitoring) -> None:
        # the ids no tool claims first: a program's own profiler or optimizer tool (PROFILER_ID, OPTIMIZER_ID) finds its
        # id free
        for tool in (4, 3, monitoring.OPTIMIZER_ID, monitoring.PROFILER_ID):
            if monitoring.get_tool(tool) is None:
                self._tool = tool
                break
        else:
            raise PerflabError("--step: every sys.monitoring tool id is taken (a debugger or coverage tool is running); use --step-range")
        monitoring.use_tool_id(self._tool, "perflab")
        events = monitoring.events
        disable = monitoring.DISABLE
        called = self._called

        def start(code, offset):
            if not self.matches(code):
                called.add(code)
                return disable
            self._begin()

        def finish(code, offset, value):
            if not self.matches(code):
                return disable
            self._finish()

        def unwind(code, offset, exception):
            # a call that raises ends with PY_UNWIND, not PY_RETURN: its step ends there (sys.setprofile's "return"
            # says the same), else every later call would nest inside it and no step would end. PY_UNWIND cannot be
            # disabled per code object, so nothing is returned
            if self.matches(code):
                self._finish()

        monitoring.register_callback(self._tool, events.PY_START, start)
        monitoring.register_callback(self._tool, events.PY_RETURN, finish)
        monitoring.register_callback(self._tool, events.PY_UNWIND, unwind)
        monitoring.set_events(self._tool, events.PY_START | events.PY_RETURN | events.PY_UNWIND)

    def _install_profile(self) -> None:
        """perflab's profile function, with the program's own beside it: a program that calls ``sys.setprofile`` has
        its function called first on every event (``sys.getprofile`` gives it back), and perflab's steps go on being
        found. A profiler that replaces it from C (``cProfile``) is seen at the end: perflab says it gave way."""
        real_set, real_get = sys.setprofile, sys.getprofile
        self._old_profile = real_get()
        matches, begin, finish, called = self.matches, self._begin, self._finish, self._called
        programs: list = [None]  # the program's own profile function

        def profile(frame, event, arg):
            own = programs[0]
            if own is not None:
                own(frame, event, arg)
            if event == "call":
                code = frame.f_code
                if matches(code):
                    begin()
                else:
                    called.add(code)
            elif event == "return" and matches(frame.f_code):
                finish()

        def setprofile(function):
            if function is profile:  # a thread's start setting threading.setprofile's function (perflab's own) in itself
                real_set(profile)
                return
            programs[0] = function
            if real_get() is not profile:  # a C profiler had replaced perflab's: the program's own function alone
                real_set(function)

        def getprofile():
            current = real_get()
            return programs[0] if current is profile else current

        real_set(profile)
        # threads the program starts from now on (a step in a worker thread): sys.setprofile sees only this one
        self._old_thread_profile = threading.getprofile() if hasattr(threading, "getprofile") else None
        threading.setprofile(profile)
        self._profile, self._real = profile, (real_set, real_get)
        sys.setprofile, sys.getprofile = setprofile, getprofile

    def _remove(self) -> None:
        monitoring = getattr(sys, "monitoring", None)
        if self._tool is not None and monitoring is not None:
            monitoring.set_events(self._tool, 0)
            monitoring.register_callback(self._tool, monitoring.events.PY_START, None)
            monitoring.register_callback(self._tool, monitoring.events.PY_RETURN, None)
            monitoring.register_callback(self._tool, monitoring.events.PY_UNWIND, None)
            monitoring.free_tool_id(self._tool)
            self._tool = None
        elif self._real is not None:
            threading.setprofile(self._old_thread_profile)
            real_set, real_get = self._real
            program_function = sys.getprofile()
            sys.setprofile, sys.getprofile = real_set, real_get
            if real_get() is self._profile:
                real_set(program_function if program_function is not None else self._old_profile)
            else:
                self.gave_way = (f"the program replaced perflab's sys.setprofile function (a profiler or debugger of its own, such as "
                                 f"cProfile) after step {self.seen}: later calls of {self.qualname} were not seen (Python < 3.12 finds "
                                 "--step through sys.setprofile; on 3.12+ through sys.monitoring, which leaves it alone)")
            self._real = None

    def never_matched(self) -> str:
        """No call matched: the functions of the program's own files that it called (closest names first), and its
        optimizer steps."""
        own = sorted({getattr(c, "co_qualname", c.co_name) for c in self._called if _programs_code(c) and not c.co_name.startswith("<")})
        close = difflib.get_close_matches(self.qualname, own, n=3, cutoff=0.5)
        listed = close + [n for n in own if n not in close]
        if listed:
            called = ", ".join(listed[:8]) + (f" and {len(listed) - 8} more" if len(listed) > 8 else "")
            functions = f"the program's own functions called: {called}"
        else:
            functions = "no function of the program's own files was called"
        return f"--step {self.qualname if self.file is None else f'{self.file}:{self.qualname}'} never matched a call; {functions}; {self.what_happened()}"


def _programs_code(code) -> bool:
    """Is this code object's file the program's (not Python's, an installed package's or perflab's)?"""
    return programs_file(code.co_filename)


_PERFLAB_DIR = str(Path(__file__).resolve().parents[1])


def programs_file(name: str) -> bool:
    """Is this source file the program's (not Python's, an installed package's or perflab's)?"""
    if name.startswith("<") or "site-packages" in name or "dist-packages" in name:
        return False
    return not name.startswith((sys.base_prefix, sys.prefix, _PERFLAB_DIR))


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
        self.ranges: list[str] = []  # the other ranges' names, the first 20 (for the line when none matched)

    def _open(self, name) -> bool:
        is_step = not self.internal and isinstance(name, str) and name.startswith(self.prefix)
        if is_step:
            self._inside += 1
            if self._inside == 1:
                self._began()
        elif not self.internal and isinstance(name, str) and len(self.ranges) < 20 and name not in self.ranges:
            self.ranges.append(name)
        return is_step

    def _close(self) -> None:
        self._inside -= 1
        if self._inside == 0:
            self._ended()

    def _install(self) -> None:
        import torch.cuda.nvtx as nvtx
        from torch.autograd import profiler

        self._count_optimizer_steps()
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

    def never_matched(self) -> str:
        if self.ranges:
            ranges = "the ranges opened: " + ", ".join(repr(r) for r in self.ranges) + (" and more" if len(self.ranges) == 20 else "")
        else:
            ranges = "the program opened no NVTX or record_function range"
        return f"--step-range {self.prefix} never matched a range; {ranges}; {self.what_happened()}"

    def _remove(self) -> None:
        if not self._saved:
            return
        import torch.cuda.nvtx as nvtx
        from torch.autograd import profiler

        nvtx.range_push, nvtx.range_pop = self._saved["range_push"], self._saved["range_pop"]
        nvtx.range_start, nvtx.range_end = self._saved["range_start"], self._saved["range_end"]
        profiler.record_function.__enter__, profiler.record_function.__exit__ = self._saved["enter"], self._saved["exit"]
        self._saved = {}


def make_source(step: str | None, step_range: str | None) -> StepSource:
    if step is not None and step_range is not None:
        raise PerflabError("give one of --step and --step-range, not both")
    if step is not None:  # an empty --step is a mistake, not the default steps
        return FunctionSteps(step)
    if step_range is not None:
        return RangeSteps(step_range)
    return OptimizerSteps()
