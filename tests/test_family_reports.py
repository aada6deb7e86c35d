"""The lm and decode report sections on the stores measured on an H100 (docs/reports/lm_sizes, docs/reports/decode):
every figure in the tables is recomputed here from the stored rows, independently of the report code."""

import re
import shutil
import sqlite3
import json
from pathlib import Path

import pytest

from perflab.analysis.names import short_kernel_name
from perflab.report.lm import WORKLOAD_TITLES
from perflab.report.markdown import write_report

ROOT = Path(__file__).resolve().parents[1]


def _rows(store: Path) -> list[dict]:
    with sqlite3.connect(str(store)) as conn:
        return [json.loads(r) for (r,) in conn.execute("SELECT row_json FROM results")]


@pytest.fixture(scope="module")
def decode(tmp_path_factory):
    out = tmp_path_factory.mktemp("decode")
    shutil.copy(ROOT / "docs/reports/decode/results.sqlite", out / "results.sqlite")
    # counted against the whole spec, as the committed report was written (perflab report --spec experiments/decode.yaml)
    return write_report(out, spec=ROOT / "experiments/decode.yaml").read_text(), _rows(out / "results.sqlite")


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    out = tmp_path_factory.mktemp("lm")
    shutil.copy(ROOT / "docs/reports/lm_sizes/results.sqlite", out / "results.sqlite")
    return write_report(out).read_text(), _rows(out / "results.sqlite"), out


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n### ", start + len(heading))
    return text[start:end if end > 0 else None]


