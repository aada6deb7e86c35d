"""nsys SQLite loading, on the fixture built by tests/data/nsys_fixture.py (schema 3.28.1)."""

from __future__ import annotations

import importlib.util
import sqlite3

import pandas as pd
import pytest
from reference_trace import DATA_DIR, NSYS_FIXTURE

from perflab.errors import PerflabError
from perflab.trace import KERNEL_COLUMNS, load_trace
from perflab.trace.schema import check_kernel_table


def _fixture_module():
    spec = importlib.util.spec_from_file_location("nsys_fixture", DATA_DIR / "nsys_fixture.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fixture = _fixture_module()


@pytest.fixture(scope="module")
def trace():
    return load_trace(NSYS_FIXTURE)


def by_start(trace):
    return trace.kernels.set_index("start_ns")


def test_committed_fixture_matches_its_builder(tmp_path, trace):
    fresh = load_trace(fixture.build(tmp_path / "fresh.sqlite"))
    pd.testing.assert_frame_equal(fresh.kernels.astype(str), trace.kernels.astype(str))
    pd.testing.assert_frame_equal(fresh.ranges.astype(str), trace.ranges.astype(str))


def test_schema_and_counts(trace):
    check_kernel_table(trace.kernels)
    assert list(trace.kernels.columns) == list(KERNEL_COLUMNS)
    assert trace.meta["format"] == "nsys" and trace.meta["schema_version"] == "3.28.1"
    assert trace.kernels["kind"].astype(str).value_counts().to_dict() == {"kernel": 8, "memcpy": 1, "memset": 1}
    assert trace.meta["unlinked"] == 0
    assert trace.meta["devices"][0]["name"] == "NVIDIA H200" and trace.meta["devices"][0]["numSms"] == 132


def test_names_are_joined_from_string_ids(trace):
    kernels = by_start(trace)
    assert kernels.loc[3_000, "name"] == fixture.GEMM  # demangledName, not the integer id
    assert kernels.loc[5_000, "name"] == fixture.TRITON
    assert kernels.loc[7_200, "name"] == "Memcpy DtoH (Device -> Pinned)"
    assert kernels.loc[7_400, "name"] == "Memset (Device)"
    assert kernels.loc[3_000, "grid"] == "(64, 4, 1)" and kernels.loc[3_000, "block"] == "(128, 1, 1)"


def test_launch_names_lose_their_version_suffix(trace):
    assert set(trace.launches["name"].astype(str)) == {
        "cudaLaunchKernel", "cuLaunchKernel", "cudaMemcpyAsync", "cudaMemsetAsync", "cudaGraphLaunch", "cudaStreamSynchronize"}


def test_linking_is_per_process_when_correlation_ids_collide(trace):
    kernels = by_start(trace)
    # process 2002's correlation ids 1 and 2 also exist in process 1001
    assert kernels.loc[20_000, "launch_start_ns"] == 500 and kernels.loc[20_000, "launch_tid"] == 2002
    assert kernels.loc[21_000, "launch_start_ns"] == 1_000
    assert kernels.loc[3_000, "launch_start_ns"] == 2_100 and kernels.loc[3_000, "launch_tid"] == 1001
    assert kernels.loc[5_000, "launch_start_ns"] == 2_700


def test_driver_launch_and_graph_launch(trace):
    kernels = by_start(trace)
    assert kernels.loc[5_000, "launch_api"] == "cuLaunchKernel"
    graph = trace.kernels[trace.kernels["launch_api"] == "cudaGraphLaunch"]
    assert graph["start_ns"].tolist() == [13_500, 14_000, 14_600]
    assert set(graph["launch_start_ns"]) == {12_600} and set(graph["range"]) == {"prefetch"}


def test_nvtx_ranges_and_innermost_attribution(trace):
    ranges = trace.ranges.set_index("name")
    assert ranges.loc["attn", "depth"] == 2 and ranges.loc["forward", "depth"] == 1 and ranges.loc["step", "depth"] == 0
    assert ranges.loc["prefetch", "depth"] == 1  # a start/end range (text through textId), inside "step"
    kernels = by_start(trace)
    assert kernels["range"].to_dict() == {
        3_000: "attn", 5_000: "attn", 7_200: "mlp", 7_400: "mlp", 8_000: "mlp",
        13_500: "prefetch", 14_000: "prefetch", 14_600: "prefetch", 20_000: "p2_step", 21_000: "p2_step"}
    assert trace.steps["name"].tolist() == ["step"]


def test_streams_devices_and_kinds(trace):
    kernels = by_start(trace)
    assert kernels.loc[7_400, "stream"] == 8 and kernels.loc[7_400, "kind"] == "memset"
    assert set(trace.kernels["stream"]) == {7, 8, 13}
    assert set(trace.kernels["device"]) == {0}


def test_an_older_export_with_a_driver_table(tmp_path):
    trace = load_trace(fixture.build(tmp_path / "driver.sqlite", driver_table=True))
    kernels = by_start(trace)
    assert kernels.loc[5_000, "launch_api"] == "cuLaunchKernel" and kernels.loc[5_000, "launch_start_ns"] == 2_700
    assert trace.meta["unlinked"] == 0


def test_absent_optional_tables_are_tolerated(tmp_path):
    trace = load_trace(fixture.build(tmp_path / "minimal.sqlite", minimal=True))
    assert trace.kernels["kind"].astype(str).value_counts().to_dict() == {"kernel": 8}
    assert len(trace.ranges) == 0 and (trace.kernels["range"] == "").all()
    assert trace.meta["unlinked"] == 0


def test_a_cross_thread_start_end_range_is_not_used_for_attribution(tmp_path):
    path = fixture.build(tmp_path / "cross.sqlite")
    with sqlite3.connect(path) as db:
        db.execute("UPDATE NVTX_EVENTS SET endGlobalTid = ? WHERE eventType = 60", (fixture.global_tid(fixture.P1, 4242),))
    trace = load_trace(path)
    assert trace.meta["cross_thread_ranges"] == 1
    assert set(trace.kernels.loc[trace.kernels["launch_api"] == "cudaGraphLaunch", "range"]) == {"step"}


def test_sqlite_that_is_not_an_nsys_export(tmp_path):
    path = tmp_path / "other.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE results (x INTEGER)")
    with pytest.raises(PerflabError, match="not an nsys export"):
        load_trace(path)


