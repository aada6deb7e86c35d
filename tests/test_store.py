"""The SQLite results store: one row per (case id, environment), WAL, nothing lost or doubled."""

import json
import math
import sqlite3

import numpy as np
import pytest

from perflab.errors import PerflabError
from perflab.sweep.store import Store, dumps, load_stored, read_rows


def _row(case_id, status="ok", **extra):
    return {"case_id": case_id, "status": status, "model": "test:tiny", "input_size": 32, "batch_size": 1, "dtype": "fp32", "mode": "eager", **extra}


def test_rows_are_unique_per_case_and_environment(tmp_path):
    with Store.create(tmp_path / "d") as store:
        assert store.put(_row("a", median_ms=1.0), "env1")
        assert not store.put(_row("a", median_ms=2.0), "env1")  # a second row for the same key is ignored
        assert store.put(_row("a", median_ms=3.0), "env2")  # another environment is another row
        assert store.put(_row("b", status="error"), "env1")
        assert store.put(_row("b", median_ms=4.0), "env1", replace=True)  # --retry-failed replaces
        assert store.count() == 3 and store.count("env1") == 2
        assert store.statuses("env1") == {"a": "ok", "b": "ok"}
        assert [(r["case_id"], r["median_ms"], r["env_key"]) for r in store.rows("env1")] == [("a", 1.0, "env1"), ("b", 4.0, "env1")]
        assert store.env_keys()[0] == "env1"  # most rows first
        assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_rows_survive_json_round_trip_without_nan(tmp_path):
    with Store.create(tmp_path) as store:
        store.put(_row("a", cv=float("nan"), samples_ms=np.array([1.0, 2.0]), n=np.int64(3), ci95_ms=(1.0, math.inf)), "e")
    (row,) = read_rows(tmp_path)
    assert row["cv"] is None and row["samples_ms"] == [1.0, 2.0] and row["n"] == 3 and row["ci95_ms"] == [1.0, None]
    assert dumps({"x": float("inf")}) == '{"x": null}'


def test_a_row_whose_column_sqlite_cannot_bind_is_stored_as_an_error_row(tmp_path):
    with Store.create(tmp_path) as store:  # a list or mapping in a column: ProgrammingError on Python 3.11, not a lost row
        assert store.put(_row("a", median_ms=2.0, model=["test:tiny"]), "e")
        assert store.put(_row("b", median_ms=3.0, dtype={"x": 1}, input_size=2 ** 64), "e")
        assert store.put(_row("c", median_ms=4.0), "e")  # and the next row is stored as it is
    rows = {r["case_id"]: r for r in read_rows(tmp_path)}
    assert [(r["status"], r["median_ms"], r["model"], r["dtype"]) for r in rows.values()] == [
        ("error", 2.0, None, "fp32"), ("error", 3.0, "test:tiny", None), ("ok", 4.0, "test:tiny", "fp32")]
    assert rows["a"]["message"] == ("this row could not be stored as measured (ProgrammingError: Error binding parameter 4: type 'list' is "
                                    "not supported); model stored as null; it was ok")
    assert rows["b"]["message"].endswith("; input_size, dtype stored as null; it was ok")


def test_commits_are_visible_to_another_connection_at_once(tmp_path):
    with Store.create(tmp_path) as store:
        store.put(_row("a"), "e")
        other = sqlite3.connect(str(tmp_path / "results.sqlite"))
        assert other.execute("SELECT COUNT(*) FROM results").fetchone()[0] == 1
        other.close()


def test_sweep_records_and_loading(tmp_path):
    with Store.create(tmp_path) as store:
        store.put_environment("e", {"host": "h"})
        sid = store.begin_sweep(command="perflab sweep x.yaml", spec_source="x.yaml", spec_text="grid: {}", experiment={},
                                env_key="e", n_cases=2, n_skipped=0)
        store.put(_row("a"), "e", sweep_id=sid)
        store.put(_row("z"), "other")
        store.end_sweep(sid, "complete", 1)
    stored = load_stored(tmp_path)
    assert stored.env_key == "e" and [r["case_id"] for r in stored.rows] == ["a"]
    assert stored.other_env_keys == ["other"] and stored.environments == {"e": {"host": "h"}}
    assert stored.sweeps[0]["outcome"] == "complete" and stored.sweeps[0]["n_done"] == 1


