"""Kineto loading: exact against the simple reference on every committed trace, linking, both readers."""

from __future__ import annotations

import gzip
import json
import shutil

import numpy as np
import pandas as pd
import pytest
from reference_trace import CPU_ONLY_TRACE, KINETO_TRACES, summarize

from perflab.errors import PerflabError
from perflab.trace import KERNEL_COLUMNS, load_trace
from perflab.trace.build import build_trace
from perflab.trace.kineto import load_kineto, read_events, us_text_to_ns
from perflab.trace.schema import check_kernel_table

TRACE_IDS = [p.name.split(".")[0] for p in KINETO_TRACES]


def test_all_real_traces_are_there():
    assert TRACE_IDS == ["by_module_lm_forward", "compile_block", "cudagraph_vit", "decode_cudagraph", "eager_vit", "lm_train_step_compile", "lm_train_step_explicit", "reduce_overhead",
                         "train_step", "two_streams"]


@pytest.fixture(scope="module", params=KINETO_TRACES, ids=TRACE_IDS)
def loaded(request):
    return request.param, load_trace(request.param), summarize(request.param)


def test_kernel_table_schema(loaded):
    _, trace, _ = loaded
    check_kernel_table(trace.kernels)
    assert list(trace.kernels.columns) == list(KERNEL_COLUMNS)
    assert trace.kernels["start_ns"].is_monotonic_increasing


def test_counts_and_summed_time_equal_the_reference(loaded):
    _, trace, ref = loaded
    kernels = trace.kernels
    is_kernel = kernels["kind"] == "kernel"
    assert int(is_kernel.sum()) == ref["kernels"]
    assert int(kernels.loc[is_kernel, "dur_ns"].sum()) == ref["kernel_time_ns"]
    assert len(kernels) == ref["gpu_activities"]
    assert int(kernels["dur_ns"].sum()) == ref["gpu_activity_time_ns"]
    assert int((kernels["kind"] == "memcpy").sum()) == ref["memcpy"]
    assert int((kernels["kind"] == "memset").sum()) == ref["memset"]


def test_every_activity_is_linked_to_its_launch(loaded):
    _, trace, ref = loaded
    kernels = trace.kernels
    assert ref["unlinked"] == 0
    assert trace.meta["unlinked"] == 0
    assert (kernels["launch_api"] != "").all()
    assert (kernels["launch_start_ns"] >= 0).all() and (kernels["launch_tid"] >= 0).all()
    assert (kernels["launch_end_ns"] >= kernels["launch_start_ns"]).all()
    # the launch is the API call with the same correlation id
    expected = kernels["correlation"].map(ref["launch_api_by_correlation"])
    assert (kernels["launch_api"].astype(str) == expected).all()
    # a kernel starts after the call that launched it started
    assert (kernels["start_ns"] >= kernels["launch_start_ns"]).all()


def test_a_compact_reserialised_copy_gives_the_same_tables(loaded, tmp_path):
    path, trace, _ = loaded
    document = json.load(gzip.open(path), parse_float=lambda s: __import__("decimal").Decimal(s))
    compact = tmp_path / "compact.json"
    compact.write_text(json.dumps(document, separators=(",", ":"), default=str))  # timestamps become strings
    raw, meta = read_events(compact)
    assert_same_tables(trace, build_trace(raw, meta))


def assert_same_tables(a, b):
    key = ["start_ns", "stream", "correlation", "dur_ns", "kind"]
    left = a.kernels.sort_values(key).reset_index(drop=True)
    right = b.kernels.sort_values(key).reset_index(drop=True)
    for column in KERNEL_COLUMNS:
        assert (left[column].astype(str) == right[column].astype(str)).all(), column
    pd.testing.assert_frame_equal(a.ranges.astype(str), b.ranges.astype(str))
    pd.testing.assert_frame_equal(a.steps, b.steps)
    assert len(a.launches) == len(b.launches)


def test_driver_launched_kernels_are_linked():
    compiled = load_trace(KINETO_TRACES[TRACE_IDS.index("compile_block")]).kernels
    driver = compiled[compiled["launch_api"] == "cuLaunchKernel"]
    assert len(driver) == 24
    assert driver["name"].astype(str).str.startswith("triton_").all()
    eager = load_trace(KINETO_TRACES[TRACE_IDS.index("eager_vit")]).kernels
    nvjet = eager[eager["name"].astype(str).str.startswith("nvjet")]
    assert len(nvjet) == 147 and (nvjet["launch_api"] == "cuLaunchKernelEx").all()
    # cuLaunchKernelEx also launches cuDNN's fused attention kernels
    driver = eager[eager["launch_api"] == "cuLaunchKernelEx"]
    assert len(driver) == 183 and set(driver["category"]) == {"gemm", "attention"}


