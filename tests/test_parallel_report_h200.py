"""The lm report's data-parallel section on the store measured on two H200s (docs/reports/lm_parallel, issue 27):
every cell recomputed here from the stored rows, independently of the report code."""

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from perflab.report.markdown import write_report

ROOT = Path(__file__).resolve().parents[1]
STORE = ROOT / "docs/reports/lm_parallel"


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    out = tmp_path_factory.mktemp("lm_parallel")
    shutil.copy(STORE / "results.sqlite", out / "results.sqlite")
    with sqlite3.connect(str(out / "results.sqlite")) as conn:
        rows = [json.loads(r) for (r,) in conn.execute("SELECT row_json FROM results")]
    return write_report(out).read_text(), rows


def _table(text: str, heading: str) -> dict:
    section = text[text.index(heading):].splitlines()
    start = next(i for i, l in enumerate(section) if l.startswith("|"))
    lines = section[start:start + next(i for i, l in enumerate(section[start:]) if not l.startswith("|"))]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return {(cells[0], cells[4]): dict(zip(header, cells)) for cells in
            ([c.strip() for c in l.strip("|").split("|")] for l in lines[2:])}


def test_the_committed_report_is_what_the_store_gives(measured):
    text, _ = measured
    assert (STORE / "report.md").read_text() == text


def test_every_case_of_the_spec_ran_on_two_h200s_and_each_cell_is_the_rows(measured):
    text, rows = measured
    assert len({r["case_id"] for r in rows}) == 12 and all(r["status"] == "ok" for r in rows)
    table = _table(text, "## Training on several GPUs")
    parallel = [r for r in rows if r["case"].get("parallel")]
    assert len(parallel) == len(table) == 8
    for r in parallel:
        cell = table[(r["model"], r["case"]["parallel"])]
        assert r["env"]["gpu_name"] == "NVIDIA H200" and r["env"]["gpus"] == [0, 1] and r["world_size"] == 2 and r["multicast_off"] is True
        assert r["step_ms"] == max(r["rank_median_ms"]) and cell["step (ms)"] == f"{r['step_ms']:.2f}"
        low, high = r["scaling_efficiency_ci95"]
        assert low <= r["scaling_efficiency"] <= high and r["scaling_efficiency_pairs"] >= 10
        assert cell["scaling eff."] == f"{r['scaling_efficiency']:.3f} ({low:.3f}–{high:.3f})"
        # the efficiency is of the interleaved blocks: within 3% of the ratio of their medians, whatever the step alone read
        assert cell["1 GPU (ms)"] == f"{r['single_gpu_ms']:.2f}" and cell["step beside 1 GPU (ms)"] == f"{r['step_ms_beside_single']:.2f}"
        assert r["scaling_efficiency"] == pytest.approx(r["single_gpu_ms"] / r["step_ms_beside_single"], rel=0.03)
        # the bytes on the bus: DDP all-reduces the fp32 gradients, 2(N−1)/N of them; FSDP all-gathers the parameters
        # (forward, and again in the backward, but for the last unit) and reduce-scatters the gradients, (N−1)/N each
        grads = r["grad_bytes"]
        if r["case"]["parallel"] == "ddp":
            assert r["comm_bus_bytes"] == grads and r["ranks_agree"] is True
        else:
            assert r["comm_bus_bytes"] == pytest.approx(1.5 * grads, rel=0.01)  # gathers twice, scatters once: 1.5× DDP's at N = 2
        assert cell["bus MiB/step"] == f"{r['comm_bus_bytes'] / 2**20:.1f}"
        # the floor: bus bytes at the bus bandwidth the ranks measured (no sweep was cached), at the step's message size
        assert r["all_reduce"]["source"].startswith(("measured in this run", "perflab ceilings' cache"))
        assert r["comm_floor_ms"] == pytest.approx(r["comm_bus_bytes"] / (r["busbw_gbps"] * 1e9) * 1e3, rel=1e-9)
        assert 100 < r["busbw_gbps"] < 400 and cell["comm floor (ms)"] == f"{r['comm_floor_ms']:.2f}"
        assert cell["floor ÷ step"] == f"{r['comm_floor_ms'] / r['step_ms']:.1%}"
