"""The result row's one declaration (``records.row.ROW``) and the rows already written: a store's rows of format 0
(written before rows carried ``row_format``) and of format 1 are read back field by field, as they were stored.

tests/data/records/ holds rows as the store writes them (``row_json``, one JSON object a line):
``format0_bench.jsonl`` two rows of ``bench --model test:tiny test:oom --batch-size 2 --input-size 32`` on the CPU
(an ok row and an oom row) written before this format existed, ``format1_bench.jsonl`` an ok row of ``test:tiny``
at batch size 4, and ``format1_timeout.json`` the row the sweep's parent writes for a case whose worker timed out."""

from __future__ import annotations

import json
import time
from pathlib import Path

import msgspec
import pytest

from perflab.errors import PerflabError
from perflab.records.row import (BASE_FIELDS, FIELDS, FORMAT_KEY, ROW, ROW_FORMAT, TEXT_FIELDS, WHOLE_FIELDS, StoredRow,
                                 check_row, new_row, row_format)

DATA = Path(__file__).parent / "data" / "records"


def _stored(tmp_path, *names: str) -> list[dict]:
    """The rows of the files ``names``, each line's text put into a store as its row_json verbatim, read back by the
    store's reader (``Store.rows``: ``decode_row`` holds each to ``StoredRow``)."""
    from perflab.sweep.store import Store

    with Store.create(tmp_path / "old") as store:
        for name in names:
            for text in (DATA / name).read_text().splitlines():
                case_id, status = json.loads(text)["case_id"], json.loads(text)["status"]
                with store.conn:
                    store.conn.execute("INSERT INTO results (case_id, env_key, status, row_json, stored_at) VALUES (?, ?, ?, ?, ?)",
                                       (case_id, "e1", status, text, time.time()))
        rows = store.rows()
        assert store.unreadable == []
    return rows


def test_a_store_of_rows_without_a_format_reads_them_as_format_0_as_they_were_stored(tmp_path):
    ok, oom = _stored(tmp_path, "format0_bench.jsonl")
    assert FORMAT_KEY not in ok and FORMAT_KEY not in oom  # read as stored: no format is added
    assert row_format(ok) == row_format(oom) == 0
    assert (ok["case_id"], ok["status"], ok["model"], ok["batch_size"], ok["input_size"]) == ("aee982a6d5ca", "ok", "test:tiny", 2, 32)
    assert ok["median_ms"] == pytest.approx(0.7473998) and ok["ci95_ms"] == pytest.approx([0.2182453, 2.5595348])
    assert ok["throughput_per_s"] == pytest.approx(2 * 1000.0 / ok["median_ms"]) == pytest.approx(2675.944)
    assert ok["n_samples"] == len(ok["samples_ms"]) == 20 and ok["host_canary_us"] == pytest.approx(549.789)
    assert ok["flags"] == ["high_cv", "host_contention"] and ok["params_m"] == pytest.approx(0.024938)
    assert ok["env_key"] == "e1"
    assert (oom["case_id"], oom["status"], oom["model"], oom["median_ms"], oom["ci95_ms"]) == ("96d9174d8bed", "oom", "test:oom", None, None)
    assert oom["message"] == "OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB (planted by test:oom)"
    assert oom["host_canary_us"] == pytest.approx(313.654) and oom["flags"] == []
    for row in (ok, oom):  # compare's check of each field holds for the old rows
        assert check_row(row, "old store, case x") is row
    # the old builder's keys are the declared base fields but the format, in their order
    assert [k for k in oom if k != "detail"] == [k for k in BASE_FIELDS if k != FORMAT_KEY] + ["env_key"]


def test_a_store_of_format_1_rows_reads_them_with_their_format(tmp_path):
    ok, timeout = _stored(tmp_path, "format1_bench.jsonl", "format1_timeout.json")
    assert ok[FORMAT_KEY] == timeout[FORMAT_KEY] == row_format(ok) == 1 == ROW_FORMAT
    assert (ok["case_id"], ok["status"], ok["batch_size"], ok["input_size"]) == ("f09d14790a8c", "ok", 4, 32)
    assert ok["median_ms"] == pytest.approx(0.5860559) and ok["ci95_ms"] == pytest.approx([0.3667941, 0.9363878])
    assert ok["throughput_per_s"] == pytest.approx(4 * 1000.0 / ok["median_ms"]) == pytest.approx(6825.287)
    assert ok["n_samples"] == 20 and ok["host_canary_us"] == pytest.approx(314.276)
    assert (timeout["case_id"], timeout["status"], timeout["batch_size"], timeout["median_ms"]) == ("2cf37e6f0656", "timeout", 8, None)
    assert timeout["message"] == "no result within the 60 s limit; the worker was killed (log: logs/x.log)"
    assert timeout["device_name"] == "CPU (x86_64, 2 threads)" and timeout["flags"] == [] and timeout["warnings"] == []
    assert list(timeout)[:len(BASE_FIELDS)] == list(BASE_FIELDS)  # a failed row is its base fields, in their order
    for row in (ok, timeout):
        assert check_row(row, "store, case x") is row


