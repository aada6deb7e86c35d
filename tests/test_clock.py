"""perflab's one step clock (perflab.clock.StepClock) and the one tracer, and that nothing in src/ builds another."""

import re
import time
from pathlib import Path

import pytest

from perflab.clock import StepClock
from perflab.measure import timing
from perflab.measure.timing import TimingPlan

SRC = Path(__file__).resolve().parents[1] / "src" / "perflab"


def test_the_clocks_host_path_reads_the_same_ms_as_step_and_host_time_on_the_cpu():
    clock = StepClock(cuda=False)
    clock.reserve(2)  # events are made ahead on a GPU only
    a = clock.stamp()
    time.sleep(0.002)
    b = clock.stamp()
    step_ms, host_ms = clock.read(a, b)
    assert a[0] is None and b[0] is None
    assert step_ms == host_ms and step_ms >= 2.0
    assert clock.read((None, 1_000_000), (None, 3_500_000)) == (2.5, 2.5)
    assert clock.read_marks([(None, 0), (None, 1_000_000), (None, 4_000_000)]) == ([1.0, 3.0], [1.0, 3.0])
    assert clock.read_pairs([((None, 0), (None, 2_000_000))]) == ([2.0], [2.0])
    assert StepClock.reached(a)


def test_a_host_only_stamp_records_no_cuda_event_even_on_a_cuda_clock():
    """held_round's end of issuing: the host clock alone, nothing put on the stream (here no CUDA is touched)."""
    stamp = StepClock(cuda=True).stamp(on_device=False)
    assert stamp[0] is None and isinstance(stamp[1], int)
    assert StepClock.reached(stamp)


def test_time_step_on_the_cpu_gives_each_blocks_host_ms_per_step(monkeypatch):
    now = [0]
    monkeypatch.setattr(timing.time, "perf_counter_ns", lambda: now[0])

    def step():
        now[0] += 1_500_000  # 1.5 ms a step

    plan = TimingPlan(n_blocks=3, block_iters=2, extra=1)
    got = timing.time_step(step, plan, "cpu")
    assert got.samples_ms.tolist() == [1.5, 1.5, 1.5]
    assert got.timed_s == pytest.approx(7 * 1.5e-3)


def test_a_tracer_without_a_path_hands_torchs_summary_to_on_ready_and_writes_nothing(tmp_path, monkeypatch):
    import torch

    from perflab.trace.capture import Tracer

    monkeypatch.chdir(tmp_path)
    averages = []
    tracer = Tracer(None, "cpu", steps=1, warmup=0, on_ready=lambda prof: averages.extend(prof.key_averages()))
    tracer.start()
    try:
        torch.ones(4).mul_(3)
        assert tracer.step()
    finally:
        tracer.stop()
    assert tracer.written
    assert any(e.key == "aten::mul_" and e.count == 1 for e in averages)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("pattern, home", [(r"cuda\.Event\(", "clock.py"),
                                           (r"profiler\.profile\(|\bprofile\(activities", "trace/capture.py")])
def test_cuda_events_and_profiler_sessions_are_built_in_one_module_each(pattern, home):
    found = sorted({str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if re.search(pattern, p.read_text())})
    assert found == [home]


def test_host_samples_ns_times_each_call_alone_after_its_warmup(monkeypatch):
    """clock.host_samples_ns: the one host loop (ceilings' copy and eager launch, the canary): warm-up calls untimed,
    ``after`` outside each call's time."""
    import perflab.clock

    now = {"ns": 0}
    monkeypatch.setattr(perflab.clock.time, "perf_counter_ns", lambda: now["ns"])
    calls, cost = [], iter([100, 200, 1_000, 2_500, 4_000])

    def fn():
        calls.append("fn")
        now["ns"] += next(cost)

    def after():
        calls.append("after")
        now["ns"] += 10_000  # a synchronisation: not in the call's time

    assert perflab.clock.host_samples_ns(fn, 3, warmup=2, after=after) == [1_000, 2_500, 4_000]
    assert calls == ["fn", "fn", "fn", "after", "fn", "after", "fn", "after"]
    assert perflab.clock.host_samples_ns(fn, 0, warmup=0) == []


def test_the_host_loops_are_the_clocks():
    """No hand-written loop of perf_counter pairs around a call is left where host_samples_ns does it: ceilings' copy
    and eager launch cost, the canary."""
    for module in ("measure/ceilings.py", "measure/canary.py"):
        text = (SRC / module).read_text()
        assert "host_samples_ns(" in text and "t0 = time.perf_counter" not in text


def test_copy_gbps_on_the_cpu_is_bytes_over_the_fastest_copy(monkeypatch):
    from perflab.measure import ceilings

    monkeypatch.setattr(ceilings, "host_samples_ns", lambda fn, repeats, warmup=0, after=None: [2_000_000, 1_000_000, 3_000_000])
    # 2**20 bytes read and written in the fastest, 1 ms: 2.097152 GB/s
    assert ceilings.copy_gbps(nbytes=2**20, repeats=3, device="cpu") == 2 * 2**20 / 1e-3 / 1e9
    assert ceilings.copy_gbps(nbytes=2**16, repeats=2, device="cpu") > 0  # the real clock
