"""Host contention (measure.sched) on recorded /proc samples, the host flags' thresholds, the GPU-bound
exemption, and the timing thread's pinning (measure.pinning): on and off, refused, and not in case ids."""

import gc
import json
import os
import threading
from pathlib import Path

import pytest
import torch

from perflab.measure import sched
from perflab.measure.canary import (EXEMPT_KEY, HOST_BOUND_THRESHOLD, HOST_CONTENTION_FLAG, HOST_DRIFT_FLAG, Canary, canary_fields,
                                    mark_host_flags)
from perflab.measure.harness import run_case
from perflab.measure.pinning import HostOptions, choose_core, keep_off_timing_core, timing_thread
from perflab.spec import Case

DATA = Path(__file__).resolve().parent / "data" / "proc"
FAST = dict(device="cpu", min_time=0.1, warmup=1, repeats=6)
LINUX = hasattr(os, "sched_setaffinity") and os.path.exists("/proc/thread-self/schedstat")


def recorded(scenario: str) -> dict:
    d = DATA / scenario
    files = {name: (d / name).read_text() for name in ("schedstat_before", "schedstat_after", "stat_before", "stat_after")}
    return dict(files, meta=json.loads((d / "meta.json").read_text()))


# ---------------------------------------------------------------------------------------------------
# Parsing, on samples recorded on the 2-core development VM (tests/data/proc/record.py)


def test_schedstat_parsing_on_recorded_samples():
    idle, busy = recorded("idle"), recorded("contended")
    assert sched.parse_schedstat(idle["schedstat_before"]) == (79260113, 563247, 15)
    assert sched.parse_schedstat(idle["schedstat_after"]) == (1074372821, 3666776, 65)
    assert sched.parse_schedstat(busy["schedstat_after"]) == (1576298545, 507402498, 207)
    with pytest.raises(ValueError):
        sched.parse_schedstat("12 34")


def test_wait_and_steal_fractions_of_the_recorded_loops():
    idle, busy = recorded("idle"), recorded("contended")
    assert idle["meta"]["cpu"] == busy["meta"]["cpu"] == 1 and idle["meta"]["user_hz"] == 100

    def fractions(s, cpus):
        before = sched.HostSample(0.0, s["schedstat_before"], s["stat_before"])
        after = sched.HostSample(s["meta"]["wall_s"], s["schedstat_after"], s["stat_after"])
        return sched.contention(before, after, cpus, s["meta"]["user_hz"])

    # A 1 s busy loop alone on CPU 1: 3.1 ms waiting for a CPU; the same loop sharing CPU 1 with a busy process: half.
    alone, shared = fractions(idle, [1]), fractions(busy, [1])
    assert alone[sched.WAIT_KEY] == pytest.approx((3666776 - 563247) / 1e9 / idle["meta"]["wall_s"]) == pytest.approx(0.0031, abs=1e-4)
    assert shared[sched.WAIT_KEY] == pytest.approx((507402498 - 3666776) / 1e9 / busy["meta"]["wall_s"]) == pytest.approx(0.503, abs=1e-3)
    # Steal: CPU 1's line did not move (46 → 46 ticks); the all-CPU line moved one tick over 2 CPUs × 1 s × 100 Hz.
    assert sched.parse_steal(idle["stat_before"], [1]) == sched.parse_steal(idle["stat_after"], [1]) == 46
    assert sched.parse_steal(idle["stat_before"]) == 114 and sched.parse_steal(idle["stat_after"]) == 115
    assert sched.parse_steal(idle["stat_after"], [0, 1]) == 68 + 46
    assert alone[sched.STEAL_KEY] == 0.0 and shared[sched.STEAL_KEY] == 0.0
    assert fractions(idle, None)[sched.STEAL_KEY] == pytest.approx(1 / 100 / idle["meta"]["wall_s"] / 2) == pytest.approx(0.005, abs=1e-5)
    with pytest.raises(ValueError, match="cpu7"):
        sched.parse_steal(idle["stat_after"], [7])
    with pytest.raises(ValueError, match="no steal field"):
        sched.parse_steal("cpu  1 2 3 4\ncpu0 1 2 3 4\n")
    # Against the provisional thresholds: the shared loop is contention, the lone one is not.
    assert shared[sched.WAIT_KEY] > sched.HOST_WAIT_THRESHOLD > alone[sched.WAIT_KEY]


def test_thread_cpu_is_field_39_counted_after_the_command():
    fields = ["S"] + [str(i) for i in range(4, 39)] + ["5"] + ["0"] * 13  # fields 3.., field 39 = "5"
    assert sched.parse_thread_cpu("4242 (py thon) x) " + " ".join(fields)) == 5
    if LINUX:
        assert sched.current_cpu() in os.sched_getaffinity(0)