def test_opening_a_directory_without_a_store_says_what_to_do(tmp_path):
    with pytest.raises(PerflabError, match="no results store"):
        Store.open(tmp_path)
    assert not (tmp_path / "results.sqlite").exists()
    (tmp_path / "results.sqlite").write_text("not a database")
    with pytest.raises(PerflabError, match="not a perflab results store|cannot open"):
        Store.open(tmp_path)


def test_a_resumed_grid_stores_its_experiment_once(tmp_path):
    grid = {"cases": [{"model": f"m{i}", "batch_size": i} for i in range(200)]}
    other = {"cases": [{"model": "x"}]}
    with Store.create(tmp_path) as store:
        ids = [store.begin_sweep(command="perflab sweep g.yaml", spec_source="g.yaml", spec_text="g", experiment=e, env_key="e",
                                 n_cases=1, n_skipped=0) for e in (grid, grid, other, grid)]
        raw = dict(store.conn.execute("SELECT id, experiment_json FROM sweeps").fetchall())
        assert [s["experiment"] for s in store.sweeps()] == [grid, grid, other, grid]
    assert json.loads(raw[ids[1]]) == json.loads(raw[ids[3]]) == {"same_as_sweep": ids[0]} and json.loads(raw[ids[0]]) == grid
    # a store written before this (every sweep with the whole experiment) is compacted by its next sweep
    conn = sqlite3.connect(str(tmp_path / "results.sqlite"))
    with conn:
        conn.execute("UPDATE sweeps SET experiment_json = ? WHERE id IN (?, ?)", (dumps(grid), ids[1], ids[3]))
    conn.close()
    with Store.open(tmp_path) as store:
        store.begin_sweep(command="c", spec_source="g.yaml", spec_text="g", experiment=grid, env_key="e", n_cases=1, n_skipped=0)
        raw = [r for (r,) in store.conn.execute("SELECT experiment_json FROM sweeps ORDER BY id")]
        assert sum(len(r) > 100 for r in raw) == 1 and [s["experiment"] for s in store.sweeps()] == [grid, grid, other, grid, grid]


def test_the_store_reads_a_row_by_the_fields_the_row_declares():
    """One declaration of a result row (records.row, below its builder, the harness, and its readers): the store's view (``StoredRow``:
    types, not ranges) reads fields that ``FIELDS`` describes, and a row the builder makes is read back by the store and
    passes ``check_row``."""
    from perflab.measure.harness import failed_row
    from perflab.records.row import FIELDS, StoredRow, check_row
    from perflab.spec import Case
    from perflab.sweep.store import decode_row

    assert set(StoredRow.__struct_fields__) - set(FIELDS) == set()
    row = failed_row(Case("test:tiny", batch_size=2), "error", "RuntimeError: boom", {"device": "cpu", "cpu": "x86_64", "cpu_threads": 4})
    stored = decode_row(dumps(row))
    assert stored == row and check_row(stored, "d, case c") is stored
    assert row["device_name"] == "CPU (x86_64, 4 threads)" and row["tokens"] is None
    with pytest.raises(PerflabError, match=r"^d, case c: mfu: -0.5: expected a finite number, 0 or more$"):
        check_row(dict(row, mfu=-0.5), "d, case c")


def test_a_row_whose_version_is_not_a_mapping_or_a_record_whose_kind_is_not_text_is_damage_not_a_traceback(tmp_path):
    """Which kind of run wrote a store (``run_kinds``, read before ab or track writes to it) from a damaged store: a row
    whose ``version`` is not a mapping names no kind (compare names it, ``records.row.check_row``); a run record whose ``kind``
    is not text names no kind, and the rows say."""
    from perflab.sweep.store import row_version, run_kinds

    with Store.create(tmp_path / "row") as store:
        store.put({"case_id": "a", "status": "ok", "median_ms": 1.0, "version": "abc"}, "e1")
        store.put({"case_id": "b", "status": "ok", "median_ms": 1.0, "version": {"key": "k", "kind_of_run": "track"}}, "e1")
        assert run_kinds(store) == {"track"}  # the damaged version names no kind
        assert row_version(next(r for r in store.rows() if r["case_id"] == "a")) == {}
    with Store.create(tmp_path / "record") as store:
        store.put({"case_id": "a", "status": "ok", "median_ms": 1.0}, "e1")
        store.begin_sweep(command="", spec_source="spec.yaml", spec_text="", experiment={"versions": [{"key": "k"}, {"key": "j"}], "kind": ["ab"]},
                          env_key="e1", n_cases=1, n_skipped=0)
        assert run_kinds(store) == {"sweep"}
