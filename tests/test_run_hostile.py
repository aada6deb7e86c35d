"""perflab run never harms the program it runs: hostile programs planted on the CPU (a full disk, a stderr the program
closes, its own profiler, forks, a changed directory, its own sys.setprofile, SIGTERM, a program that cannot start, a
step name that never matches). Each program is tiny; they run in this process as the CLI runs them, except the two
that would take the test process down with them before the fix (a segfault, SIGTERM)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest
from cli_util import run_cli
from test_run import program, run

from perflab import api
from perflab.errors import PerflabError

TRAINS = """
import sys, torch
torch.set_num_threads(1)
m = torch.nn.Linear(8, 8); opt = torch.optim.SGD(m.parameters(), lr=0.1)
for i in range({steps}):
{before}
    m(torch.randn(4, 8)).sum().backward(); opt.step()
print("last line")
"""


def trains(steps: int, before: str = "    pass") -> str:
    """A program of ``steps`` optimizer steps that runs ``before`` (indented code, ``i`` the 0-based iteration) at the
    top of each iteration, and prints "last line" at its end."""
    return TRAINS.format(steps=steps, before=before)


def test_a_run_json_that_cannot_be_written_is_said_after_the_program_which_ends_as_alone(tmp_path, capsys, monkeypatch):
    def full_disk(path, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("perflab.program.run.write_json", full_disk)
    prog = program(tmp_path, trains(12))
    code, report = run(tmp_path, prog, skip=2, steps=4, trace=1)
    captured = capsys.readouterr()
    assert code == 0 and captured.out.endswith("last line\n") and report is None
    last = captured.err.strip().splitlines()[-1]
    assert last == f"perflab: run.json could not be written to {tmp_path / 'out'} (OSError: [Errno 28] No space left on device)"


def test_a_program_that_closes_stderr_ends_as_alone_and_perflab_speaks_on_fd_2(tmp_path, capfd, monkeypatch):
    # the program closes the sys.stderr it was given (a file of its own here, so the test's capture stays open)
    monkeypatch.setattr(sys, "stderr", io.TextIOWrapper(io.BytesIO()))
    prog = program(tmp_path, trains(20, "    if i == 9:\n        sys.stderr.close()"))
    code, report = run(tmp_path, prog, skip=2, steps=8, trace=1, render=lambda report: print("the report", file=sys.stderr))
    captured = capfd.readouterr()
    assert code == 0 and captured.out.endswith("last line\n")
    assert report["timing"]["steps"] == 8 and not report["partial"]
    assert captured.err.strip().splitlines()[-1] == (f"perflab: the report could not be printed; it is in {tmp_path / 'out' / 'run.json'} "
                                                     "(ValueError: I/O operation on closed file.)")


def test_a_program_that_starts_its_own_profiler_while_perflab_traces_writes_its_trace(tmp_path):
    # in a process of its own: before perflab gave way at the right place, the program segfaulted in export_chrome_trace
    prog = program(tmp_path, trains(20, """    if i == 8:
        own = torch.profiler.profile(); own.start()
    if i == 12:
        own.stop(); own.export_chrome_trace(sys.argv[1]); print("own trace written")"""))
    done = run_cli("run", "--skip", "2", "--steps", "4", "--trace", "4", "--out", tmp_path / "out", "--", prog, tmp_path / "own.json")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "own trace written" in done.stdout and done.stdout.endswith("last line\n")
    assert any(e.get("name") == "aten::addmm" for e in json.loads((tmp_path / "own.json").read_text())["traceEvents"])
    report = json.loads((tmp_path / "out" / "run.json").read_text())
    assert report["timing"]["steps"] == 4 and report["traced"] is None
    assert "the program started torch.profiler itself while perflab traced" in report["recorded"]["trace_note"]


def test_a_forked_child_neither_reports_nor_writes(tmp_path, capsys):
    # the child trains through every phase of perflab's (it would trace and report), then leaves; the parent, 3 steps
    prog = program(tmp_path, """
        import os, sys, torch
        torch.set_num_threads(1)
        m = torch.nn.Linear(8, 8); opt = torch.optim.SGD(m.parameters(), lr=0.1)
        pid = os.fork()
        if pid == 0:
            for i in range(12):
                m(torch.randn(4, 8)).sum().backward(); opt.step()
            os._exit(0)
        os.waitpid(pid, 0)
        for i in range(3):
            m(torch.randn(4, 8)).sum().backward(); opt.step()
        print("parent done")
    """)
    rendered = tmp_path / "rendered"
    code, report = run(tmp_path, prog, skip=2, steps=4, trace=1, render=lambda report: rendered.write_text(str(os.getpid())))
    assert code == 0 and "parent done" in capsys.readouterr().out
    assert not rendered.exists() and not (tmp_path / "out" / "trace.json.gz").exists()
    assert report["partial"] and report["recorded"]["steps_seen"] == 3 and report["timing"]["steps"] == 1


def test_hogwild_workers_neither_report_nor_write(tmp_path, capsys):
    # torch.multiprocessing's Hogwild: two forked workers train the shared model through every phase of perflab's,
    # then the parent trains 3 steps of its own
    prog = program(tmp_path, """
        import os, torch, torch.multiprocessing as mp
        torch.set_num_threads(1)
        def train(model, steps):
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            for i in range(steps):
                model(torch.randn(4, 8)).sum().backward(); opt.step(); opt.zero_grad()
        if __name__ == "__main__":
            model = torch.nn.Linear(8, 8); model.share_memory()
            workers = [mp.get_context("fork").Process(target=train, args=(model, 12)) for _ in range(2)]
            for w in workers: w.start()
            for w in workers: w.join()
            train(model, 3)
            print("exit codes", [w.exitcode for w in workers])
    """)
    rendered = tmp_path / "rendered"
    code, report = run(tmp_path, prog, skip=2, steps=4, trace=1, render=lambda report: rendered.write_text(str(os.getpid())))
    assert code == 0 and "exit codes [0, 0]" in capsys.readouterr().out
    assert not rendered.exists() and not (tmp_path / "out" / "trace.json.gz").exists()
    assert report["partial"] and report["recorded"]["steps_seen"] == 3


def test_a_program_that_changes_directory_gets_its_run_json_where_the_run_began(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    prog = program(tmp_path, trains(40, """    if i == 1:
        import os; os.chdir("elsewhere")
    if i == 34:
        raise ValueError("bad batch")"""))
    code = api.run([str(prog)], out_dir="out", skip=2, steps=4, trace=1)
    err = capsys.readouterr().err
    assert code == 1
    report = json.loads((tmp_path / "out" / "run.json").read_text())
    assert report["traced"]["trace_path"] == str(tmp_path / "out" / "trace.json.gz")
    assert not (tmp_path / "elsewhere" / "out").exists()
    # the raise is in the program's 35th step (34 optimizer steps before it), well after perflab's report
    assert err.strip().splitlines()[-1] == (f"perflab: the program raised an exception at step 35, after perflab's report of its steps "
                                            f"was written to {tmp_path / 'out' / 'run.json'}")


@pytest.mark.parametrize("own", [
    "sys.setprofile(lambda frame, event, arg: calls.append(event))",  # chained: the program's and perflab's see every call
    "sys.settrace(lambda frame, event, arg: calls.append(event))",  # another hook than perflab's
])
def test_a_program_that_sets_its_own_profile_or_trace_function_keeps_its_steps_found(tmp_path, own, capsys):
    prog = program(tmp_path, f"""
        import sys
        calls = []
        def step(i):
            return sum(range(200))
        for i in range(40):
            if i == 8:
                {own}
            step(i)
        sys.setprofile(None); sys.settrace(None)
        print("own hook saw", len(calls) > 0)
    """)
    code, report = run(tmp_path, prog, step="step", skip=2, steps=30, trace=0)
    assert code == 0 and "own hook saw True" in capsys.readouterr().out
    assert not report["partial"] and report["recorded"]["steps_seen"] == 32 and report["timing"]["steps"] == 30


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12+ finds --step through sys.monitoring, which cProfile leaves alone")
def test_a_c_profiler_that_replaces_perflabs_step_finder_is_said(tmp_path, capsys):
    prog = program(tmp_path, """
        import cProfile
        def step(i):
            return sum(range(200))
        own = cProfile.Profile()
        for i in range(40):
            if i == 8:
                own.enable()
            step(i)
        own.disable()
        print("done")
    """)
    code, report = run(tmp_path, prog, step="step", skip=2, steps=30, trace=0)
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 0 and report["partial"]
    # 8 calls seen: 7 steps (a step is the period from one call's start to the next's)
    assert "exited with code 0 after 7 step(s)" in lines[-2]
    assert lines[-1].startswith("perflab: the program replaced perflab's sys.setprofile function (a profiler or debugger of its own, "
                                "such as cProfile) after step 7: later calls of step were not seen")
    assert report["perflab_notes"] == [lines[-1][len("perflab: "):]]


def test_sigterm_in_a_timed_step_writes_what_was_measured_and_exits_143(tmp_path, capsys):
    # the program checks that someone took SIGTERM before it sends it: left at its default it would end the test process
    prog = program(tmp_path, trains(40, """    if i == 6:
        import os, signal
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            raise RuntimeError("SIGTERM left at its default")
        os.kill(os.getpid(), signal.SIGTERM)"""))
    code, report = run(tmp_path, prog, skip=2, steps=20, trace=1)
    err = capsys.readouterr().err
    assert code == 143 and "Traceback" not in err
    (line,) = err.strip().splitlines()
    assert line.startswith("perflab: the program was terminated (SIGTERM) after 6 step(s)") and "4 timed step(s) written to" in line
    assert report["partial"] and report["ended_by"] == "sigterm" and report["exit_code"] == 143 and report["timing"]["steps"] == 4
    import signal

    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # given back


@pytest.mark.parametrize("what, source", [
    ("a syntax error", "import torch\ndef f(:\n    pass\n"),
    ("a text file", "These are my notes about the training run.\n"),
])
def test_a_program_that_cannot_start_is_its_syntax_error_as_python_shows_it_and_one_line(tmp_path, capsys, what, source):
    prog = program(tmp_path, source)
    alone = subprocess.run([sys.executable, str(prog.resolve())], capture_output=True, text=True)
    with pytest.raises(PerflabError) as raised:
        api.run([str(prog)], out_dir=tmp_path / "out")
    assert raised.value.exit_code == 2
    assert str(raised.value).startswith(f"{prog}: the program cannot start: SyntaxError at line ")
    assert capsys.readouterr().err == alone.stderr  # python's own lines, no perflab frame
    assert not (tmp_path / "out").exists()


def test_a_module_that_is_not_found_cannot_start(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PerflabError, match="^-m no_such_module_here: the program cannot start: No module named no_such_module_here; nothing was run$"):
        api.run(["-m", "no_such_module_here"], out_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_step_function_that_never_matched_names_what_the_program_did(tmp_path, capsys):
    prog = program(tmp_path, """
        import torch
        m = torch.nn.Linear(8, 8); opt = torch.optim.AdamW(m.parameters())
        def train_step():
            m(torch.randn(4, 8)).sum().backward(); opt.step(); opt.zero_grad()
        for i in range(60):
            train_step()
    """)
    code, report = run(tmp_path, prog, step="train_stp", skip=2, steps=4, trace=1)
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert code == 0
    assert line.startswith("perflab: --step train_stp never matched a call; the program's own functions called: train_step; "
                           "60 optimizer step(s) were seen (AdamW): without --step/--step-range they are the steps; the program exited with code 0")
    assert "no step boundary" not in line


def test_a_step_range_that_never_matched_names_the_ranges_seen(tmp_path, capsys):
    prog = program(tmp_path, """
        import torch
        from torch.autograd.profiler import record_function
        for i in range(10):
            with record_function("decode"):
                torch.randn(4, 4).sum()
    """)
    code, report = run(tmp_path, prog, step_range="BENCH", skip=0, steps=4, trace=1)
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert code == 0
    assert line.startswith("perflab: --step-range BENCH never matched a range; the ranges opened: 'decode'; no torch optimizer stepped; "
                           "the program exited with code 0")


def test_a_compiled_step_function_gets_its_report_not_dynamo_tracing_perflab(tmp_path, capsys):
    # the hook runs at the compiled function's return, where dynamo would trace perflab's own report code as the
    # program's (and fail in numpy)
    prog = program(tmp_path, """
        import torch
        @torch.compile(backend="eager")
        def decode_step(x):
            return torch.tanh(x @ x)
        x = torch.randn(8, 8)
        for i in range(10):
            decode_step(x)
        print("last line")
    """)
    code, report = run(tmp_path, prog, step="decode_step", skip=2, steps=4, trace=1)
    captured = capsys.readouterr()
    assert code == 0 and captured.out.endswith("last line\n") and "perflab" not in captured.err
    assert not report["partial"] and report["timing"]["steps"] == 4 and report["traced"]["steps"] == 1


def test_a_step_source_records_only_in_its_guards_process():
    """The run's Guard says which process is perflab's (Guard.owner); a step in any other (a forked child) is not the run's."""
    from perflab.program.boundaries import StepSource
    from perflab.program.guard import Guard

    class Steps(StepSource):
        def _install(self):
            pass

        def _remove(self):
            pass

    ours, child = Guard(), Guard()
    child.pid = os.getpid() + 1  # as a forked child sees the guard of the process that started the run
    recorded = []
    for guard in (ours, child, None):
        source = Steps()
        source.on_start, source.on_end = lambda: recorded.append("start"), lambda: recorded.append("end")
        source.install(guard)
        source._began(), source._ended(), source._ended()
        recorded.append(source.seen)
    assert recorded == ["start", "end", "end", 2, 0, "start", "end", "end", 2]


