"""run.json read and written through one record (``records.run_report``: ``RunReport``, ``load``, ``read``, ``save``),
with its format: kept run.json files of each format (tests/data/records) read back with their values, written again
as they were read; a newer format is one error line; the readers (compare's sides, a program's ab, the scaling over
rank counts) read them through ``load``.

tests/data/records:
- ``nanogpt_h200_run_format0.json``: nanoGPT's train.py on an H200, written before run.json had a format (no loop
  section then either): format 0;
- ``mlp_cpu_run.json``: a small MLP's ``perflab run --skip 2 --steps 8 --trace 2 --trace-warmup 1`` on a busy 2-core
  CPU VM (2026-11-29): format 1;
- ``mlp_cpu_run_no_format.json``: the same, its ``format`` key taken out: format 0, the same fields.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cli_util import assert_one_line_error, run_cli_here

from perflab.errors import PerflabError
from perflab.records.run_report import (ABSENT, FORMAT, NewerFormat, RunReport, UnreadableReport, load, read, read_dict,
                                        save)

DATA = Path(__file__).parent / "data" / "records"
H200 = DATA / "nanogpt_h200_run_format0.json"
CPU = DATA / "mlp_cpu_run.json"
CPU_NO_FORMAT = DATA / "mlp_cpu_run_no_format.json"


def test_a_format_0_run_json_from_an_h200_reads_with_its_values():
    report = load(H200)
    assert report.format == 0 and report.device == "cuda" and report.world_size == 1 and report.partial is False
    assert report.timing["steps"] == 30 and report.timing["median_ms"] == pytest.approx(102.8873291015625)
    assert report.timing["ci95_ms"] == pytest.approx([102.62138519712263, 103.3414712652632])
    assert report.verdict["verdict"] == "GPU-bound" and report.verdict["step_ms"] == pytest.approx(102.8873291015625)
    assert report.traced_verdict.startswith("not launch-bound: the GPU is busy 94%")
    assert report.program.startswith("train.py --dataset=synthetic --batch_size=12")
    # written before the loop section and the run's id were: absent, not null
    assert report.loop is ABSENT and report.run_id is ABSENT and "loop" not in report.to_dict()
    assert report.get("loop") is None and report.section("loop") == {}


def test_a_format_1_run_json_from_the_cpu_reads_with_its_values():
    report = load(CPU)
    assert report.format == FORMAT == 1 and report.device == "cpu" and report.rank == 0 and report.world_size == 1
    assert report.timing["steps"] == 8 and report.timing["median_ms"] == pytest.approx(0.6886795)
    assert report.loop["steps"] == 8 and report.loop["mean_ms"] == pytest.approx(5.829282125000001)
    assert report.verdict["verdict"] == "operator-bound" and report.traced["steps"] == 2 and report.traced["inflated"] is True
    assert report.flops["flops_per_step"] == 970752.0
    assert report.flag_names() == ["trace_inflated", "stalls", "high_cv"]
    assert report.recorded["steps_seen"] == 2 + 8 + 1 + 2 and report.recorded["optimizers"] == ["SGD"]  # skipped, timed, warm-up, traced
    assert report.program == "/tmp/rr_gen/prog.py 14"


def test_a_run_json_without_the_format_key_is_format_0_with_the_same_fields():
    old, new = load(CPU_NO_FORMAT), load(CPU)
    assert old.format == 0 and new.format == 1
    assert {**old.to_dict(), "format": 1} == new.to_dict()


@pytest.mark.parametrize("path", [H200, CPU, CPU_NO_FORMAT])
def test_a_run_json_read_is_written_again_as_it_was_key_order_included(path, tmp_path):
    report = load(path)
    assert json.dumps(report.to_dict()) == json.dumps(json.loads(path.read_text()))
    save(report, tmp_path / "run.json")
    assert json.loads((tmp_path / "run.json").read_text()) == json.loads(path.read_text())
    assert load(tmp_path / "run.json") == report


def test_a_new_report_is_written_with_the_format_first():
    written = RunReport(timing={"median_ms": 1.0}, device="cpu").to_dict()
    assert list(written) == ["format", "timing", "device"] and written["format"] == FORMAT


def test_a_newer_format_is_one_error_line_naming_the_file_and_both_formats(tmp_path):
    data = json.loads(CPU.read_text())
    (tmp_path / "run.json").write_text(json.dumps(dict(data, format=FORMAT + 1)))
    with pytest.raises(NewerFormat) as caught:
        load(tmp_path / "run.json")
    message = str(caught.value)
    assert isinstance(caught.value, PerflabError) and "\n" not in message
    assert message.startswith(f"{tmp_path / 'run.json'}: a perflab run report of format {FORMAT + 1}, newer than this perflab")
    assert f"(up to {FORMAT})" in message
    with pytest.raises(NewerFormat):  # there is a report, and it cannot be read right: not "no report"
        read(tmp_path / "run.json")
    # at the command line: one line, exit 2 (the run's page, and compare of its run.json)
    assert_one_line_error(run_cli_here("report", tmp_path), f"format {FORMAT + 1}, newer than this perflab")
    assert_one_line_error(run_cli_here("compare", tmp_path / "run.json", tmp_path / "run.json"), f"format {FORMAT + 1}")


@pytest.mark.parametrize("value", ["1", -1, 1.5, True, None])
def test_a_format_that_is_no_format_number_is_a_damaged_file(tmp_path, value):
    (tmp_path / "run.json").write_text(json.dumps({"format": value, "timing": {}, "device": "cpu"}))
    with pytest.raises(UnreadableReport, match="damaged, its 'format' is .*, not a format number"):
        load(tmp_path / "run.json")
    assert read(tmp_path / "run.json") is None


def test_no_report_to_read_is_unreadable_and_read_says_none(tmp_path):
    (tmp_path / "cut.json").write_text(CPU.read_text()[:300])
    (tmp_path / "list.json").write_text("[1, 2]")
    for name, fragment in (("missing.json", "could not be read"), ("cut.json", "damaged, not JSON"), ("list.json", "damaged, not a JSON object")):
        with pytest.raises(UnreadableReport, match=fragment):
            load(tmp_path / name)
        assert read(tmp_path / name) is None
    assert read_dict(CPU)["format"] == 1


def test_the_readers_read_run_json_through_the_record(tmp_path):
    from perflab.analysis.compare import _run_program, run_record, untraced_loop
    from perflab.analysis.program import scaling_section
    from perflab.api import run_trace
    from perflab.sweep.programs import step_of

    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    shutil.copy(CPU, tmp_path / "a" / "run.json")
    shutil.copy(H200, tmp_path / "b" / "run.json")
    # compare: a run.json side names the trace beside it, its program labels it, its untraced steps beside the verdict
    assert run_trace(tmp_path / "a" / "run.json") == tmp_path / "a" / "trace.json.gz"
    assert run_trace(tmp_path / "b" / "run.json") == tmp_path / "b" / "trace.json.gz"
    assert _run_program(tmp_path / "a" / "run.json") == "/tmp/rr_gen/prog.py 14"
    assert isinstance(run_record(tmp_path / "b" / "run.json"), RunReport) and run_record(tmp_path / "c" / "run.json") is None
    loop = untraced_loop(run_record(tmp_path / "a" / "run.json"), "A")
    assert loop["median_ms"] == pytest.approx(0.6886795) and loop["mean_ms"] == pytest.approx(5.829282125000001)
    assert untraced_loop(run_record(tmp_path / "b" / "run.json"), "B")["mean_ms"] is None  # format 0 from the GPU: no loop then
    # a program's ab: the mean step a round compares
    assert step_of(load(CPU), tmp_path / "a", None) == (pytest.approx(5.829282125000001), "mean step")
    # the scaling over rank counts (``perflab run --nproc 1,2``): each count's run.json as read
    section = scaling_section({1: load(H200), 2: load(H200)})
    assert [row["step_ms"] for row in section["rows"]] == [pytest.approx(102.8873291015625)] * 2
    assert section["rows"][0]["verdict"].startswith("GPU-bound: kernels fill 98%")


def undeclared(view, path: str = "") -> list[str]:
    """Every key a section holds that its ``Section`` does not declare, through the sections it declares (``a.b[0].c``)."""
    from perflab.records.run_report import Section, _kind

    found = [f"{path}{key}" for key in view.raw if key not in type(view).keys()]
    for key in sorted(view.raw.keys() & type(view).keys()):
        kind = _kind(type(view), key)
        value = getattr(view, key)
        if kind and kind[0] == "one" and isinstance(view.raw[key], dict):
            found += undeclared(value, f"{path}{key}.")
        elif kind and kind[0] == "list":
            for i, item in enumerate(value):
                found += undeclared(item, f"{path}{key}[{i}].") if isinstance(item, Section) else []
    return found


@pytest.mark.parametrize("name", ["mlp_cpu_run.json", "nanogpt_h200_run_format0.json", "spawn_resnet50_h200_run.json",
                                  "sync_compiled_h200_run.json"])
def test_the_declared_sections_name_every_key_a_run_writes(name):
    """Each section is declared once (``records.run_report``'s ``Section``s, ``RunView`` from ``RunReport``'s fields):
    every key of a CPU run, of an H200 nanoGPT run of format 0, and of a spawned ResNet-50's H200 run (its loop's
    input, loaders and fix, its processes, its evidence), through every declared section, is declared, so a reader
    that goes by attribute finds what is there."""
    from perflab.records.run_report import RunView

    assert undeclared(RunView.of(load(DATA / name))) == []


def test_two_ddp_ranks_communication_is_declared():
    from perflab.records.run_report import Communication

    communication = json.loads((Path(__file__).parent / "data" / "run" / "nanogpt_ddp_h100.json").read_text())["communication"]
    assert undeclared(Communication(communication)) == []
    assert Communication(communication).ranks[0].rank == 0


def test_a_section_read_by_attribute_keeps_its_dict_and_refuses_an_undeclared_name():
    from perflab.records.run_report import Loop, RunView

    report = load(DATA / "spawn_resnet50_h200_run.json")
    view = RunView.of(report)
    assert view.loop.raw is report.loop  # the dict run.json holds, not a copy
    assert view.loop.input.loaders[0].num_workers == 12 and view.utilisation.mfu == pytest.approx(0.98399, abs=1e-5)
    assert view.loop.stalls.threshold_ms == pytest.approx(93.687, abs=1e-3) and view.options.skip == 10
    empty = Loop(None)
    assert not empty and empty.stalls.steps is None and empty.sync.sites == [] and empty.input.fix.speedup is None
    assert "median_ms" in view.timing and "fix" in view.loop.input and "named" not in view.timing
    with pytest.raises(AttributeError):
        view.timing.medain_ms
    assert not RunView({"verdict": "a sentence, as a format-0 file may hold"}).verdict  # no mapping: an empty section
