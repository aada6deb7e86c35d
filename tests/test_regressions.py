"""analysis.regressions (issue 40): ratios of stored rows with CIs that state their level and basis, verdicts at a
threshold, host-dependent cases, change points over revisions; and bench --out files read back. Synthetic rows, so
every figure is checked against one computed here by hand (t quantiles from the table: t(2) = 4.303, t(4) = 2.776)."""

import math
import re
import sqlite3
import statistics

import pytest

from perflab.analysis.regressions import (compare_rows, process_ratio, revision_series, row_ratio, verdict,
                                          within_run_ratio, Ratio)
from perflab.errors import PerflabError
from perflab.report.export import read_exported_rows, to_csv, to_json_lines


def row(case_id, median, ci=None, processes=None, session=None, key=None, **extra):
    out = {"case_id": case_id, "status": "ok", "model": f"m{case_id}", "input_size": 224, "batch_size": 1, "dtype": "bf16",
           "mode": "eager", "median_ms": median, "ci95_ms": list(ci) if ci else [median * 0.99, median * 1.01]}
    if processes:
        out["process_medians_ms"] = list(processes)
    if session or key:
        out["version"] = {"session": session, "key": key}
    return dict(out, **extra)


def test_a_paired_ratio_is_the_geometric_mean_of_the_rounds_with_a_t_interval_over_them():
    a, b = [2.0, 3.0, 2.5], [4.2, 5.7, 5.1]
    logs = [math.log(4.2 / 2.0), math.log(5.7 / 3.0), math.log(5.1 / 2.5)]
    mean = sum(logs) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 2)
    r = row_ratio(row("x", 2.5, processes=a, session="s"), row("x", 5.1, processes=b, session="s"))
    assert r.basis == "paired" and r.units == 3 and r.level == 0.95
    assert r.ratio == pytest.approx(math.exp(mean))
    assert (r.low, r.high) == pytest.approx((math.exp(mean - 4.303 * sd / math.sqrt(3)), math.exp(mean + 4.303 * sd / math.sqrt(3))))
    # the host slowed the second round by half on both sides: the pairs cancel it, two unpaired sets of processes do not
    unpaired = process_ratio(a, b)
    assert unpaired.basis == "processes" and math.log(unpaired.high / unpaired.low) > 3 * math.log(r.high / r.low)
    assert row_ratio(row("x", 2.0, processes=[2.0], session="s"), row("x", 4.0, processes=[4.0], session="s")).basis == "within-run"  # one round: no paired interval


def test_a_process_ratio_is_welchs_interval_on_the_logs_of_the_process_medians():
    a, b = [1.0, 1.1, 0.9, 1.05], [1.5, 1.4, 1.6]
    la, lb = [math.log(v) for v in a], [math.log(v) for v in b]
    ma, mb = sum(la) / 4, sum(lb) / 3
    va = sum((x - ma) ** 2 for x in la) / 3
    vb = sum((x - mb) ** 2 for x in lb) / 2
    se2 = va / 4 + vb / 3
    df = se2 ** 2 / ((va / 4) ** 2 / 3 + (vb / 3) ** 2 / 2)
    assert 4 <= df < 5  # Welch's degrees of freedom, rounded down: the table's t(4) = 2.776 applies
    r = process_ratio(a, b)
    assert r.ratio == pytest.approx(math.exp(mb - ma))
    assert r.low == pytest.approx(math.exp(mb - ma - 2.776 * math.sqrt(se2)), rel=1e-3)
    assert r.high == pytest.approx(math.exp(mb - ma + 2.776 * math.sqrt(se2)), rel=1e-3)
    assert "4 vs 3 processes" in r.note and process_ratio([1.0], b) is None


