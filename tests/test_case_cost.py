"""What a case costs (issue 23, P9): the cuts, each with the numbers it must keep.

- The launcher: each case still a fresh process of its own (its own pid, a child of a launcher that never touched
  the GPU), a crash or a timeout in it still its status row, its start counted from the parent's request.
- The FLOP count: once per eager step in a sweep, the cached count equal to the uncached one.
- The held timing: bounded when its first round fails, later rounds starting where the first succeeded.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from perflab import api
from perflab.errors import PerflabError
from perflab.measure import host
from perflab.measure.flops import FlopCache, count_flops, count_flops_once, count_key
from perflab.spec import Case, validate_case
from perflab.sweep import launcher as launcher_mod
from perflab.sweep import runner
from perflab.sweep.launcher import Launcher, choose_launcher

FAST = {"device": "cpu", "input_size": 32, "warmup": 1, "iters": 5, "repeats": 5}
TINY_LM = dict(d_model=64, d_ff=96, n_layers=2, n_heads=4, vocab_size=97, context_length=32)


def _worker_argv(case: Case, result) -> list[str]:
    return ["--case", json.dumps(case.to_dict()), "--result", str(result)]


def test_the_launchers_children_are_fresh_processes_each_with_its_own_pid(tmp_path):
    cases = [Case("test:tiny", batch_size=b, **FAST) for b in (1, 2, 3)]
    pids = []
    with Launcher(label=str(tmp_path)) as launcher:
        ready = launcher.wait_ready()
        assert not ready.get("refused") and ready["ready"] == launcher.proc.pid
        # no thread of its own beside numpy's OpenBLAS pool (which stops around a fork): a child copies no thread's locks
        assert ready["threads"] is None or ready["threads"] <= 1 + (os.cpu_count() or 1)
        assert "torch._dynamo" in ready["preloaded"] and "perflab.measure.harness" in ready["preloaded"]
        for case in cases:
            log = tmp_path / f"{case.id}.log"
            log.write_text("# header\n")
            child = launcher.start(_worker_argv(case, tmp_path / f"{case.id}.json"), runner.slot_env("w0"), log)
            assert child.wait(timeout=120) == 0
            pids.append(child.pid)
            text = log.read_text()
            assert text.startswith("# header\n") and "stage: timing" in text  # its output appended to the case's log
            forked = re.search(r"forked by the sweep's launcher \(pid (\d+)\): pid (\d+)", text)
            assert forked and int(forked.group(1)) == launcher.proc.pid and int(forked.group(2)) == child.pid
            row = json.loads((tmp_path / f"{case.id}.json").read_text())
            assert row["status"] == "ok" and row["batch_size"] == case.batch_size
            assert row["cost_s"]["start_and_imports"] < 5.0  # a fork, not an interpreter and torch's import
    # a different process from the parent, from the launcher, and from every earlier child
    assert len(set(pids)) == 3 and os.getpid() not in pids and launcher.proc.pid not in pids
    assert launcher.proc.returncode == 0  # closing the pipe ends the launcher


def test_a_child_whose_launcher_dies_ends_with_it_and_is_reported_at_once(tmp_path):
    case = Case("test:hangs", **FAST)
    with Launcher(label=str(tmp_path)) as launcher:
        assert not launcher.wait_ready().get("refused")
        log = tmp_path / "hangs.log"
        child = launcher.start(_worker_argv(case, tmp_path / "hangs.json"), runner.slot_env("w0"), log)
        deadline = time.monotonic() + 60
        # it runs (the launcher, a process of its own, makes the log when it starts the child: it may not be there yet)
        while not log.exists() or "stage: check" not in log.read_text():
            assert time.monotonic() < deadline and child.poll() is None
            time.sleep(0.05)
        os.kill(launcher.proc.pid, signal.SIGKILL)
        assert child.wait(timeout=10) == -signal.SIGKILL  # not a wait for the case's time limit
        deadline = time.monotonic() + 10
        while _alive(child.pid):
            assert time.monotonic() < deadline, "the child outlived its launcher"
            time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        return "zombie" not in open(f"/proc/{pid}/status").read().lower()
    except OSError:
        return False


def test_a_new_interpreters_limit_counts_from_the_end_of_its_imports(tmp_path):
    """A worker in a new interpreter imports torch first (5-6 s on a loaded 2-core host, past a 5 s limit): its case's
    limit starts when its alive file appears, and it is killed that limit after, not before."""
    (tmp_path / "logs").mkdir()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    start = time.monotonic()
    job = runner._Running(Case("test:hangs", **FAST), "w0", proc, start, start + 0.3 + runner.IMPORT_ALLOWANCE_S,
                          tmp_path / "case.json", tmp_path / "logs" / "case.log", 0.3)
    try:
        time.sleep(0.5)  # past the limit, still importing: waited for
        assert runner._finished_row(job, {}, 0.3) is None and job.alive_at is None
        job.alive_path.touch()  # sweep.worker, once its imports are done
        assert runner._finished_row(job, {}, 0.3) is None and job.deadline == pytest.approx(job.alive_at + 0.3)
        while (row := runner._finished_row(job, {}, 0.3)) is None:
            time.sleep(0.02)
        assert time.monotonic() - job.alive_at >= 0.3 and row["status"] == "timeout"
        assert not job.alive_path.exists() and proc.wait(timeout=10) < 0
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("how", ["fork", "exec"])
def test_a_crash_and_a_timeout_in_a_child_still_give_their_status_rows(tmp_path, how):
    measured = [{"model": "test:tiny"}, {"model": "test:tiny", "batch_size": 2}] if how == "fork" else []
    spec = {"defaults": FAST, "harness": {"timeout_s": 5}, "cases": measured + [{"model": "test:crashes"}, {"model": "test:hangs"}]}
    summary = api.sweep(spec, tmp_path, launcher=how)
    assert summary.counts == dict({"error": 1, "timeout": 1}, **({"ok": 2} if measured else {}))
    rows = {(r["model"], r["batch_size"]): r for r in api.results(tmp_path)}
    assert "worker exited with status 134 without a result" in rows[("test:crashes", 1)]["message"]
    assert "no result within the 5 s limit; the worker was killed" in rows[("test:hangs", 1)]["message"]
    log = (tmp_path / "logs" / f"{rows[('test:crashes', 1)]['case_id']}.log").read_text()
    assert ("forked by the sweep's launcher" in log) == (how == "fork")
    if measured:
        first, second = rows[("test:tiny", 1)]["cost_s"], rows[("test:tiny", 2)]["cost_s"]
        assert first["total"] == pytest.approx(sum(v for k, v in first.items() if k != "total"))
        # the first case waited for the launcher's imports (its start is counted from the launcher's), the later ones forked
        assert second["start_and_imports"] < 1.0 and second["start_and_imports"] < first["start_and_imports"]
    assert not _processes_mentioning(str(tmp_path))  # the launcher and the hung child are gone


def test_a_childs_intra_op_threads_follow_its_slot_as_an_interpreter_of_its_own_would(tmp_path, monkeypatch):
    """torch read the launcher's environment at its import; a child sets its slot's OMP_NUM_THREADS again, as an
    interpreter started with that environment would have read it."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    spec = {"defaults": FAST, "cases": [{"model": "test:tiny"}, {"model": "test:tiny", "batch_size": 2}]}
    api.sweep(spec, tmp_path, launcher="fork", workers=2)
    expected = max(1, (os.cpu_count() or 1) // 2)  # two CPU workers side by side: half the cores each (runner.slot_env)
    assert [r["env"]["cpu_threads"] for r in api.results(tmp_path)] == [expected, expected]


def test_the_launcher_is_chosen_by_flag_then_environment_and_a_refusing_one_falls_back_to_exec(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(launcher_mod.LAUNCHER_ENV, raising=False)
    assert choose_launcher() == "fork" and choose_launcher("exec") == "exec"
    monkeypatch.setenv(launcher_mod.LAUNCHER_ENV, "exec")
    assert choose_launcher() == "exec" and choose_launcher("fork") == "fork"
    with pytest.raises(PerflabError, match="--launcher: expected fork or exec, got 'spawn'"):
        choose_launcher("spawn")
    with pytest.raises(PerflabError, match="--launcher fork: the Ray engine starts each case's worker as a new interpreter"):
        api.sweep({"defaults": FAST, "cases": [{"model": "test:tiny"}]}, tmp_path / "ray", engine="ray", launcher="fork")
    # a launcher whose imports opened the GPU driver (or started a thread) refuses: every case then starts an interpreter

    class Refusing:
        def __init__(self, label="", python=None, env=None):
            self.dead = False

        def wait_ready(self):
            return {"ready": 1, "refused": "the imports loaded libcuda.so"}

        def close(self):
            self.dead = True

    monkeypatch.setattr(launcher_mod, "Launcher", Refusing)
    forks = runner.Forks("x")
    assert forks.start(["--case", "{}"], {}, tmp_path / "log") is None and forks.start([], {}, tmp_path / "log") is None
    assert capsys.readouterr().err.count("the launcher will not fork workers (the imports loaded libcuda.so)") == 1


def test_the_preloaded_imports_never_ask_for_a_gpu():
    """Imported in a fresh interpreter with every way to the GPU's count and context made to fail: none is taken (on a
    CPU build of torch some checks stop earlier; the launcher also checks /proc/self/fd for the driver's files)."""
    code = (
        "import torch\n"
        "def refuse(*a, **k): raise SystemExit('asked for the GPU')\n"
        "for name in ('is_available', 'device_count', 'init', '_lazy_init', 'current_device', 'get_device_properties'):\n"
        "    setattr(torch.cuda, name, refuse)\n"
        "from perflab.sweep.launcher import PRELOAD, PRELOAD_COMPILER, fork_hazard, native_threads\n"
        "baseline = native_threads()  # torch imported numpy: its OpenBLAS pool\n"
        "for name in PRELOAD + PRELOAD_COMPILER: __import__(name)\n"
        "print('hazard', fork_hazard(baseline))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "hazard None"
    # and a thread does make a fork unsafe
    started = subprocess.run([sys.executable, "-c", "import threading, time, numpy\nthreading.Thread(target=time.sleep, args=(120,), daemon=True).start()\n"
                              "from perflab.sweep.launcher import fork_hazard\nprint(fork_hazard(None))"], capture_output=True, text=True, timeout=60)
    assert started.stdout.strip() == "the imports started 1 Python thread(s)"


def test_the_driver_counts_as_opened_by_its_device_files_not_by_its_library_being_mapped(monkeypatch):
    """A CUDA 13 torch maps libcuda.so at its import without initialising it, and a forked child then runs CUDA (H100,
    2026-11-26): what makes a fork unsafe is the driver opened (cuInit, nvmlInit), which holds /dev/nvidia* open."""
    links = {"0": "/dev/null", "3": "/dev/nvidiactl", "4": "pipe:[123]", "5": "/dev/nvidia0", "6": "/dev/nvidiactl",
             "7": "/usr/lib/libcuda.so.1"}
    monkeypatch.setattr("threading.active_count", lambda: 1)  # an earlier test's lingering Python thread is not this test's
    monkeypatch.setattr(launcher_mod.os, "listdir", lambda path: list(links) if path == "/proc/self/fd" else [])
    monkeypatch.setattr(launcher_mod.os, "readlink", lambda path: links[path.rsplit("/", 1)[1]])
    assert launcher_mod.driver_files() == ["/dev/nvidia0", "/dev/nvidiactl"]
    assert launcher_mod.fork_hazard(None) == "the imports opened the GPU driver (/dev/nvidia0, /dev/nvidiactl)"
    del links["3"], links["5"], links["6"]  # a mapped or open libcuda.so alone is no hazard
    assert launcher_mod.driver_files() == [] and launcher_mod.fork_hazard(None) is None


def test_jemallocs_background_thread_is_not_counted_against_a_fork(monkeypatch):
    names = {"100": "python3", "101": "jemalloc_bg_thd", "102": "python3"}
    monkeypatch.setattr("threading.active_count", lambda: 1)  # an earlier test's lingering Python thread is not this test's
    real = launcher_mod.Path

    class FakePath(type(real())):
        def read_text(self, *a, **k):
            return names[str(self).split("/")[4]] + "\n" if str(self).startswith("/proc/self/task/") else super().read_text(*a, **k)

    monkeypatch.setattr(launcher_mod.os, "listdir", lambda path: list(names) if path == "/proc/self/task" else [])
    monkeypatch.setattr(launcher_mod, "Path", FakePath)
    assert launcher_mod.native_threads() == 2
    assert launcher_mod.fork_hazard(2) is None and launcher_mod.fork_hazard(1) == "the imports started 1 thread(s)"


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                cmdline = open(f"/proc/{entry}/cmdline", "rb").read().decode(errors="replace")
            except OSError:
                continue
            if "perflab.sweep" in cmdline and text in cmdline:
                pids.append(int(entry))
    return pids


# ---------------------------------------------------------------------------------------------------
# The FLOP count, once per eager step


def _lm(mode="eager", **extra) -> Case:
    fields = dict(model="gpt_small", workload="forward_backward", seq_len=16, batch_size=2, device="cpu", warmup=1, iters=2, repeats=2,
                  model_args=TINY_LM, mode=mode)
    return validate_case(Case(**{**fields, **extra}))


def _uncached_count(case: Case) -> int:
    from perflab.runtime.workload import build, step_context

    built = build(case)
    with step_context(case, built):
        return count_flops(built.make_step(built.model))


def test_a_cached_flop_count_equals_the_uncached_one(tmp_path):
    eager, compiled, timed_longer = _lm(), _lm(mode="compile"), _lm(iters=7, repeats=7, warmup=3)
    assert count_key(eager) == count_key(compiled) == count_key(timed_longer)  # the same eager step...
    assert count_key(eager) != count_key(_lm(seq_len=8)) and count_key(eager) != count_key(_lm(workload="forward"))  # ...not another's
    assert count_key(_lm(dtype="bf16")) != count_key(eager)
    assert count_key(Case("my_model.py:Net", family="lm", seq_len=8, device="cpu")) is None  # a user's model: counted in every case

    uncached = _uncached_count(eager)
    assert uncached > 0 and _uncached_count(compiled) == uncached  # the compile case's own count: its eager step, the same
    cache = FlopCache(tmp_path / "flops")
    calls = []

    def step_of(case):
        def make():
            from perflab.runtime.workload import build

            calls.append(case.mode)
            built = build(case)
            return built.make_step(built.model)
        return make

    def flops(result):
        return result[0].flops, result[1]

    first = count_flops_once(eager, step_of(eager), cache)
    assert flops(first) == (uncached, None) and calls == ["eager"]  # counted, stored
    again = count_flops_once(compiled, step_of(compiled), cache)
    assert flops(again) == (uncached, eager.id) and calls == ["eager"]  # reused: no step run, the counting case named
    assert again[0] == first[0]  # the whole count, its uncounted ops too
    assert flops(count_flops_once(eager, step_of(eager), cache)) == (uncached, None)  # its own count, not "counted in" itself
    assert flops(count_flops_once(compiled, step_of(compiled), None)) == (uncached, None) and calls == ["eager", "compile"]


def test_a_sweep_counts_each_eager_step_once_and_its_rows_report_the_same_flops(tmp_path):
    spec = {"defaults": dict(FAST, iters=3, repeats=3), "cases": [{"model": "test:tiny"}, {"model": "test:tiny", "warmup": 2},
                                                                  {"model": "test:tiny", "batch_size": 2}]}
    api.sweep(spec, tmp_path)
    by_id = {r["case_id"]: r for r in api.results(tmp_path)}
    reused = [r for r in by_id.values() if r.get("flops_counted_in")]
    assert len(reused) == 1 and by_id[reused[0]["flops_counted_in"]]["batch_size"] == 1
    assert reused[0]["gflops_per_batch"] == by_id[reused[0]["flops_counted_in"]]["gflops_per_batch"]
    assert reused[0]["cost_s"]["flops"] < 0.5  # no step counted: a file read
    assert len(list((tmp_path / "flops").glob("*.json"))) == 2 and len(by_id) == 3  # batch 1 and batch 2


# ---------------------------------------------------------------------------------------------------
# The held timing, bounded


def test_held_timing_stops_after_a_failed_first_round_and_starts_later_rounds_where_the_first_succeeded(monkeypatch):
    calls = []

    def failing(step, device, issue, steps, first_sleep_s=None):
        calls.append((steps, first_sleep_s))
        return host.HeldTiming(None, None, 1, "waited")

    monkeypatch.setattr(host, "held_round", failing)
    got = host.held_timing(lambda: None, "cuda", 0.5)
    assert got.note == "waited" and got.host_s is None and len(calls) == 1  # one round, not three: the step cannot be held

    calls.clear()
    results = iter([host.HeldTiming(2.0e-3, 0.5e-3, 1, sleep_s=0.024), host.HeldTiming(2.1e-3, 0.6e-3, 1, sleep_s=0.024),
                    host.HeldTiming(1.9e-3, 0.4e-3, 1, sleep_s=0.024)])

    def succeeding_with_one_step(step, device, issue, steps, first_sleep_s=None):
        calls.append((steps, first_sleep_s))
        return next(results)

    monkeypatch.setattr(host, "held_round", succeeding_with_one_step)
    got = host.held_timing(lambda: None, "cuda", 1e-3)
    assert calls == [(3, None), (1, 0.024), (1, 0.024)]  # rounds 2 and 3 go straight to what round 1 needed
    assert got.host_s == pytest.approx(0.5e-3) and got.device_s == pytest.approx(2.0e-3) and got.steps == 3 and got.rounds == 3


def test_a_held_rounds_tries_sleep_15_issue_times_at_most_where_they_slept_63():
    """A step that cannot be held (an H100 gpt_2.7b forward_backward fp32, issue 1.66 s: its host waits for the queue)
    was given up after 9 + 18 + 36 issue times of sleep and 7 steps; now after 9 + 6 and 4 steps."""
    plan = host.held_plan(3, 1.66)
    assert plan == [(3, pytest.approx(3 * 3 * 1.66)), (1, pytest.approx(6 * 1.66))]
    assert sum(s for _, s in plan) == pytest.approx(15 * 1.66) and sum(n for n, _ in plan) == 4
    assert host.held_plan(3, 1e-6) == [(3, host.MIN_SLEEP_S), (1, host.MIN_SLEEP_S)]  # a graph replay: the 4 ms floor
    assert host.held_plan(1, 1.66, first_sleep_s=9.96) == [(1, 9.96)]  # a later round: the try that held in the first
    assert host.held_round(lambda: None, "cpu", 1e-3, steps=1) == host.HeldTiming(None, None, 1, "no GPU")
