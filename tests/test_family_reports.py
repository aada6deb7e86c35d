"""The lm and decode report sections on the stores measured on an H100 (docs/reports/lm_sizes, docs/reports/decode):
every figure in the tables is recomputed here from the stored rows, independently of the report code."""

import re
import shutil
import sqlite3
import json
from pathlib import Path

import pytest

from perflab.analysis.names import short_kernel_name
from perflab.report.markdown import write_report

ROOT = Path(__file__).resolve().parents[1]


def _rows(store: Path) -> list[dict]:
    with sqlite3.connect(str(store)) as conn:
        return [json.loads(r) for (r,) in conn.execute("SELECT row_json FROM results")]


@pytest.fixture(scope="module")
def decode(tmp_path_factory):
    out = tmp_path_factory.mktemp("decode")
    shutil.copy(ROOT / "docs/reports/decode/results.sqlite", out / "results.sqlite")
    return write_report(out).read_text(), _rows(out / "results.sqlite")


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
    header = ["eager", "compile:reduce-overhead", "cudagraph"]
    for batch in (1, 8, 64):
        times = _table_row(full, "#### Step time", str(batch))[1:]
        tokens = _table_row(full, "#### Tokens/s", str(batch))[1:]
        mbu = _table_row(full, "#### MBU", str(batch))[1:]
        for i, mode in enumerate(header):
            row = by[(mode, batch)]
            assert times[i].startswith(f"{row['median_ms']:.3f} [")
            assert float(tokens[i]) == pytest.approx(batch / row["median_ms"] * 1000, abs=0.05)
            # MBU = analytic bytes per step / time / the copy bandwidth measured on the GPU
            copy_gbps = row["bytes_per_step"] / (row["median_ms"] / 1000) / 1e9 / row["mbu"]
            assert 2500 < copy_gbps < 3400  # an H100's measured copy bandwidth
            assert mbu[i].startswith(f"{100 * row['mbu']:.1f}%")
    ratio = _table_row(full, "#### Eager ÷ mode", "1")[1]
    assert ratio == f"{by[('eager', 1)]['median_ms'] / by[('compile:reduce-overhead', 1)]['median_ms']:.2f}×"
    assert "| 8 | not run | not run | not run |" in _section(text, "### llama3_8b: decode, context 4096, bf16, cuda")


def test_decode_ncu_table_names_each_library_with_dram_percent_bandwidth_and_share_in_percent(decode):
    text, rows = decode
    testbench = _section(text, "### llama3_8b (layers only, 1 layer(s)): decode, context 512, bf16, cuda")
    (tuned,) = [r for r in rows if r["case"].get("layers") == 1 and r["case"]["mode"] == "compile:max-autotune"]
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
    by = {(r["model"], r["case"]["workload"], r["case"]["seq_len"]): r for r in rows}
    forward = _table_row(fp32, "#### (a) Step time (ms): inference forward", "gpt_medium")[1:]
    assert [c.split(" [")[0] for c in forward] == [f"{by[('gpt_medium', 'forward', s)]['median_ms']:.2f}" for s in (128, 256, 512, 1024)]
    assert _table_row(fp32, "#### (a) Step time (ms): inference forward", "gpt_xl")[1:] == ["not run"] * 4
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
        named = {m for c in cells for m in re.findall(r"`([^`]+)`", c)}  # in these reports, only kernel names are in backticks
        legend = re.findall(r"^- `([^`]+)`: `([^`]+)`$", _legend(report), flags=re.M)
        assert len(named) >= 5 and {short for short, _ in legend} == named  # each name in the tables, and only those
        assert len({full for _, full in legend}) == len(legend)  # one short name per kernel
    assert committed == text  # the committed report is the one this code writes
