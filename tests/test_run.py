"""perflab run: a user's program (that does not import perflab), run unchanged, its steps found, timed, traced and
explained on the CPU; under torchrun with two gloo ranks, the ranks merged and the communication section.

The programs run in this process (as ``python -m perflab run`` runs them), except the torchrun one."""

from __future__ import annotations

import json
import textwrap

import pytest
from cli_util import run_cli
from reference_trace import load_events, summarize, top_level_cpu_ops

from perflab import api
from perflab.errors import PerflabError

MLP = """
import sys
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Linear(96, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
print("argv", sys.argv[1:], "name", __name__)
for i in range(int(sys.argv[1])):
    x = torch.randn(32, 64)
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
print("trained")
"""
# forward 2·32·64·96 + 2·32·96·10; backward: the first layer's weight gradient (x needs none), the second's input and
# weight gradients
MLP_FLOPS = 2 * 32 * 64 * 96 + 2 * 32 * 96 * 10 + 2 * 32 * 64 * 96 + 2 * (2 * 32 * 96 * 10)
# run.json's keys, in order, captured from perflab run on the CPU (a whole run, and a program that ended before the
# traced steps): tools read these names, so the typed record (records.run_report.RunReport) must write exactly them;
# "format" first (records.run_report.FORMAT)
RUN_KEYS = ["format", "timing", "device", "loop", "traced", "accounting", "flops", "utilisation", "floors", "verdict", "compiled", "traced_verdict",
            "verdict_evidence", "model_bytes", "ceilings_note", "program", "steps_from", "options", "recorded", "partial", "rank",
            "world_size", "run_id", "flags"]
EARLY_KEYS = ["format", "timing", "device", "loop", "program", "steps_from", "options", "recorded", "partial", "rank", "world_size", "run_id", "flags",
              "exit_code", "ended_by"]


