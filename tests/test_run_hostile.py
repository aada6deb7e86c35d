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
from pathlib import Path

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


def test_the_report_of_the_traced_steps_is_made_in_a_process_of_its_own_while_the_program_runs_on(tmp_path, monkeypatch):
    """The report (the trace read back, analysed, run.json, the page, the console report) is made by program.report_job in
    another process, started at the boundary after the traced steps, so that none of that work lands in a step of the
    program (its own clock: benchmarks/own_clock_cpu.py); the run's end waits for it and reads its run.json; the trace is
    gzipped there too (the recorder wrote it plain)."""
    from perflab.program import report_job
    from perflab.report.program import StderrRender

    started = []
    real_start = report_job.start

    def start(job):
        process = real_start(job)
        started.append((process, job))
        return process

    monkeypatch.setattr(report_job, "start", start)
    # the program checks, in the iteration after the one whose boundary ends the traced steps, that the report is not made in it:
    # run.json holds only the timed steps (partial) until the job has written the whole report
    prog = program(tmp_path, trains(30, before=(
        "    if i == 11:\n"
        "        import json, pathlib, time\n"
        f"        d = json.loads(pathlib.Path({str(tmp_path / 'out' / 'run.json')!r}).read_text())\n"
        f"        pathlib.Path({str(tmp_path / 'seen.json')!r}).write_text(json.dumps({{'partial': d['partial'], 'traced': 'traced' in d}}))")))
    code, report = run(tmp_path, prog, skip=2, steps=4, trace=1, render=StderrRender())
    assert code == 0
    ((process, job),) = started
    assert process.pid != os.getpid() and process.returncode == 0  # another process, awaited at the run's end
    assert job.recorded.timing["steps"] == 4 and job.recorded.trace_path.endswith("trace.json.gz")
    # 2 skipped + 4 timed + 1 between + 1 profiler warm-up + 1 traced: the boundary of iteration 9's end starts the job
    assert json.loads((tmp_path / "seen.json").read_text()) == {"partial": True, "traced": False}
    assert report["partial"] is False and report["traced"]["steps"] == 1 and report["timing"]["steps"] == 4
    assert report["timing"]["median_ms"] == job.recorded.timing["median_ms"]  # the same figures, reported there
    out = tmp_path / "out"
    assert (out / "trace.json.gz").read_bytes()[:2] == b"\x1f\x8b" and not (out / "trace.json").exists()
    assert not (out / report_job.JOB_FILE).exists() and (out / "report.html").exists()


def test_a_report_process_that_fails_leaves_the_report_to_the_programs_own_process(tmp_path, monkeypatch, capsys):
    from perflab.program import report_job

    def start(job):  # a job that dies at once, as a killed one would
        return subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(9)"])

    monkeypatch.setattr(report_job, "start", start)
    prog = program(tmp_path, trains(12))
    code, report = run(tmp_path, prog, skip=2, steps=4, trace=1)
    err = capsys.readouterr().err
    assert code == 0 and "perflab: the report's own process failed (exit 9); the report is made in the program's process" in err
    assert report["partial"] is False and report["traced"]["steps"] == 1 and report["timing"]["steps"] == 4  # nothing lost
    assert (tmp_path / "out" / "trace.json.gz").read_bytes()[:2] == b"\x1f\x8b"


