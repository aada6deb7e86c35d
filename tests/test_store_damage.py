"""Issue 39: a damaged store is reported in part: rows that cannot be decoded are named and skipped, a sweep record of
the wrong shape is named and the rows are reported without it, and damaged pages are one line naming the file."""

import json
import random
import sqlite3

import pytest

from cli_util import assert_one_line_error, run_cli_here
from perflab import api
from perflab.errors import PerflabError
from perflab.spec import Case
from perflab.sweep.store import Store

CASES = [Case("test:tiny", input_size=32, batch_size=bs, device="cpu") for bs in (1, 2, 3, 4)]


def _store(out, padding: int = 0):
    """A sweep's store of four ok rows, as the runner writes them (``padding`` characters more per row, to span pages)."""
    with Store.create(out) as store:
        store.put_environment("env", {"host": "lab"})
        sweep = store.begin_sweep(command="perflab sweep x.yaml", spec_source="x.yaml", spec_text="", env_key="env", n_cases=4, n_skipped=0,
                                  experiment={"name": "x", "source": "x.yaml", "cases": [c.to_dict() for c in CASES]})
        for case in CASES:
            median = 1.0 + case.batch_size
            store.put({"case_id": case.id, "case": case.to_dict(), "status": "ok", "model": "test:tiny", "input_size": 32,
                       "batch_size": case.batch_size, "dtype": "fp32", "mode": "eager", "device": "cpu", "label": case.label(),
                       "median_ms": median, "ci95_ms": [median * 0.99, median * 1.01], "samples_ms": [median] * 3, "flags": [],
                       "warnings": [], "throughput_per_s": 1000 * case.batch_size / median, "pad": "x" * padding}, "env", sweep_id=sweep)
        store.end_sweep(sweep, "complete", 4)
    return out


def _sql(out, statement, *args):
    with sqlite3.connect(str(out / "results.sqlite")) as conn:
        conn.execute(statement, args)


def test_rows_that_cannot_be_decoded_are_named_and_skipped(tmp_path):
    out = _store(tmp_path / "run")
    _sql(out, "UPDATE results SET row_json = substr(row_json, 1, 40) WHERE case_id = ?", CASES[1].id)  # cut short
    _sql(out, "UPDATE results SET row_json = '{\"case_id\": \"x\", \"status\": 5}' WHERE case_id = ?", CASES[2].id)  # the wrong shape
    r = run_cli_here("results", out, "--format", "json")
    assert r.returncode == 0 and "Traceback" not in r.stderr
    assert len(r.stdout.splitlines()) == 2  # the two rows that are whole
    lines = r.stderr.splitlines()
    assert lines == [f"warning: {out}: row {CASES[1].id} (env): malformed JSON of 40 characters, cut short or damaged "
                     "(Unterminated string starting at: line 1 column 38 (char 37)); skipped",
                     f"warning: {out}: row {CASES[2].id} (env): not a result row (Expected `str`, got `int` - at `$.status`); skipped"]
    r = run_cli_here("report", out, "--bootstrap", "100")
    assert r.returncode == 0 and len(r.stderr.splitlines()) == 2 and "Traceback" not in r.stderr
    assert "(2 unreadable stored record(s) left out, named in its Status section)" in r.stdout
    text = (out / "report.md").read_text()
    assert "2 cases: 2 ok." in text  # the two unreadable rows are neither counted nor called "not run"
    assert "2 stored record(s) could not be read and are left out of this report (2 result row(s) among them, not counted above):" in text
    assert f"| row | `{CASES[1].id}` | malformed JSON of 40 characters" in text