def test_missing_files_give_none_not_a_crash(monkeypatch, tmp_path):
    monkeypatch.setattr(sched, "SCHEDSTAT_PATH", str(tmp_path / "no_schedstat"))
    monkeypatch.setattr(sched, "STAT_PATH", str(tmp_path / "no_stat"))
    monkeypatch.setattr(sched, "THREAD_STAT_PATH", str(tmp_path / "no_thread_stat"))
    a, b = sched.sample(), sched.sample()
    assert sched.contention(a, b, {0}) == {sched.WAIT_KEY: None, sched.STEAL_KEY: None}
    row = run_case(Case("test:tiny", **FAST))
    assert row["status"] == "ok" and row[sched.WAIT_KEY] is None and row[sched.STEAL_KEY] is None
    assert row["host_cpu"] is None and row["host_canary_us"] > 0
    (judged,) = mark_host_flags([row])
    assert HOST_CONTENTION_FLAG not in judged["flags"]
    # Unreadable contents: None as well.
    bad = sched.HostSample(0.0, "garbage", "cpu x\n")
    assert sched.contention(bad, sched.HostSample(1.0, "1 2", "cpu x\n"), None, 100) == {sched.WAIT_KEY: None, sched.STEAL_KEY: None}


# ---------------------------------------------------------------------------------------------------
# The flags


def row(**kw):
    base = {"case_id": "c", "status": "ok", "mode": "eager", "label": "m bs1 eager", "flags": ["no_power"], "warnings": ["w"], "env_key": "e"}
    return dict(base, **kw)


def test_contention_thresholds():
    assert sched.HOST_WAIT_THRESHOLD == 0.05 and sched.HOST_STEAL_THRESHOLD == 0.02
    rows = [row(host_wait_frac=0.06, host_steal_frac=0.0), row(host_wait_frac=0.04, host_steal_frac=0.0),
            row(host_wait_frac=0.0, host_steal_frac=0.03), row(host_wait_frac=0.01, host_steal_frac=0.01),
            row(host_wait_frac=0.5, status="error"), row(host_wait_frac=None, host_steal_frac=None)]
    out = mark_host_flags(rows)
    assert [HOST_CONTENTION_FLAG in r["flags"] for r in out] == [True, False, True, False, False, False]
    assert out[0]["flags"] == ["no_power", HOST_CONTENTION_FLAG]
    assert "waited for a CPU 6.0% of the timed loop (threshold 5%)" in out[0]["warnings"][1]
    assert "stole 3.0% of its CPU time (threshold 2%)" in out[2]["warnings"][1]
    assert out[5] is rows[5]  # nothing to judge: the row itself
    twice = mark_host_flags(out)  # recomputed, not repeated
    assert [r["flags"] for r in twice] == [r["flags"] for r in out] and twice[0]["warnings"] == out[0]["warnings"]
    assert mark_host_flags(out, wait_threshold=0.10)[0]["flags"] == ["no_power"]  # stored rows follow the thresholds read with


def test_gpu_bound_rows_are_exempt_from_both_host_flags():
    assert HOST_BOUND_THRESHOLD == 0.5
    canaries = [100, 100, 100, 100, 130, 130, 130]
    fracs = [0.9, 0.9, 0.9, 0.9, 0.95, 0.2, None]  # launch-bound rows, a GPU-bound row (0.2), a row from before host_bound_frac
    rows = [row(case_id=f"c{i}", label=f"row{i}", host_canary_us=c, host_bound_frac=f, host_wait_frac=0.2 if i >= 4 else 0.0)
            for i, (c, f) in enumerate(zip(canaries, fracs))]
    out = mark_host_flags(rows)  # median canary 100: the 130s are 1.30×, waits 20%
    flags = [[f for f in r["flags"] if f != "no_power"] for r in out]
    assert flags[:4] == [[], [], [], []]
    assert flags[4] == flags[6] == [HOST_DRIFT_FLAG, HOST_CONTENTION_FLAG]
    assert flags[5] == [] and out[5][EXEMPT_KEY] == [HOST_DRIFT_FLAG, HOST_CONTENTION_FLAG] and out[5]["warnings"] == ["w"]
    assert out[5]["host_canary_ratio"] == pytest.approx(1.3)  # its canary still counts in the median
    assert all(EXEMPT_KEY not in r for i, r in enumerate(out) if i != 5)
    # A GPU-bound row with nothing to waive is still named exempt; a failed row is not judged.
    (calm,) = mark_host_flags([row(host_bound_frac=0.1)])
    assert calm[EXEMPT_KEY] == []
    assert EXEMPT_KEY not in mark_host_flags([row(host_bound_frac=0.1, status="oom")])[0]
    from perflab.report.console import exempt_line

    line = exempt_line(out)
    assert line.startswith("Host flags (host_drift, host_contention) are not applied to 1 GPU-bound row(s), whose host issue time "
                           "is under 50% of the step time (a host up to 2× slower cannot lengthen them): row5")
    assert line.endswith("waived: row5: host_drift, host_contention.")
    assert exempt_line(rows) is None