def test_a_run_json_that_cannot_be_written_is_said_after_the_program_which_ends_as_alone(tmp_path, capsys, monkeypatch):
    def full_disk(path, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("perflab.records.run_report.write_json", full_disk)  # every report's writer (records.run_report.save)
    # the full disk is this process's: the report is made here, not in a process of its own (program.report_job), whose
    # writer the patch does not reach (its own failure to write: the test below)
    monkeypatch.setattr("perflab.program.report_job.start", lambda job: None)
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


def test_hogwild_workers_are_followed_each_into_a_report_of_its_own_and_the_parents_stays_its_own(tmp_path, capsys):
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
    assert report["partial"] and report["recorded"]["steps_seen"] == 3  # the parent stepped: its report is the run's
    workers = [p for p in report["processes"][1:] if p["followed"]]
    assert [(p["kind"], p["target"], p["steps_seen"], p["exit_code"]) for p in workers] == [("process", "__main__.train", 12, 0)] * 2
    for p in workers:  # each worker's own report and trace, in its own folder
        mine = json.loads((tmp_path / "out" / f"proc{p['pid']}" / "run.json").read_text())
        assert mine["timing"]["steps"] == 4 and mine["run_id"] == report["run_id"] and mine["traced"]["steps"] == 1


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


def test_a_rank_count_the_host_cannot_run_is_one_line_and_creates_nothing(tmp_path):
    from cli_util import assert_one_line_error, run_cli_here

    prog = program(tmp_path, trains(3))
    for nproc in ("100000000000000000000", "1000000"):
        assert_one_line_error(run_cli_here("run", "--nproc", nproc, "--out", tmp_path / "o", "--", prog), "this host runs at most", "one rank per GPU")
    assert_one_line_error(run_cli_here("run", "--nproc", "0", "--out", tmp_path / "o", "--", prog), "at least 1")
    assert_one_line_error(run_cli_here("run", "--nproc", "1,1", "--out", tmp_path / "o", "--", prog), "distinct")
    assert not (tmp_path / "o").exists()
    assert_one_line_error(run_cli_here("run", "--inflation-limit", "100", "--", prog), "above 1 and below 100", "got 100")


def test_scaling_reads_over_the_first_count_given():
    from perflab.analysis.program import scaling_section

    def report(step):
        return {"timing": {"median_ms": step}, "flops": {"known": True, "flops_per_step": 1e9}}

    section = scaling_section({2: report(6.0), 1: report(10.0)})  # --nproc 2,1
    assert section["base"] == 2 and [row["nproc"] for row in section["rows"]] == [2, 1]
    assert section["rows"][1]["expected_ms"] == 6.0 and section["rows"][1]["efficiency"] == pytest.approx(0.6)


def test_a_count_whose_step_is_its_slowest_ranks_gives_that_ranks_ci_beside_it():
    """Under torchrun a count's step is its slowest rank's median; the CI printed beside it (the scaling row's, and the
    note on an efficiency above 1) is that rank's, never rank 0's, so that no step stands outside its own interval (the
    hostile round: 0.738 ms beside rank 0's 0.327-0.731)."""
    from perflab.analysis.program import scaling_section

    two = {"timing": {"median_ms": 0.52, "ci95_ms": [0.327, 0.731], "ci_coverage": 0.875}, "step_ms": 0.738, "slowest_rank": 1,
           "ranks": [{"rank": 0, "median_ms": 0.52, "ci95_ms": [0.327, 0.731], "ci_coverage": 0.875},
                     {"rank": 1, "median_ms": 0.738, "ci95_ms": [0.70, 0.78], "ci_coverage": 0.875}]}
    one = {"timing": {"median_ms": 0.60, "ci95_ms": [0.55, 0.65], "ci_coverage": 0.875}}
    section = scaling_section({2: two, 1: one})
    base, other = section["rows"]
    assert base["step_ms"] == 0.738 and base["ci95_ms"] == [0.70, 0.78] and other["ci95_ms"] == [0.55, 0.65]
    assert other["efficiency"] == pytest.approx(0.738 / 0.60)
    assert "(0.738 ms, CI ≥87.5% 0.700–0.780)" in section["note"], section["note"]


def test_a_rank_report_an_earlier_run_left_is_not_merged(tmp_path, monkeypatch):
    from perflab.program import ranks

    monkeypatch.setattr(ranks, "WAIT_S", 0.3)
    (tmp_path / "rank1").mkdir()
    (tmp_path / "rank1" / "rank.json").write_text(json.dumps({"run_id": "earlier", "timing": {"median_ms": 9.0}}))
    (tmp_path / "rank0").mkdir()
    (tmp_path / "rank0" / "rank.json").write_text(json.dumps({"run_id": "this", "timing": {"median_ms": 5.0}}))
    assert sorted(ranks._wait_for_ranks(tmp_path, 2, "this")) == [0]
    # a rank's timed steps, kept while its traced steps run, are not its report yet
    (tmp_path / "rank1" / "rank.json").write_text(json.dumps({"run_id": "this", "partial": True, "timing": {}}))
    assert sorted(ranks._wait_for_ranks(tmp_path, 2, "this")) == [0]
    (tmp_path / "rank1" / "rank.json").write_text(json.dumps({"run_id": "this", "partial": True, "exit_code": 1, "timing": {}}))
    assert sorted(ranks._wait_for_ranks(tmp_path, 2, "this")) == [0, 1]


def test_rank_0_stops_waiting_for_a_rank_whose_process_ended_without_its_report(tmp_path, monkeypatch, capsys):
    """A rank that exits (os._exit, a clean exit mid-run) before its traced steps' end writes no whole report; rank 0 read
    its rank.pid and stops waiting once that process is gone, instead of waiting WAIT_S (300 s) for it."""
    import time

    from perflab.program import ranks

    monkeypatch.setattr(ranks, "WAIT_S", 60.0)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    for r, pid in ((0, os.getpid()), (1, gone.pid)):
        (tmp_path / f"rank{r}").mkdir()
        (tmp_path / f"rank{r}" / ranks.PID_FILE).write_text(json.dumps({"pid": pid, "run_id": "this"}))
    (tmp_path / "rank0" / "rank.json").write_text(json.dumps({"run_id": "this", "timing": {"median_ms": 5.0}}))
    (tmp_path / "rank1" / "rank.json").write_text(json.dumps({"run_id": "this", "partial": True, "timing": {}}))  # its timed steps only
    ended: set = set()
    t0 = time.monotonic()
    assert sorted(ranks._wait_for_ranks(tmp_path, 2, "this", ended)) == [0] and ended == {1}
    assert time.monotonic() - t0 < 5
    merged = ranks.merge({0: ranks.read(tmp_path / "rank0" / "rank.json")}, 2, ended)
    assert merged["ranks_missing"] == [1]
    assert "perflab: rank(s) [1] ended (the process exited) before the report of the traced steps" in capsys.readouterr().err
    # a pid file of an earlier run, or of a process still running, is no reason to stop waiting
    monkeypatch.setattr(ranks, "WAIT_S", 0.3)
    (tmp_path / "rank1" / ranks.PID_FILE).write_text(json.dumps({"pid": gone.pid, "run_id": "earlier"}))
    ended = set()
    assert sorted(ranks._wait_for_ranks(tmp_path, 2, "this", ended)) == [0] and ended == set()
    (tmp_path / "rank1" / ranks.PID_FILE).write_text(json.dumps({"pid": os.getpid(), "run_id": "this"}))
    assert sorted(ranks._wait_for_ranks(tmp_path, 2, "this", ended)) == [0] and ended == set()


def test_a_program_that_dies_in_its_traced_steps_keeps_its_timed_steps(tmp_path):
    """os._exit inside the traced steps: nothing of perflab's runs after it, and the timed steps were written before
    the profiler started."""
    prog = program(tmp_path, trains(40, "    if i == 10:\n        import os; os._exit(0)"))  # 2 skipped, 6 timed, 1 warm-up, 1 of 3 traced
    done = run_cli("run", "--skip", "2", "--steps", "6", "--trace-warmup", "1", "--trace", "3", "--out", tmp_path / "o", "--", prog, timeout=120)
    assert done.returncode == 0
    report = json.loads((tmp_path / "o" / "run.json").read_text())
    assert report["partial"] and report["timing"]["steps"] == 6 and "exit_code" not in report and report["run_id"]


def test_a_failing_rank_is_one_line_with_its_exit_code_and_last_words(tmp_path):
    prog = program(tmp_path, trains(20, "    if i == 4 and __import__('os').environ.get('RANK') == '1':\n        raise RuntimeError('rank one gives up')"))
    done = run_cli("run", "--nproc", "2", "--skip", "1", "--steps", "6", "--trace", "0", "--out", tmp_path / "o", "--", prog, timeout=240)
    assert done.returncode != 0
    assert "ChildFailedError" not in done.stderr and "perflab FAILED" not in done.stderr
    line = [ln for ln in done.stderr.splitlines() if ln.startswith("perflab: rank 1 exited with code 1")]
    assert line and line[0].endswith(f"RuntimeError: rank one gives up (its report: {tmp_path / 'o' / 'rank1' / 'rank.json'})"), done.stderr[-2000:]
    assert "RuntimeError: rank one gives up" in done.stderr.split(line[0])[0]  # the rank's own traceback, as the program printed it


def test_a_step_function_called_in_a_thread_is_found(tmp_path):
    prog = program(tmp_path, """
        import threading, torch
        w = torch.randn(64, 64)
        def step(x):
            return (x @ w).relu().sum()
        def worker():
            for i in range(14):
                step(torch.randn(8, 64))
        t = threading.Thread(target=worker)
        t.start(); t.join()
    """)
    code, report = run(tmp_path, prog, step="step", skip=2, steps=6, trace=0)
    assert code == 0 and report["timing"]["steps"] == 6 and report["recorded"]["steps_seen"] >= 8


def test_without_shapes_no_operator_is_said_to_lack_a_formula():
    from perflab.program.report import run_report_checks

    flops = {"complete": False, "known": False, "shapes_recorded": False, "uncounted_ops": {"aten::mm": 3}, "uncounted_heavy_share": None}
    message = [c["message"] for c in run_report_checks({"flops": flops}) if c["flag"] == "flops_incomplete"][0]
    assert "no operator shapes were recorded" in message and "no FLOP formula" not in message


def test_a_program_that_raises_ends_the_processes_it_started(tmp_path, capsys):
    """Its child still running when the program raises: ended (SIGTERM), not left behind; its pid written for the test."""
    prog = program(tmp_path, f"""
        import multiprocessing as mp, time, torch
        def wait():
            time.sleep(60)
        if __name__ == "__main__":
            child = mp.get_context("fork").Process(target=wait)
            child.start()
            open({str(tmp_path / "pid")!r}, "w").write(str(child.pid))
            m = torch.nn.Linear(4, 4); opt = torch.optim.SGD(m.parameters(), lr=0.1)
            for i in range(3):
                m(torch.randn(2, 4)).sum().backward(); opt.step()
            raise RuntimeError("the program gives up")
    """)
    code, report = run(tmp_path, prog, skip=1, steps=1, trace=0)
    err = capsys.readouterr().err
    pid = int((tmp_path / "pid").read_text())
    assert code == 1 and "its processes still running were ended: " + str(pid) in err
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # gone (and reaped by multiprocessing)


def test_an_inflated_cpu_traces_operator_time_is_carried_to_the_untraced_step(tmp_path):
    """Many tiny operators: the profiler's cost per operator inflates the traced steps (×2.2-2.4 on this VM). The
    verdict's busy_ms is then the operators' share of the traced steps of the untraced median step, never the traced
    operator time (above the step it would describe), and says so; run.json keeps the traced figure beside it."""
    prog = program(tmp_path, """
        import torch
        torch.set_num_threads(1)
        w = [torch.randn(4, 4, requires_grad=True) for _ in range(4)]
        opt = torch.optim.SGD(w, lr=0.001)
        for i in range(16):
            x = torch.randn(4, 4)
            for _ in range(150):
                x = (x @ w[_ % 4]).tanh()
            x.sum().backward()
            opt.step(); opt.zero_grad()
    """)
    code, report = run(tmp_path, prog, skip=2, steps=4, trace=2)
    assert code == 0
    verdict, evidence = report["verdict"], report["verdict_evidence"]
    if not report["traced"]["inflated"]:
        pytest.skip(f"the traced steps ran ×{report['traced']['inflation']:.2f} the untraced ones here: not inflated")
    share, median = evidence["operator_share"], report["timing"]["median_ms"]
    assert verdict["busy_ms"] == pytest.approx(share * median) and verdict["busy_ms"] <= median
    assert evidence["traced_busy_ms"] > verdict["busy_ms"] and "the untraced median step" in verdict["busy_basis"]


def test_a_ctrl_c_to_perflab_alone_under_nproc_ends_torchrun_and_its_ranks(tmp_path):
    """SIGINT to the perflab process only (not its group, as `kill -INT` gives it): it exits 130, and torchrun and the
    ranks end with it instead of running on as orphans (the helper's hostile round saw them left)."""
    import signal
    import time

    prog = program(tmp_path, """
        import time, torch
        torch.set_num_threads(1)
        m = torch.nn.Linear(8, 8); opt = torch.optim.SGD(m.parameters(), lr=0.01)
        for i in range(2000):
            time.sleep(0.05); m(torch.randn(4, 8)).sum().backward(); opt.step()
    """)
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1] / "src"), OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "perflab", "run", "--nproc", "2", "--skip", "2", "--steps", "4", "--trace", "0",
                             "--out", str(out), "--", str(prog)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    pid_files = [out / f"rank{r}" / "rank.pid" for r in (0, 1)]
    deadline = time.monotonic() + 90
    # the report written (rank 0's run.json): the ranks now run on silently, as a long training job's would
    while not ((out / "run.json").exists() and all(p.exists() for p in pid_files)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert (out / "run.json").exists(), "the ranks never reported"
    time.sleep(1.0)
    ranks = [json.loads(p.read_text())["pid"] for p in pid_files]
    os.kill(proc.pid, signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        alive_after = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            alive_after = [pid for pid in ranks if Path(f"/proc/{pid}").exists()
                           and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"]
            if not alive_after:
                break
            time.sleep(0.2)
        for pid in alive_after:
            os.kill(pid, signal.SIGKILL)
        os.killpg(proc.pid, signal.SIGKILL) if proc.poll() is None else None
    assert proc.returncode == 130, err[-2000:]
    assert not alive_after, f"ranks {alive_after} still running 30 s after perflab exited"
    assert "Traceback (most recent call last)" not in err
