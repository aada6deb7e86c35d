"""Versions at the report floor, their comparisons rendered; ``sweep/versions.py`` runs an experiment at each.

Comparisons of stored runs and of versions (``perflab compare`` of results, ``ab``, ``track``): console tables, and
the report's "A/B" and "By revision" sections with their plots. Rows in, text out; the numbers are
``analysis.regressions``'."""

from __future__ import annotations

import re
from pathlib import Path

from perflab.analysis.regressions import LEVEL, MOST_ROUNDS, CaseChange, RowComparison, compare_rows, revision_series
from perflab.records.row import row_version
from perflab.report.fit import text_table
from perflab.report.md import escape, md_table
from perflab.stats import row_ci_note

BASIS_WORDS = {
    "blocks": "blocks: one ratio a round, the median of B's block ÷ A's, their cases timed interleaved in one process "
              "(a process's own speed cancels); the CI is over the rounds (one round: over its blocks)",
    "paired": "paired: one ratio a round, each A process timed beside a B process; the CI is over the rounds",
    "processes": "processes: each side's process medians, unpaired (Welch); between-process variance is in the CI",
    "within-run": "within-run: one process a side; the CI is each run's own and does NOT cover between-process variance "
                  "(two runs minutes apart can differ by more): rerun with --processes 3 or use perflab ab",
}


def ms_cell(ms, ci, note: str = "") -> str:
    """A median with its CI, and what that CI states where it is less than 95% (``stats.row_ci_note``: ``≥75%``)."""
    if ms is None:
        return "–"
    return f"{ms:.4g}" + (f" ({ci[0]:.4g}–{ci[1]:.4g})" if ci else "") + (f" {note}" if ci and note else "")


def ms_header(what: str, notes) -> str:
    """``A ms (95% CI)`` where every CI under it is 95%; else ``A ms (CI)``, each cell saying its own (``ms_cell``), as
    bench's and results' tables do."""
    return f"{what} ({'CI' if any(notes) else '95% CI'})"


def ratio_cell(change: CaseChange) -> str:
    r = change.ratio
    return "–" if r is None else f"{r.ratio:.3f}× ({r.low:.3f}–{r.high:.3f})"


def verdict_cell(change: CaseChange) -> str:
    """The verdict as its case's row shows it (``CaseChange.verdict_text``), and host-dependent."""
    if change.verdict == "not compared":
        failed = change.status_a != "ok" or change.status_b != "ok"
        return f"not compared (A {change.status_a}, B {change.status_b})" if failed else "not compared (no CI)"
    return change.verdict_text + (" · host-dependent" if change.host_dependent else "")


def floor_line(change: CaseChange) -> str | None:
    """What a case's comparison could see: the noise floor on this host and how it was measured, the smallest change
    this run could have detected, and, inconclusive, the rounds that would settle it."""
    if change.ratio is None or change.band is None:
        return None
    if change.floor is None:
        head = ("noise floor on this host unknown: one process a side (rerun with --processes 3, or use perflab ab, "
                "which measures it)")
    else:
        head = f"noise floor on this host ±{change.floor.fraction:.1%} ({change.floor.words})"
    text = f"{change.label}: {head}; smallest change this run could detect: ±{change.detectable:.1%}"
    if change.verdict == "inconclusive" and change.ratio.units >= 2:
        unit = "rounds" if change.ratio.basis in ("blocks", "paired") else "processes a side"
        text += (f"; about {change.needed} {unit} would settle it" if change.needed else
                 f"; more than {MOST_ROUNDS} {unit} would not settle it")
    return text + "."


# Each side's throughput beside its time, where a row states it: (header, CaseChange field)
RATE_COLUMNS = (("A samples/s", "a_samples_per_s"), ("B samples/s", "b_samples_per_s"), ("A tokens/s", "a_tokens_per_s"),
                ("B tokens/s", "b_tokens_per_s"))


def _rates(comparison: RowComparison) -> list[tuple[str, str]]:
    """The throughput columns a comparison shows: samples/s and tokens/s, each where some case's row states it."""
    kinds = [kind for kind in ("samples", "tokens") if any(getattr(c, f"a_{kind}_per_s") or getattr(c, f"b_{kind}_per_s") for c in comparison.changes)]
    return [(header, name) for header, name in RATE_COLUMNS if any(kind in name for kind in kinds)]


def rate_cell(x) -> str:
    return "–" if not x else f"{x:,.4g}" if x < 1e4 else f"{x:,.0f}"