def test_graph_replayed_kernels_get_their_graph_launch():
    for name, launches, per_launch in (("cudagraph_vit", 3, 265), ("reduce_overhead", 3, 15)):
        trace = load_trace(KINETO_TRACES[TRACE_IDS.index(name)])
        graph = trace.kernels[trace.kernels["launch_api"] == "cudaGraphLaunch"]
        calls = trace.launches[trace.launches["name"] == "cudaGraphLaunch"]
        assert len(calls) == launches
        assert len(graph) == launches * per_launch
        # every one of them carries one of the graph launches' times and range
        assert set(graph["launch_start_ns"]) == set(calls["start_ns"])
        assert (graph.groupby("correlation").size() == per_launch).all()


def test_ranges_are_the_innermost_annotation():
    trace = load_trace(KINETO_TRACES[TRACE_IDS.index("eager_vit")])
    ranges = trace.kernels["range"].value_counts()
    # each of the 3 steps runs 12 blocks; blocks 3, 6, 9 reduce tokens (top-k: more kernels)
    assert ranges["block3.attn"] == ranges["block6.attn"] == 48
    assert ranges["block0.attn"] == 33
    assert ranges["patch_embed"] == 24
    assert "ProfilerStep#1" not in set(trace.kernels["range"])  # an inner annotation always exists
    depth = trace.ranges.set_index("name")["depth"]
    assert depth["ProfilerStep#1"] == 0 and depth["step"].min() == 1
    # the backward kernels of the training step run on autograd's thread, outside any annotation
    train = load_trace(KINETO_TRACES[TRACE_IDS.index("train_step")]).kernels
    assert set(train.loc[train["launch_tid"] != train["launch_tid"].mode()[0], "range"]) == {""}


def test_steps():
    for name in TRACE_IDS:
        trace = load_trace(KINETO_TRACES[TRACE_IDS.index(name)])
        expected = [] if name == "two_streams" else [1, 2] if name.startswith(("lm_", "decode_")) else [1, 2, 3]
        assert trace.steps["step"].tolist() == expected, name


def test_step_annotations_are_used_without_profiler_steps(tmp_path):
    path = KINETO_TRACES[TRACE_IDS.index("cudagraph_vit")]
    document = json.load(gzip.open(path))
    document["traceEvents"] = [e for e in document["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep#")]
    target = tmp_path / "no_profiler_step.json"
    target.write_text(json.dumps(document))
    trace = load_trace(target)
    assert trace.steps["name"].tolist() == ["step", "step", "step"]
    assert trace.steps["step"].tolist() == [0, 1, 2]
    assert summarize(target)["steps"] == 3


@pytest.mark.parametrize("text, ns", [
    ("5983925445894.137", 5983925445894137),  # float64 would make this ...136.99...
    ("4382075239980.014", 4382075239980014),
    ("0.001", 1),
    ("12", 12000),
    ("1.5", 1500),
    (12, 12000),
])
def test_timestamps_parse_exactly(text, ns):
    assert us_text_to_ns(text) == ns


def test_epoch_timestamps_stay_exact_where_float64_cannot():
    # without baseTimeNanoseconds, ts are µs since the epoch: float64 has 0.25 µs steps there
    text = "1712195495505543.201"
    assert us_text_to_ns(text) == 1712195495505543201
    assert int(float(text) * 1000) != 1712195495505543201


def test_a_reformatted_trace_reads_the_same(tmp_path):
    path = KINETO_TRACES[TRACE_IDS.index("train_step")]
    document = json.load(gzip.open(path), parse_float=lambda s: float(s))
    compact = tmp_path / "compact.json"
    compact.write_text(json.dumps(document, separators=(",", ":")))
    trace = load_trace(compact)
    reference = load_trace(path)
    assert len(trace.kernels) == len(reference.kernels)
    assert (trace.kernels["launch_api"] != "").all()


