"""The host canary (measure.canary): its measurement, and the host_drift rule on synthetic rows."""

import gc
import json
import shutil

import pytest
import torch

from cli_util import ROOT
from perflab.measure.canary import (HOST_DRIFT_FLAG, HOST_DRIFT_MIN_ROWS, HOST_DRIFT_THRESHOLD, REPEATS, host_canary,
                                    mark_host_flags)
from perflab.sweep.store import Store, load_stored, read_rows


def test_canary_is_positive_and_stable_within_one_process():
    runs = [host_canary() for _ in range(5)]
    for c in runs:
        assert len(c.samples_us) == REPEATS and all(s > 0 for s in c.samples_us)
        assert 0 < c.min_us <= c.median_us
    medians = [c.median_us for c in runs]
    # The medians of back-to-back calls agree; 3× is loose enough for a busy shared 2-core VM (measured spread: ~5%).
    assert max(medians) < 3 * min(medians), medians
    assert 1 < min(medians) < 1e5  # µs per run: between 1 µs and 0.1 s on any plausible host


def test_canary_leaves_the_callers_state_as_it_was():
    assert gc.isenabled()
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.inference_mode():
        c = host_canary(repeats=3)
        assert torch.is_autocast_enabled("cpu") and torch.is_inference_mode_enabled()
    assert c.median_us > 0 and gc.isenabled() and torch.is_grad_enabled()
    gc.disable()
    try:
        host_canary(repeats=1)
        assert not gc.isenabled()
    finally:
        gc.enable()


def rows_with(canaries, env_key="e", status="ok"):
    return [{"case_id": f"c{i}", "status": status, "mode": "eager", "host_canary_us": c, "flags": ["no_power"], "warnings": ["w"],
             "env_key": env_key} for i, c in enumerate(canaries)]


def flagged(rows):
    return [HOST_DRIFT_FLAG in r["flags"] for r in rows]


def test_only_the_row_beyond_the_threshold_is_flagged():
    assert HOST_DRIFT_THRESHOLD == 0.15
    out = mark_host_flags(rows_with([100, 102, 98, 130]))  # median 101: 130 is 1.287×
    assert flagged(out) == [False, False, False, True]
    assert [round(r["host_canary_ratio"], 4) for r in out] == [0.9901, 1.0099, 0.9703, 1.2871]
    assert out[3]["flags"] == ["no_power", "host_drift"] and len(out[3]["warnings"]) == 2
    assert "130 µs, 1.29× the median 101 µs" in out[3]["warnings"][1]
    # Both directions, and the bound itself: 116 and 84 are 16% off the median 100, 114 and 86 14%.
    out = mark_host_flags(rows_with([100, 100, 100, 114, 116, 86, 84]))
    assert flagged(out) == [False, False, False, False, True, False, True]
    assert flagged(mark_host_flags(rows_with([100, 102, 98, 130]), threshold=0.30)) == [False] * 4


def test_rows_without_a_canary_are_never_flagged_and_do_not_count():
    rows = rows_with([100, 102, 98, 130])
    rows.insert(1, {"case_id": "old", "status": "ok", "flags": [], "env_key": "e"})  # a row stored before the canary
    rows.insert(2, dict(rows[0], case_id="timeout", status="timeout", host_canary_us=None))  # the parent's row: no canary
    out = mark_host_flags(rows)
    assert flagged(out) == [False, False, False, False, False, True]
    assert out[1] is rows[1] and "host_canary_ratio" not in out[1]
    assert out[5]["host_canary_ratio"] == pytest.approx(130 / 101)  # the median is of the four canaries only
    # Fewer canaries than HOST_DRIFT_MIN_ROWS give no reference: with two, which one drifted?
    assert HOST_DRIFT_MIN_ROWS == 3
    out = mark_host_flags(rows_with([100, 200]))
    assert flagged(out) == [False, False] and all("host_canary_ratio" not in r for r in out)


def test_each_environment_is_its_own_reference_and_failed_rows_count_but_are_not_flagged():
    fast, slow = rows_with([100, 101, 99], env_key="fast"), rows_with([200, 202, 198], env_key="slow")
    assert not any(flagged(mark_host_flags(fast + slow)))  # a slower host is another environment, not drift
    assert all(flagged(mark_host_flags(fast + slow, group=lambda r: None))[3:])  # one pool would flag the slow host
    rows = rows_with([100, 100, 100]) + rows_with([400], status="oom")
    out = mark_host_flags(rows)
    assert flagged(out) == [False] * 4 and out[3]["host_canary_ratio"] == pytest.approx(4.0)


def test_marking_copies_rows_and_is_idempotent():
    rows = rows_with([100, 102, 98, 130])
    once = mark_host_flags(rows)
    assert rows[3]["flags"] == ["no_power"] and "host_canary_ratio" not in rows[3]  # the input rows are untouched
    twice = mark_host_flags(once)
    assert [r["flags"] for r in twice] == [r["flags"] for r in once] and twice[3]["warnings"] == once[3]["warnings"]
    # A stale flag (a row judged among other rows) is recomputed against the rows present now.
    assert mark_host_flags(once[2:])[1]["flags"] == ["no_power"]


def test_the_flag_is_derived_when_read_never_stored(tmp_path):
    rows = rows_with([100, 102, 98, 130])
    for row in rows:
        row.update(model="test:tiny", input_size=32, batch_size=1, dtype="fp32")
    with Store.create(tmp_path) as store:
        for row in rows:
            assert store.put(row, "e")
        assert not store.put(dict(rows[3], host_canary_us=999.0), "e")  # a duplicate is still refused
        assert store.statuses("e") == {r["case_id"]: "ok" for r in rows}
        stored = [json.loads(r[0]) for r in store.conn.execute("SELECT row_json FROM results ORDER BY rowid")]
        assert [r["flags"] for r in stored] == [["no_power"]] * 4 and all("host_canary_ratio" not in r for r in stored)
        assert [r["flags"] for r in store.rows()] == [["no_power"]] * 4
    assert flagged(read_rows(tmp_path)) == [False, False, False, True]
    shown = load_stored(tmp_path)
    assert flagged(shown.rows) == flagged(shown.all_rows) == [False, False, False, True]
    assert [r["case_id"] for r in shown.rows] == ["c0", "c1", "c2", "c3"]


@pytest.mark.parametrize("name", ["token_reduction", "breakeven_bs8_bf16_eager"])
def test_stores_from_before_the_canary_still_load_and_report(tmp_path, name):
    from perflab.report.markdown import write_report

    out = tmp_path / name
    shutil.copytree(ROOT / "docs" / "reports" / name, out)
    rows = read_rows(out)
    assert rows and all("host_canary_us" not in r for r in rows)
    assert not any(HOST_DRIFT_FLAG in (r.get("flags") or []) for r in rows)
    text = write_report(out, n_boot=100).read_text()
    assert "Host µs" not in text and "host_drift" not in text and "Host speed" not in text
