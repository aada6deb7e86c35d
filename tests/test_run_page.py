"""perflab run's page (``OUT/report.html``, ``report.run_page``), without a browser: the figures of run.json on it as
the console formats them, nothing on it that loads from anywhere, ``perflab report OUT`` for a run's directory and its
bad input. The browser's view of the same pages: tests/test_run_page_browser.py."""

from __future__ import annotations

import html
import json
import re
import shutil
from pathlib import Path

import pytest
from cli_util import assert_one_line_error, run_cli_here

from perflab.report.run_page import run_page_html, write_run_page
from perflab.units import ms as _ms
from perflab.units import pct as _pct
from perflab.units import us as _in_us

ROOT = Path(__file__).resolve().parents[1]
GPU_RUNS = sorted((ROOT / "docs" / "performance" / "whole-loop-h200").glob("*/run.json"))
SLOW = ROOT / "docs" / "performance" / "whole-loop-h200" / "slow" / "run.json"
DDP = ROOT / "tests" / "data" / "run" / "nanogpt_ddp_h100.json"


def text_of(page: str) -> str:
    """The page's text as a reader sees it: tags out, entities decoded."""
    return html.unescape(re.sub(r"<[^>]+>", " ", page))


def cell_after(page: str, label: str) -> str:
    """The cell after the table cell holding ``label`` (a two-column table's value)."""
    match = re.search(r"<td[^>]*>" + re.escape(html.escape(label, quote=True)) + r"</td><td[^>]*>(.*?)</td>", page)
    assert match, label
    return html.unescape(match.group(1))


def test_the_page_of_a_gpu_run_holds_run_jsons_figures_as_the_console_formats_them(tmp_path):
    report = json.loads(SLOW.read_text())
    page = run_page_html(report, out_dir=tmp_path)
    timing, loop = report["timing"], report["loop"]
    assert re.search(r'id="median-ms">' + re.escape(_ms(timing["median_ms"])) + "<", page)  # 104.397
    assert re.search(r'id="mean-ms">' + re.escape(_ms(loop["mean_ms"])) + "<", page)  # 314.952: the stalls' doing
    assert f'id="verdict-message">{html.escape(report["verdict"]["message"])}<' in page
    assert cell_after(page, "step: mean (wall time ÷ steps) / median ms") == f"{_ms(loop['mean_ms'])} / {_ms(timing['median_ms'])}"
    busy = loop["busy"]
    assert cell_after(page, "GPU busy (no profiler)") == f"{_pct(busy['busy_share'])} (GPM; NVML's samples {_pct(busy['nvml_util'])})"
    # every kernel of the top table with its total and mean, as analyze's drawer prints them
    for kernel in report["accounting"]["top_kernels"]:
        row = f"<td class=\"l\">{html.escape(kernel['name'])}</td><td class=\"l\">{kernel['category']}</td><td class=\"r\">{kernel['count']:,}</td>" \
              f"<td class=\"r\">{_in_us(kernel['total_us'])}</td><td class=\"r\">{_in_us(kernel['total_us'] / kernel['count'])}</td>"
        assert row in page
    acc = report["accounting"]["accounting_ns"]
    assert cell_after(page, "wall (trace window)") == f"{acc['wall_ns'] / 1000:,.1f}"
    # the plot: a bar per step, in order, by phase; the stalls marked, as loop.stalls counts them
    bars = re.findall(r'<g class="bar (\w+)( stall)?" data-step="(\d+)" data-ms="([^"]+)">', page)
    timed = [float(ms) for kind, _, _, ms in bars if kind == "timed"]
    assert timed == timing["samples_ms"]
    assert [float(ms) for kind, _, _, ms in bars if kind == "traced"] == report["traced"]["step_ms_each"]
    assert [float(ms) for kind, _, _, ms in bars if kind == "warmup"] == report["traced"]["warmup_step_ms"]
    assert [int(i) for kind, stall, i, _ in bars if stall] == loop["stalls"]["steps"]
    assert f"stall threshold {_ms(loop['stalls']['threshold_ms'])} ms" in text_of(page)
    # a stall's tooltip names its wait for input, from loop.per_step
    i = loop["stalls"]["steps"][0]
    assert f"timed step {i}: {_ms(timing['samples_ms'][i])} ms (a stall); waiting for input {_ms(loop['per_step']['input_ms'][i])} ms" in text_of(page)
    # the evidence: the synchronising call site, the loader, the processes seen, the trace to open in Perfetto
    site = loop["sync"]["sites"][0]
    assert site["site"] in text_of(page) and _ms(site["blocked_ms_per_step"]) in text_of(page)
    assert "SyntheticImages" in page and 'id="processes-table"' in page and "DataLoader worker" in page
    assert '<a href="https://ui.perfetto.dev"' in page and report["traced"]["trace_path"] in page


def test_the_page_fetches_nothing(tmp_path):
    page = run_page_html(json.loads(SLOW.read_text()), out_dir=tmp_path)
    assert "default-src 'none'" in page  # the browser refuses any load, should one creep in
    assert not re.search(r"<(script|img|link[^>]*stylesheet|iframe|object|embed)\b[^>]*\b(src|href)=", page)
    assert not re.search(r"url\(|@import", page)
    # the only addresses are Perfetto's (a link the reader follows) and the SVG namespace
    assert set(re.findall(r"https?://[^\s\"'<)]+", page)) <= {"https://ui.perfetto.dev", "http://www.w3.org/2000/svg"}


