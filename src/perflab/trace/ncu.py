"""Nsight Compute: run it on chosen kernels of a case, and read its CSV robustly.

ncu runs a child process (``python -m perflab.trace.ncu_target``) that warms the case up outside any
range, then runs the measured steps inside an NVTX push/pop range named ``perflab_ncu``. ncu profiles only
kernels launched inside that range (``--nvtx --nvtx-include perflab_ncu/``) whose function names match the
top kernels of a profile pass (``-k regex:...``), with ``--clock-control none`` so the clocks stay as the
card runs them.

By default ncu profiles every matching launch of one step. ``per_config`` > 0 profiles that many launches of each
launch configuration instead (``--filter-mode per-launch-config``: the kernel, its grid and its block): a
llama3_8b step launches its top kernels hundreds of times in a handful of configurations, and ncu replays each
profiled launch several times (the decode grid's 8B ncu passes took 76–241 s each). Each profiled launch then
stands for the step's launches of its configuration (:func:`attach_step_configs`), so a kernel's means weigh each
configuration by how often the step launches it, as a pass over every launch would. Not yet the default: it has
not been run on a GPU against every launch (``benchmarks/ncu_per_config.py`` does that).

The CSV (``--csv --page raw``): ``==PROF==``/``==WARNING==`` lines (and anything the program printed)
come before the header; a units row follows the header; numbers carry thousands separators ("13,568").
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys

import pandas as pd

from perflab.errors import PerflabError
from perflab.paths import child_env

NVTX_RANGE = "perflab_ncu"

# Column name in perflab -> ncu metric.
METRICS = {
    "duration_ns": "gpu__time_duration.sum",
    "sm_throughput_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "memory_throughput_pct": "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "dram_throughput_pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "achieved_occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "l1_hit_rate_pct": "l1tex__t_sector_hit_rate.pct",
    "l2_hit_rate_pct": "lts__t_sector_hit_rate.pct",
}

# Requested too, but a CSV without them (an older perflab's, or a sample) still parses: their columns are NaN.
OPTIONAL_METRICS = {
    "dram_bytes": "dram__bytes.sum",  # bytes read + written in DRAM: dram_bytes / duration_ns = achieved GB/s
}

# Roofline class from the speed-of-light percentages: a unit at or above this share of its peak is the
# limiter; a kernel with neither unit busy is latency-bound (too little work in flight, or too short).
BUSY_PCT = 60.0


def find_ncu() -> str:
    path = shutil.which("ncu") or next((p for p in ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/ncu") if os.path.exists(p)), None)
    if path is None:
        raise PerflabError("Nsight Compute (ncu) is not installed or not on PATH; install it (it ships with the CUDA toolkit) to use perflab ncu")
    return path


def function_name(kernel_name: str) -> str:
    """The bare function name ncu matches by default: no return type, namespaces, template args or params.

    ``void at::native::vectorized_elementwise_kernel<8, ...>(int, ...)`` → ``vectorized_elementwise_kernel``.
    """
    name = re.sub(r"\(anonymous namespace\)|<unnamed>", "anon", kernel_name.strip())
    if name.startswith("void "):
        name = name[5:]
    out, depth = [], 0
    for ch in name:  # drop template arguments and stop at the parameter list
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            break
        elif depth == 0:
            out.append(ch)
    base = "".join(out).strip()
    return base.split("::")[-1].split()[-1] if base else kernel_name


def kernel_filter(kernel_names) -> str:
    names = sorted({function_name(n) for n in kernel_names})
    return "regex:^(" + "|".join(re.escape(n) for n in names) + ")$"


def ncu_command(ncu: str, case_json: str, kernel_names, launch_count: int, steps: int = 1, per_config: int = 0) -> list[str]:
    """The ncu command line. ``per_config`` > 0: that many launches of each launch configuration; 0: every
    matching launch, up to ``launch_count`` in all."""
    count = ["--filter-mode", "per-launch-config", "--launch-count", str(per_config)] if per_config > 0 else ["--launch-count", str(launch_count)]
    return [
        ncu, "--clock-control", "none", "--csv", "--page", "raw", "--print-units", "base",
        "--metrics", ",".join([*METRICS.values(), *OPTIONAL_METRICS.values()]),
        "--nvtx", "--nvtx-include", f"{NVTX_RANGE}/",
        "--kernel-name-base", "function", "-k", kernel_filter(kernel_names),
        *count,
        sys.executable, "-m", "perflab.trace.ncu_target", case_json, "--steps", str(steps),
    ]


def run_ncu(case, kernel_names, launch_count: int = 500, timeout_s: int = 1200, per_config: int = 0) -> pd.DataFrame:
    ncu = find_ncu()
    cmd = ncu_command(ncu, json.dumps(case.to_dict()), kernel_names, launch_count, per_config=per_config)
    env = child_env()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        raise PerflabError(f"ncu did not finish within {timeout_s} s") from None
    if "ERR_NVGPUCTRPERM" in proc.stdout + proc.stderr:
        raise PerflabError("ncu may not read the GPU's performance counters here (ERR_NVGPUCTRPERM); run as root or allow profiling for all users")
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise PerflabError(f"ncu exited with status {proc.returncode}: {tail[0]}")
    return parse_ncu_csv(proc.stdout)


def parse_number(text: str) -> float:
    text = text.strip().replace(",", "")
    if text in ("", "n/a", "N/A"):
        return float("nan")
    return float(text)


def parse_ncu_csv(text: str) -> pd.DataFrame:
    """One row per profiled kernel launch, with perflab's metric columns and a roofline class."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID",')), None)
    if start is None:
        raise PerflabError("no ncu CSV table found (expected a header line starting with \"ID\"); did ncu profile any kernel?")
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    header, body = rows[0], rows[1:]
    if body and not body[0][0].strip().isdigit():
        body = body[1:]  # the units row
    missing = [m for m in METRICS.values() if m not in header]
    if missing:
        raise PerflabError(f"the ncu CSV lacks metric column(s) {', '.join(missing)}; was it made with perflab's --metrics list?")
    col = {name: header.index(name) for name in header}
    records = []
    for row in body:
        if len(row) != len(header) or not row[0].strip().isdigit():
            continue  # program output interleaved after the table
        rec = {
            "id": int(row[col["ID"]]),
            "kernel_name": row[col["Kernel Name"]],
            "function": function_name(row[col["Kernel Name"]]),
            "grid": row[col["Grid Size"]] if "Grid Size" in col else "",
            "block": row[col["Block Size"]] if "Block Size" in col else "",
            "stream": row[col["Stream"]] if "Stream" in col else "",
        }
        for ours, metric in METRICS.items():
            rec[ours] = parse_number(row[col[metric]])
        for ours, metric in OPTIONAL_METRICS.items():
            rec[ours] = parse_number(row[col[metric]]) if metric in col else float("nan")
        records.append(rec)
    if not records:
        raise PerflabError("the ncu CSV has a header but no kernel rows; no kernel matched the filter inside the NVTX range")
    df = pd.DataFrame.from_records(records)
    df["roofline"] = [roofline_class(s, m) for s, m in zip(df["sm_throughput_pct"], df["memory_throughput_pct"])]
    return df


