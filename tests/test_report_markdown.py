"""report.md from stored rows: the seeds' table shapes, exact numbers, failed cells, plots; results export."""

import csv
import io
import json

import pytest

from cli_util import run_cli_here
from perflab.report.markdown import write_report
from perflab.spec import Case
from perflab.sweep.spec import ComparisonSpec, Experiment
from perflab.sweep.store import Store

BASE, TOPK = "deit_base_patch16_224", "topk_deit_base_patch16_224"
# Seed 001's batch sweep at 224 px (img/s): baseline, with TR.
SEED_001 = {1: (152.68, 137.25), 2: (157.88, 136.39), 4: (149.81, 132.04), 8: (157.65, 136.68), 16: (157.34, 132.85)}
TOKENS = {224: ([197], [197, 21, 3, 2]), 448: ([785], [785, 80, 9, 2])}
GFLOPS = {224: (35.14, 11.10), 448: (157.04, 49.46)}


def synthetic_row(model, size, bs, tp, status="ok", dtype="bf16", mode="eager", flags=("no_power",)):
    reducing = model.startswith("topk_")
    case = Case(model, input_size=size, batch_size=bs, dtype=dtype, mode=mode, device="cuda",
                keep_rate=(0.1,) if reducing else (), reduction_loc=(3, 6, 9) if reducing else ())
    row = {
        "case_id": case.id, "case": case.to_dict(), "status": status, "message": None, "model": model,
        "method": case.method, "keep_rate": list(case.keep_rate), "reduction_loc": list(case.reduction_loc),
        "tokens": TOKENS[size][reducing], "input_size": size, "batch_size": bs, "dtype": dtype, "mode": mode,
        "attn": "sdpa", "device": "cuda", "device_name": "NVIDIA Test GPU", "flags": list(flags), "warnings": [],
        "env": {"gpu_name": "NVIDIA Test GPU", "driver": "999.1", "torch": "2.9.0", "cuda": "12.8", "host": "lab"},
        "gflops": None, "median_ms": None, "ci95_ms": None, "throughput_per_s": None,
    }
    if status == "ok":
        median = bs * 1000.0 / tp
        row.update(median_ms=median, ci95_ms=[median * 0.995, median * 1.005], throughput_per_s=tp,
                   latency_ms_per_batch=median, latency_ms_per_sample=median / bs, gflops=GFLOPS[size][reducing],
                   cv=0.01, samples_ms=[median] * 5)
    else:
        row["message"] = "OutOfMemoryError: CUDA out of memory (synthetic)"
    return row


@pytest.fixture
def seed_store(tmp_path):
    rows = []
    for bs, (base_tp, tr_tp) in SEED_001.items():
        rows.append(synthetic_row(BASE, 224, bs, base_tp))
        rows.append(synthetic_row(TOPK, 224, bs, tr_tp, flags=("no_power", "high_cv") if bs == 4 else ("no_power",)))
    rows.append(synthetic_row(BASE, 224, 32, 158.0))
    rows.append(synthetic_row(TOPK, 224, 32, None, status="oom"))  # a planted OOM cell
    rows.append(synthetic_row(BASE, 448, 8, 32.8))
    rows.append(synthetic_row(TOPK, 448, 8, 73.6))
    with Store.create(tmp_path) as store:
        for row in rows:
            store.put(row, "synthetic")
    return tmp_path


def table_after(text, heading):
    """The rows (lists of cells) of the first markdown table after a heading."""
    lines = text[text.index(heading):].splitlines()[1:]
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    table = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        table.append([cell.strip() for cell in line.strip("|").split(" | ")])
    return table


def test_report_rebuilds_the_seed_001_table_with_exact_speedups_and_an_oom_cell(seed_store):
    text = write_report(seed_store, n_boot=100).read_text()
    assert "### bf16, eager" in text  # one table group per (dtype, mode)
    header = "| Batch size | Baseline TP (img/s) | TR TP (img/s) | Speedup | Latency Δ | Result | Flags |"
    assert header in text
    table = table_after(text, "#### Batch size sweep (input size 224)")
    assert [r[0] for r in table] == ["1", "2", "4", "8", "16", "32"]
    speedups = [r[3].split("×")[0] for r in table[:5]]
    assert speedups == ["0.899", "0.864", "0.881", "0.867", "0.844"]  # seed 001's column, from the stored rows
    assert [r[4] for r in table[:5]] == ["+11.2%", "+15.8%", "+13.5%", "+15.3%", "+18.4%"]
    assert table[0][1].startswith("152.68 [151.92–153.45]")  # TP with its 95% CI
    assert all(r[5] == "✗ Slower" for r in table[:5])
    assert table[2][6] == "high_cv" and table[0][6] == "–"  # no_power is on every row: said once, not per cell
    assert "Flags raised on every successful case (not repeated in the tables): no_power" in text
    assert table[5][2] == "OOM" and table[5][3] == "–" and table[5][5] == "— TR OOM"
    assert "**FLOPs:** 35.14 → 11.10 GFLOPs per image (68.4% fewer)." in text
    assert "**Mean speedup:** 0.871× (geometric mean over 5 of 6 batch sizes)." in text