def comparison_rows(comparison: RowComparison) -> list[list[str]]:
    rates = _rates(comparison)
    return [[c.label, ms_cell(c.a_ms, c.a_ci_ms, c.a_ci_note), ms_cell(c.b_ms, c.b_ci_ms, c.b_ci_note),
             *(rate_cell(getattr(c, name)) for _, name in rates), ratio_cell(c),
             f"{c.ratio.basis} ({c.ratio.units})" if c.ratio else "–", verdict_cell(c)] for c in comparison.changes]


def comparison_headers(comparison: RowComparison) -> list[str]:
    """The table's headers, each side's CI labelled by the coverage its intervals may state (``ms_header``), and each
    side's throughput beside its time where the rows state it."""
    changes = comparison.changes
    return ["case", ms_header("A ms", [c.a_ci_note for c in changes]), ms_header("B ms", [c.b_ci_note for c in changes]),
            *(header for header, _ in _rates(comparison)), f"B/A time ({LEVEL:.0%} CI)", "CI over (n)", "verdict"]



def comparison_notes(comparison: RowComparison, names: tuple[str, str]) -> list[str]:
    """The sentences under a comparison's table: what the sides are, the threshold, how each CI was taken, the host-
    dependent cases and the cases of one side only."""
    t = comparison.threshold
    lines = [f"A: {names[0]}; B: {names[1]}. B/A above 1: B is slower. Verdict at ±{t:.0%} or the noise floor where that is "
             f"wider (the band): slower or faster where the {LEVEL:.0%} CI excludes 1 and the ratio is beyond the band; no change "
             f"where the whole CI lies within it (at ±{t:.0%}: {1 / (1 + t):.3f}–{1 + t:.3f}); inconclusive otherwise."]
    for basis in dict.fromkeys(c.ratio.basis for c in comparison.changes if c.ratio):
        lines.append("CI over " + BASIS_WORDS[basis] + ".")
    lines += [line for line in map(floor_line, comparison.changes) if line]
    if any(c.a_ci_note or c.b_ci_note for c in comparison.changes):
        lines.append(SIDE_CI_NOTE)
    lines += [f"{c.label}: {c.host_dependent}." for c in comparison.changes if c.host_dependent]
    for side, only in (("A", comparison.only_a), ("B", comparison.only_b)):
        if only:
            lines.append(f"Only {side} holds {len(only)} case(s), not compared: {', '.join(only[:5])}{' ...' if len(only) > 5 else ''}.")
    return lines


SIDE_CI_NOTE = ("A's and B's own CIs: 95% from 5 or more units (processes, or stretches of the run); from fewer, the coverage "
                "their ranks guarantee, said beside each (3 units: ≥75%, 4: ≥87.5%), as perflab results says it.")


def drops(headers: list[str], order: list[int]) -> list[str]:
    """Narrow, a table of versions gives up how each CI was taken first (the notes under it say it too), then the sides'
    own times; the ratio with its CI and the verdict stay."""
    return [headers[i] for i in order]
LEFT = ("case", "revision", "verdict", "CI over (n)")


def comparison_drops(headers: list[str]) -> list[str]:
    """A comparison's table, narrow: how each CI was taken goes first, then the throughput (the notes and the sides'
    own tables say them), then the sides' own times; the ratio with its CI and the verdict stay."""
    rates = [h for h in headers if h.endswith("/s")]
    return [headers[headers.index("CI over (n)")], *rates, headers[1], headers[2]]


def render_comparison(console, comparison: RowComparison, names: tuple[str, str]) -> None:
    if not comparison.changes:  # an interrupted ab: no case finished its rounds
        return
    headers = comparison_headers(comparison)
    console.print(text_table(headers, comparison_rows(comparison), "Stored runs compared, case by case", LEFT, comparison_drops(headers)))
    for line in comparison_notes(comparison, names):
        console.say(line, markup=False)


def version_what(info: dict) -> str:
    """What a version is: ``revision c2 (a3d3cc65ea: its subject)``, ``interpreter /venv/bin/python``."""
    if info.get("kind") == "revision":
        return f"revision {info.get('revision')} ({(info.get('commit') or '')[:10]}: {info.get('subject') or ''})"
    if info.get("kind") == "arguments":
        return f"arguments {info.get('args')!r} added: {' '.join(info.get('program') or [])}"
    return f"interpreter {info.get('python')}"