def test_one_process_a_side_combines_the_runs_own_cis_and_says_they_miss_between_process_variance():
    a, b = row("x", 2.0, ci=(1.9, 2.1)), row("x", 3.0, ci=(2.8, 3.3))
    se = math.hypot(math.log(2.1 / 1.9), math.log(3.3 / 2.8)) / (2 * 1.959964)
    r = within_run_ratio(a, b)
    assert r.basis == "within-run" and r.ratio == pytest.approx(1.5)
    assert (r.low, r.high) == pytest.approx((1.5 * math.exp(-1.959964 * se), 1.5 * math.exp(1.959964 * se)))
    assert "does not cover between-process variance" in r.note
    assert row_ratio(a, b).basis == "within-run"


def test_the_basis_is_paired_only_for_rows_one_run_timed_together():
    a = row("x", 2.0, processes=[2.0, 2.1, 1.9], session="s1")
    b = row("x", 4.0, processes=[4.1, 4.0, 3.9], session="s1")
    assert row_ratio(a, b).basis == "paired"
    assert row_ratio(a, dict(b, version={"session": "s2"})).basis == "processes"  # other runs: not paired in time
    assert row_ratio(dict(a, process_medians_ms=[2.0]), dict(b, process_medians_ms=[4.0])).basis == "within-run"


def test_a_round_on_a_busy_or_slower_host_is_left_out_of_the_pairs_while_two_remain():
    a = row("x", 2.0, processes=[2.0, 2.1, 4.0, 1.9], session="s")
    b = row("x", 4.0, processes=[4.0, 4.1, 4.2, 3.9], session="s")  # round 3: A's process waited for a CPU (2.0 → 4.0 ms)
    a["process_flags"] = [["short_timing"], [], ["host_contention"], []]
    b["process_flags"] = [[], ["high_cv"], [], ["host_drift"]]  # round 4: B's host canary was off the run's median
    r = row_ratio(a, b)
    assert r.basis == "paired" and r.units == 2 and "round(s) 3, 4 of 4 left out" in r.note
    assert r.ratio == pytest.approx(math.sqrt(4.0 / 2.0 * 4.1 / 2.1))
    b["process_flags"] = [["host_drift"], [], [], ["host_drift"]]  # only round 2 clean: all four rounds are kept
    assert row_ratio(a, b).units == 4 and "left out" not in row_ratio(a, b).note


def blocks_row(samples: list[list[float]], sessions=("p0", "p1", "p2"), **extra) -> dict:
    """A row of a blocks-paired ab run: per process (round), its blocks' ms in interleaved-round order."""
    flat = [v for blocks in samples for v in blocks]
    out = row("x", sorted(flat)[len(flat) // 2], processes=[sorted(b)[len(b) // 2] for b in samples], session="run",
              samples_ms=flat, sample_processes=[p for p, b in enumerate(samples) for _ in b],
              sample_rounds=[r for b in samples for r in range(len(b))], process_sessions=list(sessions), **extra)
    out["session"] = sessions[0]  # a merged row's interleaved session: its first process's
    return out


def test_blocks_rounds_are_each_the_median_of_their_block_ratios_with_a_t_interval_over_the_rounds():
    # round 2's process ran 60% slower throughout, on both sides alike; round 3's second block hit a busy host (A only)
    a = blocks_row([[2.0, 2.0, 2.1], [3.2, 3.3, 3.2], [2.0, 4.0, 2.1]])
    b = blocks_row([[2.2, 2.1, 2.3], [3.5, 3.6, 3.4], [2.2, 2.1, 2.2]])
    per_round = [sorted([2.2 / 2.0, 2.1 / 2.0, 2.3 / 2.1])[1], sorted([3.5 / 3.2, 3.6 / 3.3, 3.4 / 3.2])[1],
                 sorted([2.2 / 2.0, 2.1 / 4.0, 2.2 / 2.1])[1]]
    logs = [math.log(x) for x in per_round]
    mean = sum(logs) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 2)
    a["process_flags"], b["process_flags"] = [[], ["host_drift"], ["host_contention"]], [[], ["host_drift"], []]
    r = row_ratio(a, b)
    assert r.basis == "blocks" and r.units == 3 and "left out" not in r.note  # one process a round: its host is both sides'
    assert r.ratio == pytest.approx(math.exp(mean))
    assert (r.low, r.high) == pytest.approx((math.exp(mean - 4.303 * sd / math.sqrt(3)), math.exp(mean + 4.303 * sd / math.sqrt(3))))
    # rows whose rounds did not share an interleaved session are paired by process, as processes pairing pairs them
    assert row_ratio(a, dict(b, process_sessions=["p0", "q1", "p2"])).basis == "paired"
    # one round: the median of its block ratios, the CI over that process's blocks
    one_a, one_b = blocks_row([[2.0, 2.1, 2.0, 2.2]], sessions=("p0",)), blocks_row([[3.0, 3.1, 3.2, 3.3]], sessions=("p0",))
    one = row_ratio(one_a, one_b)
    assert one.basis == "blocks" and one.units == 1 and "one round" in one.note
    assert one.ratio == pytest.approx(statistics.median([3.0 / 2.0, 3.1 / 2.1, 3.2 / 2.0, 3.3 / 2.2])) and one.low <= one.ratio <= one.high