def test_report_has_the_seed_002_combined_table_environment_and_plots(seed_store):
    text = write_report(seed_store, n_boot=100).read_text()
    table = table_after(text, "#### All input sizes")
    assert [(r[0], r[1]) for r in table] == [("224", b) for b in ("1", "2", "4", "8", "16", "32")] + [("448", "8")]
    last = table[-1]
    assert last[2].startswith("32.80") and last[3].startswith("73.60") and last[4].startswith("2.244×")
    assert last[6:9] == ["157.04", "49.46", "785 → 2"]
    assert "| test |" not in text
    assert "**NVIDIA Test GPU** · driver 999.1 · CUDA 12.8 · torch 2.9.0" in text
    assert "| OOM | OutOfMemoryError: CUDA out of memory (synthetic) |" in text  # the status table
    images = [p for p in seed_store.iterdir() if p.suffix == ".png"]
    assert {p.name for p in images} >= {"throughput_topk_deit_base_patch16_224_vs_deit_base_patch16_224_bf16_eager.png",
                                        "latency_topk_deit_base_patch16_224_vs_deit_base_patch16_224_bf16_eager.png",
                                        "speedup_vs_tokens_topk_deit_base_patch16_224_vs_deit_base_patch16_224.png"}
    for image in images:
        assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"]({image.name})" in text


def test_named_mode_comparison_groups_by_model_and_marks_cases_not_run(tmp_path):
    rows = [synthetic_row(m, 224, 1, tp, mode=mode) for m, mode, tp in
            [(BASE, "eager", 150.0), (BASE, "cudagraph", 300.0), (TOPK, "eager", 130.0)]]
    missing = synthetic_row(TOPK, 224, 1, 400.0, mode="cudagraph")
    cases = [Case.from_dict(r["case"]) for r in rows + [missing]]
    experiment = Experiment("graphs.yaml", "graphs", "eager vs CUDA graph", None, 600.0, tuple(cases),
                            (ComparisonSpec("cuda_graph", {"mode": "eager"}, {"mode": "cudagraph"}, ("eager", "CUDA graph")),))
    with Store.create(tmp_path) as store:
        sid = store.begin_sweep(command="perflab sweep graphs.yaml", spec_source="graphs.yaml", spec_text="name: graphs\n",
                                experiment=experiment.to_json(), env_key="e", n_cases=4, n_skipped=0)
        for row in rows:
            store.put(row, "e", sweep_id=sid)
    text = write_report(tmp_path, n_boot=100).read_text()
    assert "### deit_base_patch16_224, bf16" in text and "### topk_deit_base_patch16_224, bf16, keep 0.1 @ 3,6,9" in text
    base_table = table_after(text, "### deit_base_patch16_224, bf16")
    assert base_table[0][3].startswith("2.000×") and base_table[0][5] == "✓ Faster"
    topk_table = table_after(text, "### topk_deit_base_patch16_224")
    assert topk_table[0][2] == "not run" and topk_table[0][5] == "— CUDA graph not run"
    assert "`perflab sweep graphs.yaml`" in text and "did not finish" in text
    assert "```yaml\nname: graphs\n```" in text


def test_results_export_json_and_csv(seed_store):
    r = run_cli_here("results", seed_store, "--format", "json")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(rows) == 14 and len({row["case_id"] for row in rows}) == 14
    assert {"case_id", "status", "model", "throughput_per_s", "ci95_ms", "env", "env_key"} <= set(rows[0])
    r = run_cli_here("results", seed_store, "--format", "csv")
    assert r.returncode == 0, r.stderr
    table = list(csv.DictReader(io.StringIO(r.stdout)))
    assert r.stdout.splitlines()[0].startswith("run_name,tp,latency_ms,time_total,gmacs,max_memory,no_params,no_params_trainable,power,case_id")
    oom = next(rec for rec in table if rec["status"] == "oom")
    assert oom["tp"] == "" and oom["model"] == TOPK
    assert float(table[0]["tp"]) == pytest.approx(152.68)
    # the study-shaped CSV: its nine columns alone, under its names, its flops the GMACs its column held
    study = run_cli_here("results", seed_store, "--format", "study-csv")
    assert study.returncode == 0, study.stderr
    records = list(csv.DictReader(io.StringIO(study.stdout)))
    assert study.stdout.splitlines()[0] == "run_name,tp,latency_ms,time_total,flops,max_memory,no_params,no_params_trainable,power"
    assert [r["flops"] for r in records] == [rec["gmacs"] for rec in table] and len(records) == 14