def version_cell(info: dict | None) -> str:
    """A row's version in a table cell: ``c2 (a3d3cc65ea)`` (track), ``A: c2 (a3d3cc65ea)`` or ``B: /venv/bin/python``
    (ab); "–" for a row of no version."""
    if not isinstance(info, dict):
        return "–"
    if info.get("kind") == "revision":
        what = f"{info.get('revision')} ({(info.get('commit') or '')[:10]})"
        return what if info.get("name") in (None, info.get("revision")) else f"{info.get('name')}: {what}"
    if info.get("kind") == "arguments":
        return f"{info.get('name')}: args {info.get('args')!r}"
    return f"{info.get('name')}: {info.get('python')}" if info.get("name") else str(info.get("python"))


def version_header(rows) -> str | None:
    """The header of a version column for these rows: revision, interpreter or version (both kinds); None where no row
    has a version (a sweep's or bench's rows)."""
    kinds = {version.get("kind") for version in map(row_version, rows) if version}
    if not kinds:
        return None
    return {frozenset({"revision"}): "revision", frozenset({"python"}): "interpreter", frozenset({"arguments"}): "arguments"}.get(
        frozenset(kinds), "version")


def version_line(info: dict) -> str:
    """One version in words: what it is, and the environment it ran in."""
    what = version_what(info)
    env = " · ".join(f"{name} {info.get(key) or '–'}" for name, key in (("torch", "torch"), ("CUDA", "cuda"), ("driver", "driver"),
                                                                        ("perflab", "perflab")))
    return f"{info.get('name')}: {what} · {env}"


def failures_line(failed) -> str | None:
    """One line for the cases that failed at a version (``VersionsSummary.failed()``: (version, row) pairs), or None."""
    if not failed:
        return None
    shown = "; ".join(f"{v.name}: {row.get('label') or row.get('case_id')}: {row.get('status')}: {row.get('message')}" for v, row in failed[:3])
    more = f"; and {len(failed) - 3} more" if len(failed) > 3 else ""
    return (f"{len(failed)} case(s) failed at a version, stored as that version's {'row' if len(failed) == 1 else 'rows'} and not "
            f"compared ({shown}{more}); exit status 1")


def first_counts(rows: list[dict]) -> tuple[int, int]:
    """(pairings in which the rows' version went first, pairings), over the rounds' places its rows keep
    (``process_positions``: per round, its place in each pairing of that round, 0 first)."""
    places = [p for row in rows for per_round in row.get("process_positions") or [] for p in per_round or []]
    return sum(1 for p in places if p == 0), len(places)


def before_counts(rows_a: list[dict], rows_b: list[dict]) -> tuple[int, int]:
    """(pairings in which A's version went before B's, pairings), over the places both keep per round
    (``process_positions``), case by case; an A/A copy timed beside them takes places of its own, so "first" among
    three is not the balance that matters: who of A and B went before the other is."""
    by_case = {row.get("case_id"): row for row in rows_b}
    before = total = 0
    for a in rows_a:
        b = by_case.get(a.get("case_id")) or {}
        for pa, pb in zip(a.get("process_positions") or [], b.get("process_positions") or []):
            for x, y in zip(pa or [], pb or []):
                before += x < y
                total += 1
    return before, total


def everyone(summary) -> list:
    """A versions run's versions, and its A/A copy after them where it timed one."""
    return summary.versions + ([summary.copy] if summary.copy else [])


def ab_document(summary, comparison) -> dict:
    """``perflab ab --json``'s object: the comparison, the versions (and the A/A copy), the store and how often each
    version went first, and A before B."""
    order = {v.name: dict(zip(("first", "pairings"), first_counts(summary.rows_of(v)))) for v in everyone(summary)}
    if len(summary.versions) >= 2:
        order["A before B"] = dict(zip(("count", "pairings"), before_counts(*(summary.rows_of(v) for v in summary.versions[:2]))))
    return dict(comparison.to_dict(), versions=[v.info() for v in summary.versions], store=str(summary.out_dir),
                rounds=summary.rounds, pairing=summary.pairing, order=order, aa=summary.copy.info() if summary.copy else None)


def track_document(summary, series, threshold: float) -> dict:
    """``perflab track --json``'s object: the versions (and the A/A copy), each case's series, the store and the
    threshold judged by."""
    return {"versions": [v.info() for v in summary.versions], "cases": [series_dict(s) for s in series],
            "store": str(summary.out_dir), "reused": summary.reused, "threshold": threshold, "pairing": summary.pairing,
            "aa": summary.copy.info() if summary.copy else None}