@pytest.mark.parametrize("ratio,low,high,expected", [
    (1.20, 1.10, 1.30, "slower"),
    (0.80, 0.75, 0.85, "faster"),
    (1.00, 0.97, 1.04, "no change"),
    (1.03, 1.01, 1.045, "no change"),       # significant, but within the threshold: asv would not report it either
    (1.03, 0.90, 1.18, "inconclusive"),     # could be 18% slower: not called no change
    (1.08, 0.99, 1.17, "inconclusive"),     # beyond the threshold, but the CI holds 1
    (1.06, 1.02, 1.10, "slower"),
])
def test_verdicts_at_the_threshold(ratio, low, high, expected):
    assert verdict(Ratio(ratio, low, high, "paired", 3, ""), 0.05) == expected


@pytest.mark.parametrize("ratio,low,high,expected", [
    (1.20, 1.10, 1.30, "inconclusive"),  # a change by its own CI, but no larger than the A/A reads: neither slower nor no change
    (1.02, 0.90, 1.15, "no change"),     # within the floor of ±30%, the CI holding 1
    (1.45, 1.35, 1.55, "slower"),        # beyond the floor
    (0.70, 0.65, 0.74, "faster"),
    (1.20, 0.90, 1.60, "inconclusive"),
])
def test_verdicts_at_a_floor_wider_than_the_threshold(ratio, low, high, expected):
    assert verdict(Ratio(ratio, low, high, "blocks", 3, ""), 0.05, floor=0.30) == expected


def test_compare_rows_matches_by_case_id_and_labels_launch_bound_cases_host_dependent():
    a = [row("c1", 1.0, host_held_ms=0.9, device_ms=0.3), row("c2", 5.0, host_held_ms=0.5, device_ms=5.0), row("only_a", 1.0)]
    b = [row("c2", 10.0, ci=(9.9, 10.1), host_held_ms=0.5, device_ms=10.0), row("c1", 1.0, host_held_ms=0.9, device_ms=0.3),
         dict(row("c3", 1.0), status="oom")]
    result = compare_rows(a, b, threshold=0.05)
    by_id = {c.case_id: c for c in result.changes}
    assert set(by_id) == {"c1", "c2"} and result.only_a == ["monly_a 224px bs1 bf16 eager"] and result.only_b == ["mc3 224px bs1 bf16 eager"]
    assert by_id["c2"].verdict == "slower" and by_id["c2"].ratio.ratio == pytest.approx(2.0) and by_id["c2"].host_dependent is None
    assert by_id["c1"].verdict == "no change" and by_id["c1"].host_dependent.startswith("host-dependent: A launch-bound (host 0.9 ms")
    failed = compare_rows([row("c3", 1.0)], b[2:])
    assert failed.changes[0].verdict == "not compared" and failed.changes[0].status_b == "oom"
    with pytest.raises(PerflabError, match="share no case id"):
        compare_rows([row("c1", 1.0)], [row("c9", 1.0)])
    with pytest.raises(PerflabError, match="appears twice"):
        compare_rows([row("c1", 1.0), row("c1", 1.1)], [row("c1", 1.0)])
    with pytest.raises(PerflabError, match="--threshold"):
        compare_rows(a, b, threshold=5)