def test_a_sweep_record_of_the_wrong_shape_is_named_and_the_rows_are_still_reported(tmp_path):
    out = _store(tmp_path / "run")
    _sql(out, "UPDATE sweeps SET experiment_json = '{\"cases\": [5]}'")
    r = run_cli_here("report", out, "--bootstrap", "100")
    assert r.returncode == 0 and "Traceback" not in r.stderr
    assert r.stderr.splitlines() == [f"warning: {out}: sweep 1 (env): experiment_json is not an experiment (TypeError: 'int' object is not "
                                     "iterable); the cases it did not run are not counted; skipped"]
    text = (out / "report.md").read_text()
    assert "4 cases: 4 ok." in text and "| sweep | `1` | experiment_json is not an experiment" in text
    _sql(out, "UPDATE sweeps SET experiment_json = '[1, 2'")  # cut short
    warned = []
    assert len(api.results(out)) == 4  # rows alone do not read the sweep record
    api.report(out, n_boot=100, on_unreadable=warned.append)
    assert [(u.what, u.key, u.problem) for u in warned] == [
        ("sweep", "1", "experiment_json: malformed JSON of 5 characters, cut short or damaged (Expecting ',' delimiter: line 1 column 6 (char 5))")]


def test_damaged_pages_are_one_line_naming_the_file_and_sqlite_recover(tmp_path):
    out = _store(tmp_path / "run", padding=3000)  # rows on pages of their own
    path = out / "results.sqlite"
    data = bytearray(path.read_bytes())
    assert len(data) >= 10 * 4096
    rng = random.Random(39)
    data[4 * 4096:8 * 4096] = bytes(rng.randrange(256) for _ in range(4 * 4096))  # random bytes past the first page
    path.write_bytes(bytes(data))
    Store.open(out).close()  # its first page is whole: the damage shows only once the rows are read
    for command in (["results", out], ["report", out]):
        r = run_cli_here(*command)
        assert_one_line_error(r, f"{path}: the store is damaged (database disk image is malformed); recover what it holds with "
                                 f"`mkdir {tmp_path / 'run_recovered'} && sqlite3 {path} .recover | sqlite3 {tmp_path / 'run_recovered' / 'results.sqlite'}`")
    before = path.read_bytes()
    with pytest.raises(PerflabError, match=r"the store is damaged \(\*\*\* in database main \*\*\*"):
        Store.create(out)  # as a sweep (--resume) opens it: refused before a case runs, and nothing written to it
    assert path.read_bytes() == before


def test_keys_and_columns_of_the_wrong_type_are_named_and_a_missing_table_is_one_line(tmp_path):
    out = _store(tmp_path / "run")
    _sql(out, "UPDATE results SET row_json = json_set(row_json, '$.throughput_per_s', 'x') WHERE case_id = ?", CASES[0].id)
    _sql(out, "UPDATE results SET row_json = json_set(row_json, '$.ci95_ms', json('[1]')) WHERE case_id = ?", CASES[1].id)
    _sql(out, "UPDATE environments SET env_json = '{\"gpus\": 5}'")
    _sql(out, "UPDATE sweeps SET started_at = 'x', experiment_json = '{\"same_as_sweep\": [1]}'")
    warned = []
    api.report(out, n_boot=100, on_unreadable=warned.append)
    assert [(u.what, u.key, u.problem) for u in warned] == [
        ("sweep", "1", "column started_at ('x'): Expected `float | null`, got `str`; experiment_json: Expected `int`, got `array`"),
        ("environment", "env", "not as stored (Expected `array | null`, got `int` - at `$.gpus`)"),
        ("row", CASES[0].id, "not a result row (Expected `float | null`, got `str` - at `$.throughput_per_s`)"),
        ("row", CASES[1].id, "not a result row (Expected `array` of length 2, got 1 - at `$.ci95_ms`)")]
    text = (out / "report.md").read_text()
    assert "2 cases: 2 ok." in text and "start unknown" in text
    assert "4 stored record(s) could not be read and are left out of this report (2 result row(s) among them" in text  # one sweep record
    r = run_cli_here("results", out)
    assert r.returncode == 0 and len(r.stderr.splitlines()) == 2 and "2 stored results" in " ".join(r.stdout.split())  # a long tmp path wraps the title
    _sql(out, "DROP TABLE sweeps")
    assert_one_line_error(run_cli_here("report", out), f"{out / 'results.sqlite'}: not a perflab results store (no such table: sweeps)")