def order_line(named_rows: list[tuple[str, list[dict]]]) -> str | None:
    """How often each version went first in the rounds' pairings, and the first before the second (the order is
    balanced: an A/A cannot read faster or slower by order), or None where the rows keep no places."""
    counts = [(name, *first_counts(rows)) for name, rows in named_rows]
    if not any(n for _, _, n in counts):
        return None
    (a, rows_a), (b, rows_b) = named_rows[:2]
    before, pairings = before_counts(rows_a, rows_b)
    return (f"Order: {a} before {b} in {before} of {pairings} pairing(s); " +
            ", ".join(f"{name} first in {first} of its {n}" for name, first, n in counts) +
            " (the versions take turns, each order then its reverse, so a drift linear in time cancels).")


def render_versions(console, versions) -> None:
    for v in versions:
        console.say(version_line(v.info()), markup=False)


def step_cells(point) -> list[str]:
    step = point.step
    if step is None:
        return ["–", "–", "first" if point.status == "ok" else point.status]
    return [ratio_cell(step), f"{step.ratio.basis} ({step.ratio.units})" if step.ratio else "–", verdict_cell(step)]


def series_headers(series, what: str = "ms") -> list[str]:
    return ["revision", ms_header(what, [p.ci_note for p in series.points]), f"vs previous ({LEVEL:.0%} CI)", "CI over (n)", "verdict"]


def series_rows(series) -> list[list[str]]:
    return [[p.name, ms_cell(p.median_ms, p.ci_ms, p.ci_note) if p.status == "ok" else p.status] + step_cells(p) for p in series.points]


def change_line(series) -> str:
    changes = series.change_points
    if not changes:
        return "no change point"
    return "change points: " + ", ".join(f"{p.name} ({p.step.verdict}, {p.step.ratio.ratio:.3f}×)" for p in changes)


def series_floor_line(series) -> str | None:
    """What a case's steps over the revisions could see: the noise floor (the A/A pair's, the same for every step, or
    each step's between-round spread) and the smallest change a step could have detected."""
    steps = [p.step for p in series.points if p.step is not None and p.step.band is not None]
    if not steps:
        return None
    floors = [s.floor for s in steps if s.floor is not None]
    pct = lambda values: f"±{min(values):.1%}" if max(values) - min(values) < 5e-4 else f"±{min(values):.1%} to ±{max(values):.1%}"  # noqa: E731
    if not floors:
        head = "noise floor on this host unknown (one process a side)"
    elif floors[0].source == "A/A":
        head = f"noise floor on this host ±{floors[0].fraction:.1%} ({floors[0].words})"
    else:
        head = f"noise floor on this host {pct([f.fraction for f in floors])} (each step's between-round spread; --aa measures an A/A pair)"
    return f"{series.label}: {head}; smallest change a step could detect: {pct([s.detectable for s in steps])}."


def render_series(console, all_series, threshold: float, what: str = "ms") -> None:
    """Each case's series over the revisions; ``what``: its times' header (a program's: ``mean step ms``)."""
    for series in all_series:
        headers = series_headers(series, what)
        console.print(text_table(headers, series_rows(series), f"{series.label}: {change_line(series)}", LEFT, drops(headers, [3, 1])))
        floor = series_floor_line(series)
        if floor:
            console.say(floor, markup=False)
        for line in cause_lines(series):
            console.say(line, markup=False)
    console.say(f"Each revision against the one before it that measured the case: B/A time with its {LEVEL:.0%} CI; a change "
                f"point is a step slower or faster beyond ±{threshold:.0%} (or the noise floor, where wider) whose CI excludes 1 "
                f"(docs/regressions.md).", markup=False)


def series_dict(series) -> dict:
    return {"case_id": series.case_id, "label": series.label, "change_points": [p.name for p in series.change_points],
            "points": [{"revision": p.name, "key": p.version, "status": p.status, "median_ms": p.median_ms, "ci_ms": p.ci_ms,
                        "ci_coverage": p.ci_coverage, "ci95_ms": p.ci_ms, "step": p.step.to_dict() if p.step else None,
                        "cause": p.cause.to_dict() if p.cause is not None else None} for p in series.points]}


def cause_lines(series) -> list[str]:
    """Each change point's cause, one line each: what a profile of both sides shows, and the command that reproduces it."""
    return [f"{series.label}: {p.cause.line()}" for p in series.points if p.cause is not None]