@pytest.mark.parametrize("path", GPU_RUNS, ids=[p.parent.name for p in GPU_RUNS])
def test_every_committed_gpu_run_makes_a_page_with_its_median_and_verdict(tmp_path, path):
    report = json.loads(path.read_text())
    shutil.copy(path, tmp_path / "run.json")
    page = write_run_page(tmp_path).read_text()
    assert f'id="median-ms">{_ms(report["timing"]["median_ms"])}<' in page
    assert f'id="verdict-message">{html.escape(report["verdict"]["message"])}<' in page
    assert page.count('class="bar timed') == report["timing"]["steps"]


def test_ranks_communication_and_scaling_tables(tmp_path):
    from perflab.analysis.program import scaling_section

    one = json.loads(SLOW.read_text())
    ddp = json.loads(DDP.read_text())
    two = dict(one, world_size=2, slowest_rank=ddp["slowest_rank"], step_ms=ddp["step_ms"], communication=ddp["communication"],
               ranks=[{"rank": int(r), "median_ms": ms, "ci95_ms": [ms - 1, ms + 1], "steps_seen": 58, "flags": ["high_cv"]}
                      for r, ms in ddp["rank_median_ms"].items()])
    page = run_page_html(two)
    assert cell_after(page, "0*") == _ms(ddp["rank_median_ms"]["0"])  # the slowest rank starred, as the console stars it
    comm = ddp["communication"]["ranks"][0]
    assert f"<td class=\"r\">{_ms(comm['comm_ms'])}</td><td class=\"r\">{_ms(comm['exposed_ms'])}</td>" in page
    assert f"floor {ddp['communication']['floor_ms']:.3f} ms" in page
    # a --nproc 1,2 run's directory: the scaling page, and each count's own page
    for n, report in ((1, one), (2, two)):
        (tmp_path / f"nproc{n}").mkdir()
        (tmp_path / f"nproc{n}" / "run.json").write_text(json.dumps(report))
    section = scaling_section({1: one, 2: two})
    (tmp_path / "scaling.json").write_text(json.dumps(section))
    page = write_run_page(tmp_path).read_text()
    row = section["rows"][1]
    assert f"<td class=\"r\">2</td><td class=\"r\">{_ms(row['step_ms'])}</td><td class=\"r\">×{row['work_ratio']:.2f}</td>" in page
    assert f"{row['efficiency']:.3f}" in page and 'href="nproc2/report.html"' in page
    assert (tmp_path / "nproc1" / "report.html").is_file() and (tmp_path / "nproc2" / "report.html").is_file()


def test_a_run_that_ended_before_its_traced_steps_has_a_page_of_its_timed_steps():
    report = json.loads(SLOW.read_text())
    early = {k: report[k] for k in ("timing", "device", "loop", "program", "steps_from", "options", "recorded", "rank", "world_size", "run_id")}
    early.update(partial=True, flags=[], exit_code=1, ended_by="exception")
    page = run_page_html(early)
    assert "the program ended before its traced steps were analysed" in page and "ended by exception (exit code 1)" in page
    assert page.count('class="bar timed') == report["timing"]["steps"] and "This run wrote no trace" not in page  # recorded names it


def test_perflab_report_writes_a_runs_page_and_says_what_is_wrong_with_bad_input(tmp_path):
    shutil.copy(SLOW, tmp_path / "run.json")
    r = run_cli_here("report", tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == f"wrote {tmp_path / 'report.html'}"
    assert "perflab run: " in (tmp_path / "report.html").read_text()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_one_line_error(run_cli_here("report", empty), "no results store (results.sqlite) here, nor a `perflab run`'s run.json")
    for name, text, fragment in (("cut", SLOW.read_text()[:500], "damaged, not JSON"), ("list", "[1, 2]", "damaged, not a JSON object"),
                                 ("other", '{"rows": []}', "not a `perflab run` report"),
                                 ("wrong", json.dumps(dict(json.loads(SLOW.read_text()), loop={"stalls": 3})), "damaged, a field")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "run.json").write_text(text)
        assert_one_line_error(run_cli_here("report", tmp_path / name), f"{tmp_path / name / 'run.json'}: {fragment}")


def test_a_damaged_flag_entry_is_left_out_not_shown_as_none():
    """run.json's flags are mappings; an entry that is not one (a hand-edited or damaged file) is not shown as a flag
    named "None", on the page or in the console's lines."""
    from pathlib import Path

    from perflab.records.run_report import load
    from perflab.report.program import run_lines
    from perflab.report.run_page import run_page_html

    report = load(Path(__file__).parent / "data" / "records" / "mlp_cpu_run.json").to_dict()
    report["flags"] = ["not a mapping", {"flag": "high_cv", "message": "the steps vary"}]
    page = run_page_html(report)
    assert "<code>high_cv</code>: the steps vary" in page and "<code>None</code>" not in page
    lines = run_lines(report)
    assert "high_cv: the steps vary" in lines and not any(line.startswith("None") for line in lines)
