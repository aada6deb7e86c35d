"""perflab's own work inside the program's steps (issue 55): what each boundary cost, kept in run.json's
``recorded.own_work``; the program's modules found by registration hooks, not by scanning the garbage collector; the
profiler's one-time start-up paid in the program's first step; and the report made after the program where this GPU's
peaks were never measured (measuring them in a step of the program took 0.9 s on an H200)."""

from __future__ import annotations

import json
import textwrap
import time
from types import SimpleNamespace

import torch

from perflab import api
from perflab.program import recorder as recorder_module
from perflab.program.recorder import ModuleWatch, Recorder, module_bytes

PROGRAM = """
import sys
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.ReLU(), torch.nn.Linear(48, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for i in range(int(sys.argv[1])):
    loss = model(torch.randn(16, 32)).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
"""
SKIP, STEPS, WARMUP, TRACE = 2, 5, 1, 2
BETWEEN = SKIP + STEPS + 1  # the boundary that ends the step between: the timed steps read, the profiler started


def run(tmp_path, steps: int = 20):
    prog = tmp_path / "prog.py"
    prog.write_text(textwrap.dedent(PROGRAM))
    out = tmp_path / "out"
    code = api.run([str(prog), str(steps)], out_dir=out, skip=SKIP, steps=STEPS, trace=TRACE, trace_warmup=WARMUP)
    assert code == 0
    return json.loads((out / "run.json").read_text())


def test_each_boundary_s_own_work_is_kept_with_its_parts_and_a_planted_cost_lands_where_it_was_planted(tmp_path, monkeypatch):
    read = Recorder._read_timed

    def slow_read(self):
        time.sleep(0.040)
        read(self)

    monkeypatch.setattr(Recorder, "_read_timed", slow_read)
    report = run(tmp_path)
    work = report["recorded"]["own_work"]
    assert [w["step"] for w in work] == sorted({w["step"] for w in work})  # one entry a boundary, in order
    for w in work:
        assert w["ms"] >= recorder_module.OWN_WORK_MS
        # the parts close on the boundary's total: what no part named is "other" (kept from half OWN_WORK_MS)
        assert abs(sum(w["parts"].values()) - w["ms"]) < recorder_module.OWN_WORK_MS / 2 + 0.01
    between = [w for w in work if w["step"] == BETWEEN]
    assert len(between) == 1 and between[0]["phase"] == "between"
    assert 40 <= between[0]["parts"]["read the timed steps"] < 40 + 1000
    assert "start the profiler" in between[0]["parts"]
    # nowhere else: the timed steps are read once
    assert all("read the timed steps" not in w["parts"] for w in work if w["step"] != BETWEEN)


def test_the_report_s_facts_and_its_start_each_take_a_boundary_after_the_trace_s_write(tmp_path, monkeypatch):
    import perflab.program.run as run_module

    taken = []
    facts = run_module.Run._on_facts

    def on_facts(self, recorder):
        taken.append((recorder.data.steps_seen, recorder.data.trace_path is not None))
        facts(self, recorder)

    monkeypatch.setattr(run_module.Run, "_on_facts", on_facts)
    report = run(tmp_path)
    written = BETWEEN + WARMUP + TRACE + 1  # the boundary after the traced steps writes the trace (on the CPU: one pass)
    assert taken == [(written + 1, True)]
    assert report["recorded"]["steps_seen"] == written + 2  # the report starts a boundary later, in its own process
    assert report["traced"]["steps"] == TRACE and report["timing"]["steps"] == STEPS


def test_a_gpu_s_missing_peaks_put_the_report_after_the_program_and_are_measured_there(tmp_path, monkeypatch, capsys):
    """On a GPU whose peaks were never measured, the report is not started at its boundary: the program's end makes it,
    measuring the peaks then (``complete_gpu_facts``), with the facts taken in the program's step."""
    import perflab.program.report as report_module
    import perflab.program.run as run_module

    calls = {"start": 0, "measured": 0}
    monkeypatch.setattr(report_module, "_cached_ceilings", lambda: None)

    def measured(rank):
        calls["measured"] += 1
        return {"planted": True}

    monkeypatch.setattr(report_module, "_ceilings", measured)
    start = run_module.Run._start_report_job

    def counting_start(self, recorder):
        calls["start"] += 1
        return start(self, recorder)

    monkeypatch.setattr(run_module.Run, "_start_report_job", counting_start)
    facts = run_module.Run._on_facts

    def as_on_a_gpu(self, recorder):
        recorder.data.device = "cuda"  # gpu_facts reads TF32 and the modules' CUDA bytes: none here, and no CUDA is touched
        try:
            facts(self, recorder)
        finally:
            recorder.data.device = "cpu"
        assert self._deferred and self._facts["ceilings"] is None and self._facts["model_bytes"]["modules"] == 2

    monkeypatch.setattr(run_module.Run, "_on_facts", as_on_a_gpu)
    run(tmp_path)
    assert calls == {"start": 0, "measured": 0}  # a CPU record at the end: no peaks to measure, and no job was started
    assert "measured once, after the program" in capsys.readouterr().err
    facts_taken = {"tf32": False, "model_bytes": None, "ceilings": None}
    done = report_module.complete_gpu_facts(facts_taken, SimpleNamespace(device="cuda"), SimpleNamespace(rank=0))
    assert done["ceilings"] == {"planted": True} and calls["measured"] == 1 and facts_taken["ceilings"] is None