def program(tmp_path, source: str, name: str = "prog.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def run(tmp_path, prog, *args, **options):
    out = tmp_path / "out"
    options.setdefault("trace_warmup", 1)
    code = api.run([str(prog), *map(str, args)], out_dir=out, **options)
    report = json.loads((out / "run.json").read_text()) if (out / "run.json").exists() else None
    return code, report


def test_a_training_loop_is_timed_by_its_optimizer_steps_and_its_trace_accounted_to_the_ns(tmp_path, capsys):
    prog = program(tmp_path, MLP)
    code, report = run(tmp_path, prog, 15, skip=2, steps=6, trace=2)
    captured = capsys.readouterr()
    assert code == 0
    assert "argv ['15'] name __main__" in captured.out and "trained" in captured.out  # the program's own, unchanged
    # 2 skipped + 6 timed + 1 between (perflab reads the timed steps and starts its profiler) + 1 under the profiler thrown
    # away + 2 traced (on the CPU with their shapes: no second pass) + 1 in which the trace is written + 1 in which the
    # report's facts are taken + 1 at whose end the report starts (in its own process): each a boundary of its own
    assert report["recorded"]["steps_seen"] == 15 and report["recorded"]["shapes_trace_path"] is None and report["timing"]["steps"] == 6 and report["traced"]["steps"] == 2
    # each traced step (and the warm-up one) timed by the same clock as the untraced ones
    assert len(report["traced"]["step_ms_each"]) == 2 and len(report["traced"]["warmup_step_ms"]) == 1
    assert report["traced"]["step_ms"] == pytest.approx(sorted(report["traced"]["step_ms_each"])[0] / 2 + sorted(report["traced"]["step_ms_each"])[1] / 2)
    assert report["traced"]["inflation"] == pytest.approx(report["traced"]["step_ms"] / report["timing"]["median_ms"])
    assert len(report["timing"]["samples_ms"]) == 6 and report["timing"]["median_ms"] > 0
    assert report["recorded"]["optimizers"] == ["SGD"] and report["device"] == "cpu"
    # FLOPs of a step from the traced operators' shapes, against the formula
    assert report["flops"]["flops_per_step"] == MLP_FLOPS and report["flops"]["complete"]
    # the accounting closes exactly, and agrees with a second reader of the same trace
    acc = report["accounting"]["accounting_ns"]
    assert acc["wall_ns"] == acc["busy_ns"] + acc["host_bound_ns"] + acc["kernel_gap_ns"] + acc["other_ns"]
    reference = summarize(report["traced"]["trace_path"])
    assert (acc["wall_ns"], acc["busy_ns"]) == (reference["wall_ns"], reference["busy_ns"])
    assert reference["steps"] == 2
    assert not [f for f in report["flags"] if f["flag"] in ("fell_back_to_eager", "compiled_while_timed")]
    # the same keys as ever, null where nothing was measured (no GPU: no peaks, no bytes) and never left out
    assert list(report) == RUN_KEYS
    assert [k for k in ("utilisation", "floors", "model_bytes", "ceilings_note") if report[k] is not None] == []


def test_step_names_an_inference_function_and_each_call_begins_a_step(tmp_path):
    prog = program(tmp_path, """
        import time
        import torch
        w = torch.randn(128, 128)
        def infer(x):
            return (x @ w).relu() @ w
        x = torch.randn(16, 128)
        for i in range(12):
            infer(x)
            time.sleep(0.003)  # between calls: in the step (the period from one call's start to the next's), not in the call
    """)
    code, report = run(tmp_path, prog, step="infer", skip=1, steps=5, trace=2)
    assert code == 0
    # 12 call starts make the 11 periods: 1 skipped, 5 timed, 1 between (perflab's own work), 1 under the profiler thrown
    # away, 2 traced, 1 in which the trace is written
    assert report["recorded"]["steps_seen"] == 11 and report["timing"]["steps"] == 5
    assert report["flops"]["flops_per_step"] == 2 * (2 * 16 * 128 * 128)
    assert report["steps_from"] == "the period between the starts of successive calls of infer"
    # the call's own duration beside the step: the sleep is in the step, not in the call
    timing = report["timing"]
    assert timing["calls"] == 5 and timing["call_median_ms"] + 2.5 < timing["median_ms"]


def test_step_range_names_a_record_function_range(tmp_path):
    prog = program(tmp_path, """
        import torch
        from torch.autograd.profiler import record_function
        w = torch.randn(64, 32)
        for i in range(14):
            with record_function("BENCHMARK/decode"):
                y = torch.randn(8, 64) @ w
            with record_function("other"):
                y.sum()
    """)
    code, report = run(tmp_path, prog, step_range="BENCHMARK", skip=2, steps=4, trace=3)
    assert code == 0
    # 2 + 4 + 1 between + 1 + 3 + 1 writing + 1 taking the report's facts + 1 starting the report
    assert report["recorded"]["steps_seen"] == 14 and report["traced"]["steps"] == 3
    assert report["flops"]["flops_per_step"] == 2 * 8 * 64 * 32


RECOMPILING = """
    import torch
    import torch._dynamo

    # torch's own limit, set as shipped: this test process may have compiled perflab's cases, which raise it
    torch._dynamo.config.recompile_limit = 8

    @torch.compile(backend="eager")
    def scale(x, tag):
        return x * len(tag) + 1

    @torch.compile(backend="eager")
    def shift(x, n):
        return x + n

    def infer(x, i):
        return scale(x, f"tag{i}") + shift(x, i)

    x = torch.randn(16)
    for i in range(16):
        infer(x, i)
"""


def test_a_guard_that_fails_every_step_is_counted_and_the_recompile_limit_named(tmp_path):
    prog = program(tmp_path, RECOMPILING)
    code, report = run(tmp_path, prog, step="infer", skip=3, steps=8, trace=1)
    assert code == 0
    phases = report["recorded"]["compile_phases"]
    scale = next(f for f in phases["timed"]["recompiles"] if f.startswith("scale "))
    # a new string every step: each step's guard fails (steps 2-9), the first 7 failures recompile, the 8th finds the
    # limit of 8 entries reached, and the frame runs eagerly from then on
    assert len(phases["skipped"]["recompiles"][scale]) + len(phases["timed"]["recompiles"][scale]) == 8
    assert phases["skipped"]["frames_ok"] + phases["timed"]["frames_ok"] >= 8
    assert phases["timed"]["recompiles"][scale][-1].endswith("tag == 'tag7'")
    # an int that changes is made dynamic after one recompile, and never recompiles again
    assert [f for f in phases["skipped"]["recompiles"] if f.startswith("shift ")]
    assert not [f for f in phases["timed"]["recompiles"] if f.startswith("shift ")]
    (hit,) = report["recorded"]["limit_hits"]
    assert (hit["function"], hit["limit"], hit["value"], hit["step"]) == ("scale", "recompile_limit", 8, 9)
    flags = {f["flag"]: f["message"] for f in report["flags"]}
    assert "compiled_while_timed" in flags and "scale" in flags["fell_back_to_eager"]


def test_the_programs_exit_code_and_traceback_are_its_own_and_what_was_measured_is_written(tmp_path, capsys):
    prog = program(tmp_path, """
        import sys, torch
        m = torch.nn.Linear(8, 8); opt = torch.optim.SGD(m.parameters(), lr=0.1)
        def fail(i):
            raise ValueError(f"bad batch {i}")
        for i in range(30):
            m(torch.randn(4, 8)).sum().backward(); opt.step()
            if i == 5:
                fail(i)
    """, name="fails.py")
    code, report = run(tmp_path, prog, skip=2, steps=10, trace=1)
    err = capsys.readouterr().err
    assert code == 1
    assert 'File "' + str(prog.resolve()) + '", line 9, in <module>' in err and "ValueError: bad batch 5" in err
    assert "perflab/program" not in err.split("Traceback")[1]  # perflab's own frames are left out
    assert report["partial"] and report["ended_by"] == "exception" and report["timing"]["steps"] == 4
    assert list(report) == EARLY_KEYS + ["last_words"] and report["exit_code"] == 1  # no traced steps: their keys absent, not null
    assert report["last_words"] == "ValueError: bad batch 5"  # what a rank's failure line quotes under --nproc
    assert err.strip().splitlines()[-1].startswith("perflab: the program raised an exception after 6 step(s)")


def test_a_program_that_ends_early_exits_with_its_code_and_one_line(tmp_path, capsys):
    prog = program(tmp_path, """
        import sys, torch
        m = torch.nn.Linear(8, 8); opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for i in range(3):
            m(torch.randn(4, 8)).sum().backward(); opt.step()
        sys.exit(3)
    """)
    code, report = run(tmp_path, prog, skip=1, steps=5, trace=1)
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 3 and len(lines) == 1
    assert "exited with code 3 after 3 step(s)" in lines[0] and "needs 9: 2 timed step(s)" in lines[0]
    assert report["timing"]["steps"] == 2


def test_a_program_with_no_step_boundary_is_told_which_options_name_one(tmp_path, capsys):
    prog = program(tmp_path, "import torch\nprint(float(torch.ones(3).sum()))\n")
    code, report = run(tmp_path, prog)
    captured = capsys.readouterr()
    assert code == 0 and captured.out == "3.0\n"
    (line,) = captured.err.strip().splitlines()
    assert "no step boundary was seen" in line and "--step QUALNAME" in line and "--step-range NAME" in line


def test_ctrl_c_writes_what_was_measured_and_exits_130(tmp_path, capsys):
    prog = program(tmp_path, """
        import torch
        m = torch.nn.Linear(8, 8); opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for i in range(100):
            m(torch.randn(4, 8)).sum().backward(); opt.step()
            if i == 6:
                raise KeyboardInterrupt  # as Ctrl-C raises it in the main thread
    """)
    code, report = run(tmp_path, prog, skip=2, steps=20, trace=1)
    err = capsys.readouterr().err
    assert code == 130 and "KeyboardInterrupt" in err and "was interrupted after 7 step(s)" in err
    assert report["ended_by"] == "interrupt" and report["timing"]["steps"] == 5


def test_a_program_running_torch_profiler_itself_is_timed_and_left_to_trace(tmp_path, capsys):
    prog = program(tmp_path, """
        import torch
        m = torch.nn.Linear(8, 8); opt = torch.optim.SGD(m.parameters(), lr=0.1)
        with torch.profiler.profile() as p:
            for i in range(12):
                m(torch.randn(4, 8)).sum().backward(); opt.step()
        print("own trace", len(p.events()) > 0)
    """)
    code, report = run(tmp_path, prog, skip=1, steps=4, trace=2)
    assert code == 0 and "own trace True" in capsys.readouterr().out
    assert report["timing"]["steps"] == 4 and report["traced"] is None
    assert "only one profiler can record at a time" in report["recorded"]["trace_note"]


@pytest.mark.parametrize("options, fragment", [
    ({"step": "not a name"}, "qualified name"),
    ({"step": "f", "step_range": "R"}, "not both"),
    ({"step": ""}, "--step '': give a function's qualified name"),
    ({"step": "", "step_range": "R"}, "not both"),
    ({"steps": 0}, "--steps must be at least 1"),
])
def test_bad_options_are_one_line_before_the_program_runs(tmp_path, options, fragment):
    prog = program(tmp_path, "raise SystemExit('must not run')\n")
    with pytest.raises(PerflabError, match=fragment):
        api.run([str(prog)], out_dir=tmp_path / "out", **options)


def test_an_out_dir_that_cannot_take_the_report_is_one_line_before_the_program_runs(tmp_path):
    prog = program(tmp_path, "raise SystemExit('must not run')\n")
    (tmp_path / "a_file").write_text("kept\n")
    with pytest.raises(PerflabError, match="a_file/out: cannot create the output directory"):
        api.run([str(prog)], out_dir=tmp_path / "a_file" / "out")
    assert (tmp_path / "a_file").read_text() == "kept\n"


def test_the_command_line_keeps_the_programs_own_options_apart(tmp_path):
    prog = program(tmp_path, MLP)
    done = run_cli("run", "--skip", "1", "--steps", "3", "--trace-warmup", "1", "--trace", "1", "--out", tmp_path / "o", "--", "python", prog, "7", "--lr", "3")
    assert done.returncode == 0, done.stderr
    assert "argv ['7', '--lr', '3']" in done.stdout
    assert "perflab run:" in done.stderr and "verdict:" in done.stderr  # the report, on stderr beside the program's output
    missing = run_cli("run", "--", tmp_path / "nothere.py")
    assert missing.returncode == 2 and missing.stderr.strip().endswith("no such file (perflab run [OPTIONS] -- SCRIPT [ARGS...])")


DDP = """
    import json, sys, time
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, Dataset
    dist.init_process_group("gloo")
    rank = dist.get_rank()

    class Batches(Dataset):  # rank 1's storage is slow: 30 ms a batch (an input straggler); rank 0's is not
        def __len__(self):
            return 16 * 10
        def __getitem__(self, i):
            if rank == 1 and i % 16 == 0:
                time.sleep(0.030)
            return torch.randn(128)

    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    own = []
    it = iter(DataLoader(Batches(), batch_size=16))
    for i in range(10):
        t0 = time.perf_counter()
        x = next(it)
        t1 = time.perf_counter()
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
        own.append({"data_ms": (t1 - t0) * 1e3, "iteration_ms": (time.perf_counter() - t0) * 1e3})
    json.dump(own, open(f"{sys.argv[1]}/own{rank}.json", "w"))
    dist.destroy_process_group()
"""


def test_two_gloo_ranks_under_torchrun_merge_their_traces_into_the_communication_section(tmp_path):
    prog = program(tmp_path, DDP)
    out = tmp_path / "ddp"
    done = run_cli("run", "--nproc", "2", "--skip", "2", "--steps", "3", "--trace-warmup", "1", "--trace", "2", "--out", out, "--", prog, tmp_path,
                   timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "run.json").read_text())
    comm = report["communication"]
    assert list(report) == RUN_KEYS + ["ddp", "all_reduce", "ranks", "slowest_rank", "step_ms", "communication"]
    grad_bytes = 4 * (128 * 256 + 256 + 256 * 128 + 128)
    assert report["ddp"]["grad_bytes"] == grad_bytes
    assert comm["bus_bytes"] == grad_bytes  # 2(N−1)/N × the gradients, N = 2
    assert comm["floor_ms"] == pytest.approx(grad_bytes / (comm["busbw_gbps"] * 1e9) * 1e3)
    assert [r["rank"] for r in comm["ranks"]] == [0, 1] and report["slowest_rank"] in (0, 1)
    for r in comm["ranks"]:  # exposed communication = waiting for the later rank + transfer
        assert r["exposed_ms"] == pytest.approx(r["waiting_ms"] + r["transfer_ms"], abs=1e-9)
        assert r["comm_ms"] == pytest.approx(r["exposed_ms"] + r["overlapped_ms"], abs=1e-9)
        # over the rank's own step windows: a part of its steps, never more (a whole-trace window gave rank 1 28.6 ms
        # exposed in a 3.8 ms step)
        assert 0 <= r["waiting_ms"] <= r["exposed_ms"] <= r["traced_step_ms"] and r["busy_ms"] <= r["traced_step_ms"]
    # each rank's trace holds its own operators and gloo's collectives
    for rank in (0, 1):
        events = load_events(out / f"rank{rank}" / "trace.json.gz")
        assert top_level_cpu_ops(events) and any(str(e.get("name", "")).startswith("gloo:") for e in events)
    assert "communication per step on 2 ranks" in done.stderr
    # rank 1's slow input holds both back: named from untraced evidence, its share against its own data meter over the
    # same steps (every timed step: perflab's own work waits for the step after the last), rank 0's waiting for it in the
    # collective from the traces
    verdict = report["verdict"]
    assert verdict["verdict"] == "input straggler" and verdict["straggler_rank"] == 1, verdict
    own = json.loads((tmp_path / "own1.json").read_text())[2:5]
    rank1 = json.loads((out / "rank1" / "rank.json").read_text())
    samples, exposed = rank1["timing"]["samples_ms"], rank1["loop"]["per_step"]["exposed_input_ms"]
    assert abs(sum(exposed) / sum(samples) - sum(s["data_ms"] for s in own) / sum(s["iteration_ms"] for s in own)) < 0.05
    assert verdict["others_waiting_ms"][0]["rank"] == 0 and verdict["others_waiting_ms"][0]["waiting_ms"] > 0 and "rank 0" in verdict["message"]
    assert [r["rank"] for r in report["ranks"]] == [0, 1] and report["ranks"][1]["input_exposed_ms"] > 20
    page = (out / "report.html").read_text()  # the run's page: the ranks, their communication, each rank's trace
    assert 'id="ranks-table"' in page and 'id="communication-table"' in page and str(out / "rank1" / "trace.json.gz") in page


