"""A/B and track of the user's own program (``perflab ab ... -- SCRIPT [ARGS]``, ``perflab track --revs ... -- SCRIPT``).

A **side** (a version of the program) is a git revision of the repository that holds the program (its worktree, as
``sweep.versions`` checks it out: the program runs in the worktree's directory that stands for ``--repo``), a Python
interpreter (``--python-a/--python-b``: perflab's own source first on its PYTHONPATH, ``versions.interpreter_env``), or
an argument string added to the program's command line (``--a-args/--b-args``). Every side is timed by ``perflab run``
itself, never by a clock of this module: each side, each round, is a fresh process

    python -m perflab run --trace 0 --stop-after --skip S --steps K --out OUT/runs/<side>-r<k> -- SCRIPT ARGS

alternated over the rounds in the balanced order of model ab's processes pairing (``versions.versions_order``: A B,
B A, B A, A B, ...; an even number of rounds), and each process's ``run.json`` is read:

- the value compared is the **mean step** (``loop.mean_ms``): the program's wall time over its timed steps ÷ their
  number, what its throughput is made of. A median would leave out the stalls a program pays for (a loader slow
  every 4th step); the output says it compares means. Under ``--nproc`` it is the slowest rank's mean step (each
  rank's ``rankR/rank.json``), or where those are missing run.json's ``step_ms``, the slowest rank's median (said so);
- where the sides' work a step differs (their samples a step, from run.json's ``loop.throughput`` or ``--batch-size``,
  or their tokens), the time a **sample** (or a **token**, where both sides count tokens) is compared instead: B/A of
  it is A's throughput ÷ B's. The output says which unit;
- each side's **explanation** is its verdict from ``perflab run``'s traced steps. The traced steps come from the last
  round's process, run with ``--trace 3`` in place of ``--trace 0``: ``perflab run`` starts its profiler only after
  the timed steps have ended, so that round's timing is as untraced as the others', and no extra process a side is
  paid for the verdict. The change of verdict (``interpreter-bound → GPU-bound``) is said beside the ratio.

**The statistics are ``analysis.regressions``'**, unchanged: each side's rounds become one result row of the store's
shape (below) whose per-process values are the rounds' mean steps, both rows carry the run's ``version.session``,
so ``compare_rows`` pairs them round by round (``paired``: one B/A a round, their geometric mean, a t-interval on
logs over the rounds), with its noise floor (an A/A pair, a second copy of A each round unless ``--no-aa``, else the
rounds' spread), verdict rules, smallest detectable change and rounds needed; ``track``'s change points are
``revision_series``'.

**The store** (``OUT/results.sqlite``, written through ``lifecycle.SweepSession`` as ab's and track's are; the run's
record has ``kind`` ab or track and its ``versions``, so ``perflab report`` writes its "A/B" or "By revision"
section and ``perflab results`` lists the rows with their version) holds **one result row per side**, as model ab
holds one per case per version: a side's rounds merged. The result row's shape holds a side whole: its samples
(``samples_ms``) are the rounds' values, one per round (the round's mean step, or time a sample or token), each round
its own process (``sample_processes``, ``process_medians_ms``: a round's one value is its process's), so the row's
``median_ms`` and CI are over rounds, summarised by ``stats.summarize`` as any row's samples are. What a round's
``perflab run`` said beyond that (its median step, throughput, flags, verdict, its directory) is kept in the row's
``program_rounds``, and the side's traced verdict in ``program_verdict``. The row's ``statistic`` ("mean step",
or "mean step ÷ samples") and ``unit`` name what its times are. A program track does not reuse the rows of an
earlier run (a model track does): rows timed together are not mixed with older ones.

**A side that fails** (its process exits with another status than 0, writes no run.json, or times fewer steps than
asked) ends the run at once with one line naming the side, its exit status and its last words (run.json's
``last_words``, else the last line of its output), and where its output is: a comparison with a side missing is
none. Nothing of the run is stored then (a row is stored when its side's last round has run).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from perflab.errors import PerflabError
from perflab.records.row import FORMAT_KEY, ROW_FORMAT
from perflab.records.run_report import RANK_FILE, RunReport, RunView
from perflab.records.run_report import read as read_run_report
from perflab.sweep.versions import Version, _set_env

DEFAULT_ROUNDS = 4  # ab of a program: processes side by side, an even number (each order, then its reverse)
TRACED_STEPS = 3  # the last round's traced steps, for each side's verdict (perflab run's default)
DEFAULT_TIMEOUT_S = 600.0  # a round's process, as a model case's
LAST_LINE_CHARS = 300


@dataclass
class ProgramVersion(Version):
    """One side of a program's A/B: a ``Version`` (revision or interpreter) or an argument string (``kind``
    ``arguments``), with the program's command line on this side (``words``), the directory it runs in (``root``), and
    its samples and tokens a step where the user gives them."""

    words: list = field(default_factory=list)  # SCRIPT ARGS... as perflab run takes them, this side's arguments included
    extra_args: str | None = None  # --a-args / --b-args as given
    batch_size: int | None = None
    seq_len: int | None = None

    @property
    def label(self) -> str:
        if self.kind == "arguments":
            return f"args {self.extra_args!r}" if self.extra_args else "no extra args"
        return super().label

    def info(self) -> dict:
        out = super().info()
        out["program"] = list(self.words)
        if self.kind == "arguments":
            out["args"] = self.extra_args or ""
        return out


@dataclass(frozen=True)
class ProgramCase:
    """The program, as the versions machinery's events and tables name a case: its id (the same at every side) and label."""

    id: str
    name: str

    def label(self) -> str:
        return self.name