def test_canary_fields_take_the_faster_of_before_and_after():
    before = Canary(130.0, 120.0, (130.0,), cpu_frac=0.6, cpu=3, cpu_end=3)
    after = Canary(100.0, 95.0, (100.0,), cpu_frac=0.99, cpu=3, cpu_end=2)
    f = canary_fields(before, after)
    assert f == {"host_canary_us": 100.0, "host_canary_before_us": 130.0, "host_canary_after_us": 100.0, "host_canary_min_us": 95.0,
                 "host_canary_cpu_frac": 0.6, "host_cpu": 3, "host_cpu_after": 2}
    assert canary_fields(before)["host_canary_us"] == 130.0 and canary_fields(before)["host_canary_after_us"] is None


# ---------------------------------------------------------------------------------------------------
# Pinning


@pytest.mark.skipif(not LINUX, reason="CPU affinity is Linux's")
def test_pin_on_and_off_seen_from_inside_the_step():
    from perflab.models.testing import Affinity

    everything = frozenset(os.sched_getaffinity(0))
    Affinity.seen.clear()
    pinned = run_case(Case("test:affinity", **FAST))
    assert pinned["status"] == "ok" and pinned["pinned_cpu"] == max(everything) and "pin_warning" not in pinned
    steps = Affinity.seen[:]
    first = next(i for i, (aff, _, _) in enumerate(steps) if aff != everything)
    assert first >= 1 and all(aff == everything for aff, _, _ in steps[:first])  # the checks and the first call run before the pin
    # warm-up (1), the step estimate (3), the issue timing (3) and the timed loop: all on one core
    assert all(aff == {max(everything)} for aff, _, _ in steps[first:]) and len(steps) - first >= 1 + 3 + 3 + pinned["timed_iters"]
    assert sum(1 for _, _, gc_on in steps if not gc_on) >= pinned["timed_iters"]  # the collector is off in the timed loop
    assert steps[-1][1] == torch.get_num_threads()  # a CPU case keeps its intra-op threads
    assert frozenset(os.sched_getaffinity(0)) == everything and gc.isenabled()  # restored
    Affinity.seen.clear()
    free = run_case(Case("test:affinity", **FAST), host=HostOptions(pin=False))
    assert free["pinned_cpu"] is None and all(aff == everything for aff, _, _ in Affinity.seen)
    assert free["case_id"] == pinned["case_id"]  # a run option, not part of the case


@pytest.mark.skipif(not LINUX, reason="CPU affinity is Linux's")
def test_other_threads_are_kept_off_the_timing_core_and_put_back():
    everything = frozenset(os.sched_getaffinity(0))
    if len(everything) < 2:
        pytest.skip("one CPU: nowhere else to put the other threads")
    before = torch.get_num_threads()
    torch.set_num_threads(len(everything))  # the test processes run one thread (conftest): here, one a core, to be put back
    stop, seen = threading.Event(), {}
    sleeper = threading.Thread(target=stop.wait)
    sleeper.start()

    def helper():
        keep_off_timing_core()
        seen["helper"] = frozenset(os.sched_getaffinity(0))

    try:
        with timing_thread("cuda", HostOptions(pin_index=1)) as t:
            assert t.pinned_cpu == sorted(everything)[-2] and os.sched_getaffinity(0) == {t.pinned_cpu}
            assert t.threads == 1 == torch.get_num_threads()
            seen["sleeper"] = frozenset(os.sched_getaffinity(sleeper.native_id))
            h = threading.Thread(target=helper)
            h.start()
            h.join()
        assert seen["sleeper"] == seen["helper"] == everything - {t.pinned_cpu}
        assert frozenset(os.sched_getaffinity(sleeper.native_id)) == everything == frozenset(os.sched_getaffinity(0))
        assert torch.get_num_threads() != 1 or os.cpu_count() == 1
        assert torch.get_num_threads() == len(everything)  # put back as it was
    finally:
        stop.set()
        sleeper.join()
        torch.set_num_threads(before)
    with timing_thread("cuda", HostOptions(pin=False, one_thread=False)) as t:
        assert t.pinned_cpu is None and os.sched_getaffinity(0) == everything and t.threads == torch.get_num_threads()
    assert choose_core({0, 1, 2, 3}) == 3 and choose_core({0, 1, 2, 3}, 1) == 2 and choose_core({4, 9}, 3) == 4


