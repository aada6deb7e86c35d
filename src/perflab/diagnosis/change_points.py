"""A change point's cause (``perflab track``): both revisions of the step profiled, the difference of their traced steps
by kernel (or, on the CPU, operator) category with its intervals (``analysis.compare``), and the ``perflab ab``
command that times the pair again, paired.

Each side is recorded in this process (``trace.capture.capture_case``: the case built as the harness builds it, warmed,
``steps`` steps traced) inside its revision's ``references.ModelScope``, so each revision's model code is its own;
the traces are kept under the store's ``change_points/``. A side that cannot be profiled leaves the cause with its
error and the run as it was: the timings are stored already.
"""

from __future__ import annotations

import contextlib
import shlex
from dataclasses import dataclass
from pathlib import Path

from perflab.spec import Case

PROFILE_CHANGES = 5  # track's default: traced steps a side with which each change point's two revisions are profiled

AB_ROUNDS = 6  # the reproducing ab's rounds: a 95% CI over rounds (stats.FULL_UNITS), even for the processes pairing
# track's options that ab does not take, with whether each takes a value
TRACK_ONLY = {"--revs": True, "--range": True, "--out": True, "--rounds": True, "--profile-changes": True, "--json": False}


@dataclass
class ChangeCause:
    """Why a case stepped at a revision, as far as a profile of both sides shows it."""

    case_id: str
    previous: str  # the revision before the step (as named)
    revision: str  # the change point
    reproduce: str  # the perflab ab command that times the pair again, paired
    comparison: object = None  # analysis.compare.TraceComparison of the two sides' traces
    traces: tuple | None = None  # (previous's trace, the revision's)
    error: str | None = None  # why a side could not be profiled

    def line(self) -> str:
        """One sentence: the traced Δ with its CI and the categories that moved most, or why there is none; the command."""
        head = f"{self.revision} against {self.previous}, both profiled: "
        if self.comparison is None:
            return head + f"no profile ({self.error}). Reproduce: {self.reproduce}"
        c = self.comparison
        wall = c.intervals.get("wall")
        ci = f" (95% CI {wall.low / 1e6:+.3g} to {wall.high / 1e6:+.3g})" if wall is not None else ""
        steps = min(c.a.steps, c.b.steps)
        movers = sorted(c.delta_by_category.items(), key=lambda kv: -abs(kv[1]))[:3]
        parts = []
        for category, delta in movers:
            d = c.intervals.get(f"category:{category}")
            parts.append(f"{category} {delta / 1e6:+.3g} ms" + (f" ({d.low / 1e6:+.3g} to {d.high / 1e6:+.3g})" if d is not None else ""))
        return (head + f"Δ {c.delta_wall_ns / 1e6:+.3g} ms a traced step{ci} over {steps} steps a side; by {c.words.work} category: "
                + ", ".join(parts) + f". Reproduce: {self.reproduce}")

    def to_dict(self) -> dict:
        out = {"case_id": self.case_id, "previous": self.previous, "revision": self.revision, "reproduce": self.reproduce,
               "traces": list(self.traces) if self.traces else None, "error": self.error, "line": self.line()}
        if self.comparison is not None:
            d = self.comparison.to_dict()
            out.update({k: d[k] for k in ("delta_wall_us", "delta_wall_ci_us", "delta_by_category", "delta_by_category_ci_us",
                                          "delta_idle_by_cause", "delta_idle_by_cause_ci_us", "decided", "steps", "cpu_only")})
        return out