def roofline_class(sm_pct: float, mem_pct: float) -> str:
    if sm_pct >= BUSY_PCT and sm_pct >= mem_pct:
        return "compute-bound"
    if mem_pct >= BUSY_PCT:
        return "memory-bound"
    return "latency-bound"


def _name_key(name: str) -> str:
    # Kineto writes "(anonymous namespace)" where ncu writes "<unnamed>"; spacing differs in places.
    return re.sub(r"\s+", "", re.sub(r"\(anonymous namespace\)", "<unnamed>", str(name)))


def attach_trace_names(launches: pd.DataFrame, step_kernel_names: list[str]) -> pd.DataFrame:
    """Give each ncu launch (ordered by ID) the kernel-table name of the kernel it profiled.

    ncu profiled the kernels of one step whose function names passed the filter, in launch order; the
    trace's step, filtered the same way, must list the same functions in the same order. When it does,
    the launches take the trace's names position by position (ncu demangles differently: lambdas,
    anonymous namespaces). Otherwise names are matched by a normalised key.
    """
    launches = launches.sort_values("id", kind="stable").reset_index(drop=True)
    wanted = set(launches["function"])
    sequence = [n for n in step_kernel_names if function_name(n) in wanted][: len(launches)]
    if len(sequence) == len(launches) and [function_name(n) for n in sequence] == launches["function"].tolist():
        return launches.assign(full_name=sequence, matched_by="launch order")
    by_key = {_name_key(n): n for n in step_kernel_names}
    names = [by_key.get(_name_key(n)) for n in launches["kernel_name"]]
    return launches.assign(full_name=names, matched_by="name")