def test_the_profiler_s_warm_up_session_is_perflab_s_own_not_the_program_s(tmp_path, monkeypatch):
    """The session that pays CUPTI's start-up at the first boundary must not read as the program's own profiler (perflab's
    trace would give way). On the CPU it is planted as a CPU session, with CUDA said to be up."""
    import perflab.trace.capture as capture

    warmed = []

    def warm_on_the_cpu():
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        prof.start()
        prof.stop()
        warmed.append(True)

    monkeypatch.setattr(capture, "warm_cuda_profiler", warm_on_the_cpu)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(Recorder, "_on_gpu", property(lambda self: False))  # the steps' clock and trace stay the CPU's
    monkeypatch.setattr(recorder_module.Recorder, "_choose_clock", _cpu_clock)
    report = run(tmp_path)
    assert warmed == [True]
    assert report["recorded"]["trace_note"] is None and report["traced"]["steps"] == TRACE
    first = [w for w in report["recorded"]["own_work"] if w["step"] == 1]
    assert not first or set(first[0]["parts"]) <= {"warm the profiler", "other"}


def _cpu_clock(self):
    from perflab.clock import StepClock

    self._clock = StepClock(False)
    self.data.device = "cpu"


def test_module_watch_finds_the_modules_that_registered_tensors_and_their_bytes_exactly():
    watch = ModuleWatch()
    watch.install()
    try:
        model = torch.nn.Sequential(torch.nn.Linear(10, 20), torch.nn.BatchNorm1d(20), torch.nn.Linear(20, 5))
        tied = torch.nn.Linear(20, 5)
        tied.weight = model[2].weight  # one tensor in two modules: counted once
        container = torch.nn.ModuleList([model])  # registers no tensor of its own
    finally:
        watch.remove()
    after = torch.nn.Linear(100, 100)  # after the hooks' removal: not seen
    assert len(watch.modules) == 4 and container not in watch.modules and after not in watch.modules
    found = module_bytes("cpu", watch.modules)
    params = (10 * 20 + 20) + 2 * 20 + (20 * 5 + 5) + 5  # the tied Linear adds its own bias only
    buffers = 2 * 20 * 4 + 8  # BatchNorm's running mean and variance (fp32), and its int64 batch count
    assert found == {"param_bytes": params * 4, "buffer_bytes": buffers, "modules": 4}
    # none seen (a model unpickled whole registers nothing): the garbage collector's modules, these among them
    everything = module_bytes("cpu", set())
    assert everything["param_bytes"] >= found["param_bytes"] + (100 * 100 + 100) * 4
    del model, tied, container, after


def test_a_profiler_warm_up_that_fails_leaves_the_run_whole_and_is_said_after_the_program(tmp_path, monkeypatch, capsys):
    """The warm-up is an optimisation: where it raises, the steps are still timed and traced, and one line says so."""
    import perflab.trace.capture as capture

    def fails():
        raise RuntimeError("CUPTI refused")

    monkeypatch.setattr(capture, "warm_cuda_profiler", fails)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(Recorder, "_on_gpu", property(lambda self: False))
    monkeypatch.setattr(recorder_module.Recorder, "_choose_clock", _cpu_clock)
    report = run(tmp_path)
    assert report["timing"]["steps"] == STEPS and report["traced"]["steps"] == TRACE
    err = capsys.readouterr().err
    assert "could not start its profiler ahead" in err and "CUPTI refused" in err


RECORDS = __import__("pathlib").Path(__file__).parent / "data" / "records"