def test_change_points_are_the_revisions_whose_step_from_the_previous_one_is_beyond_the_threshold():
    order = [("k1", "r1"), ("k2", "r2"), ("k3", "r3"), ("k4", "r4")]
    medians = {"k1": [1.0, 1.02, 0.98], "k2": [1.01, 1.0, 0.99], "k3": [2.0, 2.05, 1.98], "k4": [2.0, 2.02, 1.97]}
    rows = [row("c", sum(m) / 3, processes=m, session="s", key=k) for k, m in medians.items()]
    rows.append(dict(row("c", 1.0, key="k0"), version={"key": "k0"}))  # a revision not in the order: left out
    (series,) = revision_series(rows, order)
    assert [p.name for p in series.points] == ["r1", "r2", "r3", "r4"]
    assert [p.name for p in series.change_points] == ["r3"] and series.points[2].step.verdict == "slower"
    assert series.points[0].step is None and series.points[1].step.verdict in ("no change", "inconclusive")
    # a failed revision is skipped: the next one is compared with the last that measured the case
    rows[2] = dict(rows[2], status="error")
    (series,) = revision_series(rows, order)
    assert series.points[2].status == "error" and series.points[3].step.verdict == "slower"
    assert [p.name for p in series.change_points] == ["r4"]


def test_bench_out_files_read_back_as_rows_in_either_format(tmp_path):
    rows = [row("c1", 1.5, ci=(1.4, 1.6), processes=[1.5, 1.45, 1.55], host_held_ms=0.7, device_ms=0.2, processes_n=3,
                keep_rate=[0.1], reduction_loc=[3, 6], flags=["high_cv"]),
            dict(row("c2", 2.5), status="oom", median_ms=None, ci95_ms=None, message="out of memory")]
    for name, text in (("r.csv", to_csv(rows)), ("r.jsonl", to_json_lines(rows))):
        (tmp_path / name).write_text(text)
        back = read_exported_rows(tmp_path / name)
        assert [r["case_id"] for r in back] == ["c1", "c2"]
        assert back[0]["median_ms"] == pytest.approx(1.5) and back[0]["ci95_ms"] == pytest.approx([1.4, 1.6])
        assert back[0]["process_medians_ms"] == pytest.approx([1.5, 1.45, 1.55]) and back[0]["batch_size"] == 1
        assert back[0]["host_held_ms"] == pytest.approx(0.7) and back[0]["keep_rate"] == [0.1] and back[0]["flags"] == ["high_cv"]
        assert back[1]["status"] == "oom" and back[1]["median_ms"] is None and back[1]["ci95_ms"] is None
    (tmp_path / "bad.jsonl").write_text('{"case_id": "c1"}\nnot json\n')
    with pytest.raises(PerflabError, match="line 2: not JSON"):
        read_exported_rows(tmp_path / "bad.jsonl")
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    with pytest.raises(PerflabError, match="no case_id column"):
        read_exported_rows(tmp_path / "bad.csv")


@pytest.mark.parametrize("line, message", [
    ('{"case_id": "c1", "status": "ok", "median_ms": "1.5"}', "median_ms: '1.5': expected a time in ms, a number from 1e-09 to 1e+10"),
    ('{"case_id": "c1", "ci95_ms": 5}', "ci95_ms: 5: expected [low, high] in ms, each a number from 1e-09 to 1e+10"),
    ('{"case_id": ["c1"]}', 'case_id: ["c1"]: expected non-empty text on one line, without control characters'),
    ('{"case_id": "c1", "process_medians_ms": [1.0, "a"]}',
     "process_medians_ms[1]: 'a': expected a list of process medians in ms, each a number from 1e-09 to 1e+10 or null")])