FSDP = """
    import sys
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128))
    if sys.argv[1] == "fully_shard":  # FSDP2: each Linear its own unit, then the root (which holds no parameter)
        from torch.distributed.fsdp import fully_shard
        for layer in (model[0], model[2]):
            fully_shard(layer)
        fully_shard(model)
    else:  # FSDP1: one flat parameter, on the CPU
        from torch.distributed.fsdp import FullyShardedDataParallel
        model = FullyShardedDataParallel(model, device_id=torch.device("cpu"))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for i in range(10):
        model(torch.randn(16, 128)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()
"""


@pytest.mark.parametrize("api", ["fully_shard", "FullyShardedDataParallel"])
def test_an_fsdp_program_on_two_gloo_ranks_gets_its_layout_and_its_all_gathers_and_reduce_scatters_floor(tmp_path, api):
    prog = program(tmp_path, FSDP)
    out = tmp_path / "fsdp"
    done = run_cli("run", "--nproc", "2", "--skip", "2", "--steps", "3", "--trace-warmup", "1", "--trace", "2", "--out", out, "--", prog, api,
                   timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "run.json").read_text())
    assert list(report) == RUN_KEYS + ["ddp", "fsdp", "all_reduce", "ranks", "slowest_rank", "step_ms", "communication"]
    param_bytes = 4 * (128 * 256 + 256 + 256 * 128 + 128)  # 263,680: every parameter whole, fp32
    assert param_bytes == 263680
    # FSDP2: the two Linears, each gathered again for the backward (the root holds no parameter); FSDP1: the root's one
    # flat parameter, which FSDP keeps gathered from the forward to the backward
    units, gathers = (2, 2) if api == "fully_shard" else (1, 1)
    layout = report["fsdp"]
    assert report["ddp"] is None
    assert {k: layout[k] for k in ("api", "sharding_strategy", "world_size", "units", "reshard_after_forward", "param_bytes", "grad_bytes",
                                   "all_gather_bytes", "reduce_scatter_bytes")} == {
        "api": api, "sharding_strategy": "FULL_SHARD", "world_size": 2, "units": units, "reshard_after_forward": gathers == 2,
        "param_bytes": 263680, "grad_bytes": 263680, "all_gather_bytes": gathers * 263680, "reduce_scatter_bytes": 263680}
    assert layout["unit_param_bytes"] == ([4 * (128 * 256 + 256), 4 * (256 * 128 + 128)] if units == 2 else [263680])
    if api == "FullyShardedDataParallel":
        assert layout["flat_param_bytes"] == [263680]  # 65,920 elements: padded to 2 ranks, nothing added
    comm = report["communication"]
    assert comm["mode"] == "fsdp"
    # all-gathered once a step per gather (forward; backward, after resharding), reduce-scattered once: (N−1)/N = 1/2
    # of each on the bus; FSDP2: 263,680 + 131,840 = 395,520 bus bytes, FSDP1: 131,840 + 131,840 = 263,680
    assert comm["collectives"] == [
        {"collective": "all_gather", "payload_bytes": gathers * 263680, "bus_bytes": gathers * 131840, "calls": gathers * units,
         "message_bytes": 263680 / units, "bus_factor": "(N−1)/N"},
        {"collective": "reduce_scatter", "payload_bytes": 263680, "bus_bytes": 131840, "calls": units, "message_bytes": 263680 / units,
         "bus_factor": "(N−1)/N"}]
    bus = {"fully_shard": 395520, "FullyShardedDataParallel": 263680}[api]
    assert comm["bus_bytes"] == bus and comm["calls"] == (gathers + 1) * units
    assert comm["floor_ms"] == pytest.approx(bus / (comm["busbw_gbps"] * 1e9) * 1e3)
    assert [r["rank"] for r in comm["ranks"]] == [0, 1]
    for r in comm["ranks"]:
        assert r["comm_ms"] > 0 and r["comm_ms"] == pytest.approx(r["exposed_ms"] + r["overlapped_ms"], abs=1e-9)
    # the traces hold the all-gathers the floor counts, each traced step's
    events = load_events(out / "rank0" / "trace.json.gz")
    assert sum(e.get("name") == "gloo:all_gather" for e in events) == gathers * units * comm["steps_profiled"]
    said = " ".join(done.stderr.split())  # the table's title, wrapped to the terminal
    assert f"all-gather of {gathers * 0.13:.1f} MB bus bytes in {gathers * units} call(s) + reduce-scatter of 0.1 MB bus bytes in {units} call(s)" in said
    assert 'id="communication-table"' in (out / "report.html").read_text()