def ab_command(track_command: str, previous: str, revision: str, repo) -> str:
    """The ``perflab ab`` that times ``previous`` against ``revision`` paired, from the ``perflab track`` command line that
    found the step: its case options kept, its revisions, store and rounds replaced. From the Python API (no command
    line), the cases are named as track was given them."""
    try:
        words = shlex.split(track_command)
    except ValueError:
        words = []
    if words[:2] != ["perflab", "track"]:
        return (f"perflab ab --repo {shlex.quote(str(repo))} --a {shlex.quote(previous)} --b {shlex.quote(revision)} "
                f"(the cases as track was given them) --rounds {AB_ROUNDS}")
    kept, i = [], 2
    while i < len(words):
        word = words[i]
        name = word.split("=", 1)[0]
        if name in TRACK_ONLY:
            i += 1
            if TRACK_ONLY[name] and "=" not in word:
                while i < len(words) and not words[i].startswith("-"):  # --revs takes several
                    i += 1
            continue
        kept.append(word)
        i += 1
    return shlex.join(["perflab", "ab", "--a", previous, "--b", revision, *kept, "--rounds", str(AB_ROUNDS)])


def profile_pair(sides: list[tuple[Case, str | None, str]], out_dir: Path, steps: int):
    """Record ``steps`` steps of each side ((case, its model root or None, a name for its file)) in this process, each in
    its own ``ModelScope``, and compare the two traces (``analysis.compare.compare_traces``). Returns (the comparison,
    the two trace paths)."""
    from perflab.analysis.compare import compare_traces
    from perflab.references import ModelScope
    from perflab.trace.capture import capture_case
    from perflab.trace.load import load_trace

    paths = []
    for case, root, name in sides:
        slug = "".join(ch if ch.isalnum() else "_" for ch in name)[:40]
        path = Path(out_dir) / "change_points" / f"{case.id}_{slug}.json.gz"
        path.parent.mkdir(parents=True, exist_ok=True)
        with ModelScope(root) if root else contextlib.nullcontext():
            capture_case(case, path, steps=steps)
        paths.append(path)
    traces = [load_trace(p) for p in paths]
    return compare_traces(traces[0], traces[1], tuple(name for _, _, name in sides)), tuple(str(p) for p in paths)


CAUSES_FILE = "change_points.json"


def write_causes(out_dir: Path, causes: list[ChangeCause]) -> None:
    """Keep the causes beside the store (``OUT/change_points.json``), for ``perflab report``; none: the file removed."""
    import json

    path = Path(out_dir) / CAUSES_FILE
    if not causes:
        path.unlink(missing_ok=True)
        return
    path.write_text(json.dumps([c.to_dict() for c in causes], indent=1, allow_nan=False))


def read_causes(out_dir: Path) -> list[dict]:
    """The causes a track run kept beside its store, or none (no file, or not one this wrote)."""
    import json

    try:
        data = json.loads((Path(out_dir) / CAUSES_FILE).read_text())
    except (OSError, ValueError, RecursionError):
        return []
    return [c for c in data if isinstance(c, dict) and isinstance(c.get("line"), str)] if isinstance(data, list) else []


def explain_changes(series, versions, out_dir: Path, steps: int, command: str, repo) -> list[ChangeCause]:
    """For every change point of every case (``series``: ``analysis.regressions.revision_series``), profile the step's
    two revisions (``versions``: the plan's, by key: their cases and worktrees) and attach the cause to the point
    (``RevisionPoint.cause``). Returns the causes."""
    from perflab.errors import PerflabError

    by_key = {v.key: v for v in versions}
    causes = []
    for s in series:
        previous = None
        for point in s.points:
            if point.change and previous is not None:
                sides = []
                for p in (previous, point):
                    v = by_key[p.version]
                    case = next(c for c in v.experiment.cases if c.id == s.case_id)
                    sides.append((case, v.experiment.model_root or (str(v.root) if v.root else None), p.name))
                cause = ChangeCause(s.case_id, previous.name, point.name, ab_command(command, previous.name, point.name, repo))
                try:
                    cause.comparison, cause.traces = profile_pair(sides, out_dir, steps)
                except PerflabError as exc:
                    cause.error = str(exc)
                except Exception as exc:  # the timings are stored: a profile that fails leaves them as they are
                    cause.error = f"{type(exc).__name__}: {exc}"
                point.cause = cause
                causes.append(cause)
            if point.status == "ok":
                previous = point
    return causes