@dataclass(frozen=True)
class RoundOptions:
    """What each round's ``perflab run`` is given, beside the program: run's own options."""

    skip: int = 5
    steps: int = 20
    nproc: int | None = None
    inputs: tuple = ()
    step: str | None = None
    step_range: str | None = None

    def argv(self, version: ProgramVersion, out: Path, trace: int) -> list[str]:
        args = ["run", "--trace", str(trace), "--stop-after", "--skip", str(self.skip), "--steps", str(self.steps), "--out", str(out)]
        if self.nproc:
            args += ["--nproc", str(self.nproc)]
        for spec in self.inputs:
            args += ["--input", spec]
        if self.step:
            args += ["--step", self.step]
        if self.step_range:
            args += ["--step-range", self.step_range]
        if version.batch_size:
            args += ["--batch-size", str(version.batch_size)]
        if version.seq_len:
            args += ["--seq-len", str(version.seq_len)]
        return args + ["--", *version.words]


def check(options: RoundOptions, rounds, order: str = "alternate", seed: int | None = None) -> None:
    """Bad options of a program's A/B, each one line before anything runs: ``perflab run``'s own checks, the rounds
    (2 to 100, even: each order then its reverse), the order and its seed (``versions.check_order``, ``check_seed``)."""
    from perflab.program.boundaries import make_source
    from perflab.program.run import check_options
    from perflab.sweep.versions import check_balance, check_order, check_rounds, check_seed

    check_options(options.skip, options.steps, 0, options.step, options.step_range, inputs=options.inputs)
    make_source(options.step, options.step_range)
    if options.nproc is not None:
        from perflab.program.torchrun import check_rank_counts

        check_rank_counts([options.nproc], several=False)
    check_rounds(rounds, least=2)
    check_balance("processes", rounds)
    check_order(order)
    check_seed(seed, order, "processes")


def check_sizes(sizes: list[tuple[int | None, int | None]]) -> list[tuple[int | None, int | None]]:
    """Each side's (--batch-size, --seq-len) as ``perflab run`` takes them (``program.run.check_options``' rule: at least
    1, and --seq-len only with --batch-size), one line where not."""
    from perflab.program.run import check_options

    for batch, seq in sizes:
        check_options(5, 1, 0, batch_size=batch, seq_len=seq)
    return sizes


def program_case(words: list[str], options: RoundOptions) -> ProgramCase:
    """The program's case: its id from the script (or module) and the run's options, the same at every side (the
    sides' own arguments and code are what differ); its label the script and, under torchrun, the ranks."""
    head = words[:2] if words and words[0] == "-m" else words[:1]
    name = " ".join(head) + (f" (--nproc {options.nproc})" if options.nproc else "")
    key = json.dumps([head, options.skip, options.steps, options.nproc, options.step, options.step_range])
    return ProgramCase("program-" + hashlib.sha1(key.encode()).hexdigest()[:10], name)