def test_the_recorders_stamps_are_read_once_into_the_record_with_their_summary(monkeypatch):
    import perflab.clock
    from perflab.program.boundaries import StepSource
    from perflab.program.recorder import Recorder, RunOptions

    class Boundaries(StepSource):  # the program's step boundaries, called by hand
        def _install(self):
            pass

        def _remove(self):
            pass

    def record(boundaries: int, **options):
        stamps = iter([0, 10, 30, 60, 100, 150])  # ms on the host clock: steps of 10, 20, 30, ... ms
        monkeypatch.setattr(perflab.clock.StepClock, "stamp", lambda self, on_device=True: (None, next(stamps) * 1_000_000))
        handed = []
        source = Boundaries()
        recorder = Recorder(source, RunOptions(**options), on_traced=lambda rec: handed.append(rec.finish()))
        recorder.install()
        for _ in range(boundaries):
            source.on_end()
        return handed[0] if handed else recorder.finish()

    whole = record(4, skip=1, steps=3, trace=0)  # handed over at the end of the (untraced) traced phase
    assert whole.step_ms == whole.host_step_ms == [10.0, 20.0, 30.0] and whole.traced_step_ms == []
    assert (whole.timing["steps"], whole.timing["median_ms"], whole.timing["host_median_ms"]) == (3, 20.0, 20.0)
    cut = record(3, skip=1, steps=5, trace=0)  # the program ended after two timed steps
    assert cut.phase == "timed" and cut.step_ms == [10.0, 20.0] and cut.timing["steps"] == 2