@pytest.mark.skipif(not LINUX, reason="CPU affinity is Linux's")
def test_a_refused_pin_runs_unpinned_with_a_warning(monkeypatch):
    def refuse(pid, cpus):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setaffinity", refuse)
    row = run_case(Case("test:tiny", **FAST))
    assert row["status"] == "ok" and row["pinned_cpu"] is None
    assert row["pin_warning"].startswith("could not pin the timing thread to CPU") and "Operation not permitted" in row["pin_warning"]


def test_pinning_is_not_in_case_ids_and_a_spec_can_turn_it_off(tmp_path):
    from perflab.errors import PerflabError
    from perflab.sweep.runner import pin_index, worker_args
    from perflab.sweep.spec import Experiment, parse_experiment

    spec = {"defaults": {"device": "cpu"}, "grid": {"model": ["test:tiny"], "batch_size": [1, 2]}}
    pinned = parse_experiment(spec, "x.yaml")
    free = parse_experiment(dict(spec, harness={"pin": False}), "x.yaml")
    assert pinned.pin and not free.pin
    assert [c.id for c in pinned.cases] == [c.id for c in free.cases] == [Case("test:tiny", batch_size=b, device="cpu").id for b in (1, 2)]
    assert "--no-pin" in worker_args(free, tmp_path) and "--no-pin" not in worker_args(pinned, tmp_path)
    assert Experiment.from_json(free.to_json()).pin is False and Experiment.from_json({"cases": []}).pin is True
    assert [pin_index(s) for s in ("w0", "w1", "gpu3", "ray")] == [0, 1, 3, 0]
    with pytest.raises(PerflabError, match=r"^x.yaml: harness.pin: expected true or false, got 'no'$"):
        parse_experiment(dict(spec, harness={"pin": "no"}), "x.yaml")


@pytest.mark.skipif(not LINUX, reason="CPU affinity is Linux's")
def test_cli_no_pin_times_unpinned_under_the_same_case_id():
    from cli_util import run_cli_here

    args = ("bench", "--model", "test:tiny", "--device", "cpu", "--min-time", "0.1", "--warmup", "1", "--repeats", "5", "--format", "json")
    pinned, free = run_cli_here(*args), run_cli_here(*args, "--no-pin")
    assert pinned.returncode == free.returncode == 0, (pinned.stderr, free.stderr)
    a, b = json.loads(pinned.stdout.splitlines()[-1]), json.loads(free.stdout.splitlines()[-1])
    assert a["case_id"] == b["case_id"] and a["pinned_cpu"] == max(os.sched_getaffinity(0)) and b["pinned_cpu"] is None
    for key in ("host_wait_frac", "host_steal_frac", "host_bound_frac", "host_canary_before_us", "host_canary_after_us"):
        assert 0 <= a[key] < 1e6 and 0 <= b[key] < 1e6, key
    assert a["host_bound_frac"] > HOST_BOUND_THRESHOLD  # a CPU step runs where it is issued: never exempt


def test_report_and_results_say_which_rows_were_exempt(tmp_path, monkeypatch):
    from cli_util import run_cli_here
    from test_report_markdown import BASE, SEED_001, synthetic_row

    from perflab.report.markdown import write_report
    from perflab.sweep.store import Store

    # bs 1, 2, 4 launch-bound eager rows; bs 8 GPU-bound (0.2) with a slow canary and a 30% wait: exempt, both flags waived.
    with Store.create(tmp_path) as store:
        for bs, canary, frac, wait in ((1, 100.0, 0.9, 0.0), (2, 101.0, 0.9, 0.01), (4, 99.0, 0.9, 0.08), (8, 130.0, 0.2, 0.3)):
            row = synthetic_row(BASE, 224, bs, SEED_001[bs][0])
            store.put(dict(row, host_canary_us=canary, host_bound_frac=frac, host_wait_frac=wait, host_steal_frac=0.0), "synthetic")
    text = write_report(tmp_path, n_boot=100).read_text()
    assert "`host_contention` marks a row whose timing thread waited for a CPU more than 5% of its timed loop, or lost more than 2% " \
           "to VM steal: 1 row(s) carry it." in text
    assert "No row carries it." in text  # host_drift: the only drifting row (1.30×) is exempt
    label = f"{BASE} 224px bs8 bf16 eager"
    assert (f"are not applied to 1 GPU-bound row(s), whose host issue time is under 50% of the step time (a host up to 2× slower "
            f"cannot lengthen them): {label}; waived: {label}: host_drift, host_contention.") in text
    monkeypatch.setenv("COLUMNS", "100")
    r = run_cli_here("results", tmp_path)
    assert r.returncode == 0, r.stderr
    assert "not applied to 1 GPU-bound row(s)" in r.stdout and "host_contention" in r.stdout
    assert max(len(line.rstrip()) for line in r.stdout.splitlines()) <= 100  # piped: the note wrapped, as the tables fit