# ---------------------------------------------------------------------------------------------------
# The report's sections


def versions_run(stored) -> dict | None:
    """The store's latest ab or track run (its sweep record's experiment, which names the versions), or None."""
    for record in reversed(stored.sweeps):
        experiment = record.get("experiment") or {}
        if experiment.get("versions") and experiment.get("kind") in ("ab", "track"):
            return experiment
    return None


def latest_version_rows(stored, rows: list[dict]) -> list[dict]:
    """The rows the report's other tables show for a store of versions: the last version's (one row per case); else all."""
    run = versions_run(stored)
    if run is None:
        return rows
    last = run["versions"][-1]["key"]
    return [r for r in rows if row_version(r).get("key") == last or r.get("status") == "missing"]


def every_version_rows(stored, rows: list[dict]) -> list[dict]:
    """A store of versions' rows of every version, in the run's order of versions (each version's in stored order);
    another store's rows as they are."""
    run = versions_run(stored)
    if run is None:
        return rows
    order = {v["key"]: i for i, v in enumerate(run["versions"])}
    last = len(order) - 1  # a case not run yet belongs with the version the other tables show
    place = lambda r: order.get(row_version(r).get("key"), last)  # noqa: E731
    return sorted(rows, key=place)


def shown_version_line(stored) -> list[str]:
    """For a store of versions: one line saying whose rows the report's other tables show (the last version's)."""
    run = versions_run(stored)
    if run is None:
        return []
    last = run["versions"][-1]
    return [f"The tables below show the rows of {escape(version_cell(last))}, the last version; \"All cases\" lists every "
            f"version's rows, each with its {version_header([{'version': last}])}."]


def pairing_words(run: dict) -> str:
    """How a versions run paired its versions each round (its record's ``pairing``; runs before it had processes)."""
    if run.get("pairing") == "blocks":
        return "each round one process timing every version's cases interleaved, block by block"
    return f"versions' processes in {run.get('order')} order, each process of one version beside one of the other"


def versions_sections(stored, plot_dir: Path) -> list[str]:
    """"## A/B" or "## By revision" for a store that ``perflab ab`` or ``track`` wrote; nothing for another store."""
    run = versions_run(stored)
    if run is None:
        return []
    threshold = float(run.get("threshold") or 0.05)
    versions = run["versions"]
    rows = getattr(stored, "all_rows", stored.rows)
    lines = [f"- {escape(version_line(v))}" for v in versions]
    copy = run.get("aa") if isinstance(run.get("aa"), dict) else None
    rows_aa = [r for r in rows if copy and row_version(r).get("key") == copy.get("key")] or None
    if copy:
        lines.append(f"- {escape(copy.get('name') or '')}: a second copy of {escape(str(copy.get('copy_of')))}, timed beside the "
                     "others in every round: the A/A pair the noise floor is measured from")
    if run["kind"] == "ab":
        by_key = {v["key"]: [r for r in rows if row_version(r).get("key") == v["key"]] for v in versions}
        a, b = (by_key[v["key"]] for v in versions[:2])
        if not a or not b:
            return ["## A/B", "\n".join(lines), "No rows of both versions are stored (the run was interrupted)."]
        comparison = compare_rows(a, b, threshold, rows_aa=rows_aa)
        order = order_line([(v["name"], by_key[v["key"]]) for v in versions[:2]] + ([(copy["name"], rows_aa)] if rows_aa else []))
        return ["## A/B", f"{run.get('rounds')} rounds, {pairing_words(run)}.", "\n".join(lines),
                md_table(comparison_headers(comparison), comparison_rows(comparison)),
                " ".join(comparison_notes(comparison, tuple(version_what(v) for v in versions[:2])) + ([order] if order else []))
                ] + program_sections(run, rows)
    order = [(v["key"], v["name"]) for v in versions]
    parts = ["## By revision",
             f"Each case at {len(versions)} revisions, oldest first ({run.get('rounds')} round(s), {pairing_words(run)}). Each "
             f"revision is compared with the one before it that measured the case: its time ÷ that one's, with a {LEVEL:.0%} CI "
             f"(paired per round where one run timed both, else over processes, else each run's own), and a **change point** is "
             f"a step slower or faster "
             f"by more than {threshold:.0%} whose CI excludes 1 (docs/regressions.md).", "\n".join(lines)]
    from perflab.diagnosis.change_points import read_causes
    from perflab.report import plots

    causes = read_causes(Path(plot_dir))  # beside the store: the report is written in its directory
    for i, series in enumerate(revision_series(rows, order, threshold, rows_aa=rows_aa)):
        names = [name for _, name in order]
        index = {key: j for j, (key, _) in enumerate(order)}
        points = [(index[p.version], p.median_ms, p.ci_ms[0] if p.ci_ms else None, p.ci_ms[1] if p.ci_ms else None)
                  for p in series.points if p.median_ms is not None]
        path = plots.over_revisions(names, points, [index[p.version] for p in series.change_points],
                                    Path(plot_dir) / f"revisions_{i}.png", series.label)
        parts += [f"### {escape(series.label)}: {change_line(series)}", f"![{escape(series.label)} over revisions]({path.name})",
                  md_table(series_headers(series), series_rows(series))] + [escape(line) for line in [series_floor_line(series)] if line]
        parts += [f"Change point {escape(c['line'])}" for c in causes if c.get("case_id") == series.case_id]
    parts += program_sections(run, rows)
    return parts


