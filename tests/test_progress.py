"""Progress on stderr (report.progress): a bar on a terminal, a line every PERFLAB_PROGRESS_S seconds otherwise; each
drawer on a fake terminal and a fake pipe with a fake clock, and each command kind's lines in a pipe, end to end."""

import io
import re
import time
from types import SimpleNamespace

import pytest
from rich.console import Console

from cli_util import assert_progress_lines, run_cli_here
from perflab.measure.stages import TIMING, Stage
from perflab.report import progress as pr


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def pipe():
    buffer = io.StringIO()
    return Console(file=buffer, width=200, highlight=False, color_system=None), buffer


def terminal():
    buffer = io.StringIO()
    return Console(file=buffer, force_terminal=True, width=200, color_system=None), buffer


def lines_of(buffer):
    """The lines written, a terminal's redrawn bars each a line of its own, without the terminal's control codes."""
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", buffer.getvalue())
    return [line for line in re.split(r"[\r\n]", text) if line.strip()]


def case(label):
    return SimpleNamespace(label=lambda: label)


def test_the_interval_is_ten_seconds_or_the_environments():
    assert pr.interval_s({}) == 10.0
    assert pr.interval_s({"PERFLAB_PROGRESS_S": "0.5"}) == 0.5
    from perflab.errors import PerflabError

    for bad in ("0", "-1", "soon", "inf"):
        with pytest.raises(PerflabError, match="PERFLAB_PROGRESS_S"):
            pr.interval_s({"PERFLAB_PROGRESS_S": bad})


def test_the_time_left_is_the_pace_so_far():
    assert pr.time_left_s(30.0, 1, 4) == 90.0
    assert pr.time_left_s(30.0, 0, 4) is None  # nothing done: no pace yet
    assert pr.time_left_s(30.0, 4, 4) == 0.0
    assert [pr.clock_text(s) for s in (0, 42.9, 725, 3723)] == ["0:00", "0:42", "12:05", "1:02:03"]


def test_a_pipe_gets_a_line_per_interval_and_one_at_the_end_and_short_work_none():
    clock = FakeClock()
    console, buffer = pipe()
    meter = pr.meter(console, "bench", "cases", clock=clock, interval=10.0, ticker=False)
    assert isinstance(meter, pr.LineMeter)
    meter.start(4)
    for t, done in ((3, 0.5), (9.9, 1)):  # events within the interval: no line
        clock.now = 1000.0 + t
        meter.update(done=done, description="tiny bs1: warmup")
    assert len(lines_of(buffer)) == 0  # nothing for work shorter than the interval: a command that fails at once keeps its one line
    clock.now = 1010.0
    meter.update(done=1, description="tiny bs1: timing")
    clock.now = 1015.0
    meter.update(done=2, description="tiny bs2: build")  # 5 s after the last line: none
    clock.now = 1020.0
    meter.update(description="tiny bs2: warmup")
    clock.now = 1031.0
    meter.finish()
    assert lines_of(buffer) == ["perflab bench: 1/4 cases, 0:10 elapsed, about 0:30 left: tiny bs1: timing",
                                "perflab bench: 2/4 cases, 0:20 elapsed, about 0:20 left: tiny bs2: warmup",
                                "perflab bench: 2/4 cases, 0:31 elapsed, about 0:31 left: done"]
    meter.finish()  # said once
    assert len(lines_of(buffer)) == 3
    short, buffer = pipe()
    quick = pr.meter(short, "bench", "cases", clock=clock, interval=10.0, ticker=False)
    quick.start(1)
    clock.now += 2
    quick.finish("stopped")
    assert lines_of(buffer) == []


def test_the_lines_thread_says_a_long_stage_still_runs_and_stops_with_the_meter():
    console, buffer = pipe()
    meter = pr.meter(console, "explain", "parts", interval=0.05)
    meter.start(2, "profiling eager")
    time.sleep(0.4)  # no event at all: the thread's lines
    meter.finish()
    said = lines_of(buffer)
    assert 4 <= len(said) <= 10, said
    assert all(line.startswith("perflab explain: 0/2 parts, 0:00 elapsed: ") for line in said)
    assert said[-1].endswith(": done") and sum(line.endswith("profiling eager") for line in said) == len(said) - 1
    time.sleep(0.15)
    assert len(lines_of(buffer)) == len(said)  # nothing after the end