def test_bytes_that_are_not_utf8_are_named_not_a_traceback(tmp_path):
    out = _store(tmp_path / "run")
    _sql(out, "UPDATE results SET row_json = CAST(x'7b22a5' AS TEXT) WHERE case_id = ?", CASES[0].id)  # in a row's JSON
    _sql(out, "UPDATE results SET env_key = CAST(x'65a56e76' AS TEXT) WHERE case_id = ?", CASES[1].id)  # in a key column
    warned = []
    rows = api.results(out, on_unreadable=warned.append)
    assert [r["env_key"] for r in rows] == ["e\ufffdnv", "env", "env"]  # the damaged key reads with U+FFFD, its row whole
    assert [(u.key, u.problem) for u in warned] == [
        (CASES[0].id, "malformed JSON, cut short or damaged ('utf-8' codec can't decode byte 0xa5 in position 2: invalid start byte)")]
    path = out / "results.sqlite"
    data = bytearray(path.read_bytes())
    at = data.index(b"spec_source")  # the schema's text, in the first page
    data[at] = 0xA5
    path.write_bytes(bytes(data))
    assert_one_line_error(run_cli_here("report", out), f"{path}: the store is damaged (")


def test_a_stored_row_without_its_model_is_shown_not_a_traceback(tmp_path):
    out = _store(tmp_path / "run")
    _sql(out, "UPDATE results SET row_json = json_remove(row_json, '$.model') WHERE case_id = ?", CASES[0].id)
    r = run_cli_here("results", out)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("kind", ["ab", "track"])
def test_a_versions_row_whose_version_is_not_a_mapping_is_reported_as_of_no_version_not_a_traceback(tmp_path, kind):
    """A store that ab or track wrote, one of whose rows has a ``version`` that is no mapping (text, a list): the report
    compares the versions' rows of the other case and lists the damaged rows under no version (``records.row.row_version``,
    as the store's own readers take them), not an AttributeError."""
    from perflab.report.markdown import write_report

    case, other = CASES[1], CASES[2]
    versions = [{"key": key, "name": name, "kind": "revision", "revision": name.lower()} for key, name in (("ka", "A"), ("kb", "B"))]
    with Store.create(tmp_path) as store:
        for env in ("eA", "eB"):
            store.put_environment(env, {"host": "lab"})
        sweep = store.begin_sweep(command=f"perflab {kind}", spec_source="x.yaml", spec_text="", env_key="eA,eB", n_cases=2, n_skipped=0,
                                  experiment={"name": "x", "cases": [case.to_dict()], "versions": versions, "kind": kind})
        row = {"case": case.to_dict(), "status": "ok", "model": "test:tiny", "input_size": 32, "dtype": "fp32", "mode": "eager",
               "device": "cpu", "median_ms": 2.0, "ci95_ms": [1.98, 2.02], "samples_ms": [2.0] * 3}
        for env, version in (("eA", versions[0]), ("eB", versions[1])):
            store.put(dict(row, case_id=case.id, batch_size=2, version=version), env, sweep_id=sweep)
        for env, damaged in (("eA", "abc"), ("eB", ["kb"])):
            store.put(dict(row, case_id=other.id, batch_size=3, version=damaged), env, sweep_id=sweep)
        store.end_sweep(sweep, "complete", 4)
    text = write_report(tmp_path).read_text()
    assert ("## A/B" if kind == "ab" else "### test:tiny 32px bs2 fp32 eager: no change point") in text
    assert text.count("| – | test:tiny | 32 | 3 | fp32 | eager | ok | 2.000 [1.980–2.020] |") == 2