def test_a_json_line_whose_values_have_other_types_is_one_error_naming_the_line_and_field(tmp_path, line, message):
    (tmp_path / "r.jsonl").write_text(to_json_lines([row("c0", 1.0)]) + line + "\n")
    with pytest.raises(PerflabError) as exc:
        read_exported_rows(tmp_path / "r.jsonl")
    assert str(exc.value) == f"{tmp_path / 'r.jsonl'}, line 2: {message}"


def test_compare_of_stored_results_with_a_mistyped_or_foreign_other_side_says_which_side_is_wrong(tmp_path):
    from cli_util import assert_one_line_error, run_cli_here

    (tmp_path / "a.jsonl").write_text(to_json_lines([row("c1", 1.0)]))
    (tmp_path / "bad.sqlite").write_text("not sqlite")
    assert_one_line_error(run_cli_here("compare", tmp_path / "a.jsonl", tmp_path / "nosuch"), "nosuch: no such file or directory",
                          "a.jsonl is one")
    assert_one_line_error(run_cli_here("compare", tmp_path / "bad.sqlite", tmp_path / "a.jsonl"), "bad.sqlite: not stored results")
    with sqlite3.connect(tmp_path / "copy.sqlite") as conn:  # a store's file under another name: read from its directory as results.sqlite
        conn.execute("CREATE TABLE results (x)")
    assert_one_line_error(run_cli_here("compare", tmp_path / "copy.sqlite", tmp_path / "a.jsonl"), "copy.sqlite: a store is read as a "
                          "directory's results.sqlite")
    assert not (tmp_path / "results.sqlite").exists()



def test_an_interrupted_ab_says_to_rerun_into_another_store_and_an_interrupted_track_that_it_reuses_the_rows(monkeypatch, tmp_path):
    """An ab store holding its versions' rows is refused (run_versions), so ab's rerun must go elsewhere; track reuses."""
    from types import SimpleNamespace

    from cli_util import run_cli_here
    from perflab import api
    from perflab.analysis.regressions import RowComparison

    summary = SimpleNamespace(interrupted=True, versions=[], out_dir=tmp_path, rounds=2, pairing="blocks", reused=0, stored=1, copy=None)
    monkeypatch.setattr(api, "ab", lambda **kw: (summary, RowComparison([])))
    monkeypatch.setattr(api, "track", lambda **kw: (summary, []))
    case = ["--model", "m.py:M", "--json"]
    ab = run_cli_here("ab", "--repo", tmp_path, "--a", "x", "--b", "y", *case)
    track = run_cli_here("track", "--repo", tmp_path, "--revs", "x", "y", "--out", tmp_path, *case)
    assert ab.returncode == track.returncode == 130
    assert ab.stderr.strip().endswith("stored; run the command again (given --out, into another directory: ab does not add rows to a "
                                      "store that holds its versions)")
    assert track.stderr.strip().endswith("stored; run the command again: it reuses them")


def test_every_json_ci_names_its_level_beside_the_old_key():
    """ci95_ms stays one release; ci_ms and ci_coverage say what the interval may claim (run.json's timing, track's points)."""
    from perflab.analysis.regressions import revision_series
    from perflab.program.recorder import timing_summary
    from perflab.report.versions import series_dict

    two = timing_summary([2.0, 1.0], [])
    assert two["ci_ms"] == two["ci95_ms"] == [1.0, 2.0] and two["ci_coverage"] == 0.5  # min–max of 2 samples: 50%
    many = timing_summary([1.0 + i / 100 for i in range(40)], [])
    assert many["ci_ms"] == many["ci95_ms"] and many["ci_coverage"] == 0.95
    rows = [{"case_id": "c", "label": "m", "status": "ok", "median_ms": 1.5, "ci95_ms": [1.0, 2.0], "samples_ms": [1.0, 2.0],
             "version": {"key": "k1"}}]
    (series,) = revision_series(rows, [("k1", "c1")], 0.05)
    (point,) = series_dict(series)["points"]
    assert point["ci_ms"] == point["ci95_ms"] == [1.0, 2.0] and point["ci_coverage"] == 0.5