def check_program(words: list[str], where: Path, what: str) -> None:
    """The program as ``perflab run`` would start it in ``where`` (``program.script.parse_program``: a script that does
    not exist, is a directory or does not compile, a module not found), one line naming the side (``what``)."""
    from perflab.program.script import parse_program

    before = os.getcwd()
    try:
        os.chdir(where)
        parse_program(list(words))
    except PerflabError as exc:
        raise PerflabError(f"{what}: {exc}") from None
    finally:
        os.chdir(before)


def split_args(text: str, option: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise PerflabError(f"{option} {text!r}: cannot be split into arguments as a shell would ({exc})") from None


# ---------------------------------------------------------------------------------------------------
# The sides


def _base_env() -> dict:
    from perflab.sweep.runner import gpu_inventory, probe_environment

    try:
        uses_cuda = bool(gpu_inventory()[0])
    except Exception:  # no NVML, no nvidia-smi: no GPU names to record
        uses_cuda = False
    return probe_environment(None, uses_cuda=uses_cuda)


def plan_arguments(words: list[str], sides: list[tuple[str, str | None, str]], sizes: list[tuple[int | None, int | None]]) -> list[ProgramVersion]:
    """Sides that differ by arguments (``sides``: (name, argument string, option) each), the program run from the
    working directory with this interpreter."""
    from perflab.paths import child_env

    base = _base_env()
    out = []
    for (name, text, option), (batch, seq) in zip(sides, sizes):
        extra = split_args(text or "", option)
        these = list(words) + extra
        check_program(these, Path.cwd(), f"{name} ({option} {text!r})" if text else name)
        v = ProgramVersion(name=name, kind="arguments", key=f"{name}|args:{shlex.join(these)}", python=sys.executable, root=Path.cwd(),
                           worker_env=child_env(), words=these, extra_args=text or "", batch_size=batch, seq_len=seq)
        _set_env(v, dict(base, program=shlex.join(these)))
        out.append(v)
    return out


def plan_interpreters(words: list[str], sides: list[tuple[str, str, str]], sizes) -> list[ProgramVersion]:
    """Sides that differ by interpreter (``sides``: (name, option, path) each): each must import perflab and torch
    (``versions.probe_interpreter``); the program is run from the working directory."""
    from perflab.sweep.versions import interpreter_env, probe_interpreter

    check_program(words, Path.cwd(), "the program")
    out = []
    for (name, option, python), (batch, seq) in zip(sides, sizes):
        env, _ = probe_interpreter(python, option, [])
        v = ProgramVersion(name=name, kind="python", key=f"{name}|python:{env['python_executable']}", python=python, root=Path.cwd(),
                           worker_env=interpreter_env(), words=list(words), batch_size=batch, seq_len=seq)
        _set_env(v, dict(env))
        out.append(v)
    return out


def plan_revisions(repo, words: list[str], revisions: list[tuple[str, str, str]], sizes, stack: contextlib.ExitStack,
                   side_keys: bool) -> list[ProgramVersion]:
    """Sides that are revisions of ``repo`` (``revisions``: (name, revision, option) each), each checked out in a worktree
    of its own (``versions.Worktrees``, entered on ``stack``: removed when it closes), the program run in the
    worktree's directory that stands for ``repo``. A relative SCRIPT is read there; an absolute one inside the work
    tree is read at the same place in the worktree."""
    from perflab.paths import child_env
    from perflab.sweep.versions import Worktrees, repository, resolve_revision

    top, rel = repository(repo)
    resolved = [(name, rev, *resolve_revision(top, rev, option)) for name, rev, option in revisions]
    trees = stack.enter_context(Worktrees(top))
    base = _base_env()
    out = []
    for (name, rev, sha, subject), (batch, seq) in zip(resolved, sizes):
        root = trees.add(sha) / rel
        these = _in_worktree(list(words), top, trees.paths[-1])
        check_program(these, root, f"at revision {rev} ({sha[:10]})")
        key = f"commit:{sha}"
        v = ProgramVersion(name=name, kind="revision", key=f"{name}|{key}" if side_keys else key, python=sys.executable, commit=sha,
                           subject=subject, revision=rev, root=root, worker_env=child_env(), words=these, batch_size=batch, seq_len=seq)
        _set_env(v, dict(base, commit=sha, revision=rev, repo=str(top)))
        out.append(v)
    return out


def _in_worktree(words: list[str], top: Path, tree: Path) -> list[str]:
    """The program's words with an absolute script path inside the work tree ``top`` moved to the worktree ``tree``."""
    from perflab.program.script import INTERPRETERS

    i = 1 if words and (Path(words[0]).name in INTERPRETERS or Path(words[0]).name.startswith("python3.")) else 0
    if i < len(words) and words[i] != "-m" and os.path.isabs(words[i]):
        try:
            inside = Path(words[i]).resolve().relative_to(top)
        except ValueError:
            return words
        return words[:i] + [str(tree / inside)] + words[i + 1:]
    return words


# ---------------------------------------------------------------------------------------------------
# Running the rounds


@dataclass
class Round:
    """What one side's ``perflab run`` in one round said (read from its run.json)."""

    round: int
    out_dir: Path
    started_at: float
    position: int  # its place in the round's order (0: first)
    mean_ms: float  # the compared step: the mean (the slowest rank's under --nproc)
    statistic: str  # "mean step", or "median step of the slowest rank" where the ranks' means are missing
    median_ms: float | None
    throughput: dict
    flags: list
    verdict: dict | None = None  # the traced round's: {"verdict", "message"}
    traced: bool = False

    def to_dict(self) -> dict:
        return {"round": self.round, "out_dir": str(self.out_dir), "started_at": self.started_at, "position": self.position,
                "mean_ms": self.mean_ms, "statistic": self.statistic, "median_ms": self.median_ms, "throughput": self.throughput,
                "flags": self.flags, "traced": self.traced, "verdict": self.verdict}


@dataclass
class ProgramSummary:
    """A program's A/B or track: its sides, the rounds each ran, the rows stored."""

    out_dir: Path
    session: str
    versions: list
    case: ProgramCase
    rounds: int
    copy: ProgramVersion | None = None
    runs: dict = field(default_factory=dict)  # version key → [Round] in order
    rows: dict = field(default_factory=dict)  # (case id, version key) → the row stored
    unit: str = "step"  # what the rows' times are a time of: step, sample or token
    pairing: str = "processes"
    done: int = 0
    stored: int = 0
    reused: int = 0
    interrupted: bool = False

    @property
    def cases(self) -> list:
        return [self.case]

    def rows_of(self, version) -> list[dict]:
        row = self.rows.get((self.case.id, version.key))
        return [row] if row is not None else []

    def failed(self) -> list:
        return []


class SideFailed(PerflabError):
    """A side's program failed: the run ends in one line naming it (exit status 2, as bad input: nothing to compare)."""


def run_program_versions(versions: list[ProgramVersion], case: ProgramCase, options: RoundOptions, out_dir, *, rounds: int,
                         order: str = "alternate", seed: int | None = None, timeout_s: float | None = None, kind: str = "ab",
                         command: str = "", on_event=None, threshold: float = 0.05, aa: bool = False) -> ProgramSummary:
    """Every side, ``rounds`` times, each round's processes in a balanced order (``versions.versions_order``), into
    ``out_dir``'s store (one row a side, once its last round has run; see the module's doc). ``aa``: a second copy of
    the first side runs in each round too (``versions.aa_copy``), the A/A pair the noise floor is measured from.
    ``on_event``: as ``versions.run_versions``' ("start", "process_start", "process_done", "finish")."""
    from perflab.sweep.experiment import Experiment
    from perflab.sweep.lifecycle import SweepSession
    from perflab.sweep.store import Store, reading, run_kinds, store_path
    from perflab.sweep.versions import _KIND_WORDS, aa_copy, check_order, check_seed, versions_order

    out_dir = Path(out_dir)
    check_order(order)
    check_seed(seed, order, "processes")
    seed = 0 if seed is None else seed
    timeout_s = float(timeout_s or DEFAULT_TIMEOUT_S)
    copy = aa_copy(versions[0]) if aa else None
    everyone = versions + ([copy] if copy else [])
    if store_path(out_dir).is_file():  # refused before the lock or anything else is written, as model ab refuses it
        with Store.open(out_dir) as store, reading(store.path):
            other = sorted(run_kinds(store) - {kind})
            stored = store.count()
        if other:
            raise PerflabError(f"{out_dir} holds the results of {' and '.join(_KIND_WORDS.get(k, k) for k in other)}, not of {kind}: a store "
                               f"holds one kind of run (its report and compare read one); give {kind} another --out")
        if stored:
            raise PerflabError(f"{out_dir} already holds {stored} row(s); a program's {kind} does not add rows to a store: give another --out")
    summary = ProgramSummary(out_dir, uuid.uuid4().hex[:12], versions, case, rounds, copy)
    experiment = Experiment(source=f"perflab {kind} -- {case.name}", name=f"{kind} of a program",
                            description=f"perflab {kind} of a program, each side timed by perflab run", out=None, timeout_s=timeout_s, cases=())
    record = dict(experiment.to_json(), versions=[v.info() for v in versions], kind=kind, rounds=rounds, order=order, seed=seed,
                  session=summary.session, pairing="processes", threshold=threshold,
                  program=dict(vars(options), case_id=case.id, label=case.name, inputs=list(options.inputs)))
    if copy is not None:
        record["aa"] = copy.info()
    with SweepSession(out_dir, summary, on_event=on_event, again=f"run {kind} again with another --out",
                      kept="each side's, committed when its last round ended") as sweep:
        sweep.begin([(v.env_key, v.env) for v in everyone], experiment=experiment, record=record, env_key=",".join(v.env_key for v in everyone),
                    n_cases=len(everyone), n_skipped=0, command=command,
                    start=dict(total=len(everyone) * rounds, reused=0, versions=versions, rounds=rounds))

        def run_rounds() -> None:
            for r in range(rounds):
                for place, vi in enumerate(versions_order(len(everyone), r, 0, order, seed)):
                    v = everyone[vi]
                    sweep.emit("process_start", case=case, version=v, round=r)
                    result = run_side(v, options, out_dir, r, place, traced=r == rounds - 1, timeout_s=timeout_s)
                    summary.runs.setdefault(v.key, []).append(result)
                    summary.done += 1
                    sweep.emit("process_done", case=case, version=v, round=r, row={"status": "ok", "label": case.name})
            summary.unit = compared_unit(everyone, summary.runs)
            for position, v in enumerate(everyone):
                row = side_row(v, case, summary, position, kind, order)
                sweep.put(row, v.env_key, worker="w0")
                summary.rows[(case.id, v.key)] = row

        sweep.drive(run_rounds)
        summary.stored = sweep.stored
    return summary


def run_side(v: ProgramVersion, options: RoundOptions, out_dir: Path, r: int, place: int, *, traced: bool, timeout_s: float) -> Round:
    """One side's process in round ``r``: ``perflab run`` of its program (traced where ``traced``: the last round), its
    output kept in ``OUT/logs``; its run.json read. SideFailed where it failed, naming the side."""
    run_dir = (out_dir / "runs" / f"{v.slug}-r{r + 1}").resolve()
    shutil.rmtree(run_dir, ignore_errors=True)  # an earlier run's run.json there must not stand for this one's
    logs = (out_dir / "logs").resolve()
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{v.slug}-r{r + 1}.log"
    argv = [v.python, "-m", "perflab", *options.argv(v, run_dir, TRACED_STEPS if traced else 0)]
    started = time.time()
    code = _run_process(argv, cwd=v.root, env=v.worker_env or None, log=log, timeout_s=timeout_s, what=side_words(v, r))
    report = _read_json(run_dir / "run.json")
    if code != 0 or report is None:
        raise SideFailed(failure_line(v, r, code, report, log))
    run = RunView.of(report)
    steps = run.loop.steps or 0
    if steps < options.steps:
        raise SideFailed(f"{side_words(v, r)}: the program timed {steps} of the {options.steps} steps asked for (it ended after "
                         f"{run.recorded.steps_seen} steps); lower --skip or --steps, or let it run longer "
                         f"(its output: {log})")
    mean, statistic = step_of(report, run_dir, options.nproc)
    throughput = dict(run.loop.throughput.raw)
    flags = [f.flag for f in run.flags if f] + host_flags(run.timing.raw)
    verdict = None
    if traced:
        if run.verdict.verdict:
            verdict = {"verdict": run.verdict.verdict, "message": run.verdict.message}
        else:
            verdict = {"verdict": None, "message": report.report_error or ("the program ended before its traced steps" if report.partial
                                                                           else "no verdict: nothing was traced")}
    return Round(r, run_dir, started, place, mean, statistic, run.loop.median_ms, throughput, flags, verdict, traced)


def host_flags(timing: dict) -> list[str]:
    """``host_contention`` where the program's thread waited for a CPU (or the VM stole its time) over the timed steps
    beyond bench's thresholds (run.json's ``timing.host_wait_frac``, ``host_steal_frac``; the rule is
    ``measure.canary.mark_host_flags``'): ``analysis.regressions`` then leaves that round out where two or more remain,
    and the verdict says it was drawn from a busy host."""
    from perflab.host_flags import HOST_FLAGS
    from perflab.measure.canary import mark_host_flags
    from perflab.measure.sched import STEAL_KEY, WAIT_KEY

    row = {"status": "ok", WAIT_KEY: timing.get(WAIT_KEY), STEAL_KEY: timing.get(STEAL_KEY)}
    return [f for f in mark_host_flags([row])[0].get("flags") or [] if f in HOST_FLAGS]


def side_words(v: ProgramVersion, r: int | None = None) -> str:
    """A side in words: ``B (--b-args "--compile=True")``, ``A (revision c1 a3d3cc65ea)``, in round r."""
    what = {"arguments": f"args {v.extra_args!r}", "python": f"interpreter {v.python}",
            "revision": f"revision {v.revision} ({(v.commit or '')[:10]})"}.get(v.kind, v.kind)
    return f"{v.name} ({what})" + (f", round {r + 1}" if r is not None else "")


def failure_line(v: ProgramVersion, r: int, code, report: RunReport | None, log: Path) -> str:
    """One line naming a failed side: its exit status, its last words (run.json's, else its output's last line)."""
    words = report.last_words if report is not None else None
    if not words:
        words = _last_line(log)
    status = "was killed (its process ran past --timeout)" if code is None else f"exited with status {code}"
    if code == 0 and report is None:
        status = "wrote no run.json"
    return f"{side_words(v, r)}: the program {status}" + (f": {words}" if words else "") + f" (its output: {log})"


def step_of(report: RunReport, run_dir: Path, nproc: int | None) -> tuple[float, str]:
    """The step a round compares: the mean (``loop.mean_ms``); under --nproc the slowest rank's mean, from each rank's
    rank.json, else run.json's ``step_ms`` (the slowest rank's median)."""
    if nproc:
        means = []
        for rank in range(nproc):
            rank_report = _read_json(run_dir / f"rank{rank}" / RANK_FILE)
            rank_mean = RunView.of(rank_report).loop.mean_ms if rank_report is not None else None
            if _positive(rank_mean):
                means.append(float(rank_mean))
        if len(means) == nproc:
            return max(means), "mean step of the slowest rank"
        if _positive(report.step_ms):
            return float(report.step_ms), "median step of the slowest rank (not every rank's mean was written)"
    mean = RunView.of(report).loop.mean_ms
    if not _positive(mean):
        raise SideFailed(f"{run_dir / 'run.json'}: holds no mean step (loop.mean_ms)")
    return float(mean), "mean step"


def compared_unit(versions, runs: dict) -> str:
    """What the sides are compared by: the step, where their work a step is the same or unknown; else the time a token,
    where every side counts tokens, or a sample."""
    samples = [_work(runs.get(v.key) or [], "samples_per_step") for v in versions]
    tokens = [_work(runs.get(v.key) or [], "tokens_per_step") for v in versions]
    differ = lambda xs: None not in xs and len(set(xs)) > 1  # noqa: E731
    if differ(tokens) or (differ(samples) and None not in tokens):
        return "token"
    if differ(samples):
        return "sample"
    return "step"


def _work(rounds: list[Round], key: str) -> float | None:
    values = {r.throughput.get(key) for r in rounds}
    if len(values) != 1:
        return None
    value = values.pop()
    return float(value) if _positive(value) else None


UNIT_WORDS = {"step": "mean step", "sample": "mean step ÷ samples a step (time a sample)", "token": "mean step ÷ tokens a step (time a token)"}


def side_row(v: ProgramVersion, case: ProgramCase, summary: ProgramSummary, position: int, kind: str, order: str) -> dict:
    """A side's rounds as one result row (see the module's doc): its samples the rounds' compared values."""
    from perflab.stats import summarize

    rounds = summary.runs[v.key]
    per = "samples_per_step" if summary.unit == "sample" else "tokens_per_step"
    values = [r.mean_ms / (r.throughput[per] if summary.unit != "step" else 1.0) for r in rounds]
    timing = summarize(values, processes=list(range(len(values))), rounds=[0] * len(values)).to_dict()
    samples_s = [r.throughput.get("samples_per_s") for r in rounds]
    tokens_s = [r.throughput.get("tokens_per_s") for r in rounds]
    traced = next((r for r in rounds if r.traced), None)
    row = {"case_id": case.id, FORMAT_KEY: ROW_FORMAT, "label": case.name, "status": "ok", "model": case.name, "kind": "program",
           "statistic": rounds[0].statistic if summary.unit == "step" else UNIT_WORDS[summary.unit], "unit": summary.unit,
           **timing, "processes": len(values), "process_medians_ms": values, "sample_processes": list(range(len(values))),
           "sample_rounds": [0] * len(values), "process_started_at": [r.started_at for r in rounds],
           "process_positions": [[r.position] for r in rounds], "process_flags": [list(r.flags) for r in rounds], "flags": [],
           "step_mean_ms": [r.mean_ms for r in rounds], "step_median_ms": [r.median_ms for r in rounds],
           "samples_per_step": _work(rounds, "samples_per_step"), "tokens_per_step": _work(rounds, "tokens_per_step"),
           "samples_per_s": _geomean(samples_s), "tokens_per_s": _geomean(tokens_s), "throughput_per_s": _geomean(samples_s),
           "program": list(v.words), "program_rounds": [r.to_dict() for r in rounds],
           "program_verdict": traced.verdict if traced else None, "env": dict(v.env)}
    row["version"] = dict(v.info(), session=summary.session, rounds=summary.rounds, order=order, position=position, kind_of_run=kind,
                          pairing="processes")
    return row


def _geomean(values) -> float | None:
    import math

    if not values or not all(_positive(x) for x in values):
        return None
    return math.exp(sum(math.log(x) for x in values) / len(values))


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x < float("inf")


def _read_json(path: Path) -> RunReport | None:
    """A run.json (rank.json) read (``records.run_report.read``), or None where there is none to read."""
    return read_run_report(path)


def _last_line(path: Path) -> str | None:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            tail = f.read().decode(errors="replace")
    except OSError:
        return None
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return lines[-1][:LAST_LINE_CHARS] if lines else None


def _run_process(argv: list[str], *, cwd, env, log: Path, timeout_s: float, what: str) -> int | None:
    """``argv`` in its own session (its ranks and children with it), its output to ``log``; its exit status, or None
    where it ran past ``timeout_s`` (then it and its children are ended). Ctrl-C or SIGTERM ends them too, and is raised."""
    with open(log, "wb") as out:
        try:
            proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        except OSError as exc:
            raise SideFailed(f"{what}: {argv[0]} could not be started ({exc.strerror or exc})") from None
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _end(proc)
            return None
        except BaseException:
            _end(proc)
            raise


def _end(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


# ---------------------------------------------------------------------------------------------------
# The comparison


def verdict_change(a: dict | None, b: dict | None) -> str:
    """``launch-bound → GPU-bound``, ``interpreter-bound (unchanged)``; what is unknown said so."""
    va, vb = ((x or {}).get("verdict") for x in (a, b))
    if va and vb:
        return f"{va} (unchanged)" if va == vb else f"{va} → {vb}"
    return f"{va or 'no verdict'} → {vb or 'no verdict'}"