def _table_row(section: str, title: str, first_cell: str) -> list[str]:
    table = section[section.index(title):]
    line = next(l for l in table.splitlines() if l.startswith(f"| {first_cell} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_decode_tables_hold_the_stored_medians_tokens_per_s_and_mbu(decode):
    text, rows = decode
    full = _section(text, "### llama3_8b: decode, context 512, bf16, cuda")
    by = {(r["case"]["mode"], r["case"]["batch_size"]): r for r in rows
          if r["case"].get("layers") is None and r["case"]["context_len"] == 512}
    columns = _table_row(full, "#### Step time", "Batch")[1:]  # the spec's modes
    assert columns == ["eager", "compile", "compile:reduce-overhead", "compile:max-autotune", "cudagraph"]
    for batch in (1, 8, 64):
        times = _table_row(full, "#### Step time", str(batch))[1:]
        tokens = _table_row(full, "#### Tokens/s", str(batch))[1:]
        mbu = _table_row(full, "#### MBU", str(batch))[1:]
        for i, mode in enumerate(columns):
            row = by[(mode, batch)]
            assert times[i].startswith(f"{row['median_ms']:.3f} [")
            assert float(tokens[i]) == pytest.approx(batch / row["median_ms"] * 1000, abs=0.05)
            # MBU = analytic bytes per step / time / the copy bandwidth measured on the GPU
            copy_gbps = row["bytes_per_step"] / (row["median_ms"] / 1000) / 1e9 / row["mbu"]
            assert 2500 < copy_gbps < 3400  # an H100's measured copy bandwidth
            assert mbu[i].startswith(f"{100 * row['mbu']:.1f}%")
    ratio = _table_row(full, "#### Eager ÷ mode", "1")[1 + [m for m in columns if m != "eager"].index("compile:reduce-overhead")]
    assert ratio == f"{by[('eager', 1)]['median_ms'] / by[('compile:reduce-overhead', 1)]['median_ms']:.2f}×"
    # context 4096: every cell holds its stored case's median (the store holds the whole spec)
    long = _section(text, "### llama3_8b: decode, context 4096, bf16, cuda")
    stored = {(r["case"]["mode"], r["case"]["batch_size"]): r for r in rows
              if r["case"].get("layers") is None and not r["case"].get("layers_only") and r["case"]["context_len"] == 4096}
    assert len(stored) == 15  # 3 batches × 5 modes
    for batch in (1, 8, 64):
        for mode, cell in zip(columns, _table_row(long, "#### Step time", str(batch))[1:]):
            assert cell.startswith(f"{stored[(mode, batch)]['median_ms']:.3f} ["), (mode, batch, cell)


def test_the_committed_decode_store_holds_every_case_of_its_spec_and_no_cell_reads_not_run(decode):
    from perflab.sweep.spec import read_experiment

    text, rows = decode
    spec_ids = {c.id for c in read_experiment(ROOT / "experiments/decode.yaml").cases}
    assert len(spec_ids) == 60 and {r["case_id"] for r in rows} == spec_ids and len(rows) == 60
    assert all(r["status"] == "ok" for r in rows) and len({r["env"]["gpu_name"] for r in rows}) == 1
    assert "Decode: 60 of 60 cases stored" in text and "not run" not in text


def test_the_committed_lm_store_holds_every_case_of_its_spec_120_full_and_120_capped(lm):
    from perflab.sweep.spec import read_experiment

    text, rows, _ = lm
    cases = read_experiment(ROOT / "experiments/lm_sizes.yaml").cases
    assert len(cases) == 240 and {r["case_id"] for r in rows} == {c.id for c in cases} and len(rows) == 240
    full = [r for r in rows if not r["case"].get("max_memory")]
    assert len(full) == 120 and {r["status"] for r in rows} <= {"ok", "oom", "error", "timeout"}
    assert len({r["env"]["gpu_name"] for r in rows}) == 1 and "120 of 120 cases stored" in text


def test_decode_ncu_table_names_each_library_with_dram_percent_bandwidth_and_share_in_percent(decode):
    text, rows = decode
    testbench = _section(text, "### llama3_8b (layers only, 1 layer(s)): decode, context 512, bf16, cuda")
    (tuned,) = [r for r in rows if r["case"].get("layers") == 1 and r["case"]["mode"] == "compile:max-autotune"
                and r["case"]["batch_size"] == 1 and r["case"]["context_len"] == 512]  # the spec's ncu_where
    top = tuned["ncu"]["kernels"][0]
    assert top["library"] == "Triton" and top["full_name"].startswith("triton_red_fused")
    line = next(l for l in testbench.splitlines() if f"`{short_kernel_name(top['full_name'])}`" in l)
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[:2] == ["compile:max-autotune", "1"] and cells[3] == "Triton"
    assert cells[4] == f"{top['dram_pct']:.1f}%" and cells[6] == f"{100 * top['time_share']:.1f}%"
    assert 10 < 100 * top["time_share"] < 100  # a share of GPU time, printed as a percentage of it
    eager = [r for r in rows if r["case"].get("layers") == 1 and r["case"]["mode"] == "eager" and r["case"]["batch_size"] == 1][0]
    gemv = eager["ncu"]["kernels"][0]
    assert gemv["library"] == "cuBLAS" and gemv["dram_gbps"] == pytest.approx(gemv["dram_pct"] / 100 * 3352, rel=0.05)  # H100 SXM: 3.35 TB/s


def test_lm_tables_a_to_e_and_mfu_from_the_stored_rows(lm):
    text, rows, out = lm
    fp32 = _section(text, "### fp32, explicit attention, eager, batch 4, cuda")
    group = [r for r in rows if (r["case"]["dtype"], r["case"]["attn"], r["case"]["mode"], r["case"]["batch_size"]) == ("fp32", "explicit", "eager", 4)
             and not r["case"].get("max_memory")]
    by = {(r["model"], r["case"]["workload"], r["case"]["seq_len"]): r for r in group}
    for model in ("gpt_medium", "gpt_2.7b"):
        forward = _table_row(fp32, "#### (a) Step time (ms): inference forward", model)[1:]
        assert [c.split(" [")[0] for c in forward] == [f"{by[(model, 'forward', s)]['median_ms']:.2f}" for s in (128, 256, 512, 1024)]
    oom = [r for r in group if r["status"] == "oom"]  # a failed cell says so
    assert oom and all(_table_row(fp32, f"#### (a) Step time (ms): {WORKLOAD_TITLES[r['case']['workload']]}", r["model"])
                       [1 + (128, 256, 512, 1024).index(r["case"]["seq_len"])] == "OOM" for r in oom)
    mfu = _table_row(fp32, "#### MFU: inference forward", "gpt_small")[1:]
    assert [c.split(";")[0] for c in mfu] == [f"{100 * by[('gpt_small', 'forward', s)]['mfu']:.1f}%" for s in (128, 256, 512, 1024)]
    for s in (128, 256, 512, 1024):  # MFU = analytic FLOPs / time / the measured fp32 matmul peak (~51 TFLOP/s on an H100)
        row = by[("gpt_small", "forward", s)]
        peak = row["flops_analytic"] / (row["median_ms"] / 1000) / row["mfu"] / 1e12
        assert 40 < peak < 70
    for table in ("(b) gpt_small: top kernel per pass", "(c) gpt_small: top non-GEMM kernel", "(d) gpt_small: GEMM fraction",
                  "(e) Softmax vs matmul inside attention"):
        assert f"#### {table}" in fp32
    gemm = _table_row(fp32, "#### (d) gpt_small: GEMM fraction", "seq512")
    assert gemm[1] == f"{100 * by[('gpt_small', 'forward', 512)]['profile']['gemm_fraction']:.1f}%"
    assert "| gpt_small | 64 | 5 : 256 | 1.95% |" in fp32  # 5 / (4 · 64)
    # kernel names are short in the tables, and the legend gives each one's full name as stored
    stored = by[("gpt_small", "forward", 128)]["profile"]["passes"][0]
    top = _table_row(fp32, "#### (b) gpt_small: top kernel per pass", "seq128")[1]
    short = short_kernel_name(stored["top_kernel"])
    assert top == f"`{short}` ({100 * stored['top_kernel_share']:.1f}%)" and len(stored["top_kernel"]) > 120
    non_gemm = _table_row(fp32, "#### (c) gpt_small: top non-GEMM kernel", "seq128")[1]
    assert non_gemm == "`elementwise_kernel<MulFunctor<float>>`"
    assert f"- `{short}`: `{stored['top_kernel']}`" in _legend(text)
    assert f"- `elementwise_kernel<MulFunctor<float>>`: `{stored['top_non_gemm_kernel']}`" in _legend(text)
    assert (out / "lm_forward_time_fp32_explicit_attention_eager_batch_4_cuda.png").stat().st_size > 4_000


def _legend(text: str) -> str:
    return text[text.index("## Kernel names"):text.index("</details>", text.index("## Kernel names"))]


def _table_cells(text: str) -> list[str]:
    """Every cell of every markdown table in ``text`` (an escaped ``\\|`` stays inside its cell)."""
    return [c.strip() for line in text.splitlines() if line.startswith("|")
            for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


@pytest.mark.parametrize("name", ["lm_sizes", "decode"])
def test_no_table_cell_over_120_characters_and_every_short_name_in_the_legend(name, lm, decode):
    text = (lm if name == "lm_sizes" else decode)[0]
    committed = (ROOT / "docs/reports" / name / "report.md").read_text()
    for report in (text, committed):  # the report as built now, and as committed
        cells = _table_cells(report)
        assert len(cells) > 200 and max(map(len, cells)) <= 120
        assert not [c for c in cells if "not run" in c]  # every case of the spec ran, capped ones too
        named = {m for c in cells for m in re.findall(r"`([^`]+)`", c)}  # in these reports, only kernel names are in backticks
        legend = re.findall(r"^- `([^`]+)`: `([^`]+)`$", _legend(report), flags=re.M)
        assert len(named) >= 5 and {short for short, _ in legend} == named  # each name in the tables, and only those
        assert len({full for _, full in legend}) == len(legend)  # one short name per kernel
    assert committed == text  # the committed report is the one this code writes


# ---------------------------------------------------------------------------------------------------
# The seeds' own figures beside perflab's (src/perflab/report/study_figures.yaml), the OOM cells against measured
# peaks, and the summary each report opens with: every number recomputed here from the YAML and the stored rows.

import yaml  # noqa: E402

SEEDS = yaml.safe_load((ROOT / "src/perflab/report/study_figures.yaml").read_text())
S3, S4 = SEEDS["seed_003"], SEEDS["seed_004"]
SEQS = S3["seq_lens"]
GIB = 1024.0


def _table(text: str, title: str) -> list[list[str]]:
    """The body rows of the first markdown table after ``title``."""
    lines = text[text.index(title):].splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("|"))
    body = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        body.append([c.strip() for c in line.strip("|").split("|")])
    return body


def _line_after(text: str, title: str, prefix: str) -> str:
    return next(l for l in text[text.index(title):].splitlines() if l.startswith(prefix))


def _seed(value, spec: str, suffix: str = "") -> str:
    return f"{format(value, spec)}{suffix}" if isinstance(value, (int, float)) else value


def _summary(text: str) -> str:
    return text[text.index("## Summary"):text.index("\n## ", text.index("## Summary") + 3)]


def test_seed_figures_file_holds_seed_003s_tables_and_seed_004s_finding_with_their_source():
    header = (ROOT / "src/perflab/report/study_figures.yaml").read_text().split("\nseed_003:")[0]
    for said in ("003_18256eef5f48fccf.txt", "004_9e1221ff29d61495.txt", "nsys", "batch size", "GPU", "RTX 3060", "RTX 4090"):
        assert said in header
    assert SEQS == [128, 256, 512, 1024] and list(S3["forward_ms"]) == ["gpt_small", "gpt_medium", "gpt_large", "gpt_xl", "gpt_2.7b"]
    for table in ("forward_ms", "top_kernel_share_pct", "gemm_fraction_pct", "softmax_ms", "matmul_ms", "softmax_to_matmul_pct"):
        assert all(len(v) == 4 for v in S3[table].values())
    # spot checks against the seed's text, and its own arithmetic: (e)'s ratio is softmax / matmul
    assert S3["forward_ms"]["gpt_small"] == [75.04, 82.42, 81.12, 108.34] and S3["forward_ms"]["gpt_2.7b"][1:] == ["OOM"] * 3
    assert S3["top_kernel_share_pct"]["gpt_small"][2] == [72.1, 71.0, "N/A"] and S3["gemm_fraction_pct"]["gpt_xl"][0] == [91.2, "OOM"]
    for m, ratios in S3["softmax_to_matmul_pct"].items():
        for i, r in enumerate(ratios):
            if isinstance(r, float):
                assert r == pytest.approx(100 * S3["softmax_ms"][m][i] / S3["matmul_ms"][m][i], abs=1.2)  # the seed rounded its ms
    assert [(s["eager"], s["compiled"]) for s in S4["eager_vs_compiled_ms"]] == [(3.05, 3.57), (2.53, 2.63)]


def _lm_committed():
    return (ROOT / "docs/reports/lm_sizes/report.md").read_text()


def _seed_group_rows(rows):
    return {(r["case"]["workload"], r["model"], r["case"]["seq_len"]): r for r in rows
            if r["case"]["dtype"] == "fp32" and r["case"]["attn"] == "explicit" and r["case"]["mode"] == "eager"
            and r["case"]["batch_size"] == 4 and not r["case"].get("max_memory")}


def _pass_of(row, name):
    if row is None or row["status"] != "ok":
        return None
    return next((p for p in (row.get("profile") or {}).get("passes") or [] if p["pass"] == name), None)


def _training_gemm(row):
    f, b = _pass_of(row, "forward"), _pass_of(row, "backward")
    return None if f is None or b is None else 100 * (f["gemm_us"] + b["gemm_us"]) / (f["gpu_time_us"] + b["gpu_time_us"])


def _absent(row) -> str:
    return "not run" if row is None else {"oom": "OOM", "error": "ERROR", "timeout": "TIMEOUT"}.get(row["status"], "–")


def test_lm_report_puts_seed_003s_tables_a_b_d_e_beside_perflabs_values(lm):
    text, rows, _ = lm
    committed = _lm_committed()
    assert committed == text
    by = _seed_group_rows(rows)
    section = text[text.index("### The GPT size study's figures beside perflab's (fp32, explicit attention, eager, batch 4, NVIDIA H100 80GB HBM3)"):]
    # (a): the seed's nsys range, perflab's median, and their ratio
    a = {(r[0], r[1]): r[2:] for r in _table(section, "#### (a) Forward time (ms): study vs perflab")}
    assert len(a) == 20
    ratios = []
    for m, values in S3["forward_ms"].items():
        for s, seed in zip(SEQS, values):
            cells, row = a[(m, f"seq{s}")], by.get(("forward", m, s))
            assert cells[0] == _seed(seed, ".2f")
            if row is not None and row["status"] == "ok":
                assert cells[1].startswith(f"{row['median_ms']:.2f} [")
                if isinstance(seed, float):
                    ratios.append(seed / row["median_ms"])
                    assert cells[2] == f"{seed / row['median_ms']:.1f}×"
            else:
                assert cells[1] == _absent(row) and cells[2] == "–"
    assert len(ratios) >= 7  # gpt_small and gpt_medium at every length the seed ran
    differs = _line_after(section, "#### (a)", "What differs")
    assert "NVTX ranges under the profiler" in differs and "untraced medians" in differs
    assert f"{min(ratios):.1f}–{max(ratios):.1f}×" in differs and f"Over the {len(ratios)} cells" in differs
    # (b): the top kernel's share of each pass (perflab: the forward row's forward; the forward + backward row's two passes)
    b = {(r[0], r[1]): r[2:] for r in _table(section, "#### (b) Top kernel's share of each pass: study vs perflab")}
    n = 0
    for m, per_seq in S3["top_kernel_share_pct"].items():
        for s, seed in zip(SEQS, per_seq):
            cells = b[(m, f"seq{s}")]
            ours = (_pass_of(by.get(("forward", m, s)), "forward"), _pass_of(by.get(("forward_backward", m, s)), "forward"),
                    _pass_of(by.get(("forward_backward", m, s)), "backward"))
            for i in range(3):
                assert cells[2 * i] == _seed(seed[i], ".1f", "%")
                if ours[i] is not None:
                    assert cells[2 * i + 1] == f"{100 * ours[i]['top_kernel_share']:.1f}%"
                    n += 1
    assert n >= 24
    # (d): GEMM fraction, inference and training (forward + backward), and the mean difference the line states
    d = {(r[0], r[1]): r[2:] for r in _table(section, "#### (d) GEMM fraction: study vs perflab")}
    deltas = {"inference": [], "training": []}
    for m, per_seq in S3["gemm_fraction_pct"].items():
        for s, seed in zip(SEQS, per_seq):
            cells = d[(m, f"seq{s}")]
            inf = _pass_of(by.get(("forward", m, s)), "forward")
            ours = (100 * inf["gemm_fraction"] if inf else None, _training_gemm(by.get(("forward_backward", m, s))))
            for i, kind in enumerate(deltas):
                assert cells[2 * i] == _seed(seed[i], ".1f", "%")
                if ours[i] is not None:
                    assert cells[2 * i + 1] == f"{ours[i]:.1f}%"
                    if isinstance(seed[i], float):
                        deltas[kind].append(ours[i] - seed[i])
    differs = _line_after(section, "#### (d)", "What differs")
    for kind, values in deltas.items():
        assert f"{kind} {sum(values) / len(values):+.1f} points on average over {len(values)} cells" in differs
    # (e): softmax and matmul ms per step and their ratio, against the seed's
    e = {(r[0], r[1]): r[2:] for r in _table(section, "#### (e) Softmax vs matmul inside attention: study vs perflab")}
    for m in S3["softmax_ms"]:
        for i, s in enumerate(SEQS):
            cells = e[(m, f"seq{s}")]
            assert cells[0::2] == [_seed(S3["softmax_ms"][m][i], ".2f"), _seed(S3["matmul_ms"][m][i], ".2f"),
                                   _seed(S3["softmax_to_matmul_pct"][m][i], ".1f", "%")]
            row = by.get(("forward", m, s))
            att = (row or {}).get("profile", {}).get("attention") if row and row["status"] == "ok" else None
            if att:
                assert cells[1::2] == [f"{att['softmax_ns'] / 1e6:.3f}", f"{att['matmul_ns'] / 1e6:.3f}",
                                       f"{100 * att['softmax_ns'] / att['matmul_ns']:.1f}%"]
            elif row is None:
                assert cells[1::2] == ["not run"] * 3
    assert e[("gpt_small", "seq1024")][4] == "137.6%"  # the seed's softmax slower than its matmuls at 1024


CAPS = (12, 16, 24)


def _predict(row, cap):
    if row is None:
        return None
    if row["status"] == "oom":
        return "OOM"
    if row["status"] != "ok":
        return None
    peak = row["peak_mem_alloc_mb"] / GIB
    return "OOM" if peak > cap else ("fits (tight)" if cap - peak < 0.5 else "fits")


def test_lm_report_lists_the_seeds_oom_cells_with_perflabs_peaks_and_the_capacities_that_reproduce_them(lm):
    text, rows, _ = lm
    by = _seed_group_rows(rows)
    section = text[text.index("#### The GPT size study's OOM cells against perflab's measured memory"):]
    assert "derived from measured peaks, not run capped" in section
    listed = {(r[0], r[1]): r[2:] for r in _table(section, "#### The GPT size study's OOM cells")}
    seed_marks = {}
    for m in S3["forward_ms"]:
        for i, s in enumerate(SEQS):
            inf, train = S3["forward_ms"][m][i], S3["gemm_fraction_pct"][m][i][1]
            seed_marks[(m, s)] = {"inference": None if inf == "N/A" else inf == "OOM", "training": None if train == "N/A" else train == "OOM"}
    oom_cells = {k for k, v in seed_marks.items() if any(v.values())}
    assert set(listed) == {(m, f"seq{s}") for m, s in oom_cells} and len(oom_cells) == 11
    assert listed[("gpt_xl", "seq128")][0] == "ran / OOM" and listed[("gpt_medium", "seq1024")][0] == "OOM / OOM"
    fwd = by[("forward", "gpt_medium", 1024)]
    assert listed[("gpt_medium", "seq1024")][1] == f"{fwd['peak_mem_alloc_mb'] / GIB:.2f}"
    # per capacity, every seed mark against the prediction from perflab's measured peak, counted here independently
    counts = {}
    for cap in CAPS:
        match = mismatch = unknown = 0
        for (m, s), marks in seed_marks.items():
            for kind, workload in (("inference", "forward"), ("training", "forward_backward")):
                if marks[kind] is None:
                    continue
                pred = _predict(by.get((workload, m, s)), cap)
                if pred is None:
                    unknown += 1
                elif (pred == "OOM") == marks[kind]:
                    match += 1
                else:
                    mismatch += 1
        counts[cap] = (match, mismatch, unknown)
    table = {r[0]: r[1:] for r in _table(section, "Every cell the study has a mark for")}
    for cap, (match, mismatch, unknown) in counts.items():
        assert table[f"{cap} GiB"] == [f"{match} of {match + mismatch}", str(mismatch), str(unknown)]
    # the cell the stored rows decide: gpt_medium seq1024 training peaks between 16 and 24 GiB, so 12 and 16 GiB OOM as the seed did
    peak = by[("forward_backward", "gpt_medium", 1024)]["peak_mem_alloc_mb"] / GIB
    assert 16 < peak < 24
    assert listed[("gpt_medium", "seq1024")][3:] == [
        f"{'fits' if _predict(fwd, c) != 'OOM' else 'OOM'} {'✓' if _predict(fwd, c) == 'OOM' else '✗'} / "
        f"{'OOM ✓' if peak > c else 'fits ✗'}" for c in CAPS]


def test_lm_report_opens_with_a_summary_whose_numbers_come_from_the_rows(lm):
    text, rows, _ = lm
    summary = _summary(text)
    assert text.index("## Summary") < text.index("\n|") and text.index("## Summary") < text.index("## Status")
    by = _seed_group_rows(rows)
    stored = [r for r in rows if not r["case"].get("max_memory")]
    assert summary.startswith("## Summary\n\nLanguage models: ") and f"{len(stored)} of 120 cases stored, on NVIDIA H100 80GB HBM3" in summary
    for m in ("gpt_small", "gpt_medium"):
        a, b = by[("forward", m, 128)]["median_ms"], by[("forward", m, 1024)]["median_ms"]
        assert f"{m} {a:.2f} → {b:.2f} ms (×{b / a:.1f})" in summary
    inf = [100 * _pass_of(r, "forward")["gemm_fraction"] for (w, _, _), r in by.items() if w == "forward" and _pass_of(r, "forward")]
    train = [_training_gemm(r) for (w, _, _), r in by.items() if w == "forward_backward" and _training_gemm(r) is not None]
    assert f"GEMM kernels take {min(inf):.1f}–{max(inf):.1f}% of the inference forward's kernel time" in summary
    assert f"{min(train):.1f}–{max(train):.1f}% of training's" in summary
    small = by[("forward", "gpt_small", 1024)]["profile"]["attention"]
    assert f"at seq 1024 softmax takes {100 * small['softmax_to_matmul']:.1f}% (gpt_small)" in summary
    best = max((r for r in stored if r["status"] == "ok"), key=lambda r: r["mfu"])
    assert f"Best MFU: {100 * best['mfu']:.1f}%" in summary and f"({best['model']} {best['case']['workload']}" in summary
    ratios = [S3["forward_ms"][m][SEQS.index(s)] / r["median_ms"] for (w, m, s), r in by.items()
              if w == "forward" and r["status"] == "ok" and isinstance(S3["forward_ms"][m][SEQS.index(s)], float)]
    assert f"{min(ratios):.1f}–{max(ratios):.1f}× perflab's untraced medians over the {len(ratios)} cells" in summary
    assert "derived, not run capped" in summary


def _decode_by(rows):
    return {(bool(r["case"].get("layers_only")), r["case"]["context_len"], r["case"]["batch_size"], r["case"]["mode"]): r
            for r in rows if r["case"].get("workload", "decode") == "decode" and r["status"] == "ok"}


def test_decode_report_puts_seed_004s_eager_vs_compiled_beside_every_measured_mode(decode):
    text, rows = decode
    assert (ROOT / "docs/reports/decode/report.md").read_text() == text
    section = text[text.index("### The Llama decode testbench's eager-vs-compiled finding beside perflab's modes"):]
    body = _table(section, "#### One decode step of one layer: eager against compiled (ms)")
    seed_rows = [r for r in body if r[0] == "the testbench"]
    assert [r[1:] for r in seed_rows] == [[f"{s['gpu']}, one layer", f"{s['eager']:.2f}", f"{s['compiled']:.2f} (compiled)",
                                           f"{s['compiled'] / s['eager']:.2f}", "eager"] for s in S4["eager_vs_compiled_ms"]]
    by = _decode_by(rows)
    ours = [r for r in body if r[0].startswith("perflab")]
    expected = []
    for (bench, ctx, batch, mode), row in by.items():
        eager = by.get((bench, ctx, batch, "eager"))
        if bench and mode != "eager" and eager:
            ratio = row["median_ms"] / eager["median_ms"]
            expected.append([f"one layer, context {ctx}, batch {batch}", f"{eager['median_ms']:.3f}", f"{row['median_ms']:.3f} ({mode})",
                             f"{ratio:.2f}", "eager" if ratio > 1 else mode])
    assert len(ours) == len(expected) >= 9 and sorted(r[1:] for r in ours) == sorted(expected)
    every = [row["median_ms"] / by[(b, c, n, "eager")]["median_ms"] for (b, c, n, m), row in by.items() if m != "eager" and (b, c, n, "eager") in by]
    differs = _line_after(section, "####", "What differs")
    assert f"over all {len(every)} decode cells with an eager pair" in differs
    assert f"{min(every):.2f}–{max(every):.2f}× eager's time, slower than eager in {sum(r > 1 for r in every)}" in differs
    triton = [k["dram_pct"] for r in rows for k in (r.get("ncu") or {}).get("kernels", []) if k["library"] == "Triton" and k["roofline"] == "memory-bound"]
    assert f"Triton {min(triton):.1f}–{max(triton):.1f}% over {len(triton)}" in section
    png = ROOT / "docs/reports/decode/decode_eager_vs_compiled.png"
    assert "](decode_eager_vs_compiled.png)" in section and 4_000 < png.stat().st_size < 60_000


def test_decode_report_opens_with_a_summary_whose_numbers_come_from_the_rows(decode):
    text, rows = decode
    summary = _summary(text)
    assert text.index("## Summary") < text.index("\n|")
    by = _decode_by(rows)
    for bench, what in ((False, "llama3_8b, context 512, batch 1"), (True, "llama3_8b one layer (as the Llama decode testbench), context 512, batch 1")):
        modes = {m: r for (b, c, n, m), r in by.items() if b == bench and c == 512 and n == 1}
        best_mode, best = min(modes.items(), key=lambda kv: kv[1]["median_ms"])
        eager = modes["eager"]["median_ms"]
        assert (f"{what}: fastest {best_mode} {best['median_ms']:.3f} ms per step ({100 * best['mbu']:.1f}% MBU), "
                f"{eager / best['median_ms']:.2f}× faster than eager ({eager:.3f} ms)") in summary
    compile_speedup = by[(True, 512, 1, "eager")]["median_ms"] / by[(True, 512, 1, "compile")]["median_ms"]
    assert f"plain compile {compile_speedup:.2f}× faster than eager" in summary
    assert "The Llama decode testbench found compiled slower than eager (RTX 3060 12GB 3.57 against 3.05 ms; RTX 4090 24GB 2.63 against 2.53 ms)" in summary
    pairs = [r["median_ms"] / by[(b, c, n, "eager")]["median_ms"] for (b, c, n, m), r in by.items() if m != "eager" and (b, c, n, "eager") in by]
    assert f"here {sum(p < 1 for p in pairs)} of {len(pairs)} (cell, mode) pairs run faster than eager" in summary


def test_lm_kernel_plot_is_small_and_referenced(lm):
    text, _, out = lm
    name = "lm_kernels_fp32_explicit_attention_eager_batch_4_cuda.png"
    assert f"]({name})" in text
    for png in (out / name, ROOT / "docs/reports/lm_sizes" / name):
        assert 4_000 < png.stat().st_size < 60_000


def test_capped_rows_are_measured_cells_of_their_own_and_an_oom_on_the_full_gpu_is_an_oom_at_every_capacity(lm):
    from perflab.report import lm as lm_report

    _, rows, _ = lm
    base = next(r for r in rows if r["model"] == "gpt_medium" and r["case"]["workload"] == "forward_backward" and r["case"]["seq_len"] == 1024)
    capped = json.loads(json.dumps(base))
    capped["case"]["max_memory"] = 16 * 2**30
    capped["status"] = "oom"
    large = json.loads(json.dumps(base))
    large.update(model="gpt_2.7b", status="oom")  # a seed OOM cell, as if the store had not run it: OOM on the full GPU
    large["case"]["seq_len"] = 512
    rows = [r for r in rows if not (r["model"] == "gpt_2.7b" and r["case"]["seq_len"] == 512)]
    parts = "\n\n".join(lm_report.seed_sections(rows + [large], [capped]))
    listed = {(r[0], r[1]): r[2:] for r in _table(parts, "#### The GPT size study's OOM cells against")}
    assert listed[("gpt_2.7b", "seq512")][2] == "OOM" and listed[("gpt_2.7b", "seq512")][3:] == ["? / OOM ✓"] * 3
    cap = _table(parts, "#### The GPT size study's OOM cells run capped")
    assert cap == [["gpt_medium", "seq1024", "training", "OOM", "OOM ✓ / OOM", "16", "16", "–"]]
    assert lm_report.fit_at_capacity(base, 24) == "fits" and lm_report.fit_at_capacity(base, 16) == "OOM"
    assert base["peak_mem_alloc_mb"] / GIB > 16


def _capped(row: dict, cap_gib: int, status: str, peak_gib: float | None = None) -> dict:
    out = json.loads(json.dumps(row))
    out["case"]["max_memory"] = cap_gib * 2**30
    out["status"] = status
    out["peak_mem_alloc_mb"] = None if peak_gib is None else peak_gib * 1024
    return out


def test_the_capped_section_puts_each_run_beside_its_derived_verdict_and_says_why_they_differ(lm):
    """Seed 003's cells run capped: per capacity "run / derived", the capacities that give the seed's mark, and where the
    run and the derived verdict disagree, one line with the figures that explain it; the verdict counts the cells run."""
    from perflab.report import lm as lm_report

    _, rows, _ = lm
    cell = {(r["model"], r["case"]["workload"], r["case"]["seq_len"]): r for r in rows
            if r["case"]["dtype"] == "fp32" and r["case"]["attn"] == "explicit" and not r["case"].get("max_memory")}
    med = cell[("gpt_medium", "forward_backward", 1024)]  # seed: OOM; peak 19.63 GiB
    big = cell[("gpt_large", "forward_backward", 512)]  # seed: OOM; peak 19.68 GiB
    fwd = cell[("gpt_medium", "forward", 1024)]  # seed: OOM; peak 2.37 GiB
    med_peak, big_peak = med["peak_mem_alloc_mb"] / 1024, big["peak_mem_alloc_mb"] / 1024
    assert 16 < med_peak < 24 and 16 < big_peak < 24
    reserved = med["peak_mem_reserved_mb"] / 1024
    capped = [_capped(med, 16, "oom"), _capped(med, 24, "oom"), dict(_capped(med, 12, "missing"), message="not run yet"),
              _capped(big, 16, "ok", 15.25), _capped(fwd, 12, "ok", 2.0)]
    parts = "\n\n".join(lm_report.seed_sections(rows, capped))
    table = {(r[0], r[1], r[2]): r[3:] for r in _table(parts, "#### The GPT size study's OOM cells run capped")}
    assert set(table) == {("gpt_medium", "seq1024", "training"), ("gpt_large", "seq512", "training"), ("gpt_medium", "seq1024", "inference")}
    # gpt_medium training: 12 not run; 16 OOM as derived; 24 OOM where the peak says it fits: the cap bounds reserved memory
    why = (f"24: cap bounds reserved memory, {reserved:.2f} GiB uncapped (peak {med_peak:.2f})" if reserved > 24
           else f"24: OOM at a {med_peak:.2f} GiB peak: fragmentation under the cap")
    assert table[("gpt_medium", "seq1024", "training")] == ["OOM", "not run / OOM", "OOM ✓ / OOM", "OOM ✓ / fits", "16, 24", "12, 16", why]
    # gpt_large training ran under 16 GiB at 15.25 GiB, where its uncapped peak (19.68) derives an OOM
    assert table[("gpt_large", "seq512", "training")] == [
        "OOM", "–", "ran ✗ / OOM", "–", "none", "12, 16", f"16: ran, peak 15.25 GiB capped vs {big_peak:.2f} uncapped"]
    # the seed's inference OOM at seq 1024 fits in 12 GiB, run and derived alike
    assert table[("gpt_medium", "seq1024", "inference")] == ["OOM", "ran ✗ / fits", "–", "–", "none", "none", "–"]
    verdict = _line_after(parts, "#### The GPT size study's OOM cells run capped", "Run capped")
    assert verdict == ("Run capped, cells as the study per capacity: 12 GiB 0 of 1, 16 GiB 1 of 2, 24 GiB 1 of 1; 24 GiB reproduces "
                       "the study's pattern on every cell run. The capped runs agree with the verdict derived from the uncapped "
                       "peaks in 2 of 4 (cell, capacity) pairs.")  # gpt_medium training at 16 and inference at 12 agree
    assert max(map(len, _table_cells(parts))) <= 120


def test_a_store_holding_a_subset_of_a_spec_counts_the_specs_cases(tmp_path):
    # A decode store that once held 23 of experiments/decode.yaml's 60 cases had its report say "23 of 31" (it counted
    # the latest sweep's cases). Counted against the spec, a subset is "N of 60", and every other case is "not run".
    from perflab.sweep.spec import read_experiment

    shutil.copy(ROOT / "docs/reports/decode/results.sqlite", tmp_path / "results.sqlite")
    with sqlite3.connect(str(tmp_path / "results.sqlite")) as conn:  # keep the context-512 cases and llama3_8b bs1 eager at 4096
        kept = [cid for cid, rj in conn.execute("SELECT case_id, row_json FROM results")
                if (c := json.loads(rj)["case"])["context_len"] == 512
                or (c.get("layers") is None and c["batch_size"] == 1 and c["mode"] == "eager")]
        conn.execute(f"DELETE FROM results WHERE case_id NOT IN ({','.join('?' * len(kept))})", kept)
    spec = read_experiment(ROOT / "experiments/decode.yaml")
    stored_ids = {r["case_id"] for r in _rows(tmp_path / "results.sqlite")}
    assert len(stored_ids) == 31 and stored_ids < {c.id for c in spec.cases} and len(spec.cases) == 60
    text = write_report(tmp_path, spec=ROOT / "experiments/decode.yaml").read_text()
    assert "Decode: 31 of 60 cases stored" in text and "; 29 not run." in text
    assert "60 cases: 29 not run, 31 ok." in text
    long = _section(text, "### llama3_8b: decode, context 4096, bf16, cuda")
    assert _table_row(long, "#### Step time", "1")[2:] == ["not run"] * 4 and _table_row(long, "#### Step time", "8")[1:] == ["not run"] * 5


def test_the_capped_rows_measured_on_the_h100_are_counted_apart_and_each_oom_is_under_its_cap(lm):
    text, rows, _ = lm
    capped = [r for r in rows if r["case"].get("max_memory")]
    ok = sum(r["status"] == "ok" for r in capped)
    oom = sum(r["status"] == "oom" for r in capped)
    assert ok + oom == len(capped) > 0
    assert f"{len(capped)} of 120 cases capped with `--max-memory` stored ({ok} ok, {oom} oom)" in text
    for r in capped:
        cap_mb = r["case"]["max_memory"] / 2**20
        if r["status"] == "ok":  # what ran stayed under its cap
            assert r["peak_mem_reserved_mb"] <= cap_mb
        else:
            assert "OutOfMemoryError" in r["message"] or "out of memory" in r["message"].lower()
    # the summary's capped figures, counted here: per capacity the seed's marked cells whose capped run gives its mark, and
    # the (cell, capacity) pairs where the run's OOM-or-ran is what the uncapped peak derives
    by = _seed_group_rows(rows)
    matched, agree, pairs = {c: [0, 0] for c in CAPS}, 0, 0
    for r in capped:
        c = r["case"]
        if (c["dtype"], c["attn"], c["mode"], c["batch_size"]) != ("fp32", "explicit", "eager", 4):
            continue
        i = SEQS.index(c["seq_len"])
        seed = S3["forward_ms"][r["model"]][i] if c["workload"] == "forward" else S3["gemm_fraction_pct"][r["model"]][i][1]
        if seed == "N/A":
            continue
        cap, run = round(c["max_memory"] / 2**30), "OOM" if r["status"] == "oom" else "ran"
        matched[cap][0] += (run == "OOM") == (seed == "OOM")
        matched[cap][1] += 1
        derived = _predict(by[(c["workload"], r["model"], c["seq_len"])], cap)
        pairs += 1
        agree += (derived == "OOM") == (run == "OOM")
    expected = ", ".join(f"{cap} GiB {m} of {n}" for cap, (m, n) in matched.items())
    assert f"; run capped (`--max-memory`), {expected}, agreeing with the derived verdict in {agree} of {pairs} (cell, capacity) pairs." in text


def test_the_kv_fill_cut_measured_before_and_after_in_one_slice_shortens_only_the_build():
    # docs/reports/decode_build_cut: benchmarks/decode_build_cut.yaml run on one H100 in one call, old code (drawing the
    # KV context on the CPU) and new (in place on the GPU) alternated twice. The build is the stage the cut touches.
    base = ROOT / "docs/reports/decode_build_cut"
    runs = {name: {r["case"]["batch_size"]: r for r in _rows(base / name / "results.sqlite")}
            for name in ("before.1", "after.1", "before.2", "after.2")}
    assert all(set(rows) == {8, 64} and all(r["status"] == "ok" for r in rows.values()) for rows in runs.values())
    assert len({r["env"]["gpu_name"] for rows in runs.values() for r in rows.values()}) == 1
    for i in (1, 2):
        before, after = runs[f"before.{i}"], runs[f"after.{i}"]
        assert before[64]["cost_s"]["build"] > 100 and before[8]["cost_s"]["build"] > 10  # 17.2 G and 2.1 G values drawn on the CPU
        assert after[64]["cost_s"]["build"] < 1 and after[8]["cost_s"]["build"] < 1
        for batch in (8, 64):  # the same case ids, and the stages the cut does not touch stay within a few seconds
            assert before[batch]["case_id"] == after[batch]["case_id"]
            for stage in ("flops", "warmup", "timed"):
                assert abs(before[batch]["cost_s"][stage] - after[batch]["cost_s"][stage]) < 2
        # the step itself is unchanged at batch 64 (GPU-bound: 66 ms), within 2%
        assert after[64]["median_ms"] == pytest.approx(before[64]["median_ms"], rel=0.02)


def test_the_padded_cache_measured_before_and_after_in_one_slice_on_the_cells_it_moves():
    # benchmarks/decode_cache_pad.yaml on one H100 in one call: the code before the padding (a cache of 4097 positions)
    # into docs/reports/decode_cache_pad/before, then this tree (4104) into the re-run grid's store (now docs/reports/decode).
    before = {r["case_id"]: r for r in _rows(ROOT / "docs/reports/decode_cache_pad/before/results.sqlite")}
    after = {r["case_id"]: r for r in _rows(ROOT / "docs/reports/decode/results.sqlite")}
    assert len(before) == 12 and set(before) <= set(after)
    assert {r["cache_len"] for r in before.values()} == {4097} and {after[i]["cache_len"] for i in before} == {4104}
    assert len({r["env"]["gpu_name"] for r in [*before.values(), *after.values()]}) == 1
    ratio = {(bool(r["case"].get("layers_only")), r["case"]["batch_size"], r["case"]["mode"]): after[i]["median_ms"] / r["median_ms"]
             for i, r in before.items()}
    assert ratio[(False, 64, "eager")] < 0.5 and ratio[(False, 64, "compile:reduce-overhead")] < 0.35  # 66.2 → 27.2, 64.2 → 20.1 ms
    assert all(ratio[(True, 64, m)] < 0.65 for m in ("eager", "compile", "compile:reduce-overhead", "compile:max-autotune", "cudagraph"))
    assert all(ratio[(True, 8, m)] < 0.85 for m in ("compile", "compile:reduce-overhead", "compile:max-autotune", "cudagraph"))
    # the bytes a step must move are the same (the positions it reads, not the padding): MBU moves with the time alone
    assert all(after[i]["bytes_per_step"] == r["bytes_per_step"] for i, r in before.items())


def test_the_decode_report_says_the_cache_length_each_section_ran_and_flags_an_odd_one(decode):
    # docs/reports/decode_odd_cache: the first complete grid, every case on a cache of context + 1 positions (the before);
    # docs/reports/decode: the grid re-run on the padded cache (a multiple of 8)
    old = (ROOT / "docs/reports/decode_odd_cache/report.md").read_text()
    text, rows = decode
    assert "KV cache: 4097 positions per sequence. All of these rows ran a cache of 4097 positions, not a multiple of 8" in old
    assert "KV cache: 513 positions per sequence. All of these rows ran a cache of 513 positions, not a multiple of 8" in old
    assert "Decode: 60 of 60 cases stored" in old
    assert "KV cache: 4104 positions per sequence.\n" in text and "KV cache: 520 positions per sequence.\n" in text
    assert "not a multiple of 8" not in text
    assert {(r["case"]["context_len"], r["cache_len"]) for r in rows} == {(512, 520), (4096, 4104)}