# ---------------------------------------------------------------------------------------------------
# Ratios on logarithms, the noise floor, and what a run can detect


def test_the_median_of_ratios_is_taken_on_logs_so_a_change_and_its_inverse_weigh_alike():
    from perflab.stats import log_median

    # four block ratios, a first-block effect of 1.5x falling on A and on B in turn: the plain median leans "slower"
    ratios = [1 / 1.5, 1 / 1.5, 1.5, 1.5]
    assert statistics.median(ratios) == pytest.approx(1.0833, abs=1e-4)
    assert log_median(ratios) == pytest.approx(1.0)
    assert log_median([0.5, 2.0]) == pytest.approx(1.0) and log_median([1.0, 3.0, 2.0]) == 2.0  # odd: the middle value
    with pytest.raises(ValueError):
        log_median([1.0, 0.0])


def position_effect_rows(rounds=3, orders=("AB", "BA", "BA", "AB"), first=1.5, b_time=1.0, noise=(1.0, 1.01, 0.99)):
    """An A/A (``b_time`` 1.0) or A/B blocks run whose block timed first in each pair is ``first``× slower: the position
    effect the CPU measurement found, planted exactly (per round a host speed from ``noise``)."""
    a, b = [], []
    for r in range(rounds):
        speed = noise[r % len(noise)]
        a.append([speed * (first if o[0] == "A" else 1.0) for o in orders])
        b.append([speed * b_time * (first if o[0] == "B" else 1.0) for o in orders])
    sessions = tuple(f"p{r}" for r in range(rounds))
    return blocks_row(a, sessions=sessions), blocks_row(b, sessions=sessions)


def test_a_balanced_first_block_effect_cancels_on_logs_where_the_plain_median_read_slower():
    a, b = position_effect_rows()
    r = row_ratio(a, b)
    assert r.basis == "blocks" and r.ratio == pytest.approx(1.0) and r.low <= 1.0 <= r.high
    # what the plain median of each round's four block ratios made of it: 1.083 in every round, a CI that excludes 1
    plain = statistics.median([1 / 1.5, 1.5, 1.5, 1 / 1.5])
    assert plain > 1.05 and verdict(Ratio(plain, plain, plain, "blocks", 3, ""), 0.05) == "slower"
    assert compare_rows([a], [b]).changes[0].verdict in ("no change", "inconclusive")
    # and a true 10% slower B under the same effect reads 1.10 on logs
    a, b = position_effect_rows(b_time=1.1)
    assert row_ratio(a, b).ratio == pytest.approx(1.1)


def test_one_rounds_paired_ratio_is_the_log_median_of_its_blocks():
    from perflab.stats import paired_ratio

    a, b = position_effect_rows(rounds=1, orders=("AB", "BA") * 4)
    paired = paired_ratio(a, b)
    assert paired["ratio"] == pytest.approx(1.0) and paired["pairs"] == 8


def test_detectable_change_and_units_needed_by_hand():
    from perflab.stats import detectable_change, t80, t975, units_needed

    assert (t975(2), t80(2), t975(None), t80(None), t80(40)) == (4.303, 1.061, 1.96, 0.842, 0.842)
    # over 3 rounds, se 0.02: the interval's own width decides (4.303 + 1.061) x 0.02; a wide band decides beyond it
    assert detectable_change(0.02, 2) == pytest.approx(5.364 * 0.02)
    assert detectable_change(0.02, 2, band=0.2) == pytest.approx(0.2 + 1.061 * 0.02)
    # an effect of 0.10 with a spread of 0.05 a unit: the first n where (t975 + t80)(n-1) x 0.05/sqrt(n) <= 0.10
    n = units_needed(0.05, 0.10)
    assert (t975(n - 1) + t80(n - 1)) * 0.05 / math.sqrt(n) <= 0.10 < (t975(n - 2) + t80(n - 2)) * 0.05 / math.sqrt(n - 1)
    # inside a band of 0.05: the first n where 0.01 + t975(n-1) x 0.05/sqrt(n) <= 0.05
    n = units_needed(0.05, 0.01, band=0.05)
    assert 0.01 + t975(n - 1) * 0.05 / math.sqrt(n) <= 0.05 < 0.01 + t975(n - 2) * 0.05 / math.sqrt(n - 1)
    assert units_needed(0.05, 0.05, band=0.05) is None and units_needed(0.0, 0.1) is None and units_needed(1.0, 0.01, most=50) is None