def test_a_terminal_gets_a_bar_with_done_elapsed_and_left_and_no_lines():
    clock = FakeClock()
    console, buffer = terminal()
    meter = pr.meter(console, "bench", "cases", clock=clock, auto_refresh=False, interval=0.01)
    assert isinstance(meter, pr.BarMeter)
    meter.start(4)
    clock.now += 30
    meter.update(done=1, description="gpt [bs8]: warmup")  # a label's brackets are text, not markup
    drawn = buffer.getvalue()
    assert "gpt [bs8]: warmup" in drawn and "1/4 cases" in drawn and "0:00:30" in drawn and "about 1:30 left" in drawn
    meter.note("oom: gpt [bs8]: CUDA out of memory")
    meter.finish()
    assert meter.progress is None
    assert "oom: gpt [bs8]: CUDA out of memory" in buffer.getvalue()
    assert "perflab bench:" not in buffer.getvalue()  # a terminal gets no lines


def test_bench_cases_are_half_done_when_built_and_whole_when_timed():
    """Alone: build → timing (half) → the next case's build (whole). Together: every case built (half each), then the
    rounds take them to whole. With processes: each process counts the cases again."""
    alone = pr.CaseProgress(2)
    alone.hear(0, "build")
    alone.hear(0, "warmup")
    assert alone.done == 0
    alone.hear(0, TIMING)
    assert alone.done == 0.5
    alone.hear(1, "build")
    assert alone.done == 1.0
    alone.hear(1, TIMING)
    assert alone.done == 1.5

    together = pr.CaseProgress(3, processes=2)
    for i in range(3):
        together.hear(i, "build")
        together.hear(i, "warmup")
    assert together.done == 1.0 and together.total == 6  # two built, the third still warming
    together.hear(0, Stage("timing 3 cases together, round 1/4", "round", 0, 4, (0, 1, 2)))
    assert together.done == 1.5
    together.hear(0, Stage("timing 3 cases together, round 3/4", "round", 2, 4, (0, 1, 2)))
    assert together.done == 2.25
    together.hear(0, Stage("process 2/2", "process", 1, 2))
    assert together.done == 3.0


def test_bench_progress_in_a_pipe_and_on_a_terminal():
    clock = FakeClock()
    cases = [case("tiny bs1"), case("tiny bs2")]
    console, buffer = pipe()
    with pr.BenchProgress(console, cases, clock=clock, interval=10.0, ticker=False) as on_case:
        on_case(0, cases[0], "build")
        clock.now += 10
        on_case(1, cases[1], "build")
        clock.now += 10
        on_case(0, cases[0], Stage("timing 2 cases together, round 2/2", "round", 1, 2, (0, 1)))
        clock.now += 10
    assert lines_of(buffer) == ["perflab bench: 0/2 cases, 0:10 elapsed, about 0:30 left: tiny bs2: build",
                                "perflab bench: 1/2 cases, 0:20 elapsed, about 0:06 left: timing 2 cases together, round 2/2",
                                "perflab bench: 2/2 cases, 0:30 elapsed: done"]
    console, buffer = terminal()
    with pr.BenchProgress(console, cases, processes=3, clock=clock, auto_refresh=False) as on_case:
        on_case(0, cases[0], "build")
        clock.now += 10
        on_case(0, cases[0], TIMING)
        assert "tiny bs1: timing" in buffer.getvalue() and "0/6 case runs" in buffer.getvalue()
        assert "about 1:50 left" in buffer.getvalue()
    assert on_case.meter.progress is None


def test_explain_progress_counts_parts_and_the_cases_of_a_timing_session():
    clock = FakeClock()
    for console, buffer in (pipe(), terminal()):
        with pr.ExplainProgress(console, clock=clock, interval=10.0, ticker=False, auto_refresh=False) as drawer:
            drawer.on_stage(Stage("measuring this GPU's ceilings", "part", 0, 4))
            clock.now += 10
            drawer.on_stage(Stage("gpt: timing eager, 1 mode(s) and 1 fix(es) together", "part", 1, 4, range(3)))
            drawer.on_stage("gpt: compiling in a child process within 60 s")  # words alone: no part
            for i in range(3):
                drawer.on_case(i, case(f"gpt {i}"), "build")
            clock.now += 10
            drawer.on_case(0, case("gpt 0"), Stage("timing 3 cases together, round 1/2", "round", 0, 2, (0, 1, 2)))
            if console.is_terminal:
                assert "1/4 parts" in buffer.getvalue() and "timing 3 cases together, round 1/2" in buffer.getvalue()
        if not console.is_terminal:
            assert lines_of(buffer) == ["perflab explain: 1/4 parts, 0:10 elapsed, about 0:30 left: gpt: timing eager, 1 mode(s) and 1 fix(es) together",
                                        # the session's 3 cases built, half done each: 1.5 parts of 4 in 20 s
                                        "perflab explain: 1/4 parts, 0:20 elapsed, about 0:33 left: timing 3 cases together, round 1/2",
                                        "perflab explain: 4/4 parts, 0:20 elapsed: done"]