def test_escaped_names_are_decoded(tmp_path):
    path = KINETO_TRACES[TRACE_IDS.index("two_streams")]
    text = gzip.open(path).read().decode()
    text = text.replace('"name": "aten::mm"', '"name": "aten::\\"mm\\"\\u00e9"', 1)
    # and an annotation whose name needs escapes
    text = text.replace('"traceEvents": [\n', '"traceEvents": [\n  {\n    "ph": "X", "cat": "user_annotation", "name": "say \\"hi\\"", '
                        '"pid": 401, "tid": 401,\n    "ts": 4382083996960.000, "dur": 9000.000,\n    "args": {\n      "External id": 1\n    }\n  },\n', 1)
    target = tmp_path / "escaped.json"
    target.write_text(text)
    trace = load_trace(target)
    assert 'say "hi"' in set(trace.ranges["name"].astype(str))
    assert len(trace.kernels) == 24


def test_plain_and_gzipped_files_give_the_same_table(tmp_path):
    path = KINETO_TRACES[TRACE_IDS.index("reduce_overhead")]
    plain = tmp_path / "plain.json"
    with gzip.open(path) as f, open(plain, "wb") as g:
        shutil.copyfileobj(f, g)
    assert_same_tables(load_trace(path), load_trace(plain))


def test_the_reader_handles_events_across_chunk_boundaries(tmp_path, monkeypatch):
    import perflab.trace.kineto as kineto

    path = KINETO_TRACES[TRACE_IDS.index("eager_vit")]
    plain = tmp_path / "plain.json"
    with gzip.open(path) as f, open(plain, "wb") as g:
        shutil.copyfileobj(f, g)
    whole = load_trace(plain)
    monkeypatch.setattr(kineto, "CHUNK_BYTES", 4099)  # odd size: many events straddle chunks
    assert_same_tables(load_trace(plain), whole)
    gz_whole = load_trace(path)
    assert_same_tables(load_trace(path), gz_whole)


def gunzip_threads() -> list:
    import threading

    from perflab.trace.kineto import GUNZIP_THREAD

    return [t for t in threading.enumerate() if t.name == GUNZIP_THREAD]


@pytest.fixture
def small_gunzip_blocks(monkeypatch):
    """Tiny decompression blocks and queue: many blocks per member, and the thread blocks on a full queue."""
    import perflab.trace.kineto as kineto

    monkeypatch.setattr(kineto, "GUNZIP_IN_BYTES", 1000)
    monkeypatch.setattr(kineto, "GUNZIP_OUT_BYTES", 3001)
    monkeypatch.setattr(kineto, "GUNZIP_QUEUE_BLOCKS", 2)