def paired_rows(a_medians, b_medians, case="x", session="s"):
    return (row(case, statistics.median(a_medians), processes=a_medians, session=session),
            row(case, statistics.median(b_medians), processes=b_medians, session=session))


def test_an_aa_pair_in_the_schedule_sets_the_floor_and_no_change_means_smaller_than_it():
    a, b = paired_rows([1.0, 1.2, 0.9, 1.1], [1.04, 1.25, 0.93, 1.15])  # B/A 1.04, 1.042, 1.033, 1.045: a tight 4%
    _, aa = paired_rows([1.0, 1.2, 0.9, 1.1], [1.07, 1.13, 0.95, 1.16])  # A against a copy of itself reads up to ~ +/-9%
    at_2pct = compare_rows([a], [b], threshold=0.02).changes[0]
    assert at_2pct.verdict == "slower" and at_2pct.floor.source == "rounds"  # without the A/A, 4% beyond 2% is a change
    aa_ratio = row_ratio(a, aa)
    floored = compare_rows([a], [b], threshold=0.02, rows_aa=[aa]).changes[0]
    assert floored.floor.source == "A/A" and floored.floor.aa.ratio == pytest.approx(aa_ratio.ratio)
    assert floored.floor.fraction == pytest.approx(max(aa_ratio.high, 1 / aa_ratio.low) - 1) and floored.floor.fraction > 0.05
    assert floored.band == floored.floor.fraction and floored.verdict == "inconclusive"  # smaller than the floor: never slower
    # the same A/A floor, a B whose CI holds 1: no change, smaller than the floor
    _, b_same = paired_rows([1.0, 1.2, 0.9, 1.1], [1.01, 1.19, 0.92, 1.09])
    same = compare_rows([a], [b_same], threshold=0.02, rows_aa=[aa]).changes[0]
    assert same.ratio.low < 1 < same.ratio.high and same.verdict == "no change"
    assert same.verdict_text == f"no change (within ±{same.floor.fraction:.1%}, the noise floor)"
    # twice the work stands far above it
    a2, b2 = paired_rows([1.0, 1.2, 0.9, 1.1], [2.0, 2.5, 1.8, 2.1])
    doubled = compare_rows([a2], [b2], threshold=0.02, rows_aa=[aa]).changes[0]
    assert doubled.verdict == "slower" and doubled.ratio.low < 2.0 < doubled.ratio.high
    d = doubled.to_dict()
    assert d["floor"]["source"] == "A/A" and d["floor"]["aa"]["basis"] == "paired" and d["detectable"] > d["floor"]["fraction"]