def test_perflabs_own_work_longer_than_a_host_bound_step_is_flagged_with_its_step_and_cost():
    """The host-bound compiled GPT-2 loop on an H200 (thirteenth session's run.json): the pass with shapes' stop took
    37.3 ms at the boundary after perflab's step 239, against a 30.373 ms median step. The flag names the step and the
    cost; its estimate of the program's step (median + the work) is a floor of what the program's own clock read
    there: 82.78 ms at its iteration 238 (docs/performance/whole-loop-h200/own-clock-2026-11-29c/after/sync_own.jsonl;
    the rest is the recorded step's own slowing)."""
    from perflab.program.report import own_work_checks, run_report_checks

    report = json.loads((RECORDS / "sync_compiled_h200_run.json").read_text())
    (check,) = own_work_checks(report)
    assert check.flag == "perflab_slowed_a_step"
    assert "after its step 239 (stop the profiler, 37.3 ms in all)" in check.message and "(30.373 ms)" in check.message
    estimate = 30.37337589263916 + 37.288  # the median, and the whole boundary's work (its stop 37.274 ms of it)
    assert f"at least about {estimate:.1f} ms, ×{estimate / 30.373:.1f} the median" in check.message
    assert estimate <= 82.78  # the program's own clock at that step
    assert "--no-shapes" in check.message
    assert "perflab_slowed_a_step" in [f["flag"] for f in run_report_checks(report)]


def test_a_gpu_bound_or_cpu_program_is_not_flagged_for_perflabs_own_work():
    """A GPU-bound program's queued GPU work hides part of perflab's work at a boundary, so the median plus the work is
    no floor of its step there (the spawned ResNet-50: a 111.4 ms stop against a 62.4 ms median; its own clock read
    150.5 ms there, not 173.8); a CPU run has no GPU to judge by."""
    from perflab.program.report import own_work_checks

    spawn = json.loads((RECORDS / "spawn_resnet50_h200_run.json").read_text())
    assert spawn["verdict"]["verdict"] == "GPU-bound" and max(w["ms"] for w in spawn["recorded"]["own_work"]) > spawn["timing"]["median_ms"]
    assert own_work_checks(spawn) == []
    assert own_work_checks(json.loads((RECORDS / "mlp_cpu_run.json").read_text())) == []


def test_a_followed_child_on_a_gpu_without_peaks_makes_its_report_after_the_program_too(tmp_path, monkeypatch, capsys):
    """A process whose report cannot be made in a job of its own (a spawned rank perflab follows: ``_job_possible``
    False) made it at the traced steps' end, measuring this GPU's peaks there, inside the program's step: a spawned
    ResNet-50's own clock on a fresh H200 read 1325.8 ms for that step against a 62.4 ms median. Now it waits for the
    program's end there too. Planted here as a GPU at the traced steps' end, with no peaks cached."""
    import perflab.program.report as report_module
    import perflab.program.run as run_module

    monkeypatch.setattr(report_module, "_cached_ceilings", lambda: None)
    monkeypatch.setattr(run_module.Run, "_job_possible", property(lambda self: False))
    written = {}
    on_traced, write = run_module.Run._on_traced, run_module.Run._write_kept

    def as_on_a_gpu(self, recorder):
        recorder.data.device = "cuda"
        try:
            on_traced(self, recorder)
        finally:
            recorder.data.device = "cpu"
        written["deferred"] = self._deferred
        written["at_traced"] = written.get("writes", 0)

    def counting_write(self, recorder, ended_early, outcome=None, quiet=False):
        written["writes"] = written.get("writes", 0) + 1
        return write(self, recorder, ended_early, outcome, quiet)

    monkeypatch.setattr(run_module.Run, "_on_traced", as_on_a_gpu)
    monkeypatch.setattr(run_module.Run, "_write_kept", counting_write)
    report = run(tmp_path)
    assert written["deferred"] and written["at_traced"] == written["writes"] - 1  # the whole report only at the end
    assert "measured once, after the program" in capsys.readouterr().err
    assert report["verdict"] is not None and report["timing"]["steps"] == STEPS


def test_with_peaks_cached_a_followed_child_makes_its_report_at_the_traced_steps_end(tmp_path, monkeypatch):
    import perflab.program.report as report_module
    import perflab.program.run as run_module

    monkeypatch.setattr(report_module, "_cached_ceilings", lambda: {"planted": True})
    monkeypatch.setattr(run_module.Run, "_job_possible", property(lambda self: False))
    seen = {}
    on_traced = run_module.Run._on_traced

    def as_on_a_gpu(self, recorder):
        recorder.data.device = "cuda"
        try:
            assert self._peaks_to_measure(recorder) is False
        finally:
            recorder.data.device = "cpu"
        on_traced(self, recorder)
        seen["deferred"] = self._deferred

    monkeypatch.setattr(run_module.Run, "_on_traced", as_on_a_gpu)
    run(tmp_path)
    assert seen["deferred"] is False