def gzip_members(text: bytes, parts: int) -> list[bytes]:
    size = -(-len(text) // parts)
    return [gzip.compress(text[i:i + size], compresslevel=1) for i in range(0, len(text), size)]


def test_concatenated_gzip_members_are_read_in_turn(tmp_path, small_gunzip_blocks):
    path = KINETO_TRACES[TRACE_IDS.index("eager_vit")]
    members = tmp_path / "members.json.gz"
    members.write_bytes(b"".join(gzip_members(gzip.decompress(path.read_bytes()), 3)))
    assert_same_tables(load_trace(members), load_trace(path))
    assert gunzip_threads() == []


def test_a_corrupt_gzip_member_in_the_middle_is_one_error_and_stops_the_thread(tmp_path, small_gunzip_blocks):
    text = gzip.decompress(KINETO_TRACES[TRACE_IDS.index("eager_vit")].read_bytes())
    first, second, third = gzip_members(text, 3)
    second = second[:-8] + bytes(b ^ 0xFF for b in second[-8:-4]) + second[-4:]  # a wrong CRC-32
    corrupt = tmp_path / "corrupt.json.gz"
    corrupt.write_bytes(first + second + third)
    with pytest.raises(PerflabError, match=r"corrupt\.json\.gz: truncated or corrupt gzip file \(.*incorrect data check"):
        read_events(corrupt)
    assert gunzip_threads() == []


def test_reading_stopped_early_stops_the_gunzip_thread(tmp_path, small_gunzip_blocks):
    path = tmp_path / "notes.json.gz"
    path.write_bytes(gzip.compress(b"not JSON " * 100_000))  # rejected after the first 512 KiB, more to come
    with pytest.raises(PerflabError, match="not a JSON object"):
        read_events(path)
    assert gunzip_threads() == []


def test_closing_the_gzip_reader_stops_its_thread_waiting_on_a_full_queue(tmp_path, small_gunzip_blocks):
    import time

    from perflab.trace.kineto import _open

    path = tmp_path / "events.json.gz"
    path.write_bytes(gzip.compress(b"[" + b"{}, " * 300_000 + b"{}]"))
    f = _open(path)
    assert f.read(9) == b"[{}, {}, "
    deadline = time.monotonic() + 30
    while not f.blocks.full() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert f.blocks.full() and len(gunzip_threads()) == 1  # the thread now waits to hand over its next block
    f.close()
    assert gunzip_threads() == []

def test_unlinked_kernels_are_kept_and_counted(tmp_path):
    path = KINETO_TRACES[TRACE_IDS.index("two_streams")]
    document = json.load(gzip.open(path), parse_float=str)
    launches = [e for e in document["traceEvents"] if e.get("cat") == "cuda_driver"]
    dropped = {e["args"]["correlation"] for e in launches[:3]}
    document["traceEvents"] = [e for e in document["traceEvents"] if not (e.get("cat") == "cuda_driver" and e["args"]["correlation"] in dropped)]
    target = tmp_path / "unlinked.json"
    target.write_text(json.dumps(document))
    trace = load_trace(target)
    unlinked = trace.kernels[trace.kernels["launch_api"] == ""]
    assert trace.meta["unlinked"] == 3 == len(unlinked)
    assert (unlinked[["launch_start_ns", "launch_end_ns", "launch_tid", "range_id"]] == -1).all().all()


def test_cuda_sync_events_are_not_gpu_activity(tmp_path):
    path = KINETO_TRACES[TRACE_IDS.index("two_streams")]
    document = json.load(gzip.open(path), parse_float=str)
    kernel = next(e for e in document["traceEvents"] if e.get("cat") == "kernel")
    sync = {"ph": "X", "cat": "cuda_sync", "name": "Stream Sync", "pid": 0, "tid": 7, "ts": kernel["ts"], "dur": "5000.000",
            "args": {"cuda_sync_kind": "Stream Sync", "stream": 7, "correlation": 999999}}
    document["traceEvents"].append(sync)
    target = tmp_path / "sync.json"
    target.write_text(json.dumps(document))
    assert len(load_trace(target).kernels) == 24


def test_a_cpu_only_trace_is_accounted_over_its_top_level_operators_as_the_reference_reader_finds_them():
    from perflab.analysis.trace_report import analyze_trace

    trace = load_trace(CPU_ONLY_TRACE)
    assert trace.cpu_only and set(trace.kernels["kind"]) == {"cpu_op"}
    reference = summarize(CPU_ONLY_TRACE)
    assert len(trace.kernels) == reference["kernels"] == 6  # aten::matmul, aten::relu, aten::sum in each of 2 steps
    assert int(trace.kernels["dur_ns"].sum()) == reference["kernel_time_ns"]
    accounting = analyze_trace(trace).accounting
    whole = accounting.trace
    assert whole["wall_ns"] == reference["wall_ns"] and whole["busy_ns"] == reference["busy_ns"]
    # every gap between operators is the interpreter's: host-bound, none queued
    assert whole["idle_ns"] == whole["host_bound_ns"] > 0 and whole["kernel_gap_ns"] == whole["other_ns"] == 0
    assert accounting.steps["busy_ns"].tolist() == reference["window_busy_ns"]
    assert trace.kernels["category"].astype(str).tolist()[:3] == ["gemm", "elementwise", "other"]


def test_a_trace_with_neither_gpu_activity_nor_operators_is_an_error(tmp_path):
    path = tmp_path / "annotations.json"
    path.write_text('{"traceEvents": [{"ph": "X", "cat": "user_annotation", "name": "step", "pid": 1, "tid": 1, "ts": 1.0, "dur": 2.0}]}')
    with pytest.raises(PerflabError, match="no GPU activity"):
        load_trace(path)


def test_device_properties_are_kept():
    meta = load_trace(KINETO_TRACES[TRACE_IDS.index("eager_vit")]).meta
    assert meta["devices"][0]["name"] == "NVIDIA H200" and meta["devices"][0]["numSms"] == 132
    assert meta["format"] == "kineto"


def test_reader_columns_are_int64():
    raw, _ = read_events(KINETO_TRACES[TRACE_IDS.index("train_step")])
    for group in (raw.gpu, raw.api, raw.ranges):
        for values in group.values():
            assert values.dtype == np.int64


def test_a_malformed_event_is_one_clear_error(tmp_path):
    target = tmp_path / "malformed.json"
    target.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": "soon", "dur": 1.0, "args": {"correlation": 1}}]}))
    with pytest.raises(PerflabError, match="not a number"):
        load_trace(target)
    target.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 1, "dur": 1, "args": {"correlation": "x"}}]}))
    with pytest.raises(PerflabError, match="malformed: its correlation is 'x'"):
        load_trace(target)