def test_every_verdict_states_its_floor_and_detectable_change_and_an_inconclusive_one_the_rounds_it_needs():
    from perflab.stats import detectable_change, t975, units_needed

    a, b = paired_rows([1.0, 1.2, 0.9], [1.1, 1.45, 0.97])  # B/A 1.10, 1.21, 1.08: 3 rounds cannot tell
    c = compare_rows([a], [b]).changes[0]
    r = c.ratio
    assert c.verdict == "inconclusive" and r.dof == 2 and r.se == pytest.approx(math.log(r.high / r.low) / (2 * 4.303))
    assert c.floor.source == "rounds" and c.floor.fraction == pytest.approx(math.sqrt(r.high / r.low) - 1)
    assert c.band == pytest.approx(max(0.05, c.floor.fraction))
    assert c.detectable == pytest.approx(math.expm1(detectable_change(r.se, 2, math.log1p(c.band))))
    n = units_needed(r.se * math.sqrt(3), math.log(r.ratio), math.log1p(c.band), most=100)
    assert c.needed == n + n % 2 and 3 < c.needed <= 100  # paired by process: an even number of rounds
    # one process a side: no spread between processes to go by, so no floor and no rounds to offer
    w = compare_rows([row("x", 1.0)], [row("x", 1.2, ci=(1.0, 1.44))]).changes[0]
    assert w.floor is None and w.needed is None and w.band == 0.05 and t975(None) == 1.96


def test_a_verdict_from_flagged_rows_says_so_in_its_text_and_its_json():
    a, b = paired_rows([1.0, 1.01, 0.99], [2.0, 2.02, 1.99])
    a["flags"], b["process_flags"] = ["short_timing", "high_cv"], [[], ["host_contention"], []]
    c = compare_rows([a], [b]).changes[0]
    assert c.verdict == "slower" and c.flags == ["host_contention", "short_timing", "high_cv"]
    assert c.verdict_text == "slower · flagged host_contention, short_timing, high_cv"
    d = c.to_dict()
    assert d["verdict"] == "slower" and d["flags"] == c.flags and d["verdict_text"] == c.verdict_text
    clean = compare_rows(*[[r] for r in paired_rows([1.0, 1.01, 0.99], [2.0, 2.02, 1.99])]).changes[0]
    assert clean.flags == [] and clean.verdict_text == "slower"


def test_a_within_run_change_on_a_host_that_did_not_hold_still_is_held_back():
    """One process a side: each run's own CI assumes its host held still. Two runs of one program, the second on a
    busier host (flagged high_cv), 1.5x apart with CIs that do not overlap: not "slower", but inconclusive, saying why."""
    a, b = row("x", 1.0, ci=(0.97, 1.03)), row("x", 1.5, ci=(1.45, 1.55), flags=["high_cv"])
    c = compare_rows([a], [b]).changes[0]
    assert c.ratio.basis == "within-run" and c.ratio.low > 1.05 and c.verdict == "inconclusive"
    assert c.verdict_text == ("inconclusive (slower by each run's own CI, but those assume the host held still, and high_cv says it did "
                              "not) · within-run · flagged high_cv")
    assert compare_rows([a], [dict(b, flags=["short_timing"])]).changes[0].verdict == "slower"  # not a host that moved
    # paired rounds cancel what the host does to both sides: the flags qualify the verdict, they do not hold it back
    pa, pb = paired_rows([1.0, 1.01, 0.99], [1.5, 1.52, 1.49])
    pb["flags"] = ["high_cv"]
    assert compare_rows([pa], [pb]).changes[0].verdict == "slower"


def test_a_change_points_reproducing_command_is_tracks_with_its_revisions_store_and_rounds_replaced():
    from perflab.diagnosis.change_points import ab_command

    track = ("perflab track --repo models --revs c1 c2 c3 --model model.py:Net --batch-size 1 --out=runs/t --rounds 3 "
             "--profile-changes 5 --json --pairing processes")
    assert ab_command(track, "c2", "c3", "models") == ("perflab ab --a c2 --b c3 --repo models --model model.py:Net --batch-size 1 "
                                                       "--pairing processes --rounds 6")
    assert ab_command("perflab track --repo . --range=v1..v2 --spec 'my spec.yaml' --out o", "v1", "abc", ".") == \
        "perflab ab --a v1 --b abc --repo . --spec 'my spec.yaml' --rounds 6"
    assert ab_command("perflab.api.track(...)", "c2", "c3", "/r") == \
        "perflab ab --repo /r --a c2 --b c3 (the cases as track was given them) --rounds 6"