def test_the_sweep_drawers_say_what_resumes_each_row_not_ok_and_their_progress():
    """Every sweep drawer, on a terminal and in a pipe: the resume (or reuse) line, a line per row not ok naming its case
    (and its version and round), nothing for an ok row; in a pipe, the progress lines around them."""
    sweep_case = case("tiny bs1 fp32 eager")
    ok, oom = {"status": "ok"}, {"status": "oom", "message": "CUDA out of memory [at 2 GiB]"}
    failed = f"oom: {sweep_case.label()}: CUDA out of memory [at 2 GiB]"
    for console, buffer in (terminal(), pipe()):
        clock = FakeClock()
        options = dict(clock=clock, interval=10.0, ticker=False, auto_refresh=False)
        for drawer in (pr.SweepProgress(console, **options), pr.ClusterProgress(console, **options)):
            drawer("start", total=3, skipped=1, to_run=2, env_key="abc123", slots=["w0"])
            for row in (ok, oom):
                drawer("case_start", case=sweep_case, slot="w0")
                clock.now += 10
                drawer("case_done", case=sweep_case, row=row, slot="w0")
            drawer("finish", summary=SimpleNamespace(interrupted=False))
            assert getattr(drawer.meter, "progress", None) is None
        a, b = SimpleNamespace(name="A"), SimpleNamespace(name="B")
        versions = pr.VersionsProgress(console, what="ab", **options)
        versions("start", total=2, reused=3, versions=[a, b], rounds=1)
        versions("process_start", case=sweep_case, version=a, round=0)
        clock.now += 10
        versions("process_done", case=sweep_case, version=a, round=0, row=ok)
        versions("process_start", case=sweep_case, version=None, round=1)
        clock.now += 10
        versions("process_done", case=sweep_case, version=None, round=1, row=None, rows=[ok, dict(oom, label="bs8")], row_versions=[a, b])
        versions("finish", summary=SimpleNamespace(interrupted=True))
        said = lines_of(buffer)
        kept = [line for line in said if not line.startswith("perflab ")] if not console.is_terminal else \
            [line for line in said if line.startswith(("resuming", "oom", "reusing"))]
        assert kept == ["resuming: 1 of 3 cases already stored (environment abc123); running 2", failed] * 2 + [
            "reusing 3 stored row(s) (a case at a version)", "oom: B round 2: bs8: CUDA out of memory [at 2 GiB]"]
        if not console.is_terminal:
            lines = [line for line in said if line.startswith("perflab ")]
            assert lines[:3] == ["perflab sweep: 1/2 cases, 0:10 elapsed, about 0:10 left: …",
                                 "perflab sweep: 2/2 cases, 0:20 elapsed: …", "perflab sweep: 2/2 cases, 0:20 elapsed: done"]
            assert lines[-3:] == ["perflab ab: 1/2 processes, 0:10 elapsed, about 0:10 left: round 1, A: " + sweep_case.label(),
                                  "perflab ab: 2/2 processes, 0:20 elapsed: round 2, every version's cases, interleaved",
                                  "perflab ab: 2/2 processes, 0:20 elapsed: interrupted"]


def test_bench_in_a_pipe_says_its_progress(monkeypatch):
    """End to end: bench's stderr, a pipe, holds its start and end lines and, every PERFLAB_PROGRESS_S, the ones between."""
    monkeypatch.setenv("PERFLAB_PROGRESS_S", "0.05")
    r = run_cli_here("bench", "--model", "test:tiny", "--device", "cpu", "--batch-size", "1", "2", "--min-time", "0.3", "--warmup", "1",
                     "--format", "json")
    assert r.returncode == 0, r.stderr
    lines = assert_progress_lines(r.stderr, "bench", 2, "cases")
    assert any(re.search(r"1/2 cases, .* left: timing 2 cases together, round \d+/\d+$", line) for line in lines), lines