def test_a_bare_event_list_is_a_chrome_trace(tmp_path):
    target = tmp_path / "list.json"
    target.write_text(json.dumps([
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 1.5, "dur": 2, "args": {"correlation": 9}},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 5, "dur": 1.25, "args": {"correlation": 9, "stream": 7}}]))
    kernels = load_trace(target).kernels
    assert kernels[["start_ns", "dur_ns", "launch_start_ns", "launch_end_ns"]].values.tolist() == [[5000, 1250, 1500, 3500]]


@pytest.mark.parametrize("indent", [None, 4])
def test_other_layouts_read_the_same(tmp_path, indent):
    # newer torch writes one key per line (as json.dumps(indent=4) does); a re-serialised file has
    # Python's float repr: neither may be read as empty or wrong
    path = KINETO_TRACES[TRACE_IDS.index("train_step")]
    document = json.load(gzip.open(path), parse_float=lambda s: __import__("decimal").Decimal(s))
    target = tmp_path / "other_layout.json"
    target.write_text(json.dumps(document, indent=indent, default=lambda d: float(d) if d != d.to_integral_value() else int(d)))
    trace = load_trace(target)
    assert_same_tables(trace, load_trace(path))
    assert len(trace.kernels) == 117 and trace.meta["unlinked"] == 0


def test_the_cpu_only_trace_is_in_the_newer_layout():
    # (it was written by torch 2.13's profiler: one key per line)
    text = gzip.open(CPU_ONLY_TRACE).read()
    assert b'"ph": "X",\n    "cat": "user_annotation"' in text


def test_kernels_without_a_grid_load_with_the_grid_unknown(tmp_path):
    import re

    path = KINETO_TRACES[TRACE_IDS.index("two_streams")]
    text = gzip.open(path).read().decode()
    target = tmp_path / "no_grid.json"
    target.write_text(re.sub(r'"grid": \[[^\]]*\],\s*"block": \[[^\]]*\],\s*', "", text))
    trace = load_trace(target)
    assert set(trace.kernels["grid"]) == {""} and set(trace.kernels["block"]) == {""}
    assert len(trace.kernels) == 24 and trace.meta["unlinked"] == 0
    # the grid written with other whitespace is still found
    spaced = tmp_path / "spaced_grid.json"
    spaced.write_text(text.replace('"warps per SM"', '"warps per SM"  ').replace('",      "grid"', '",  "grid"'))
    assert (load_trace(spaced).kernels["grid"] != "").all()


def test_operator_input_shapes_types_and_values_are_decoded_once_in_the_reader(tmp_path):
    def op(name, ts, **args):
        return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": 1.0, "args": args}

    path = tmp_path / "ops.json"
    path.write_text(json.dumps({"traceEvents": [
        op("aten::addmm", 1.0, **{"Input Dims": [[64], [8, 32], [32, 64], [], []], "Input type": ["float", "float", "float", "Scalar", "Scalar"],
                                  "Concrete Inputs": ["", "", "", "1", "1"]}),
        op("aten::cat", 3.0, **{"Input Dims": [[[2, 3], [4, 3]], []], "Input type": ["TensorList", "Int"]}),
        op("aten::empty", 5.0, **{"Input Dims": [], "Input type": []}),
        op("aten::addmm", 7.0, **{"Input Dims": [[64], [8, 32], [32, 64], [], []]}),  # the same text as the first: one decoding
        op("aten::zero_", 9.0, **{"Input Dims": "unreadable"}),
        op("aten::ones", 11.0)]}))  # shapes not recorded
    ops = load_kineto(path, ops=True).ops
    shapes, types = ops["input_shapes"].tolist(), ops["input_types"].tolist()
    assert shapes == [((64,), (8, 32), (32, 64), (), ()), (((2, 3), (4, 3)), ()), (), ((64,), (8, 32), (32, 64), (), ()), (), None]
    assert types == [("float", "float", "float", "Scalar", "Scalar"), ("TensorList", "Int"), (), None, None, None]
    assert shapes[0] is shapes[3]  # decoded once, shared (immutable)
    assert ops["concrete_inputs"].tolist() == [("", "", "", "1", "1"), None, None, None, None, None]