def test_nsys_export_without_gpu_activity(tmp_path):
    path = tmp_path / "cpu.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL)")
    with pytest.raises(PerflabError, match="no GPU activity"):
        load_trace(path)


def test_a_truncated_sqlite_file(tmp_path):
    data = NSYS_FIXTURE.read_bytes()
    path = tmp_path / "truncated.sqlite"
    path.write_bytes(data[: len(data) // 3])
    with pytest.raises(PerflabError, match="truncated.sqlite"):
        load_trace(path)


def test_an_export_without_api_calls_loads_with_nothing_linked(tmp_path):
    """nsys exports only the tables it has data for: GPU activity with no RUNTIME table is still a trace."""
    import shutil

    from perflab.analysis import analyze_trace

    path = tmp_path / "no_runtime.sqlite"
    shutil.copy(NSYS_FIXTURE, path)
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TABLE CUPTI_ACTIVITY_KIND_RUNTIME")
    trace = load_trace(path)
    assert len(trace.kernels) == 10  # 8 kernels, a memcpy and a memset, as in the full fixture
    assert (trace.kernels["launch_start_ns"] == -1).all() and (trace.kernels["launch_api"].astype(str) == "").all()
    report = analyze_trace(trace)
    row = report.trace_accounting
    assert row["wall_ns"] == row["busy_ns"] + row["host_bound_ns"] + row["kernel_gap_ns"] + row["other_ns"]