def test_a_file_of_bench_out_rows_of_either_format_is_read_by_the_files_reader():
    """``report.export.read_exported_rows`` (``bench --out`` files, compare's reader) reads both formats: the same numbers."""
    from perflab.report.export import read_exported_rows

    old = read_exported_rows(DATA / "format0_bench.jsonl")
    new = read_exported_rows(DATA / "format1_bench.jsonl")
    assert [row_format(r) for r in old + new] == [0, 0, 1]
    assert old[0]["median_ms"] == pytest.approx(0.7473998) and old[1]["median_ms"] is None
    assert new[0]["median_ms"] == pytest.approx(0.5860559) and new[0]["batch_size"] == 4


def test_the_builder_makes_the_declared_base_fields_and_the_format():
    """``measure.harness.base_row`` builds from the declaration: the base fields, in order, with ``row_format``; a key
    the declaration does not hold as a base field is refused."""
    from perflab.measure.canary import CANARY_KEY
    from perflab.measure.harness import base_row, failed_row
    from perflab.spec import Case

    env = {"device": "cpu", "cpu": "x86_64", "cpu_threads": 4}
    row = base_row(Case("test:tiny", batch_size=2, input_size=64), env)
    assert list(row) == list(BASE_FIELDS) and len(BASE_FIELDS) == 44 and CANARY_KEY in BASE_FIELDS
    assert row[FORMAT_KEY] == 1 and row["batch_size"] == 2 and row["input_size"] == 64 and row["median_ms"] is None
    assert row["flags"] == [] and row["flags"] is not base_row(Case("test:tiny"), env)["flags"]  # each row its own list
    failed = failed_row(Case("test:tiny", batch_size=2), "error", "RuntimeError: boom", env)
    assert failed[FORMAT_KEY] == 1 and failed["status"] == "error" and set(failed) == set(BASE_FIELDS)
    with pytest.raises(KeyError, match="not a base field of a result row .*: mfu, no_such_key"):
        new_row(case_id="c", mfu=0.5, no_such_key=1)
    with pytest.raises(KeyError, match="row_format"):
        new_row(case_id="c", row_format=0)  # the format is the declaration's, not the builder's


def test_the_checks_the_store_and_the_csv_kinds_come_from_the_declaration():
    assert TEXT_FIELDS == {"run_name", "case_id", "status", "model", "method", "dtype", "mode", "attn", "device_name", "message",
                           "ci_level", "version_name", "revision", "commit", "interpreter"}
    assert WHOLE_FIELDS == {"input_size", "batch_size", "processes"}
    assert set(FIELDS) <= set(ROW) and len(FIELDS) == 67 and {"family", "seq_len", "device"} & set(FIELDS) == set()
    info = {f.name: f.required for f in msgspec.inspect.type_info(StoredRow).fields}
    assert {k for k, required in info.items() if required} == {"case_id", "status"} and len(info) == 22 and FORMAT_KEY in info
    with pytest.raises(PerflabError, match=r"^f, line 1: row_format: -1: expected a row format, a whole number 0 or more$"):
        check_row({"case_id": "c", FORMAT_KEY: -1}, "f, line 1")
    from perflab.sweep.store import decode_row

    with pytest.raises(ValueError, match="not a result row .*row_format"):
        decode_row(json.dumps({"case_id": "c", "status": "ok", FORMAT_KEY: "1"}))
    assert row_format({"case_id": "c", FORMAT_KEY: True}) == 0 and row_format({FORMAT_KEY: 1}) == 1


def test_the_csv_keeps_its_columns_and_leaves_the_format_out():
    """The format is a row's, not a CSV column: the CSV's header is as it was, and a CSV read back is format 0."""
    from perflab.report.export import PERFLAB_COLUMNS, SEED_COLUMNS, to_csv

    rows = [json.loads(line) for line in (DATA / "format1_bench.jsonl").read_text().splitlines()]
    header = to_csv(rows).splitlines()[0].split(",")
    assert len(header) == len(SEED_COLUMNS) + len(PERFLAB_COLUMNS) == 50 and FORMAT_KEY not in header
    assert header[:3] == ["run_name", "tp", "latency_ms"]