def test_stored_rows_without_their_batch_size_dtype_or_mode_are_shown_as_unknown_not_a_traceback(tmp_path):
    """The store keeps a row's batch size, dtype and mode optional (``records.row.StoredRow``), as it keeps its model:
    ``perflab results``' table shows each one lost as ``?``, not a KeyError."""
    import io

    from rich.console import Console

    from perflab.report.console import bench_table

    out = _store(tmp_path / "run")
    for case, key in zip(CASES, ("batch_size", "dtype", "mode")):
        _sql(out, f"UPDATE results SET row_json = json_remove(row_json, '$.{key}') WHERE case_id = ?", case.id)
    buffer = io.StringIO()
    Console(file=buffer, width=200, highlight=False, color_system=None).print(bench_table(api.results(out)))
    cells = [[c.strip() for c in line.split("│")[2:6]] for line in buffer.getvalue().splitlines() if "test:tiny" in line]
    assert cells == [["32px", "?", "fp32", "eager"], ["32px", "2", "?", "eager"], ["32px", "3", "fp32", "?"], ["32px", "4", "fp32", "eager"]]


@pytest.mark.parametrize("statement, lacks", [("DROP TABLE sweeps", "no such table: sweeps"),
                                              ("DROP TABLE environments", "no such table: environments"),
                                              ("ALTER TABLE results DROP COLUMN wall_s", "no such column: wall_s")])
def test_a_store_that_lacks_a_table_or_column_a_sweep_writes_is_refused_before_a_case_runs(tmp_path, statement, lacks):
    """A sweep into a store that lacks what it writes to: one line naming the store and what it lacks, before a case
    runs (not an OperationalError traceback once the run has begun); the rows stay as they were."""
    out = _store(tmp_path / "run")
    _sql(out, statement)
    spec = {"defaults": {"device": "cpu", "model": "test:tiny", "input_size": 32}, "grid": {"batch_size": [5]}}
    with pytest.raises(PerflabError) as err:
        api.sweep(spec, out, resume=True)
    assert str(err.value) == f"{out / 'results.sqlite'}: not a perflab results store ({lacks})"
    assert len(api.results(out)) == 4


def test_ab_into_a_store_without_its_sweeps_table_is_one_line_before_anything_runs(tmp_path, monkeypatch):
    """ab reads which kind of run wrote a store that is there (``run_kinds``) before it takes the lock: a store that
    lacks its sweeps table is one line naming it, as its readers say, not an OperationalError traceback."""
    import sys

    from perflab.sweep import versions

    # each interpreter is this one: its probe (a process importing torch, seconds) is not what is tried here
    monkeypatch.setattr(versions, "probe_interpreter", lambda python, option, cases: ({"python_executable": python}, [c.id for c in cases]))
    out = _store(tmp_path / "run")
    _sql(out, "DROP TABLE sweeps")
    spec = tmp_path / "spec.yaml"
    spec.write_text("defaults: {device: cpu, model: 'test:tiny', input_size: 32}\ncases: [{}]\n")
    with pytest.raises(PerflabError) as err:
        api.ab(python_a=sys.executable, python_b=sys.executable, spec=spec, out=out)
    assert str(err.value) == f"{out / 'results.sqlite'}: not a perflab results store (no such table: sweeps)"
    assert len(api.results(out)) == 4


@pytest.mark.parametrize("versions, problem", [
    ("abc", "Expected `array | null`, got `str` - at `$.versions`"),
    ([1, 2], "Expected `object`, got `int` - at `$.versions[0]`"),
    ([{"name": "A"}, {"name": "B", "key": "b"}], "Object missing required field `key` - at `$.versions[0]`"),
    ([{"name": "A", "key": "a"}], "Expected `array` of length >= 2 - at `$.versions`")])
def test_a_run_record_whose_versions_are_not_a_list_of_keyed_mappings_is_named_and_skipped(tmp_path, versions, problem):
    """An ab run's record whose versions the report cannot group rows by: named and skipped as a record of the wrong
    shape is (the report shows the rows without it), not a TypeError or KeyError traceback."""
    from perflab.report.markdown import write_report

    out = _store(tmp_path / "run")
    _sql(out, "UPDATE sweeps SET experiment_json = ?", f'{{"name": "ab", "kind": "ab", "versions": {json.dumps(versions)}}}')
    seen = []
    text = write_report(out, on_unreadable=lambda item: seen.append(item.line())).read_text()
    assert seen == [f"sweep 1 (env): experiment_json: not as stored ({problem}); skipped"]
    assert "## A/B" not in text and text.count("| test:tiny | 32 |") == 4