def test_a_failing_read_of_the_traced_steps_keeps_the_timed_steps(monkeypatch):
    """A sticky CUDA error in the traced phase (the pass with shapes) fails every event read after it: the timed steps
    are read when their phase ends, so the record keeps them and says why the traced steps' times are missing."""
    import perflab.clock
    from perflab.program.boundaries import StepSource
    from perflab.program.recorder import Recorder, RunOptions

    class Boundaries(StepSource):
        def _install(self):
            pass

        def _remove(self):
            pass

    stamps = iter([0, 10, 30, 60, 100, 150])
    monkeypatch.setattr(perflab.clock.StepClock, "stamp", lambda self, on_device=True: (None, next(stamps) * 1_000_000))
    read = perflab.clock.StepClock.read_pairs

    def read_pairs(self, pairs):  # every read once the timed phase is over fails, as after a sticky CUDA error
        if recorder.data.phase != "timed":
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return read(self, pairs)

    monkeypatch.setattr(perflab.clock.StepClock, "read_pairs", read_pairs)
    handed = []
    source = Boundaries()
    recorder = Recorder(source, RunOptions(skip=1, steps=3, trace=0), on_traced=lambda rec: handed.append(rec.finish()))
    recorder.install()
    for _ in range(4):
        source.on_end()
    (record,) = handed
    assert record.step_ms == [10.0, 20.0, 30.0] and record.timing["median_ms"] == 20.0 and record.traced_step_ms == []
    assert record.trace_note == "the traced steps' times could not be read (RuntimeError: CUDA error: an illegal memory access was encountered)"
