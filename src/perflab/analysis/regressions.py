"""Did B get faster or slower than A? Ratios of stored result rows, their CIs, verdicts, and change points.

Pure functions over result rows (plain dicts, as ``bench --out`` writes them and the store keeps them); no torch.
The method (docs/regressions.md):

- **The ratio** is B's time ÷ A's time for one case (matched by case id): above 1, B is slower.
- **Its 95% CI** comes from the best evidence both sides hold, and says which:

  - ``blocks``: both rows were measured by one ``perflab ab`` or ``perflab track`` run that timed every version in
    one process a round, interleaved block by block (the rows' ``process_sessions`` agree). One ratio per round, the
    median of B's block ÷ A's block beside it; a Student-t interval on their logarithms, over the rounds. What the
    host does to a process falls on both sides and cancels; no round is left out for a host flag (both sides share
    it). One round: that process's blocks (``stats.paired_ratio``), said in the note.
  - ``paired``: both rows were measured by one ``perflab ab`` or ``perflab track`` run, round by round, each A
    process beside a B process in time (the rows' ``version.session`` agree). One ratio per round, B's process
    median ÷ A's; a Student-t interval on their logarithms, over the rounds. A slow stretch of the host that spans
    a round lengthens both sides of its pair and cancels. A round where either process was flagged
    ``host_contention`` or ``host_drift`` (a busy or slower host) is left out where two or more rounds remain.
  - ``processes``: each side spread its samples over two or more processes (``bench --processes``, or rounds of
    runs that were not timed together). Welch's t interval on the logarithms of the process medians: between-
    process variance is in it, but nothing is paired, so a host that was slower for one whole run is not.
  - ``within-run``: one process a side. The two rows' own 95% CIs of their medians, combined on the log scale
    (their half-widths added in quadrature). It does **not** cover between-process variance: two runs minutes
    apart can differ by more than it says (``note`` states this).

- **Every ratio is taken on logarithms**: a round's B/A is the median of its block ratios on logs
  (``stats.log_median``), the rounds' mean is geometric, so a change and its inverse weigh alike.
- **The noise floor** (:class:`NoiseFloor`): how far from 1 a comparison of A with itself reads on this host. Where
  the run timed an A/A pair in the same schedule (a second copy of A beside A and B, ``ab --aa``), the farthest bound
  of that A/A ratio's 95% CI from 1: a bias of the schedule and the noise of the run both in it. Otherwise the
  between-round spread of B/A itself: the half-width of its CI. With it, the **smallest detectable change**: the
  change this run would have called four times in five (``stats.detectable_change``).
- **The verdict** at a threshold ``t`` (5%, asv's default) and the floor ``f``, the band ``b = max(t, f)``:
  ``slower`` where the CI lies above 1 and the ratio above 1 + b; ``faster`` where the CI lies below 1 and the ratio
  below 1 / (1 + b); ``no change`` where the whole CI lies within [1 / (1 + b), 1 + b] (smaller than the floor, or
  the threshold where that is wider; within a floor wider than the threshold, the CI must also hold 1); otherwise
  ``inconclusive``: the CI reaches past the band without showing a change beyond it, or shows one no larger than an
  A/A reads, and ``needed`` says how many rounds would settle it (``stats.units_needed``).
- **Flags qualify a verdict**: where either row carries ``host_contention``, ``host_drift``, ``throttled``,
  ``short_timing`` or ``high_cv`` (its own flags or a round's), the verdict says it was drawn from flagged rows. A
  ``within-run`` comparison (one process a side) whose rows carry ``host_contention``, ``host_drift`` or ``high_cv``
  is never faster or slower: its CI assumes each host held still, and the flags say one did not (``held_back``).
- **Host-dependent** cases: where either side's step is limited by the host's issue time, or within 25% of it
  (``host_held_ms`` against ``device_ms``, as the bench table's host-dependent pairs), its absolute time moves
  with the host's speed: a ratio of runs on different hosts, or far apart in time, measures the host too.
- **Change points** over an ordered list of revisions (``perflab track``): each revision against the previous one
  that has a row for the case, by the same ratio, CI and verdict; a change point is a revision whose verdict is
  ``slower`` or ``faster`` than the one before it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from perflab.errors import PerflabError
from perflab.host_flags import HOST_FLAGS
from perflab.records.row import row_version
from perflab.stats import (LEVEL, block_ratios, ci_coverage_of, combined_log_interval, detectable_change, log_median, log_t_interval,
                           paired_ratio, row_ci_note, t975, units_needed, welch_log_ratio)

DEFAULT_THRESHOLD = 0.05  # asv's reporting threshold
BORDERLINE = 1.25  # host ÷ GPU time within this factor of 1: a step that a host this much faster or slower tips over

WITHIN_RUN_NOTE = "one process a side: each run's own CI, which does not cover between-process variance"
# The flags that qualify a verdict drawn from a row carrying them (measure.checks: noise on the host, too little timing)
QUALIFYING_FLAGS = ("host_contention", "host_drift", "throttled", "short_timing", "high_cv")
# The flags that say a host did not hold still while a row was timed: a within-run comparison, whose CI assumes it did,
# is then never faster or slower
UNSTEADY_FLAGS = ("host_contention", "host_drift", "high_cv")
MOST_ROUNDS = 100  # sweep.versions.MAX_ROUNDS: more rounds than a run may have are not offered


@dataclass(frozen=True)
class Ratio:
    """B's time ÷ A's time with its 95% CI; ``basis`` says what the interval is taken over (see the module's doc)."""

    ratio: float
    low: float
    high: float
    basis: str  # blocks | paired | processes | within-run
    units: int  # rounds (blocks, paired), or the smaller side's processes (processes); 1 for within-run
    note: str
    dof: int | None = None  # the degrees of freedom of its t interval (None: a normal one, or order statistics)

    @property
    def level(self) -> float:
        return LEVEL

    @property
    def se(self) -> float:
        """The standard error of log(ratio) its interval was built from."""
        return math.log(self.high / self.low) / (2 * t975(self.dof))

    def to_dict(self) -> dict:
        return dict(asdict(self), level=LEVEL)


@dataclass
class CaseChange:
    """One case of a comparison: its two rows' medians, the ratio, the verdict and why a reader should care."""

    case_id: str
    label: str
    status_a: str
    status_b: str
    a_ms: float | None = None
    b_ms: float | None = None
    a_ci_ms: list | None = None
    b_ci_ms: list | None = None
    a_ci_note: str = ""  # what a_ci_ms states where it is less than 95% (stats.row_ci_note: "≥75%"); "" for 95%
    b_ci_note: str = ""
    ratio: Ratio | None = None
    verdict: str = "not compared"
    host_dependent: str | None = None
    unpaired_ratio: float | None = None  # B's median ÷ A's, whatever the basis of the CI
    floor: "NoiseFloor | None" = None  # how far from 1 an A/A reads here (None: one process a side, unknown)
    band: float | None = None  # the verdict's band: max(threshold, floor)
    detectable: float | None = None  # the smallest change this run would have called four times in five (a fraction)
    needed: int | None = None  # inconclusive: the rounds (processes) that would settle it; None where more than MOST_ROUNDS
    flags: list = field(default_factory=list)  # QUALIFYING_FLAGS the two rows carry: the verdict was drawn from them
    held_back: str | None = None  # faster or slower by its CI, but not called so: why (within-run on an unsteady host)
    # each side's throughput as its row states it (samples and tokens a second), shown beside its time; not judged
    a_samples_per_s: float | None = None
    b_samples_per_s: float | None = None
    a_tokens_per_s: float | None = None
    b_tokens_per_s: float | None = None

    @property
    def verdict_text(self) -> str:
        """The verdict with what qualifies it: the band a no change lies in, ``within-run`` where its CI covers one
        process a side only (not the next run), the flags of the rows it was drawn from."""
        if self.verdict == "not compared" or self.band is None:
            return self.verdict
        text = self.verdict
        if self.verdict == "no change":
            text += f" (within ±{self.band:.1%}{', the noise floor' if self.floor and self.band == self.floor.fraction else ''})"
        if self.held_back:
            text += f" ({self.held_back})"
        if self.ratio is not None and self.ratio.basis == "within-run":
            text += " · within-run"
        if self.flags:
            text += f" · flagged {', '.join(self.flags)}"
        return text

    def to_dict(self) -> dict:
        out = asdict(self)
        out["ratio"] = self.ratio.to_dict() if self.ratio else None
        out["floor"] = self.floor.to_dict() if self.floor else None
        out["verdict_text"] = self.verdict_text
        return out


@dataclass
class RowComparison:
    """Cases of two result sources matched by case id, and what either side holds alone."""

    changes: list[CaseChange]
    only_a: list[str] = field(default_factory=list)  # labels of cases only A holds
    only_b: list[str] = field(default_factory=list)
    threshold: float = DEFAULT_THRESHOLD

    def to_dict(self) -> dict:
        return {"threshold": self.threshold, "level": LEVEL, "cases": [c.to_dict() for c in self.changes],
                "only_a": self.only_a, "only_b": self.only_b}


@dataclass(frozen=True)
class NoiseFloor:
    """How far from 1 a comparison of A with itself reads on this host, as a fraction (±): a change smaller than it
    is never called faster or slower. ``source``: ``A/A`` (a copy of A timed in the same schedule: ``aa`` is its
    ratio, the floor the farthest bound of its CI from 1) or ``rounds`` (B/A's own between-round spread: the
    half-width of its CI)."""

    fraction: float
    source: str
    aa: Ratio | None = None

    @property
    def words(self) -> str:
        if self.aa is not None:
            return (f"an A/A pair in the same schedule, A against a second copy of itself: {self.aa.ratio:.3f}× "
                    f"({self.aa.low:.3f}–{self.aa.high:.3f}, {self.aa.basis}, {self.aa.units})")
        return "the between-round spread of B/A (no A/A pair: --aa times one)"

    def to_dict(self) -> dict:
        return {"fraction": self.fraction, "source": self.source, "aa": self.aa.to_dict() if self.aa else None}


def aa_floor(aa: Ratio) -> NoiseFloor:
    """The floor an A/A ratio measures: the farthest bound of its CI from 1 (its bias and its noise both)."""
    return NoiseFloor(max(aa.high, 1.0 / aa.low) - 1.0, "A/A", aa)


def spread_floor(ratio: Ratio) -> NoiseFloor | None:
    """The floor of a ratio over rounds or processes without an A/A pair: the half-width of its CI, what its spread
    lets a ratio of 1 read; None for one process a side (within-run: the spread between processes is unknown)."""
    if ratio.basis == "within-run":
        return None
    return NoiseFloor(math.sqrt(ratio.high / ratio.low) - 1.0, "rounds")


# ---------------------------------------------------------------------------------------------------
# Ratios and their CIs


PAIRED_HOW = "each A process timed beside a B process"


def process_round_ratios(a_medians, b_medians) -> list[float | None]:
    """Per round of a processes-paired run, B's process median ÷ A's (None where either is missing or not positive)."""
    return [b / a if a and b and a > 0 and b > 0 else None for a, b in zip(a_medians, b_medians)]


def rounds_ratio(ratios, basis: str, how: str) -> Ratio | None:
    """The geometric mean of per-round B/A ratios and the t-interval on their logarithms over the rounds
    (``stats.log_t_interval``); None with fewer than two, or where a round has none."""
    if len(ratios) < 2 or any(r is None or not r > 0 for r in ratios):
        return None
    t = log_t_interval(ratios)
    n = len(ratios)
    return Ratio(t.center, t.low, t.high, basis, n, f"95% CI over {n} rounds, {how}", t.dof)


BLOCKS_HOW = "each round's B/A the median (on logs) of its blocks' ratios, A's and B's cases timed interleaved in one process"


def block_round_ratios(a: dict, b: dict) -> list[float | None] | None:
    """Per round (process) of a blocks-paired run, B's time ÷ A's: the median on logarithms (``stats.log_median``) over
    that round's interleaved rounds of B's block ÷ A's block (``stats.block_ratios``, the ratio of blocks timed next to
    each other): of an even count, the geometric mean of the middle two, which a first-block effect falling on A and B
    in turn does not push above 1 as their arithmetic mean does. None unless
    both rows were timed together, round by round, in one interleaved session per process (``process_sessions``)."""
    sa, sb = a.get("process_sessions"), b.get("process_sessions")
    if not sa or sa != sb or None in sa:
        return None
    ratios, procs, _ = block_ratios(a, b)
    out = []
    for p in range(len(sa)):
        these = [float(x) for x, q in zip(ratios, procs) if q == p]
        out.append(log_median(these) if these else None)
    return out


def process_ratio(a_medians, b_medians) -> Ratio | None:
    """The ratio of the geometric means of two sides' process medians, with Welch's 95% t interval on their
    logarithms (``stats.welch_log_ratio``); None unless each side has two or more processes."""
    la = [v for v in a_medians if v and v > 0]
    lb = [v for v in b_medians if v and v > 0]
    if len(la) < 2 or len(lb) < 2:
        return None
    t = welch_log_ratio(la, lb)
    return Ratio(t.center, t.low, t.high, "processes", min(len(la), len(lb)),
                 f"95% Welch CI over {len(la)} vs {len(lb)} processes (between-process variance in it; not paired in time)", t.dof)


def within_run_ratio(a: dict, b: dict) -> Ratio | None:
    """The ratio of two rows' medians with their own 95% CIs combined on the log scale; None where a row has no CI."""
    ma, mb = a.get("median_ms"), b.get("median_ms")
    ca, cb = _ci(a), _ci(b)
    if not ma or not mb or ca is None or cb is None:
        return None
    ratio = mb / ma
    return Ratio(ratio, *combined_log_interval(ratio, (ca, cb)), "within-run", 1, WITHIN_RUN_NOTE)


def row_ratio(a: dict, b: dict) -> Ratio | None:
    """The best-founded ratio of two ok rows of one case: over blocks where one ab/track run timed them interleaved in
    one process a round, paired where it timed them in processes side by side, else over processes where both have
    several, else within-run. Paired by process, a round where either process was flagged
    ``host_contention`` or ``host_drift`` (its timing thread waited for a CPU, or the host canary ran more than 15% off
    the run's median: ``measure.canary``; the rows' ``process_flags``) is left out where two or more rounds remain,
    and the note says so: the flags are measured apart from the timing, so leaving such a round out does not pick
    rounds by their result."""
    pa, pb = _process_medians(a), _process_medians(b)
    if same_session(a, b) and len(pa) == len(pb):
        blocks = block_round_ratios(a, b)
        if blocks is not None and len(blocks) == 1:
            return one_round_blocks_ratio(a, b)
        if blocks is not None:
            per_round, basis, how = blocks, "blocks", BLOCKS_HOW
        else:
            per_round, basis, how = process_round_ratios(pa, pb), "paired", PAIRED_HOW
        # blocks: a round's A and B share a process, its host and its flags, so a slower host cancels: no round is left out
        clean = _uncontended_rounds(a, b, len(per_round)) if blocks is None else list(range(len(per_round)))
        if len(clean) >= 2 and len(clean) < len(per_round):
            paired = rounds_ratio([per_round[i] for i in clean], basis, how)
            left_out = ", ".join(str(i + 1) for i in range(len(per_round)) if i not in clean)
            if paired is not None:
                return Ratio(paired.ratio, paired.low, paired.high, paired.basis, paired.units,
                             f"{paired.note}; round(s) {left_out} of {len(per_round)} left out: a process there ran on a busy or "
                             "slower host (host_contention or host_drift)", paired.dof)
        paired = rounds_ratio(per_round, basis, how)
        if paired is not None:
            return paired
    return process_ratio(pa, pb) or within_run_ratio(a, b)


def one_round_blocks_ratio(a: dict, b: dict) -> Ratio | None:
    """One round of a blocks-paired run: the median of B's block ÷ A's over its interleaved rounds, with the
    hierarchical 95% CI of that one process's blocks (``stats.paired_ratio``)."""
    paired = paired_ratio(a, b)
    if paired is None:
        return None
    dof = paired["units"] - 1 if paired["level"] != "pooled" else None
    return Ratio(paired["ratio"], paired["ci95"][0], paired["ci95"][1], "blocks", 1,
                 f"one round: {paired['pairs']} pairs of blocks timed interleaved in one process, the CI over its stretches; "
                 "more --rounds put a CI over processes", dof)


def _uncontended_rounds(a: dict, b: dict, n: int) -> list[int]:
    """The rounds (0-based) where neither side's process carries a host flag; all where the rows do not say per process."""
    fa, fb = a.get("process_flags"), b.get("process_flags")
    if not fa or not fb or len(fa) != n or len(fb) != n:
        return list(range(n))
    return [i for i in range(n) if not any(f in HOST_FLAGS for f in (fa[i] or []) + (fb[i] or []))]


def same_session(a: dict, b: dict) -> bool:
    """Whether two rows come from one ab/track run that alternated their processes round by round."""
    sa, sb = row_version(a).get("session"), row_version(b).get("session")
    return bool(sa) and sa == sb


def verdict(ratio: Ratio, threshold: float = DEFAULT_THRESHOLD, floor: float = 0.0) -> str:
    """faster, slower, no change or inconclusive at the band max(``threshold``, ``floor``) (see the module's doc): a
    change smaller than the noise floor is never faster or slower, and no change means smaller than it."""
    band = max(threshold, floor)
    up, down = 1.0 + band, 1.0 / (1.0 + band)
    if ratio.low > 1.0 and ratio.ratio > up:
        return "slower"
    if ratio.high < 1.0 and ratio.ratio < down:
        return "faster"
    # within a floor wider than the threshold, no change also needs a CI that holds 1: one that excludes it shows a change
    # the A/A could read too, which is no reason to say there was none
    if down <= ratio.low and ratio.high <= up and (band == threshold or ratio.low <= 1.0 <= ratio.high):
        return "no change"
    return "inconclusive"


def check_threshold(threshold: float) -> float:
    if not (0 < threshold < 1) or math.isnan(threshold):
        raise PerflabError(f"--threshold: expected a fraction between 0 and 1 (0.05 for 5%), got {threshold:g}")
    return float(threshold)


# ---------------------------------------------------------------------------------------------------
# Host dependence


def bound_by(row: dict) -> str | None:
    """``host``, ``gpu`` or ``both`` (within ``BORDERLINE`` of each other): what limits the row's step, from its host
    issue time and its GPU time, each measured with the other out of the way (``host_held_ms``, ``device_ms``)."""
    host, gpu = row.get("host_held_ms"), row.get("device_ms")
    if not host or not gpu:
        return None
    ratio = host / gpu
    return "both" if 1 / BORDERLINE <= ratio <= BORDERLINE else ("host" if ratio > 1 else "gpu")


def host_dependence(a: dict, b: dict) -> str | None:
    """Why a case's absolute times depend on the host (None where neither side is limited by it, or unknown)."""
    names = {"host": "launch-bound", "both": "at the host/GPU boundary"}
    sides = [(side, bound_by(row), row) for side, row in (("A", a), ("B", b))]
    hit = [f"{side} {names[bound]} (host {row['host_held_ms']:.3g} ms, GPU {row['device_ms']:.3g} ms a step)"
           for side, bound, row in sides if bound in names]
    if not hit:
        return None
    return "host-dependent: " + "; ".join(hit) + ": its time moves with the host's speed"


# ---------------------------------------------------------------------------------------------------
# Comparing two sets of rows


def compare_rows(rows_a: list[dict], rows_b: list[dict], threshold: float = DEFAULT_THRESHOLD,
                 names: tuple[str, str] = ("A", "B"), rows_aa: list[dict] | None = None) -> RowComparison:
    """Match two sources' rows by case id and compare each case; PerflabError where they share no case, or a
    source holds one case twice. ``rows_aa``: the rows of a second copy of A timed in the same schedule (``ab
    --aa``), whose ratio to A's gives each case its noise floor."""
    threshold = check_threshold(threshold)
    by_a, by_b = _by_case(rows_a, names[0]), _by_case(rows_b, names[1])
    by_aa = _by_case(rows_aa, "A/A") if rows_aa else {}
    common = [cid for cid in by_a if cid in by_b]
    if not common:
        raise PerflabError(f"{names[0]} and {names[1]} share no case id ({names[0]}: {_ids_text(by_a)}; {names[1]}: "
                           f"{_ids_text(by_b)}): compare results of the same cases")
    changes = [compare_case(by_a[cid], by_b[cid], threshold, measured_floor(by_a[cid], by_aa.get(cid))) for cid in common]
    return RowComparison(changes, [_label(by_a[c]) for c in by_a if c not in by_b], [_label(by_b[c]) for c in by_b if c not in by_a],
                      threshold)


def measured_floor(a: dict | None, aa: dict | None) -> NoiseFloor | None:
    """The noise floor an A/A pair measured: ``a`` and ``aa``, a second copy of its case timed in the same schedule
    (``aa_floor``); None where either is missing or failed, or they were not timed together (one process a side)."""
    if a is None or aa is None or a.get("status") != "ok" or aa.get("status") != "ok":
        return None
    ratio = row_ratio(a, aa)
    return aa_floor(ratio) if ratio is not None and ratio.basis != "within-run" else None


def compare_case(a: dict, b: dict, threshold: float = DEFAULT_THRESHOLD, floor: NoiseFloor | None = None) -> CaseChange:
    """One case's comparison: the ratio and its CI (``row_ratio``), the noise floor (``floor``, an A/A pair's:
    ``measured_floor``; without one, B/A's own spread), the verdict at the band max(threshold, floor), the smallest
    change it could have detected, the rounds an inconclusive one needs, and the flags of the rows it was drawn
    from."""
    change = CaseChange(a.get("case_id") or "?", _label(a), a.get("status") or "?", b.get("status") or "?")
    if change.status_a != "ok" or change.status_b != "ok":
        change.verdict = "not compared"
        return change
    change.a_ms, change.b_ms = a.get("median_ms"), b.get("median_ms")
    change.a_ci_ms, change.b_ci_ms = _ci(a), _ci(b)
    change.a_ci_note, change.b_ci_note = row_ci_note(a), row_ci_note(b)
    change.a_samples_per_s, change.b_samples_per_s = _rate(a, "throughput_per_s"), _rate(b, "throughput_per_s")
    change.a_tokens_per_s, change.b_tokens_per_s = _rate(a, "tokens_per_s"), _rate(b, "tokens_per_s")
    if change.a_ms and change.b_ms:
        change.unpaired_ratio = change.b_ms / change.a_ms
    change.ratio = row_ratio(a, b)
    change.host_dependent = host_dependence(a, b)
    change.flags = verdict_flags(a, b)
    if not change.ratio:
        change.verdict = "not compared"
        return change
    change.floor = floor or spread_floor(change.ratio)
    floor = change.floor.fraction if change.floor else 0.0
    change.band = max(threshold, floor)
    change.verdict = verdict(change.ratio, threshold, floor)
    unsteady = [f for f in change.flags if f in UNSTEADY_FLAGS]
    if change.ratio.basis == "within-run" and change.verdict in ("faster", "slower") and unsteady:
        change.held_back = (f"{change.verdict} by each run's own CI, but those assume the host held still, and "
                            f"{', '.join(unsteady)} say{'s' if len(unsteady) == 1 else ''} it did not")
        change.verdict = "inconclusive"
    change.detectable, change.needed = power(change.ratio, change.band, change.verdict)
    return change


def power(ratio: Ratio, band: float, verdict_: str) -> tuple[float, int | None]:
    """(the smallest change, a fraction, that ``ratio``'s spread would have called four times in five at ``band``;
    where it is inconclusive, the rounds or processes that would settle it: None where more than ``MOST_ROUNDS``, or
    where one process a side leaves nothing to count)."""
    log_band = math.log1p(band)
    detectable = math.expm1(detectable_change(ratio.se, ratio.dof, log_band))
    if verdict_ != "inconclusive" or ratio.units < 2 or ratio.dof is None:
        return detectable, None
    per_unit = ratio.se * math.sqrt(ratio.units)
    needed = units_needed(per_unit, math.log(ratio.ratio), log_band, most=MOST_ROUNDS)
    if needed is not None and ratio.basis == "paired":  # processes pairing: an even number of rounds balances who goes first
        needed += needed % 2
    return detectable, needed


def verdict_flags(a: dict, b: dict) -> list[str]:
    """The ``QUALIFYING_FLAGS`` either row carries, its own or one of its rounds' (``process_flags``), in that order."""
    held = set()
    for row in (a, b):
        held.update(row.get("flags") or [])
        for flags in row.get("process_flags") or []:
            held.update(flags or [])
    return [f for f in QUALIFYING_FLAGS if f in held]


# ---------------------------------------------------------------------------------------------------
# Change points over revisions


@dataclass
class RevisionPoint:
    """One case at one revision: its row's median and CI, and the step from the previous revision with a row."""

    version: str  # the version's key
    name: str  # as the user gave it (a revision), for tables
    status: str
    median_ms: float | None = None
    ci_ms: list | None = None
    ci_coverage: float | None = None  # what ci_ms may claim (0.95 from 5 units; from fewer, less)
    ci_note: str = ""  # that coverage as a table says it (stats.row_ci_note: "≥75%"); "" for 95%
    step: CaseChange | None = None  # against the previous point with an ok row; None for the first
    cause: object = None  # a change point's profile of both sides (diagnosis.change_points.ChangeCause), where track made one

    @property
    def change(self) -> bool:
        return self.step is not None and self.step.verdict in ("slower", "faster")


@dataclass
class CaseSeries:
    case_id: str
    label: str
    points: list[RevisionPoint]

    @property
    def change_points(self) -> list[RevisionPoint]:
        return [p for p in self.points if p.change]


def revision_series(rows: list[dict], order: list[tuple[str, str]], threshold: float = DEFAULT_THRESHOLD,
                    rows_aa: list[dict] | None = None) -> list[CaseSeries]:
    """Per case, its rows in revision order (``order``: (version key, name) pairs, oldest first; rows carry
    ``version.key``) and each revision's step from the previous one that measured it (``compare_case``). ``rows_aa``:
    the rows of a second copy of the first revision timed in the same schedule (``track --aa``), whose ratio to the
    first revision's row is every step's noise floor for that case."""
    threshold = check_threshold(threshold)
    by_aa = {row.get("case_id"): row for row in rows_aa or []}
    position = {key: i for i, (key, _) in enumerate(order)}
    names = dict(order)
    cases: dict[str, dict[str, dict]] = {}
    for row in rows:
        key = row_version(row).get("key")
        if key in position:
            cases.setdefault(row.get("case_id") or "?", {})[key] = row
    out = []
    for case_id, by_version in cases.items():
        points, previous = [], None
        floor = measured_floor(by_version.get(order[0][0]), by_aa.get(case_id)) if order else None
        for key, _ in order:
            row = by_version.get(key)
            if row is None:
                continue
            point = RevisionPoint(key, names[key], row.get("status") or "?")
            if point.status == "ok":
                point.median_ms, point.ci_ms, point.ci_coverage = row.get("median_ms"), _ci(row), ci_coverage_of(row)
                point.ci_note = row_ci_note(row)
                if previous is not None:
                    point.step = compare_case(previous, row, threshold, floor)
                previous = row
            points.append(point)
        first = next(iter(by_version.values()))
        out.append(CaseSeries(case_id, _label(first), points))
    return out


# ---------------------------------------------------------------------------------------------------


def _ci(row: dict) -> list | None:
    ci = row.get("ci95_ms")
    if not ci or len(ci) != 2 or ci[0] is None or ci[1] is None or not (0 < ci[0] <= ci[1]):
        return None
    return [float(ci[0]), float(ci[1])]


def _rate(row: dict, key: str) -> float | None:
    value = row.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf else None


def _process_medians(row: dict) -> list[float]:
    return [float(v) for v in (row.get("process_medians_ms") or []) if v is not None]


def _by_case(rows: list[dict], name: str) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for row in rows:
        cid = row.get("case_id")
        if not cid:
            raise PerflabError(f"{name}: a row without a case_id; compare reads rows written by perflab (bench --out, a store)")
        if cid in out:
            raise PerflabError(f"{name}: case {cid} ({_label(row)}) appears twice; give one run's rows per side")
        out[cid] = row
    return out


def _ids_text(by_case: dict) -> str:
    ids = list(by_case)
    return ", ".join(ids[:3]) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "") if ids else "no rows"


def _label(row: dict) -> str:
    if row.get("label"):
        return str(row["label"])
    model = row.get("model") or (row.get("case") or {}).get("model") or "?"
    if row.get("keep_rate"):
        model += " kr" + "/".join(f"{r:g}" for r in row["keep_rate"])
    size = f" {row['input_size']}px" if row.get("input_size") else ""
    return f"{model}{size} bs{row.get('batch_size')} {row.get('dtype')} {row.get('mode')}"
