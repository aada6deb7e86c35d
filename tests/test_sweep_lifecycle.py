"""One sweep lifecycle for every engine: the store's lock, its sweep record, SIGTERM taken as Ctrl-C, a full disk told
in one line, and the progress display closed however the run ends."""

import os
import signal
import sqlite3

import pytest

from perflab import api
from perflab.errors import PerflabError
from perflab.sweep.spec import parse_experiment
from perflab.sweep.store import Store, store_path

FAST = {"device": "cpu", "model": "test:tiny", "input_size": 32, "warmup": 1, "iters": 2, "repeats": 2}


def _events():
    seen = []

    def on_event(kind, **info):
        seen.append(kind)

    return seen, on_event


def test_a_full_disk_in_a_sweep_is_one_line_the_record_says_failed_and_the_progress_closes(tmp_path, monkeypatch):
    """The local engine's row write fails as SQLite fails on a full disk, at the second case's row: one PerflabError
    naming the store, what it keeps (the first row) and how to go on; the sweep record says it failed, not that someone
    interrupted it; the progress display is closed."""
    experiment = parse_experiment({"defaults": FAST, "grid": {"batch_size": [1, 2]}}, "x.yaml")
    insert = Store._insert
    calls = []

    def full_after_one(self, *args, **kwargs):
        calls.append(args[0]["case_id"])
        if len(calls) > 1:
            raise sqlite3.OperationalError("database or disk is full")
        return insert(self, *args, **kwargs)

    monkeypatch.setattr(Store, "_insert", full_after_one)
    seen, on_event = _events()
    with pytest.raises(PerflabError) as caught:
        api.sweep(experiment, tmp_path, on_event=on_event)
    assert str(caught.value) == (f"{store_path(tmp_path)}: the disk is full (database or disk is full); the store keeps the rows it "
                                 "held before and the 1 row(s) of this run stored before it (each committed when its case ended; "
                                 "what was in flight is not stored). Free space, then rerun with --resume to run the rest")
    assert seen[0] == "start" and seen[-1] == "finish"
    monkeypatch.setattr(Store, "_insert", insert)
    with Store.open(tmp_path) as store:
        assert [r["case_id"] for r in store.rows()] == calls[:1]
        assert [(s["outcome"], s["n_done"]) for s in store.sweeps()] == [("failed", 1)]
    assert not (tmp_path / "tmp").exists()


def test_sigterm_stops_a_sweep_as_ctrl_c_does_and_gives_the_handler_back(tmp_path):
    """SIGTERM while a case runs: its worker is killed, its case stays unstored for --resume, the record says
    interrupted, and the handler that was there before is back."""
    experiment = parse_experiment({"defaults": FAST, "grid": {"batch_size": [1, 2]}}, "x.yaml")
    before = signal.getsignal(signal.SIGTERM)
    seen = []

    def terminate_at_first_case(kind, **info):
        seen.append(kind)
        if kind == "case_start":
            os.kill(os.getpid(), signal.SIGTERM)

    summary = api.sweep(experiment, tmp_path, on_event=terminate_at_first_case)
    assert summary.interrupted and summary.done == 0 and seen == ["start", "case_start", "finish"]
    assert signal.getsignal(signal.SIGTERM) is before
    with Store.open(tmp_path) as store:
        assert store.count() == 0 and [(s["outcome"], s["n_done"]) for s in store.sweeps()] == [("interrupted", 0)]
    assert not (tmp_path / "tmp").exists()


def test_the_session_records_how_each_run_ended_and_closes_the_progress_each_time(tmp_path):
    """Complete; Ctrl-C (interrupted, nothing raised); an error in the drive or between begin and drive (failed, raised);
    each record with the rows it stored, and "finish" heard each time."""
    from perflab.sweep.lifecycle import SweepSession, SweepSummary

    experiment = parse_experiment({"defaults": FAST, "cases": [{}]}, "x.yaml")
    case = experiment.cases[0]

    def stores_one_then(error):
        def run_cases():
            session.case_done(case, {"case_id": case.id, "status": "ok"}, "env", slot="w0", wall_s=0.1, replace=False)
            if error is not None:
                raise error
        return run_cases

    ended = []
    for error, before_drive in ((None, False), (KeyboardInterrupt(), False), (ValueError("broken"), False), (ValueError("early"), True)):
        out = tmp_path / str(len(ended))
        summary = SweepSummary(out, "env", total=1, skipped=0)
        seen, on_event = _events()
        try:
            with SweepSession(out, summary, on_event=on_event) as session:
                session.begin([("env", {"host": "h"})], experiment=experiment, record=experiment.to_json(), env_key="env", n_cases=1,
                              n_skipped=0, start={})
                if before_drive:
                    raise error
                session.drive(stores_one_then(error))
        except ValueError as exc:
            assert exc is error
        else:
            assert not isinstance(error, ValueError)
        assert seen[0] == "start" and seen[-1] == "finish" and summary.interrupted == isinstance(error, KeyboardInterrupt)
        assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["logs"]  # no worker ran: nothing in tmp or flops
        with Store.open(out) as store:
            ((record),) = store.sweeps()
            ended.append((record["outcome"], record["n_done"], store.count(), summary.done))
    assert ended == [("complete", 1, 1, 1), ("interrupted", 1, 1, 1), ("failed", 1, 1, 1), ("failed", 0, 0, 0)]


def test_a_store_whose_lock_cannot_be_opened_is_one_line_and_keeps_what_is_there(tmp_path):
    from perflab.sweep.lifecycle import one_sweep_at_a_time

    (tmp_path / "sweep.lock").mkdir()  # a directory where the lock file goes (root ignores a read-only mode)
    (tmp_path / "results.csv").write_text("kept\n")
    with pytest.raises(PerflabError) as err:
        with one_sweep_at_a_time(tmp_path):
            pass
    assert str(err.value) == f"{tmp_path / 'sweep.lock'}: cannot open the store's lock (Is a directory); give another --out"
    assert (tmp_path / "results.csv").read_text() == "kept\n"


@pytest.mark.parametrize("name, what", [("logs", "logs"), ("tmp", "result files"), ("flops", "FLOP counts")])
def test_a_file_where_the_workers_directory_goes_is_one_line_before_anything_is_stored(tmp_path, name, what):
    """A file named ``logs``, ``tmp`` or ``flops`` in DIR: one line naming it, before the store is made or a case runs
    (not a traceback mid-run, nor an error row for every case); the file is left as it was."""
    experiment = parse_experiment({"defaults": FAST, "cases": [{}]}, "x.yaml")
    (tmp_path / name).write_text("kept\n")
    with pytest.raises(PerflabError) as err:
        api.sweep(experiment, tmp_path)
    assert str(err.value) == (f"{tmp_path / name}: cannot make the directory the workers write their {what} to (File exists); "
                              "move what is there, or give another --out")
    assert (tmp_path / name).read_text() == "kept\n" and not store_path(tmp_path).exists()
