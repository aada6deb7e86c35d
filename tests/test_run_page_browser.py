"""perflab run's page opened in a real browser: Debian's Chromium, headless, driven by selenium through chromedriver.
Each page renders with nothing on the browser's console and nothing loaded from anywhere, and the figures the reader
sees equal run.json's. The pages: a CPU run made here (``api.run`` of a small training loop whose loader is slow every
4th batch) and the committed GPU runs (docs/performance/whole-loop-h200: GPM busy share, stalls, processes).

Skipped where Chromium or chromedriver is absent (``.ci/run`` installs them: apt-get install chromium chromium-driver). Two
tests need no browser: the run writes its page, and a page that cannot be written is one line after the program."""

from __future__ import annotations

import json
import shutil
import tempfile
import textwrap
from pathlib import Path

import pytest

from perflab import api
from perflab.units import ms as _ms
from perflab.units import pct as _pct
from perflab.units import us as _in_us

ROOT = Path(__file__).resolve().parents[1]
GPU_RUNS = sorted((ROOT / "docs" / "performance" / "whole-loop-h200").glob("*/run.json"))
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
# as a CI machine should run it: no sandbox (root), no GPU, nothing fetched in the background, a fresh profile
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--window-size=1280,1000")

# a training loop whose DataLoader takes 25 ms for every 4th batch: stalls, waits for input in loop.per_step
PROGRAM = """
import time
import torch
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):
    def __len__(self):
        return 32 * 16
    def __getitem__(self, i):
        if i % (32 * 4) == 32 * 3:  # the first sample of every 4th batch
            time.sleep(0.025)
        return torch.randn(64), i % 10

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Linear(96, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for x, y in DataLoader(Slow(), batch_size=32):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
"""


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    """``perflab run`` of PROGRAM on the CPU, as the API runs it: its directory (run.json, report.html, the trace)."""
    tmp = tmp_path_factory.mktemp("page_run")
    prog = tmp / "train.py"
    prog.write_text(textwrap.dedent(PROGRAM))
    out = tmp / "out"
    assert api.run([str(prog)], out_dir=out, skip=2, steps=8, trace=2, trace_warmup=1) == 0
    return out


@pytest.fixture(scope="module")
def browser():
    if not (Path(CHROMIUM).is_file() and Path(CHROMEDRIVER).is_file()):
        pytest.skip(f"Chromium is not installed ({CHROMIUM} and {CHROMEDRIVER}): apt-get install chromium chromium-driver")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[test]')")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    profile = tempfile.mkdtemp(prefix="perflab-chromium-")
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def open_page(driver, path: Path) -> list[dict]:
    """The page loaded; the browser's console entries while it loaded (none may be an error)."""
    driver.get_log("browser")  # what an earlier page left
    driver.get(path.resolve().as_uri())
    assert driver.execute_script("return document.readyState") == "complete"
    return driver.get_log("browser")


def shown(driver, element_id: str) -> str:
    return driver.find_element("id", element_id).text


def table_value(driver, table_id: str, label: str) -> str:
    """The cell after the one reading ``label`` in a table of the page, as the browser shows it."""
    cells = driver.execute_script(
        "return Array.from(document.querySelectorAll('#' + arguments[0] + ' tr'))"
        ".map(tr => Array.from(tr.cells).map(td => td.innerText))", table_id)
    return next(row[1] for row in cells if row and row[0] == label)


def words(text: str) -> str:
    return " ".join(text.split())


def check_page(driver, report: dict) -> None:
    """What every run's page shows, against its run.json."""
    timing, loop = report["timing"], report["loop"]
    assert shown(driver, "median-ms") == _ms(timing["median_ms"])
    assert shown(driver, "mean-ms") == _ms(loop["mean_ms"])
    assert words(shown(driver, "verdict-message")) == words(report["verdict"]["message"])
    device = "CUDA events on the step's stream" if report["device"] == "cuda" else "the host clock"
    assert table_value(driver, "timing-table", f"step, median ms ({device})") == _ms(timing["median_ms"])
    assert table_value(driver, "loop-table", "step: mean (wall time ÷ steps) / median ms") == f"{_ms(loop['mean_ms'])} / {_ms(timing['median_ms'])}"
    top = report["accounting"]["top_kernels"][0]  # the first kernel (a CPU run's operator): its total time
    assert table_value(driver, "kernels-table", top["name"]) == top["category"]
    row = driver.execute_script("return Array.from(document.querySelector('#kernels-table tbody tr').cells).map(td => td.innerText)")
    assert row[3] == _in_us(top["total_us"]) and row[5] == f"{top['share']:.1%}"
    # the plot is drawn: its bars laid out, one a timed step, with its time; the stalls marked as loop.stalls has them
    plot = driver.find_element("id", "steps-plot")
    assert plot.size["width"] > 600 and plot.size["height"] > 150
    bars = driver.execute_script("return Array.from(document.querySelectorAll('#steps-plot g.bar.timed'))"
                                 ".map(g => [g.getAttribute('data-ms'), g.classList.contains('stall'), g.querySelector('rect').getBBox().height])")
    assert [float(ms) for ms, _, _ in bars] == timing["samples_ms"]
    assert [i for i, (_, stall, _) in enumerate(bars) if stall] == (loop.get("stalls") or {}).get("steps", [])
    assert all(height > 0 for _, _, height in bars)
    tallest = max(range(len(bars)), key=lambda i: timing["samples_ms"][i])
    assert max(range(len(bars)), key=lambda i: bars[i][2]) == tallest  # the longest step is the tallest bar
    assert driver.find_element("css selector", 'a[href="https://ui.perfetto.dev"]').is_displayed()
    assert report["traced"]["trace_path"] in driver.find_element("id", "trace").text
    # nothing was fetched: no resource loaded by the page, and no script on it
    assert driver.execute_script("return performance.getEntriesByType('resource').length + document.scripts.length") == 0