# ---------------------------------------------------------------------------------------------------
# A program's ab and track (sweep.programs): each side's rounds, throughput and verdict, then the comparison


UNIT_NAMES = {"step": "mean step", "sample": "time a sample", "token": "time a token"}


def program_compared_line(summary) -> str:
    """What a program's A/B compares: the mean step (the program's wall time a step), or the time a sample or token where
    the sides' work a step differs, never the median."""
    row = next((r for r in summary.rows.values()), None) or {}
    statistic = row.get("statistic") or "mean step"
    if summary.unit == "step":
        uncounted = [row_version(r).get("name") or "?" for r in summary.rows.values() if not r.get("samples_per_step")]
        return (f"Compared: each side's {statistic} (the program's wall time over its timed steps ÷ their number, what its "
                "throughput is made of), not the median: a stall every few steps costs the program its time, and the median "
                "leaves it out. Each round is a fresh perflab run of each side, in a balanced order; B/A is paired round by round."
                + (f" perflab counted no batch a step on {', '.join(uncounted)} (no DataLoader, no --input): if the sides differ in "
                   "work a step (a batch size, a sequence length), this is not a throughput ratio; give --input FUNC (the function "
                   "that returns each batch) or --batch-size, and the time a sample or token is compared." if uncounted else ""))
    per = "samples" if summary.unit == "sample" else "tokens"
    return (f"Compared: the time a {summary.unit} (each side's mean step ÷ its {per} a step), because the sides' {per} a step "
            f"differ: B/A of it is A's {per}/s ÷ B's. Each round is a fresh perflab run of each side, in a balanced order; B/A "
            "is paired round by round.")


def program_side_rows(summary) -> list[list[str]]:
    """Per side: what it is, its rounds' mean steps, its throughput and its verdict (from its traced round)."""
    out = []
    everyone_ = summary.versions + ([summary.copy] if summary.copy else [])
    for v in everyone_:
        row = (summary.rows_of(v) or [{}])[0]
        means = row.get("step_mean_ms") or []
        verdict = (row.get("program_verdict") or {}).get("verdict") or "–"
        out.append([v.name, _program_side_what(v), ", ".join(f"{x:.4g}" for x in means) or "–", _rate(row.get("samples_per_s")),
                    _rate(row.get("tokens_per_s")), verdict])
    return out


PROGRAM_SIDE_HEADERS = ["side", "what", "mean step ms, each round", "samples/s", "tokens/s", "verdict (traced, last round)"]


def _rate(x) -> str:
    return "–" if not x else f"{x:,.4g}" if x < 1e4 else f"{x:,.0f}"


def _program_side_what(v) -> str:
    if v.kind == "arguments":
        return f"args {v.extra_args!r}" if v.extra_args else "no extra args"
    if v.copy_of is not None:
        return f"a second copy of {v.copy_of} (the A/A pair)"
    return f"{v.revision} ({(v.commit or '')[:10]})" if v.kind == "revision" else f"interpreter {v.python}"


def program_verdict_lines(summary, names=None) -> list[str]:
    """Each side's verdict in its own words, then the change of verdict from the first to the second."""
    from perflab.sweep.programs import verdict_change

    lines = []
    shown = names or [v for v in summary.versions]
    verdicts = []
    for v in shown:
        row = (summary.rows_of(v) or [{}])[0]
        given = row.get("program_verdict") or {}
        verdicts.append(given)
        if given.get("message"):
            # perflab run's words point at the tables it prints under them; here its run directory holds them
            message = re.sub(r"\s*\([^()]*below\)$", "", given["message"])
            lines.append(f"{v.name}'s verdict (its last round, traced after its timed steps): {message}")
    if len(verdicts) >= 2:
        lines.append(f"Verdict, {shown[0].name} → {shown[1].name}: {verdict_change(verdicts[0], verdicts[1])}.")
    return lines


