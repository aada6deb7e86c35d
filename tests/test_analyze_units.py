"""perflab analyze: a summary with a header and units, one unit per table, every JSON key naming its unit, and a
module tree that does not repeat itself for each of a model's identical layers."""

import io
import re
from pathlib import Path

from rich.console import Console

import perflab
from perflab.analysis.modules import fold_repeats
from perflab.report.trace_console import render_trace_report

TRACES = Path(__file__).parent / "data" / "traces"


def rendered(report, width=100) -> str:
    buffer = io.StringIO()
    render_trace_report(Console(file=buffer, width=width, highlight=False, color_system=None), report)
    return buffer.getvalue()


def test_the_summary_has_a_header_with_units_and_no_title_names_another_unit_than_its_columns():
    report = perflab.analyze(TRACES / "train_step.json.gz")
    text = rendered(report)
    header = next(line for line in text.splitlines() if "whole trace" in line)
    assert re.search(r"whole trace\s+┃\s+µs\s+┃\s+% of wall", header)
    wall = next(line for line in text.splitlines() if "wall (trace window)" in line)
    assert f"{report.trace_accounting['wall_ns'] / 1000:,.1f}" in wall
    assert "(exact, ns)" not in text and "exact to the ns" in text
    for title in re.findall(r"Accounting [^\n]*", text):
        assert "(µs)" in title  # the accounting tables' columns are µs, and their titles say so


def test_every_json_time_names_its_unit():
    summary = perflab.analyze(TRACES / "train_step.json.gz").to_dict()
    unitless = []

    def walk(value, key=""):
        if isinstance(value, dict):  # a mapping of causes or categories takes its unit from its own key
            for k, v in value.items():
                walk(v, key if key.endswith(("_us", "_ns")) and isinstance(v, (int, float)) else k)
        elif isinstance(value, list):
            for item in value:
                walk(item, key)
        elif isinstance(value, float) and not key.endswith(("_us", "_ns", "share", "fraction", "_per_step")):
            unitless.append(key)

    walk(summary)
    assert unitless == []
    assert set(summary["idle_by_cause_us"]) == {"host_bound", "kernel_gap", "other"}
    assert summary["wall_us"] == round(summary["accounting_ns"]["wall_ns"] / 1000, 3)


def test_the_module_tree_folds_a_models_identical_layers_into_one_row():
    report = perflab.analyze(TRACES / "by_module_lm_forward.json.gz")
    tree = report.modules
    folded = fold_repeats(tree)
    layers = folded[folded["module"] == "layers.0–11"].iloc[0]
    assert layers["instances"] == 12 and layers["class"] == "Block"
    every_layer = tree[tree["module"].str.fullmatch(r"layers\.\d+")]
    assert len(every_layer) == 12 and layers["inclusive_ns"] == every_layer["inclusive_ns"].sum()
    attention = folded[folded["module"] == "layers.0–11.attention"].iloc[0]
    assert attention["exclusive_ns"] == tree[tree["module"].str.fullmatch(r"layers\.\d+\.attention")]["exclusive_ns"].sum()
    # still closes: the folded rows' exclusive times add up to the pass's kernel time, as the tree's do
    assert folded["exclusive_ns"].sum() == tree["exclusive_ns"].sum()
    text = rendered(report)
    assert "0–11 (×12)" in text and text.count("│ forward │") == 1  # the pass named once
    module_rows = [line for line in text.split("GPU time by module")[1].splitlines() if line.startswith("│")]
    assert len(module_rows) == 10  # was 66: the same layer's five rows twelve times