def test_the_browser_console_log_is_read(browser, tmp_path):
    # the check is not vacuous: a console error, and a load the page's policy refuses, both reach the log read
    from perflab.report.run_page import CSP

    control = tmp_path / "control.html"
    control.write_text(f'<html><head><meta http-equiv="Content-Security-Policy" content="{CSP}"></head><body>'
                       f'<img src="http://127.0.0.1:9/x.png"><p style="color:red">x</p></body></html>')
    log = open_page(browser, control)
    assert any(entry["source"] == "security" and "img-src data:" in entry["message"] for entry in log if entry["level"] == "SEVERE"), log
    browser.execute_script("console.error('seen')")
    assert any("seen" in entry["message"] for entry in browser.get_log("browser"))


def test_the_page_of_a_cpu_run_made_here_renders_with_run_jsons_figures(browser, cpu_run):
    report = json.loads((cpu_run / "run.json").read_text())
    assert open_page(browser, cpu_run / "report.html") == []
    check_page(browser, report)
    assert report["loop"]["stalls"]["steps"]  # the slow batches made stalls, and their waits are on the page
    stall = report["loop"]["stalls"]["steps"][0]
    tip = browser.execute_script(f"return document.querySelector('#steps-plot g.bar.timed[data-step=\"{stall}\"] title').textContent")
    assert tip.startswith(f"timed step {stall}: {_ms(report['timing']['samples_ms'][stall])} ms (a stall); "
                          f"waiting for input {_ms(report['loop']['per_step']['input_ms'][stall])} ms")


@pytest.mark.parametrize("path", GPU_RUNS, ids=[p.parent.name for p in GPU_RUNS])
def test_the_page_of_each_committed_gpu_run_renders_with_run_jsons_figures(browser, tmp_path, path):
    report = json.loads(path.read_text())
    shutil.copy(path, tmp_path / "run.json")
    api.run_page(tmp_path)
    assert open_page(browser, tmp_path / "report.html") == []
    check_page(browser, report)
    busy = report["loop"]["busy"]
    if busy.get("gpm_graphics_util") is not None:  # GPM's busy share, NVML's beside it
        assert table_value(browser, "loop-table", "GPU busy (no profiler)") == f"{_pct(busy['busy_share'])} (GPM; NVML's samples {_pct(busy['nvml_util'])})"
    if report.get("processes"):
        rows = browser.execute_script("return document.querySelectorAll('#processes-table tbody tr').length")
        assert rows == len(report["processes"])


def test_perflab_run_writes_the_page_beside_run_json(cpu_run):
    # without a browser too: the run's own page, made at the end of its traced steps, holds its median
    page = (cpu_run / "report.html").read_text()
    report = json.loads((cpu_run / "run.json").read_text())
    assert f'id="median-ms">{_ms(report["timing"]["median_ms"])}<' in page and report["run_id"] in page


def test_a_page_that_cannot_be_written_is_one_line_after_the_program(tmp_path, monkeypatch, capsys):
    from perflab.report import run_page

    def refuse(out_dir, report=None):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(run_page, "write_run_page", refuse)
    prog = tmp_path / "train.py"
    prog.write_text(textwrap.dedent(PROGRAM))
    assert api.run([str(prog)], out_dir=tmp_path / "out", skip=2, steps=8, trace=1, trace_warmup=1, stop_after=True) == 0
    assert (tmp_path / "out" / "run.json").is_file() and not (tmp_path / "out" / "report.html").exists()
    said = [line for line in capsys.readouterr().err.splitlines() if "report.html" in line]
    assert said == [f"perflab: report.html could not be written to {tmp_path / 'out'} (OSError: [Errno 28] No space left on device)"]