def render_program_ab(console, summary, comparison) -> None:
    """A program's ab: the sides (each round's mean step, throughput, verdict), the comparison with its notes, what was
    compared and the change of verdict."""
    render_versions(console, summary.versions)
    console.print(text_table(PROGRAM_SIDE_HEADERS, program_side_rows(summary), f"{summary.case.name}: each side, {summary.rounds} rounds",
                             ["side", "what"], ["what", "tokens/s"]))
    if comparison.changes:
        word = UNIT_NAMES[summary.unit]
        rename = {"case": "program", f"B/A time ({LEVEL:.0%} CI)": f"B/A {word} ({LEVEL:.0%} CI)"}
        headers = [rename.get(h, h.replace("A ms", f"A {word} ms").replace("B ms", f"B {word} ms")) for h in comparison_headers(comparison)]
        console.print(text_table(headers, comparison_rows(comparison), f"B/A of the {word}", ["program", "verdict", "CI over (n)"],
                                 comparison_drops(headers)))
        for line in comparison_notes(comparison, tuple(v.label for v in summary.versions)):
            console.say(line, markup=False)
    console.say(program_compared_line(summary), markup=False)
    for line in program_verdict_lines(summary):
        console.say(line, markup=False)
    order = order_line([(v.name, summary.rows_of(v)) for v in everyone(summary)])
    if order:
        console.say(order, markup=False)
    console.say(f"store: {summary.out_dir}; each round's run: {summary.out_dir / 'runs'}; report: perflab report {summary.out_dir}",
                markup=False)


def _program_sides(summary) -> list[dict]:
    out = []
    for v in everyone(summary):
        row = (summary.rows_of(v) or [{}])[0]
        out.append(dict(name=v.name, version=v.info(), step_mean_ms=row.get("step_mean_ms"), step_median_ms=row.get("step_median_ms"),
                        samples_per_step=row.get("samples_per_step"), tokens_per_step=row.get("tokens_per_step"),
                        samples_per_s=row.get("samples_per_s"), tokens_per_s=row.get("tokens_per_s"), verdict=row.get("program_verdict"),
                        runs=[r.get("out_dir") for r in row.get("program_rounds") or []]))
    return out


def program_ab_document(summary, comparison) -> dict:
    """``perflab ab --json`` of a program: the comparison, what it compared, each side (throughput, verdict, its runs),
    the change of verdict, the store and the order."""
    from perflab.sweep.programs import verdict_change

    sides = _program_sides(summary)
    order = {v.name: dict(zip(("first", "pairings"), first_counts(summary.rows_of(v)))) for v in everyone(summary)}
    order["A before B"] = dict(zip(("count", "pairings"), before_counts(*(summary.rows_of(v) for v in summary.versions[:2]))))
    return dict(comparison.to_dict(), program=summary.case.name, compared=summary.unit, compared_words=program_compared_line(summary),
                sides=sides, verdict_change=verdict_change(sides[0]["verdict"], sides[1]["verdict"]),
                versions=[v.info() for v in summary.versions], store=str(summary.out_dir), rounds=summary.rounds, pairing="processes",
                order=order, aa=summary.copy.info() if summary.copy else None)


def render_program_track(console, summary, series, threshold: float) -> None:
    """A program's track: the revisions (each round's mean step, throughput, verdict), the series with its change
    points, each change point's change of verdict."""
    from perflab.sweep.programs import verdict_change

    console.print(text_table(PROGRAM_SIDE_HEADERS, program_side_rows(summary), f"{summary.case.name}: each revision, {summary.rounds} rounds",
                             ["side", "what"], ["what", "tokens/s"]))
    render_series(console, series, threshold, f"{UNIT_NAMES[summary.unit]} ms")
    verdicts = {v.key: (summary.rows_of(v) or [{}])[0].get("program_verdict") for v in summary.versions}
    for s in series:
        keys = [p.version for p in s.points]
        for p in s.change_points:
            before = keys[keys.index(p.version) - 1]
            console.say(f"{p.name}: {p.step.verdict} than the revision before it; its verdict {verdict_change(verdicts.get(before), verdicts.get(p.version))}.",
                        markup=False)
    console.say(program_compared_line(summary), markup=False)
    console.say(f"store: {summary.out_dir}; each round's run: {summary.out_dir / 'runs'}; report: perflab report {summary.out_dir}",
                markup=False)


