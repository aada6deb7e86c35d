"""Versions at the sweep floor, an experiment run at each; ``report/versions.py`` renders their comparisons.

One experiment at several versions of the code or the environment (``perflab ab``, ``perflab track``).

A **version** is a git revision of the repository that holds the model code (checked out in a worktree of its own,
in a temporary directory, where the cases' relative model references are read), or a Python interpreter (another
virtualenv, with another torch). Every version runs the same cases through the sweep's machinery (``sweep.worker``,
forked by the sweep's launcher, one launcher per interpreter), the same harness, the same store. A version is a
field of the row (``version``) and part of its environment key, not a new store.

Each of ``rounds`` rounds times each case once at every version, paired one of two ways (``pairing``):

- ``blocks`` (revisions): the round is one fresh worker process (``sweep.worker --together``) that builds every case
  at every version, each in its version's ``references.ModelScope`` (its worktree; its modules kept apart), and times
  them interleaved block by block (``measure.harness.run_cases``), a case's versions one group, adjacent in each
  interleaved round and taking turns to go first (``measure.interleave.balanced_order``). What the host does to the
  process, or to a stretch of it, falls on every version alike, and a round's B/A is the median of its block ratios
  (``analysis.regressions.block_round_ratios``).
- ``processes``: each case at each version a process of its own, one after another, in a balanced order
  (``versions_order``: ABBA, or a seeded shuffle per pair of rounds reversed in the second). Each A process has a B
  process beside it in time, and the ratio of a round's two medians cancels a slow stretch of the host that spans
  both, not what differs between the processes (``analysis.regressions.row_ratio``). Interpreters pair only so.

**An A/A pair in the schedule** (``aa``; by default with the blocks pairing): a second copy of the first version
(``aa_copy``: the same revision, built again from the same worktree) runs beside the others in every round, a member
of each case's group like any version, so its ratio to the first version measures what this schedule on this host
reads for no change: the noise floor the comparison is judged against (``analysis.regressions.measured_floor``). Its
rows are stored under a version of their own (``copy_of`` names what it copies), and the run's record lists it apart
(``aa``) from the versions compared.

**Balance**: the processes pairing needs an even number of rounds (each order, then its reverse), and
``--order-seed`` is refused where nothing is drawn with it (``check_seed``).

A case's rounds at one version are merged into one row (``measure.harness.merge_processes``: its CI across the
processes), stored once its last round has run; ``version.session`` marks the rows one run timed together.

Before anything is written: the repository must be a git work tree without uncommitted changes to tracked files
(what is dirty is named), every revision must exist, every interpreter must import perflab and torch, and every
version must expand the spec to the same case ids. A worktree is removed when the run ends, however it ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from perflab.errors import PerflabError, show
from perflab.references import ModelScope
from perflab.spec import Case
from perflab.sweep.experiment import Experiment
from perflab.records.row import row_version

ORDERS = ("alternate", "random")
PAIRINGS = ("blocks", "processes")
GIT_TIMEOUT_S = 120.0
PROBE_TIMEOUT_S = 300.0


# ---------------------------------------------------------------------------------------------------
# Versions


@dataclass
class Version:
    """One version: what it is (``kind`` revision or python), where its code and interpreter are, its environment."""

    name: str  # A or B (ab), the revision as given (track)
    kind: str  # "revision" or "python"
    key: str  # what identifies it in the store: "commit:<sha>" or "python:<path>" (ab: prefixed by its side)
    python: str  # the interpreter its workers run
    commit: str | None = None
    subject: str | None = None  # the commit's first line
    revision: str | None = None  # as the user named it
    root: Path | None = None  # the worktree's directory that stands for --repo (relative references are read here)
    worker_env: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)  # the environment probe, with the version
    env_key: str = ""
    experiment: Experiment | None = None
    copy_of: str | None = None  # an A/A copy: the name of the version it is a second copy of

    @property
    def slug(self) -> str:
        return "".join(ch if ch.isalnum() else "_" for ch in self.name)[:40] or "v"

    @property
    def label(self) -> str:
        """What it is, short: ``c2 (a3d3cc65ea)``, ``/venv/bin/python``."""
        return f"{self.revision} ({self.commit[:10]})" if self.kind == "revision" else self.python

    def info(self) -> dict:
        """What a row says of its version."""
        out = {"name": self.name, "kind": self.kind, "key": self.key, "python": self.python}
        if self.kind == "revision":
            out.update(revision=self.revision, commit=self.commit, subject=self.subject)
        out.update({k: self.env.get(k) for k in ("torch", "cuda", "driver", "perflab")})
        if self.copy_of is not None:
            out["copy_of"] = self.copy_of
        return out


def aa_copy(version: Version) -> Version:
    """A second copy of ``version`` for the A/A pair: the same code, interpreter and experiment, under a name (``A'``)
    and key of its own, so its rows are stored beside the original's and paired with them like another version's."""
    from dataclasses import replace

    name = f"{version.name}'"
    base = version.key.split("|", 1)[-1]
    copy = replace(version, name=name, key=f"{name}|{base}", copy_of=version.name)
    _set_env(copy, {k: v for k, v in version.env.items() if k != "version"})
    return copy


def _run(cmd: list[str], what: str, timeout: float = GIT_TIMEOUT_S, **kwargs) -> subprocess.CompletedProcess:
    try:
        if "input" not in kwargs:
            kwargs["stdin"] = subprocess.DEVNULL
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)
    except FileNotFoundError:
        raise PerflabError(f"{what}: {cmd[0]} not found (is it installed and on PATH?)") from None
    except subprocess.TimeoutExpired:
        raise PerflabError(f"{what}: `{' '.join(cmd[:4])} ...` did not finish within {timeout:g} s") from None


def git(repo, *args: str) -> str:
    """``git -C repo ARGS``'s output; PerflabError with git's own last line when it fails."""
    result = _run(["git", "-C", str(repo), *args], f"--repo {repo}")
    if result.returncode != 0:
        lines = [line.strip() for line in result.stderr.splitlines() if line.strip()]
        raise PerflabError(f"--repo {repo}: git {args[0]} failed: {lines[-1] if lines else f'exit status {result.returncode}'}")
    return result.stdout


def repository(path) -> tuple[Path, Path]:
    """(the work tree's top level, ``path`` relative to it); PerflabError unless ``path`` is a directory in a git work
    tree with no uncommitted changes to tracked files."""
    path = Path(path)
    if not path.is_dir():
        raise PerflabError(f"--repo {path}: no such directory")
    probe = _run(["git", "-C", str(path), "rev-parse", "--show-toplevel"], f"--repo {path}")
    if probe.returncode != 0:
        raise PerflabError(f"--repo {path}: not a git work tree (git rev-parse: {probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else 'failed'})")
    top = Path(probe.stdout.strip()).resolve()
    dirty = [line[3:] if len(line) > 3 else line for line in git(top, "status", "--porcelain", "--untracked-files=no").splitlines() if line.strip()]
    if dirty:
        shown = ", ".join(dirty[:5]) + (f" and {len(dirty) - 5} more" if len(dirty) > 5 else "")
        raise PerflabError(f"--repo {path}: uncommitted changes to {shown}; versions are committed revisions: commit or stash them first")
    return top, path.resolve().relative_to(top)


def resolve_revision(top: Path, rev: str, option: str) -> tuple[str, str]:
    """(the commit's full SHA, its subject); PerflabError where ``rev`` names no commit of the repository."""
    if not rev or rev.startswith("-"):
        raise PerflabError(f"{option}: {rev!r} is not a revision")
    result = _run(["git", "-C", str(top), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], f"{option} {rev}")
    if result.returncode != 0 or not result.stdout.strip():
        raise PerflabError(f"{option} {rev}: no such revision in {top}")
    sha = result.stdout.strip()
    return sha, git(top, "log", "-1", "--format=%s", sha).strip()


def revision_range(top: Path, text: str) -> list[str]:
    """``A..B``: A, then each commit after it up to B along B's first parents (``git rev-list --first-parent``), oldest
    first."""
    start, sep, end = text.partition("..")
    if not sep or not start or not end or end.startswith("."):
        raise PerflabError(f"--range {text}: expected A..B (two revisions)")
    resolve_revision(top, start, "--range")
    resolve_revision(top, end, "--range")
    after = git(top, "rev-list", "--reverse", "--first-parent", f"{start}..{end}").split()
    if not after:
        raise PerflabError(f"--range {text}: {end} has no commit after {start} (is {start} an ancestor of {end}?)")
    return [start] + after


class Worktrees:
    """Detached worktrees of some commits in a temporary directory, removed (with git's record of them) on exit."""

    def __init__(self, top: Path):
        self.top = top
        self.base = Path(tempfile.mkdtemp(prefix="perflab-versions-"))
        self.paths: list[Path] = []

    def add(self, commit: str) -> Path:
        path = self.base / f"{len(self.paths)}-{commit[:10]}"
        self.paths.append(path)
        git(self.top, "worktree", "add", "--detach", "--quiet", str(path), commit)
        return path

    def __enter__(self) -> "Worktrees":
        return self

    def __exit__(self, *exc) -> None:
        # A Ctrl-C while they are removed (the user's second) waits until they are gone, then is raised; --force twice
        # removes a worktree left locked by an add that the first Ctrl-C cut short, which prune would keep.
        with ctrl_c_deferred():
            for path in self.paths:
                _run(["git", "-C", str(self.top), "worktree", "remove", "--force", "--force", str(path)], "git worktree remove")
            shutil.rmtree(self.base, ignore_errors=True)
            _run(["git", "-C", str(self.top), "worktree", "prune"], "git worktree prune")


@contextlib.contextmanager
def ctrl_c_deferred():
    """SIGINT held off for the block (in the main thread; elsewhere signals are not ours), raised as KeyboardInterrupt
    when it ends, unless the block is already ending by an exception of its own or the process ignores SIGINT (a
    background job's)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught and previous is not signal.SIG_IGN:
        raise KeyboardInterrupt


def interpreter_env() -> dict:
    """The environment another interpreter's processes run in: where this perflab is a source checkout, with it first
    on PYTHONPATH (both versions then run the same perflab, and only the interpreter's packages differ); where it is
    installed in an environment's site-packages, unchanged (each interpreter imports its own perflab: putting this
    one's site-packages on the path would lend it this environment's torch)."""
    from perflab.paths import SRC, child_env

    installed = any(part in ("site-packages", "dist-packages") for part in Path(SRC).parts)
    return dict(os.environ) if installed else child_env()


# Run by each interpreter: can it import perflab and torch, what is its environment, and what are the cases' ids there.
_PROBE = r"""
import json, sys
request = json.loads(sys.stdin.read())
import torch
import perflab
from perflab.spec import Case
from perflab.sweep.runner import probe_environment
env = probe_environment(None, uses_cuda=request["uses_cuda"])
env["perflab_path"] = perflab.__file__
env["python_executable"] = sys.executable
ids = []
for d in request["cases"]:
    try:
        ids.append(Case.from_dict(d).id)
    except Exception as exc:
        ids.append("unreadable: %s: %s" % (type(exc).__name__, exc))
print("PERFLAB_PROBE " + json.dumps({"env": env, "case_ids": ids}))
"""


def probe_interpreter(python: str, option: str, cases: list[Case]) -> tuple[dict, list[str]]:
    """(the interpreter's environment, the case ids its perflab gives ``cases``); PerflabError where it is missing or
    cannot import perflab and torch."""
    path = shutil.which(python) if os.sep not in python else python
    if not path or not Path(path).is_file() or not os.access(path, os.X_OK):
        raise PerflabError(f"{option} {python}: no such interpreter")
    request = json.dumps({"uses_cuda": any(c.device == "cuda" for c in cases), "cases": [c.to_dict() for c in cases]})
    result = _run([path, "-c", _PROBE], f"{option} {python}", timeout=PROBE_TIMEOUT_S, input=request, env=interpreter_env())
    marker = [line for line in result.stdout.splitlines() if line.startswith("PERFLAB_PROBE ")]
    if result.returncode != 0 or not marker:
        lines = [line.strip() for line in result.stderr.splitlines() if line.strip()]
        why = lines[-1] if lines else f"exit status {result.returncode}"
        raise PerflabError(f"{option} {python}: cannot import perflab and torch there ({why}); install them in that environment")
    data = json.loads(marker[-1][len("PERFLAB_PROBE "):])
    return data["env"], data["case_ids"]


@dataclass
class Plan:
    """The versions of a run, checked and ready; ``close()`` removes their worktrees."""

    versions: list[Version]
    cases: list[Case]  # the first version's (every version's have the same ids)
    stack: contextlib.ExitStack

    def close(self) -> None:
        self.stack.close()


MakeExperiment = Callable[[Path | None], Experiment]


def plan_revisions(repo, revisions: list[tuple[str, str, str]], make_experiment: MakeExperiment, side_keys: bool = False) -> Plan:
    """Versions for ``revisions`` ((name, revision, the option that named it) triples) of the repository at ``repo``: each revision checked out in
    its own worktree, its experiment made there (``make_experiment(directory standing for repo)``). PerflabError,
    with nothing left behind, on a dirty repository, a missing revision, a spec that fails at a revision, or case ids
    that differ between revisions. ``side_keys``: keys prefixed by the names (ab's A and B, which may be one commit)."""
    from perflab.sweep.runner import probe_environment

    top, rel = repository(repo)
    resolved = [(name, rev, *resolve_revision(top, rev, option)) for name, rev, option in revisions]
    stack = contextlib.ExitStack()
    try:
        trees = stack.enter_context(Worktrees(top))
        versions = []
        for name, rev, sha, subject in resolved:
            root = trees.add(sha) / rel
            try:
                with ModelScope(root):  # the family of a file.py:NAME is found by importing it: its own sibling modules
                    experiment = make_experiment(root)
            except PerflabError as exc:
                raise PerflabError(f"at revision {rev} ({sha[:10]}): {exc}") from None
            key = f"commit:{sha}"
            versions.append(Version(name=name, kind="revision", key=f"{name}|{key}" if side_keys else key, python=sys.executable,
                                    commit=sha, subject=subject, revision=rev, root=root, experiment=experiment))
        _check_same_cases(versions, [[c.id for c in v.experiment.cases] for v in versions])
        base = probe_environment(versions[0].experiment)
        for v in versions:
            _set_env(v, dict(base, commit=v.commit, revision=v.revision, repo=str(top)))
        return Plan(versions, list(versions[0].experiment.cases), stack)
    except BaseException:
        stack.close()
        raise


def plan_interpreters(pythons: list[tuple[str, str, str]], experiment: Experiment) -> Plan:
    """Versions for interpreters ((name, option, path) triples) running one experiment; PerflabError where an
    interpreter is missing, cannot import perflab and torch, or gives the cases other ids (another perflab)."""
    versions, ids = [], []
    for name, option, python in pythons:
        env, case_ids = probe_interpreter(python, option, list(experiment.cases))
        version = Version(name=name, kind="python", key=f"{name}|python:{env['python_executable']}", python=python,
                          worker_env=interpreter_env(), experiment=experiment)
        _set_env(version, dict(env))
        versions.append(version)
        ids.append(case_ids)
    _check_same_cases(versions, [[c.id for c in experiment.cases]] + ids, with_parent=True)
    return Plan(versions, list(experiment.cases), contextlib.ExitStack())


def _set_env(version: Version, env: dict) -> None:
    from perflab.sweep.runner import environment_key

    env["version"] = version.key
    version.env = env
    version.env_key = environment_key(env)


def _check_same_cases(versions: list[Version], id_lists: list[list[str]], with_parent: bool = False) -> None:
    names = (["this perflab"] if with_parent else []) + [v.name for v in versions]
    first = id_lists[0]
    for name, ids in zip(names[1:], id_lists[1:]):
        if ids != first:
            only_first = [i for i in first if i not in ids]
            only_here = [i for i in ids if i not in first]
            raise PerflabError(f"versions {names[0]} and {name} give different case ids ({len(first)} vs {len(ids)} cases; "
                               f"only {names[0]}: {', '.join(only_first[:3]) or 'none'}; only {name}: {', '.join(only_here[:3]) or 'none'}): "
                               "an A/B compares the same cases; change the code, not the spec")


# ---------------------------------------------------------------------------------------------------
# Running the versions


@dataclass
class VersionsSummary:
    out_dir: Path
    session: str
    versions: list[Version]
    cases: list[Case]
    rounds: int
    pairing: str = "processes"
    copy: Version | None = None  # the A/A copy of the first version, timed beside the others in each round
    rows: dict = field(default_factory=dict)  # (case id, version key) → the merged row stored now, or read back
    done: int = 0  # processes run now
    stored: int = 0  # rows stored now
    reused: int = 0  # (case, version) rows already stored
    interrupted: bool = False

    def rows_of(self, version: Version) -> list[dict]:
        return [self.rows[(c.id, version.key)] for c in self.cases if (c.id, version.key) in self.rows]

    def failed(self) -> list[tuple[Version, dict]]:
        """(version, row) of each case at a version whose row is not ok (its own failure, stored as its version's)."""
        return [(v, row) for v in self.versions for row in self.rows_of(v) if row.get("status") != "ok"]


# Each round is a process per case at each version (processes) or one holding them all (blocks): seconds to minutes
# each, and the CI over rounds narrows as 1/sqrt(N), as bench's --processes (api.MAX_PROCESSES) is bounded for.
MAX_ROUNDS = 100


def check_rounds(rounds, least: int = 1) -> None:
    """PerflabError unless ``rounds`` is a whole number from ``least`` to ``MAX_ROUNDS`` (checked before anything is
    built: a run's rounds are never listed up front, but a run of 10^9 rounds would not end)."""
    if isinstance(rounds, bool) or not isinstance(rounds, int) or not least <= rounds <= MAX_ROUNDS:
        why = " (a CI over rounds needs two)" if least == 2 else ""
        raise PerflabError(f"--rounds must be at least {least}{why} and at most {MAX_ROUNDS}, got {show(rounds)} (each round builds "
                           f"and times every case at every version afresh, in new processes; the CI over rounds narrows as 1/√N)")


def check_order(order: str) -> None:
    if order not in ORDERS:
        raise PerflabError(f"--order: expected alternate or random, got {order!r}")


def check_seed(seed: int | None, order: str, pairing: str | None, n_cases: int | None = None) -> None:
    """PerflabError where ``--order-seed`` is given and would change nothing: ``--order alternate`` draws no order of
    versions, and within a process draws only the order of several cases (the blocks pairing's groups)."""
    if seed is None or order != "alternate":
        return
    if pairing == "processes" or n_cases == 1:
        where = "processes take turns A B, B A, B A, A B, ..." if pairing == "processes" else "one case's versions take turns A B, B A, ..."
        raise PerflabError(f"--order-seed {seed}: --order alternate draws nothing here ({where}); give --order random to draw "
                           "each pair of rounds' order with it, or leave --order-seed out")


def check_balance(pairing: str | None, rounds: int) -> None:
    """PerflabError where the processes pairing could not put each version first equally often: an odd number of
    rounds (each order is followed by its reverse, so A goes first in 1 of 3)."""
    if pairing == "processes" and rounds % 2:
        raise PerflabError(f"--pairing processes: --rounds {rounds} cannot balance who goes first (each order is followed by its "
                           f"reverse, so one version would go first in {rounds // 2 + 1} of {rounds}); give an even number, "
                           f"{rounds + 1}")


def versions_order(n_versions: int, r: int, c: int, order: str, seed: int) -> list[int]:
    """Round ``r``'s order of case ``c``'s versions (indices), balanced over the rounds so that an A/A cannot come out
    faster or slower by order: ``alternate``, ``measure.interleave.balanced_order`` (A B, B A, B A, A B, ...);
    ``random``, a shuffle seeded by ``seed``, the pair of rounds and the case, reversed in the pair's second round
    (two versions: each first once in every pair of rounds; any number: each runs before each other one once, and a
    linear drift cancels). Worked out per round, so no schedule of all the rounds is held."""
    from perflab.measure.interleave import balanced_order

    check_order(order)
    if order == "alternate":
        return balanced_order(range(n_versions), r)
    indices = list(range(n_versions))
    random.Random(f"{seed}:{r // 2}:{c}").shuffle(indices)
    return indices[::-1] if r % 2 else indices


def check_pairing(pairing: str | None, interpreters: bool, cases=()) -> None:
    """PerflabError where ``pairing`` is unknown, or is blocks for interpreters or for cases that cannot share a
    process (None: the default, checked later)."""
    if pairing is None:
        return
    if pairing not in PAIRINGS:
        raise PerflabError(f"--pairing: expected blocks or processes, got {pairing!r}")
    if pairing != "blocks":
        return
    if interpreters:
        raise PerflabError("--pairing blocks: interpreters (--python-a/--python-b) each run their own processes, so they can only "
                           "pair processes: --pairing processes")
    from perflab.measure.harness import can_interleave

    for case in cases:
        why = f"it runs {case.world_size} ranks in processes of their own" if case.parallel else can_interleave(case)
        if why:
            raise PerflabError(f"--pairing blocks: {case.label()} cannot be timed with another version in one process ({why}); "
                               "use --pairing processes")


def run_versions(plan: Plan, out_dir, *, rounds: int, order: str = "alternate", seed: int | None = None, timeout_s: float | None = None,
                 reuse: bool, command: str = "", kind: str = "ab", on_event=None, launcher: str | None = None,
                 record: dict | None = None, pairing: str = "processes", aa: bool = False) -> VersionsSummary:
    """Run every case at every version, ``rounds`` times, into ``out_dir``'s store. ``pairing``: ``processes`` (each
    case at each version a process of its own, the versions' processes one after another) or ``blocks`` (each round
    one process that builds every case at every version and times them together, interleaved block by block, a
    case's versions adjacent in each of its rounds). The versions' order in each round is balanced
    (``versions_order``), and each row keeps the places its version took (``process_positions``). ``reuse``: (case,
    version) rows already stored and measured ok are kept and not run again (track; a failed row is run again and
    replaced); else a store holding any of them is refused (ab: rows timed together are not mixed with older ones). A
    store of another kind of run (a sweep's, or track's for ab) is refused. ``on_event(kind, **info)``: "start" (total
    processes), "process_start" (case, version, round; blocks: version None, the round's first case), "process_done"
    (the same, with its row; blocks: once a round, the row None, and its ``rows`` with their ``row_versions``),
    "finish" (summary). ``record``: more to keep in the
    run's sweep record (the threshold its report judges by). ``aa``: a second copy of the first version runs beside
    the others in each round (``aa_copy``), the A/A pair the noise floor is measured from. A full disk is one
    PerflabError naming the store and what it keeps."""
    from perflab.sweep.launcher import choose_launcher
    from perflab.sweep.lifecycle import SweepSession
    from perflab.sweep.runner import case_timeout, worker_slots
    from perflab.sweep.store import Store, reading, run_kinds, store_path

    out_dir = Path(out_dir)
    check_rounds(rounds)
    check_order(order)
    check_pairing(pairing, any(v.kind == "python" for v in plan.versions), plan.cases)
    check_balance(pairing, rounds)
    check_seed(seed, order, pairing, len(plan.cases))
    seed = 0 if seed is None else seed
    copy = aa_copy(plan.versions[0]) if aa else None
    everyone = plan.versions + ([copy] if copy else [])
    experiment = plan.versions[0].experiment
    worker_slots(experiment, None, 1)  # CUDA cases where CUDA is not: refused in one line here, before any process starts
    timeout_s = case_timeout(experiment, timeout_s)
    launcher = choose_launcher(launcher)
    if store_path(out_dir).is_file():  # refuse before the directory's lock or anything else is written
        with Store.open(out_dir) as store, reading(store.path):  # a damaged store: one line naming it
            other = sorted(run_kinds(store) - {kind})
            stored = sum(len(store.statuses(v.env_key)) for v in everyone)
        if other:
            raise PerflabError(f"{out_dir} holds the results of {' and '.join(_KIND_WORDS.get(k, k) for k in other)}, not of {kind}: a store "
                               f"holds one kind of run (its report and compare read one); give {kind} another --out")
        if stored and not reuse:
            raise PerflabError(f"{out_dir} already holds {stored} row(s) of these versions; give another --out")
    summary = VersionsSummary(out_dir, uuid.uuid4().hex[:12], plan.versions, plan.cases, rounds, pairing, copy)
    again = ("run ab again with another --out (ab does not add rows to a store that holds its versions)" if kind == "ab" else
             f"run {kind} again: it reuses the rows stored")
    with SweepSession(out_dir, summary, on_event=on_event, again=again, kept="each committed when its case's last round ended") as sweep:
        _run_rounds(plan, everyone, sweep, summary, out_dir, rounds=rounds, order=order, seed=seed, timeout_s=timeout_s, reuse=reuse,
                    command=command, kind=kind, launcher=launcher, record=record, pairing=pairing)
    return summary


_KIND_WORDS = {"sweep": "a sweep", "ab": "an ab run", "track": "a track run"}


def reusable(row: dict, version: Version) -> bool:
    """Whether a stored row may stand for ``version`` in a later run: measured ok, and stored as this version's."""
    return row.get("status") == "ok" and row_version(row).get("key") == version.key


def to_run(store, versions: list[Version], reuse: bool) -> tuple[set, set, int]:
    """(the (case id, version key) pairs to run, those of them whose stored row the new one replaces, how many stored
    rows are reused). ``reuse``: a stored row that is ``reusable`` is kept; any other (a failed row, or one stored under
    this version's key that is not its own) is measured again and replaced."""
    todo, replace, reused = set(), set(), 0
    for v in versions:
        present = store.statuses(v.env_key)
        kept = {row["case_id"]: row for row in store.rows(v.env_key)} if reuse else {}
        for case in v.experiment.cases:
            if case.id in kept and reusable(kept[case.id], v):
                reused += 1
                continue
            todo.add((case.id, v.key))
            if case.id in present:
                replace.add((case.id, v.key))
    return todo, replace, reused


def _run_rounds(plan: Plan, everyone: list[Version], sweep, summary: VersionsSummary, out_dir: Path, *, rounds: int, order: str, seed: int,
                timeout_s: float, reuse: bool, command: str, kind: str, launcher: str, record: dict | None, pairing: str) -> None:
    """``run_versions``' rounds, into the open ``sweep`` (a ``sweep.lifecycle.SweepSession``): every version of
    ``everyone`` (the plan's, and the A/A copy where there is one) in each round."""
    from perflab.measure.harness import merge_processes
    from perflab.sweep.runner import Forks, run_case_in_subprocess, worker_args

    experiment = plan.versions[0].experiment
    session = summary.session
    store, emit = sweep.store, sweep.emit
    todo, replace, summary.reused = to_run(store, everyone, reuse)
    spec = dict(experiment.to_json(), versions=[v.info() for v in plan.versions], kind=kind, rounds=rounds, order=order,
                seed=seed, session=session, pairing=pairing, **(record or {}))
    if summary.copy is not None:
        spec["aa"] = summary.copy.info()
    blocks = pairing == "blocks"
    per_round = sum(1 for c in plan.cases for v in everyone if (c.id, v.key) in todo)
    sweep.begin([(v.env_key, v.env) for v in everyone], experiment=experiment, record=spec,
                env_key=",".join(v.env_key for v in everyone), n_cases=len(plan.cases) * len(everyone),
                n_skipped=summary.reused, command=command,
                start=dict(total=(min(per_round, 1) if blocks else per_round) * rounds, reused=summary.reused, versions=plan.versions,
                           rounds=rounds))
    forks: dict = {}
    runs: dict[tuple[str, str], list] = {}  # (case id, version key) → (start time, index into processes, places) per round
    processes: list[dict] = []  # every process's row of this run, in the order they ran (blocks: a row per case per version)

    def fork_of(v: Version):
        return forks.setdefault(v.python, Forks(str(out_dir), python=v.python, env=v.worker_env or None)) if launcher == "fork" else None

    def done(c: int, vi: int, r: int, started: float, row: dict, places: list[int] | None) -> None:
        v = everyone[vi]
        case, vcase = plan.cases[c], v.experiment.cases[c]
        runs.setdefault((case.id, v.key), []).append((started, len(processes), places))
        processes.append(row)
        if r == rounds - 1:
            merged = _merge(vcase, runs.pop((case.id, v.key)), processes, merge_processes)
            merged["version"] = dict(v.info(), session=session, rounds=rounds, order=order, position=vi, kind_of_run=kind,
                                     pairing=pairing)
            sweep.put(merged, v.env_key, worker="w0", replace=(case.id, v.key) in replace)
            summary.rows[(case.id, v.key)] = merged

    def run_rounds() -> None:
        try:
            for r in range(rounds):
                jobs = [(c, vi) for c, case in enumerate(plan.cases)
                        for vi in versions_order(len(everyone), r, c, order, seed) if (case.id, everyone[vi].key) in todo]
                if blocks and jobs:
                    emit("process_start", case=everyone[jobs[0][1]].experiment.cases[jobs[0][0]], version=None, round=r)
                    started = time.time()
                    args = worker_args(plan.versions[0].experiment, out_dir) + ["--order", order]
                    rows = _run_together(plan, everyone, jobs, r, out_dir, timeout_s * len(jobs), seed, fork_of(plan.versions[0]),
                                         args, run_case_in_subprocess)
                    summary.done += 1
                    places = block_places(rows, [c for c, _ in jobs])
                    for (c, vi), row, these in zip(jobs, rows, places):
                        done(c, vi, r, started, row, these)
                    emit("process_done", case=everyone[jobs[0][1]].experiment.cases[jobs[0][0]], version=None, round=r,
                         row=None, rows=rows, row_versions=[everyone[vi] for _, vi in jobs])
                    continue
                for c, vi in jobs:
                    v = everyone[vi]
                    vcase = v.experiment.cases[c]
                    emit("process_start", case=vcase, version=v, round=r)
                    args = worker_args(v.experiment, out_dir) + ["--flops-cache", str((out_dir / "flops" / v.env_key).resolve())]
                    started = time.time()
                    row, _ = run_case_in_subprocess(vcase, out_dir, timeout_s, dict(v.env, device=vcase.device), extra_args=args,
                                                    forks=fork_of(v), python=v.python, worker_env=_worker_env(v),
                                                    tag=f"-{v.slug}-r{r}")
                    summary.done += 1
                    done(c, vi, r, started, row, [[w for cc, w in jobs if cc == c].index(vi)])
                    emit("process_done", case=vcase, version=v, round=r, row=row)
        finally:
            for fork in forks.values():
                fork.close()

    sweep.drive(run_rounds)
    summary.stored = sweep.stored  # the session counts each row it commits
    for v in everyone:  # the rows this run reused, read back for the comparison
        for row in store.rows(v.env_key):
            if row_version(row).get("key") == v.key:
                summary.rows.setdefault((row["case_id"], v.key), row)


def block_places(rows: list[dict], groups: list) -> list[list[int] | None]:
    """For each row of a blocks round (``groups``: each row's case), the place its block took beside the other versions'
    blocks of its case in each interleaved round it timed, in its samples' order (0: first), read from when each block
    began (``sample_started_s``, comparable within one interleaved session); None for a row without timed blocks."""
    began: dict[tuple, list[tuple[float, int]]] = {}
    for k, row in enumerate(rows):
        for t, j in zip(row.get("sample_started_s") or [], row.get("sample_rounds") or []):
            began.setdefault((groups[k], row.get("session"), j), []).append((t, k))
    place = {}
    for key, blocks in began.items():
        for p, (_, k) in enumerate(sorted(blocks)):
            place[(k, key[2])] = p
    return [[place[(k, j)] for j in row["sample_rounds"]] if row.get("sample_started_s") and row.get("sample_rounds") else None
            for k, row in enumerate(rows)]


def _run_together(plan: Plan, everyone: list[Version], jobs: list[tuple[int, int]], r: int, out_dir: Path, timeout_s: float, seed: int,
                  fork, args: list[str], run_case_in_subprocess) -> list[dict]:
    """One round of the blocks pairing: ``jobs`` ((case index, version index) pairs) in one fresh worker process
    (``sweep.worker --together``), each version's case built in its version's worktree, a case's versions one group of
    the interleaved order (adjacent in each round). Their rows in ``jobs``' order; where the process failed (a crash, a
    timeout), each case's row says so."""
    from perflab.measure.harness import failed_row

    entries = []
    for c, vi in jobs:
        v = everyone[vi]
        entries.append({"case": v.experiment.cases[c].to_dict(), "model_root": v.experiment.model_root or str(v.root or ""), "group": c})
    path = (out_dir / "tmp" / f"together-r{r}.json").resolve()
    path.write_text(json.dumps(entries))
    first = everyone[jobs[0][1]]
    try:
        result, _ = run_case_in_subprocess(first.experiment.cases[jobs[0][0]], out_dir, timeout_s, dict(first.env, device=plan.cases[jobs[0][0]].device),
                                           extra_args=args + ["--together", str(path), "--seed", str(seed + r)], forks=fork,
                                           python=sys.executable, worker_env=_worker_env(first), tag=f"-blocks-r{r}")
    finally:
        path.unlink(missing_ok=True)
    rows = result.get("rows")
    if not isinstance(rows, list) or len(rows) != len(jobs):  # the process failed: its one row says how
        rows = [failed_row(everyone[vi].experiment.cases[c], result.get("status") or "error",
                           result.get("message") or "the process gave no rows", dict(everyone[vi].env, device=plan.cases[c].device))
                for c, vi in jobs]
    for row in rows:
        row.setdefault("cost_s", None)
    return rows


def _worker_env(version: Version) -> dict:
    """A revision's worker: a sweep's (this interpreter, this perflab); an interpreter's: ``interpreter_env``."""
    from perflab.sweep.runner import slot_env

    return dict(version.worker_env) if version.kind == "python" else slot_env("w0", 1)


def _merge(case: Case, runs: list[tuple[float, int, list[int] | None]], processes: list[dict], merge_processes) -> dict:
    """One row from a case's processes at one version (rounds in order, indices into ``processes``, every process of the
    run so far): merged as ``bench --processes`` merges, with each round's host flags (``process_flags``)."""
    from perflab.measure.canary import CANARY_KEY, mark_host_flags

    rows = [processes[i] for _, i, _ in runs]
    if len(rows) == 1:
        merged = dict(rows[0])
        if merged.get("status") == "ok":
            merged["process_medians_ms"] = [merged["median_ms"]]
            merged["processes"] = 1
    else:
        merged = merge_processes([case], [[row] for row in rows], read_peaks=False)[0]
    merged["process_started_at"] = [t for t, _, _ in runs]
    # the order used: per round, the place this version took among its case's versions in each of the round's pairings
    # (processes: its process's place in the round; blocks: its block's in each interleaved round); 0 is first
    merged["process_positions"] = [places for _, _, places in runs]
    # Each round's host flags, for the pairs: host_contention (its own wait for a CPU) and host_drift (its canary against
    # the median canary of every process of this run, whatever its case and version: the canary runs the same code)
    judged = mark_host_flags(processes, group=lambda row: "run")
    merged["process_flags"] = [list(judged[i].get("flags") or []) for _, i, _ in runs]
    merged["process_canary_us"] = [row.get(CANARY_KEY) for row in rows]
    if any(row.get("worker_pid") for row in rows):  # blocks: the process and the interleaved session each round's blocks ran in
        merged["process_pids"] = [row.get("worker_pid") for row in rows]
        merged["process_sessions"] = [row.get("session") for row in rows]
    return merged


def make_bench_experiment(name: str, source: str, cases: list[Case], model_root: Path | None, timeout_s: float | None = None) -> Experiment:
    """The experiment of bench flags (``make_cases``' cases) for the versions' runner."""
    from perflab.sweep.experiment import DEFAULT_TIMEOUT_S

    return Experiment(source=source, name=name, description=f"{name} of bench flags", out=None,
                      timeout_s=float(timeout_s or DEFAULT_TIMEOUT_S), cases=tuple(cases), model_root=str(model_root or ""))
