"""Comparisons of stored runs and of versions (``perflab compare`` of results, ``ab``, ``track``): console tables, and
the report's "A/B" and "By revision" sections with their plots. Rows in, text out; the numbers are
``analysis.regressions``'."""

from __future__ import annotations

from pathlib import Path

from perflab.analysis.regressions import LEVEL, MOST_ROUNDS, CaseChange, Comparison, compare_rows, revision_series
from perflab.records.row import row_version
from perflab.report.fit import text_table
from perflab.report.md import escape, md_table

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


def comparison_rows(comparison: Comparison) -> list[list[str]]:
    return [[c.label, ms_cell(c.a_ms, c.a_ci_ms, c.a_ci_note), ms_cell(c.b_ms, c.b_ci_ms, c.b_ci_note), ratio_cell(c),
             f"{c.ratio.basis} ({c.ratio.units})" if c.ratio else "–", verdict_cell(c)] for c in comparison.changes]


def comparison_headers(comparison: Comparison) -> list[str]:
    """The table's headers, each side's CI labelled by the coverage its intervals may state (``ms_header``)."""
    changes = comparison.changes
    return ["case", ms_header("A ms", [c.a_ci_note for c in changes]), ms_header("B ms", [c.b_ci_note for c in changes]),
            f"B/A time ({LEVEL:.0%} CI)", "CI over (n)", "verdict"]



def comparison_notes(comparison: Comparison, names: tuple[str, str]) -> list[str]:
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


def render_comparison(console, comparison: Comparison, names: tuple[str, str]) -> None:
    if not comparison.changes:  # an interrupted ab: no case finished its rounds
        return
    headers = comparison_headers(comparison)
    console.print(text_table(headers, comparison_rows(comparison), "Stored runs compared, case by case", LEFT, drops(headers, [4, 1, 2])))
    for line in comparison_notes(comparison, names):
        console.say(line, markup=False)


def version_what(info: dict) -> str:
    """What a version is: ``revision c2 (a3d3cc65ea: its subject)``, ``interpreter /venv/bin/python``."""
    if info.get("kind") == "revision":
        return f"revision {info.get('revision')} ({(info.get('commit') or '')[:10]}: {info.get('subject') or ''})"
    return f"interpreter {info.get('python')}"


def version_cell(info: dict | None) -> str:
    """A row's version in a table cell: ``c2 (a3d3cc65ea)`` (track), ``A: c2 (a3d3cc65ea)`` or ``B: /venv/bin/python``
    (ab); "–" for a row of no version."""
    if not isinstance(info, dict):
        return "–"
    if info.get("kind") == "revision":
        what = f"{info.get('revision')} ({(info.get('commit') or '')[:10]})"
        return what if info.get("name") in (None, info.get("revision")) else f"{info.get('name')}: {what}"
    return f"{info.get('name')}: {info.get('python')}" if info.get("name") else str(info.get("python"))


def version_header(rows) -> str | None:
    """The header of a version column for these rows: revision, interpreter or version (both kinds); None where no row
    has a version (a sweep's or bench's rows)."""
    kinds = {version.get("kind") for version in map(row_version, rows) if version}
    if not kinds:
        return None
    return {frozenset({"revision"}): "revision", frozenset({"python"}): "interpreter"}.get(frozenset(kinds), "version")


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


def series_headers(series) -> list[str]:
    return ["revision", ms_header("ms", [p.ci_note for p in series.points]), f"vs previous ({LEVEL:.0%} CI)", "CI over (n)", "verdict"]


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


def render_series(console, all_series, threshold: float) -> None:
    for series in all_series:
        headers = series_headers(series)
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
                " ".join(comparison_notes(comparison, tuple(version_what(v) for v in versions[:2])) + ([order] if order else []))]
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
    return parts