def program_track_document(summary, series, threshold: float) -> dict:
    """``perflab track --json`` of a program: each revision (throughput, verdict), the series, what was compared."""
    return {"program": summary.case.name, "compared": summary.unit, "compared_words": program_compared_line(summary),
            "sides": _program_sides(summary), "versions": [v.info() for v in summary.versions], "cases": [series_dict(s) for s in series],
            "store": str(summary.out_dir), "threshold": threshold, "rounds": summary.rounds, "pairing": "processes",
            "aa": summary.copy.info() if summary.copy else None}


# ---------------------------------------------------------------------------------------------------
# A program's store (sweep.programs): its report's and perflab results' own pieces


def is_program_store(stored) -> bool:
    """Whether a store holds a program's ab or track (its run's record names the program)."""
    run = versions_run(stored)
    return bool(run and run.get("program"))


def program_rows_headers() -> list[str]:
    return ["version", "compared ms (CI)", "mean step ms, each round", "samples/s", "tokens/s", "verdict (traced, last round)", "flags"]


def program_rows(rows: list[dict]) -> list[list[str]]:
    """A program's sides' rows, one line each: its version, its compared time with the CI over rounds, each round's mean
    step, its throughput, its verdict and its rounds' flags."""
    out = []
    for row in rows:
        flags = sorted({f for per in row.get("process_flags") or [] for f in per or []})
        out.append([version_cell(row.get("version")), ms_cell(row.get("median_ms"), row.get("ci95_ms"), row_ci_note(row)),
                    ", ".join(f"{x:.4g}" for x in row.get("step_mean_ms") or []) or "–", rate_cell(row.get("samples_per_s")),
                    rate_cell(row.get("tokens_per_s")), ((row.get("program_verdict") or {}).get("verdict")) or "–", ", ".join(flags) or "–"])
    return out


def program_rows_note(rows: list[dict]) -> str:
    """What a program's rows hold: each side's rounds, each a perflab run; the value compared."""
    statistic = next((r.get("statistic") for r in rows if r.get("statistic")), "mean step")
    return (f"Each row is one side of a program's A/B or track: its rounds, each a fresh perflab run of the program. "
            f"\"compared ms\" is the median over the rounds of each round's {statistic} (the program's wall time a step), with "
            f"its CI over the rounds; each round's own run is in runs/ beside the store.")


def program_sections(run: dict, rows: list[dict]) -> list[str]:
    """A program's A/B or track, in the report: what was compared, each side (its rounds, throughput and verdict) and
    the change of verdict from side to side; nothing for a store of model cases."""
    if not run.get("program"):
        return []
    from perflab.sweep.programs import verdict_change

    keys = [v["key"] for v in run["versions"]] + ([run["aa"]["key"]] if isinstance(run.get("aa"), dict) else [])
    mine = sorted([r for r in rows if row_version(r).get("key") in keys], key=lambda r: keys.index(row_version(r).get("key")))
    if not mine:
        return []
    statistic = next((r.get("statistic") for r in mine if r.get("statistic")), "mean step")
    parts = [program_rows_note(mine).replace("Each row is", "Each row below is"),
             f"Compared: each side's {escape(statistic)}, the program's wall time over its timed steps ÷ their number, not the "
             "median (a stall every few steps costs the program its time); each round a fresh perflab run of each side.",
             md_table(program_rows_headers(), program_rows(mine))]
    verdicts = [(row_version(r).get("name"), r.get("program_verdict") or {}) for r in mine if not row_version(r).get("copy_of")]
    changes = [f"{a} → {b}: {verdict_change(va, vb)}" for (a, va), (b, vb) in zip(verdicts, verdicts[1:])]
    if changes:
        parts.append("Verdicts (each side's last round, traced after its timed steps): " + "; ".join(escape(c) for c in changes) + ".")
    return parts


def program_results(console, rows: list[dict], title: str) -> None:
    """``perflab results`` of a program's store: a line a side, and what its figures are."""
    console.print(text_table(program_rows_headers(), program_rows(rows), title, ["version", "verdict (traced, last round)", "flags"],
                             ["flags", "tokens/s", "mean step ms, each round"]))
    console.say(program_rows_note(rows), markup=False)