def test_report_shows_host_speed_beside_eager_results_and_explains_host_drift(tmp_path):
    # Eager and CUDA-graph pairs at bs 1, 2, 4, 8; the canaries (µs) are ~100 except the top-k eager bs 8 row's 130.
    canary = {(BASE, "eager"): [100, 101, 99, 100], (TOPK, "eager"): [102, 98, 100, 130],
              (BASE, "cudagraph"): [101, 99, 100, 100], (TOPK, "cudagraph"): [100, 102, 98, 101]}
    with Store.create(tmp_path) as store:
        for (model, mode), values in canary.items():
            for bs, value in zip((1, 2, 4, 8), values):
                row = synthetic_row(model, 224, bs, SEED_001[bs][model == TOPK], mode=mode)
                store.put(dict(row, host_canary_us=float(value)), "synthetic")
        store.put(synthetic_row(BASE, 448, 8, 32.8), "synthetic")  # a row stored before the canary: "–", never flagged
    text = write_report(tmp_path, n_boot=100).read_text()
    assert "`host_drift` marks a row whose canary is more than 15% off the median of its environment's rows" in text
    assert "1 row(s) carry it." in text  # 130 µs against the median 100 of the 16 canaries; 1.30× > 1.15
    eager = text[text.index("### bf16, eager"):text.index("### bf16, cudagraph")]
    assert "| Batch size | Baseline TP (img/s) | TR TP (img/s) | Speedup | Latency Δ | Result | Host µs (Baseline / TR) | Flags |" in eager
    table = table_after(eager, "#### Batch size sweep (input size 224)")
    assert [r[6] for r in table] == ["100 / 102", "101 / 98", "99 / 100", "100 / 130"]
    assert [r[7] for r in table] == ["–", "–", "–", "host_drift"]
    combined = table_after(eager, "#### All input sizes")
    assert combined[-1][:2] == ["224", "8"] and combined[-1][9:] == ["100 / 130", "host_drift"]
    graphs = text[text.index("### bf16, cudagraph"):]
    assert "Host µs" not in table_after(graphs, "#### Batch size sweep (input size 224)")[0]
    assert "| Baseline TP (img/s) | TR TP (img/s) | Speedup | Latency Δ | Result | Flags |" in graphs  # CUDA graphs: no column
    rows = table_after(text, "## All cases")
    cells = {(r[0], r[2], r[4]): r[-2:] for r in rows}
    assert cells[(TOPK + " kr0.1@3,6,9", "8", "eager")] == ["130 (1.30×)", "host_drift"]
    assert cells[(BASE, "1", "eager")] == ["100 (1.00×)", "–"]
    assert [r[-2] for r in rows if r[1] == "448"] == ["–"]

    r = run_cli_here("results", tmp_path, "--format", "json")
    assert r.returncode == 0, r.stderr
    stored = [json.loads(line) for line in r.stdout.splitlines()]
    assert [row["case_id"] for row in stored if "host_drift" in row["flags"]] == [
        Case(TOPK, input_size=224, batch_size=8, dtype="bf16", mode="eager", device="cuda", keep_rate=(0.1,), reduction_loc=(3, 6, 9)).id]
    r = run_cli_here("results", tmp_path, "--wide")  # piped, at 100 columns, the table leaves the host column out and says so
    assert r.returncode == 0, r.stderr
    assert "host µs" in r.stdout and "130 (1.30×)" in r.stdout and "host_drift" in r.stdout