def attach_step_configs(launches: pd.DataFrame, step: pd.DataFrame) -> pd.DataFrame:
    """Name ncu's launches, profiled a few per launch configuration, from one step of the trace, and weigh them.

    ``step``: the step's kernels (``name``, ``grid``, ``block``, as the trace writes them: "(x, y, z)"). A launch
    takes the trace's name of the kernel with its function, grid and block (by the normalised full name where
    several kernels share those); ``weight`` is how many of the step's launches it stands for: the step's launches
    of its (name, grid, block) shared among the launches ncu profiled of it. A launch with no such kernel in the
    step keeps no name (and so no weight in the means). Where no launch matches so (no grid or block to go by),
    they are named as :func:`attach_trace_names` names them, each counting once."""
    step = pd.DataFrame({"name": step["name"].astype(str), "grid": step["grid"].astype(str), "block": step["block"].astype(str)})
    step["function"] = [function_name(n) for n in step["name"]]
    step["key"] = [_name_key(n) for n in step["name"]]
    counts = step.groupby(["name", "grid", "block"], sort=False).size()
    names = []
    for function, grid, block, kernel_name in zip(launches["function"], launches["grid"], launches["block"], launches["kernel_name"]):
        same = step[(step["function"] == function) & (step["grid"] == str(grid)) & (step["block"] == str(block))]
        distinct = same["name"].unique()
        if len(distinct) > 1:
            distinct = same.loc[same["key"] == _name_key(kernel_name), "name"].unique()
        names.append(distinct[0] if len(distinct) == 1 else None)
    if not any(n is not None for n in names):  # no grid or block to go by (a CSV without them): by name, each launch once
        return attach_trace_names(launches, step["name"].tolist())
    out = launches.assign(full_name=names, matched_by="launch config")
    profiled = out.groupby(["full_name", "grid", "block"], sort=False)["id"].transform("size")
    in_step = [counts.get((n, str(g), str(b)), 0) if n is not None else 0 for n, g, b in zip(out["full_name"], out["grid"], out["block"])]
    return out.assign(weight=[s / p if n is not None else 0.0 for s, p, n in zip(in_step, profiled.fillna(1), out["full_name"])])


def join_counters(kernels: pd.DataFrame, launches: pd.DataFrame) -> pd.DataFrame:
    """Mean ncu metrics per kernel-table name, joined onto ``kernels`` (rows with ``full_name``).

    ``launches`` went through attach_trace_names (each launch counts once) or attach_step_configs (each counts
    its ``weight``: the means are over the step's launches). ``launches`` in the result is the step's launches the
    means stand for; ``profiled``, how many ncu profiled. Kernels ncu did not profile keep empty metrics."""
    named = launches.dropna(subset=["full_name"])
    if "weight" not in named.columns:
        named = named.assign(weight=1.0)
    columns = [*METRICS, *(m for m in OPTIONAL_METRICS if m in named.columns)]
    grouped = named.groupby("full_name", sort=False)

    def weighted(group: pd.DataFrame) -> pd.Series:
        values = group[columns]
        weights = values.notna().mul(group["weight"], axis=0)
        total = weights.sum()
        return (values.fillna(0.0).mul(group["weight"], axis=0).sum() / total).where(total > 0)

    metrics = grouped[[*columns, "weight"]].apply(weighted) if len(named) else pd.DataFrame(columns=columns)
    metrics["launches"] = grouped["weight"].sum().round().astype(int)
    metrics["profiled"] = grouped.size()
    metrics["roofline"] = [roofline_class(sm, mem) for sm, mem in zip(metrics["sm_throughput_pct"], metrics["memory_throughput_pct"])]
    return kernels.reset_index(drop=True).merge(metrics, left_on="full_name", right_index=True, how="left")


def kernel_library(name: str) -> str:
    """Who wrote a kernel, from its name: cuBLAS (cutlass/xmma/gemv kernels it dispatches), Triton (inductor's
    ``triton_*``), cuDNN, FlashAttention, or PyTorch's own (ATen) kernels."""
    lower = name.lower()
    if lower.startswith("triton") or "triton_" in lower:
        return "Triton"
    if "cudnn" in lower:
        return "cuDNN"
    if "flash" in lower or "fmha" in lower:
        return "FlashAttention"
    if any(key in lower for key in ("cublas", "cutlass", "xmma", "gemv", "gemm", "sm90_", "sm80_", "nvjet")):
        return "cuBLAS"
    if "at::" in name or "at_cuda" in lower or "elementwise" in lower or "reduce_kernel" in lower:
        return "PyTorch"
    return "other"


def ncu_summary(table: pd.DataFrame) -> dict:
    """What a sweep row keeps of an ncu pass: per top kernel its name, library, share of the step's GPU time,
    ncu's mean duration, DRAM % of peak and achieved DRAM GB/s (dram bytes ÷ duration), and roofline class."""

    def num(value):
        return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)

    kernels = []
    for r in table.to_dict(orient="records"):
        duration, moved = num(r.get("duration_ns")), num(r.get("dram_bytes"))
        kernels.append({
            "name": r["name"], "full_name": r["full_name"], "library": kernel_library(r["full_name"]),
            "time_share": num(r.get("share")), "duration_us": duration / 1e3 if duration else None,
            "dram_pct": num(r.get("dram_throughput_pct")), "dram_gbps": moved / duration if moved is not None and duration else None,
            "sm_pct": num(r.get("sm_throughput_pct")), "roofline": r.get("roofline") if isinstance(r.get("roofline"), str) else None,
        })
    return {"kernels": kernels}
