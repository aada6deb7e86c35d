"""`compare A B` tells stored results from traces without parsing a trace's JSON (the Kineto reader's alone)."""

import json

from perflab.api import is_results_path


def test_a_one_line_trace_is_not_taken_for_a_result_row_even_with_a_case_id_in_its_metadata(tmp_path):
    event = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1.0, "dur": 2.0, "args": {"correlation": 1}}
    trace = tmp_path / "trace.json"  # compact, one line, with a metadata key as profile.add_metadata_json writes one
    trace.write_text(json.dumps({"case_id": "mine", "traceEvents": [event]}))
    bare = tmp_path / "events.json"
    bare.write_text(json.dumps([event]))
    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps({"case_id": "c1", "median_ms": 1.0, "message": 'no "traceEvents" list'}) + "\n")
    assert [is_results_path(p) for p in (trace, bare, rows)] == [False, False, True]