def test_one_flop_count_per_row_and_the_formulas_beside_it():
    """gpt_large bf16 train_step, seq 512, batch 4: the formula's 12.333 TFLOP (3 × forward: 4.111); the counter adds
    ½ × the forward's attention (36 layers × 4 × 4 · 512² · 1280 = 193.27 GFLOP): the fused attention's backward
    recomputes the scores. MFU 40.0% by the count is 39.69% by the formula."""
    from perflab.models.lm import LMConfig, forward_flops
    from perflab.report.md import flops_ratio, formula_cell, mfu_by_formula

    config = LMConfig.from_name("gpt_large")
    formula = 3 * forward_flops(config, 4, 512)
    attention = 36 * 4 * 4 * 512 ** 2 * 1280
    counted = formula + attention / 2
    row = {"mfu": 0.400, "gflops_per_batch": counted / 1e9, "flops_analytic": formula}
    assert flops_ratio(row) == pytest.approx(1.007836, abs=1e-6)
    assert mfu_by_formula(row) == pytest.approx(0.400 / 1.007836, rel=1e-6)
    assert formula_cell(row) == "39.7% (×1.0078)"
    assert formula_cell({"mfu": 0.4, "gflops_per_batch": 1.0}) == "–"  # no formula: nothing beside it
    assert flops_ratio({"flops_counted_over_analytic": 1.5, "gflops_per_batch": 1.0, "flops_analytic": 1e9}) == 1.5


def _track_store(tmp_path):
    """A track store of one case at two revisions (c2, then c3 at 1.5x the time), as perflab track records it."""
    row = synthetic_row(BASE, 224, 8, 150.0)
    case = Case.from_dict(row["case"])
    versions = [{"name": rev, "kind": "revision", "key": f"commit:{sha}", "python": "/venv/bin/python", "revision": rev,
                 "commit": sha, "subject": f"{rev}'s change", "torch": "2.9.0", "cuda": "12.8", "driver": "999.1", "perflab": "0.3"}
                for rev, sha in (("c2", "a3d3cc65ea" + "0" * 30), ("c3", "b4e4dd76fb" + "1" * 30))]
    experiment = Experiment("track", "track", "", None, 600.0, (case,), ())
    with Store.create(tmp_path) as store:
        store.begin_sweep(command="perflab track", spec_source="track", spec_text="", env_key="e:c2,e:c3", n_cases=2, n_skipped=0,
                          experiment=dict(experiment.to_json(), versions=versions, kind="track", rounds=1, order="alternate",
                                          threshold=0.05, pairing="blocks"))
        for scale, version in zip((1.0, 1.5), versions):
            stored = {k: ([x * scale for x in v] if k in ("ci95_ms", "samples_ms") else v * scale if k in ("median_ms", "latency_ms_per_batch", "latency_ms_per_sample") else v)
                      for k, v in row.items()}
            key = f"e:{version['revision']}"
            store.put_environment(key, {"gpu_name": "NVIDIA Test GPU", "torch": "2.9.0"})
            store.put(dict(stored, version=version, throughput_per_s=150.0 / scale), key)
    return tmp_path


def test_results_and_the_report_of_a_track_store_show_each_rows_revision(tmp_path):
    from perflab.report.export import read_exported_rows

    out = _track_store(tmp_path)
    table = run_cli_here("results", out)
    assert table.returncode == 0, table.stderr
    lines = [line for line in table.stdout.splitlines() if line.startswith("│ c")]
    assert "┃ revision" in table.stdout and len(lines) == 2
    assert "c2 (a3d3cc65ea)" in lines[0] and "53.33" in lines[0] and "c3 (b4e4dd76fb)" in lines[1] and "80.00" in lines[1]
    csv_text = run_cli_here("results", out, "--format", "csv").stdout
    (tmp_path / "rows.csv").write_text(csv_text)
    back = read_exported_rows(tmp_path / "rows.csv")
    assert [(r["revision"], r["commit"][:10], r["median_ms"]) for r in back] == [("c2", "a3d3cc65ea", pytest.approx(53.333, abs=1e-3)),
                                                                                ("c3", "b4e4dd76fb", pytest.approx(80.0))]
    text = write_report(out).read_text()
    assert "The tables below show the rows of c3 (b4e4dd76fb), the last version" in text
    cases = table_after(text, "## All cases")
    assert text.split("## All cases")[1].split("\n")[2].startswith("| Revision | Model |")
    assert [(r[0], r[7].split(" ")[0]) for r in cases] == [("c2 (a3d3cc65ea)", "53.333"), ("c3 (b4e4dd76fb)", "80.000")]


def test_a_table_cell_with_any_line_break_stays_on_its_row():
    """A failed case's message may carry \\r\\n or a Unicode line separator: each row of the table is one line, whichever
    reads it (explain's markdown once split the table with str.splitlines, which breaks at every one of them)."""
    from perflab.report.md import md_table

    table = md_table(["mode", "measured"], [["compile", "error: inductor\r\nfailed"], ["cudagraph", "oom: a\u2028b\x0cc"]])
    assert table.splitlines() == ["| mode | measured |", "|---|---|", "| compile | error: inductor failed |", "| cudagraph | oom: a b c |"]