def test_a_step_call_that_raises_ends_its_step_under_sys_monitoring(monkeypatch):
    """On Python ≥ 3.12 --step is found through sys.monitoring (planted here: this suite runs on 3.11), where a call that
    raises ends with PY_UNWIND, not PY_RETURN. A step the program catches an exception from (an OOM it retries) ends
    there, as under sys.setprofile, and the next call is a step of its own, not nested inside it."""
    import types

    from perflab.program.boundaries import FunctionSteps

    callbacks: dict = {}
    events = types.SimpleNamespace(PY_START=1, PY_RETURN=2, PY_UNWIND=4)
    monitoring = types.SimpleNamespace(
        events=events, DISABLE=object(), OPTIMIZER_ID=5, PROFILER_ID=2, get_tool=lambda tool: None,
        use_tool_id=lambda tool, name: None, free_tool_id=lambda tool: None, set_events=lambda tool, mask: None,
        register_callback=lambda tool, event, function: callbacks.__setitem__(event, function))
    monkeypatch.setattr(sys, "monitoring", monitoring, raising=False)

    def decode_one_token():
        pass

    code = decode_one_token.__code__
    source = FunctionSteps("decode_one_token")
    ended, returned = [], []
    source.on_end = lambda: ended.append(source.seen)
    source.on_call_end = lambda: returned.append(source.calls)
    source.install()
    try:
        callbacks[events.PY_START](code, 0)  # the first call raises
        if events.PY_UNWIND in callbacks:
            callbacks[events.PY_UNWIND](code, 0, RuntimeError("CUDA out of memory"))
        callbacks[events.PY_START](code, 0)  # the retry returns
        callbacks[events.PY_RETURN](code, 0, None)
    finally:
        source.close()
    # the raising call returned (unwound), so the retry's start ends the step the first call began: one step, two calls
    # (without PY_UNWIND the retry would nest inside the first call and no step would end)
    assert ended == [1] and returned == [1, 2] and callbacks[events.PY_UNWIND] is None