# ---------------------------------------------------------------------------------------------------
# What a reader leaves as it was, and what it says of what is not a store


@pytest.mark.parametrize("command", ["report", "results"])
def test_a_zero_byte_store_is_one_line_and_left_as_it_was(tmp_path, command):
    """SQLite makes a 0-byte file a database at the first pragma: `report` left a 4 KiB file where the user had 0 bytes."""
    (tmp_path / "results.sqlite").write_bytes(b"")
    assert_one_line_error(run_cli_here(command, tmp_path), "results.sqlite: an empty file (0 bytes), not a perflab results store")
    assert (tmp_path / "results.sqlite").read_bytes() == b"" and sorted(p.name for p in tmp_path.iterdir()) == ["results.sqlite"]


def test_a_reader_leaves_another_programs_sqlite_file_as_it_was(tmp_path):
    """A reader set WAL mode on whatever results.sqlite it opened, rewriting the file's header."""
    with sqlite3.connect(str(tmp_path / "results.sqlite")) as conn:
        conn.execute("CREATE TABLE other (x)")
    before = (tmp_path / "results.sqlite").read_bytes()
    assert_one_line_error(run_cli_here("results", tmp_path), "not a perflab results store (no such table: results)")
    assert (tmp_path / "results.sqlite").read_bytes() == before


def test_what_is_not_a_store_is_said_with_the_command_that_reads_it(tmp_path):
    """`results` on a bench output file and `report` on a run's directory told the user to run `perflab sweep`."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"case_id": "c", "median_ms": 1.0}) + "\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text("{}")
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"traceEvents": []}))
    store = _store(tmp_path / "store")
    said = {
        ("results", rows): f"{rows}: a file of result rows (bench --out), not a sweep's directory; `perflab compare {rows} OTHER`",
        # a run's directory gets its page (perflab report OUT): this run.json holds no run, so it is said, and nothing written
        ("report", run): f"{run / 'run.json'}: not a `perflab run` report (no timing or device)",
        ("results", run / "run.json"): "the report of `perflab run`",
        ("report", trace): f"if it is a trace, `perflab analyze {trace}` reads it",
        ("results", store / "results.sqlite"): f"a sweep's store file; give the directory that holds it, {store}",
    }
    for (command, path), words in said.items():
        result = run_cli_here(command, path)
        assert_one_line_error(result, words)
        assert "perflab sweep" not in result.stderr
    assert sorted(p.name for p in run.iterdir()) == ["run.json"]


def test_a_killed_sweeps_record_says_so_not_null(tmp_path):
    """A sweep killed with SIGKILL never records its end: its outcome stayed NULL, and its count of rows 0, for good."""
    out = _store(tmp_path / "run")
    _sql(out, "UPDATE sweeps SET outcome = NULL, finished_at = NULL, n_done = 0")  # as a SIGKILL leaves it
    with Store.open(out) as store:  # a reader says what it can, and writes nothing
        assert [(s["outcome"], s["n_done"]) for s in store.sweeps()] == [("did not finish (killed, or still running)", 4)]
    with sqlite3.connect(str(out / "results.sqlite")) as conn:
        assert conn.execute("SELECT outcome, n_done FROM sweeps").fetchall() == [(None, 0)]
    assert run_cli_here("report", out, "--bootstrap", "100").returncode == 0
    assert "did not finish (killed, or still running); 4 case(s) run" in (out / "report.md").read_text()
    # the next run into the store holds its lock: the record without an end was killed, and is stored so
    spec = {"defaults": {"device": "cpu", "model": "test:tiny", "input_size": 32}, "grid": {"batch_size": [1]}}
    api.sweep(spec, out, resume=True)
    with sqlite3.connect(str(out / "results.sqlite")) as conn:
        assert conn.execute("SELECT outcome, n_done FROM sweeps ORDER BY id").fetchall() == [("killed", 4), ("complete", 1)]
