"""Hostile inputs, round 3, thrown at perflab's command line on the CPU as a hostile user would.

Usage:
    PYTHONPATH=src python benchmarks/hostile_cpu.py [--out FILE.json] [--only NAME ...] [--timeout S] [--list]

Each input runs perflab in a fresh subprocess (``python -m perflab ...``) with a timeout, in a temporary directory of
its own, and its outcome is classified, worst first:

- ``hang``: the timeout expired;
- ``traceback``: perflab's own traceback ("Traceback (most recent call last)" whose frames lie in perflab's files,
  ``.../perflab/...``); the user's program's traceback, which perflab re-prints as the program's, is not counted;
- ``data_loss``: something stored before the input ran (a store, a run directory, a file) is gone or changed;
- ``bad_exit``: a bad input that did not end with exit code 2 and ONE line on stderr (progress lines
  ``perflab CMD: ... elapsed ...`` set aside);
- ``wrong``: the input's own check failed (each input's ``check`` says what it is);
- ``skipped``: the input cannot be run here (the reason is given);
- ``ok`` otherwise.

It prints a table (input, expected, outcome, exit code, first stderr line, seconds), writes every input's record to
``--out`` (JSON), and always exits 0: it is a measurement, not a test. Inputs are tiny (a 2-layer Linear trained for a
few steps); the whole script takes a few minutes on a 2-core machine. Run it one at a time (no parallel runs).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
TIMEOUT = 120.0
SHORT = ["--skip", "2", "--steps", "4", "--trace", "1", "--trace-warmup", "1"]

# A training loop of ``steps`` AdamW steps on a 2-layer Linear; ``before`` runs at the top of each iteration (``i`` the
# 0-based iteration); prints "last line" at its end.
TRAIN = """\
import os, sys, time, torch
torch.set_num_threads(1)
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
opt = torch.optim.AdamW(m.parameters(), lr=0.01)
for i in range({steps}):
{before}
    m(torch.randn(8, 16)).square().mean().backward()
    opt.step()
    opt.zero_grad()
{after}
print("last line")
"""


def train(steps: int, before: str = "    pass", after: str = "") -> str:
    return TRAIN.format(steps=steps, before=before, after=after)


# --------------------------------------------------------------------------------------------------------------------
# running perflab


@dataclass
class Done:
    argv: list
    rc: int | None
    out: str
    err: str
    seconds: float
    hang: bool


def perflab(args, cwd: Path, timeout: float | None = None, env: dict | None = None) -> Done:
    """``python -m perflab ARGS`` in a fresh process, in ``cwd``, with perflab's src first on PYTHONPATH."""
    environ = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH", "")) if p),
                   PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    environ.pop("PERFLAB_PROGRESS_S", None)
    environ.update(env or {})
    argv = [PY, "-m", "perflab", *map(str, args)]
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=cwd, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            errors="replace", start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout or TIMEOUT)
        hang = False
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        hang = True
    return Done([str(a) for a in args], proc.returncode, out or "", err or "", time.monotonic() - t0, hang)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux /proc), children first found first: torchrun's workers run in sessions of
    their own, out of reach of a signal to perflab's process group."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            kids = [int(k) for t in os.listdir(f"/proc/{p}/task") for k in open(f"/proc/{p}/task/{t}/children").read().split()]
        except OSError:
            kids = []
        found += kids
        todo += kids
    return found


def alive(pids) -> list[int]:
    left = []
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    left.append(p)
        except OSError:
            pass
    return left


def _kill_group(proc) -> None:
    """SIGKILL perflab's process, its group and every process below it (only those this script started)."""
    for p in [*descendants(proc.pid), proc.pid]:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def git(repo: Path, *args) -> str:
    return subprocess.run(["git", "-C", str(repo), *map(str, args)], check=True, capture_output=True, text=True).stdout.strip()


def new_repo(path: Path, commits: list[tuple[str, dict]]) -> Path:
    """A git repository at ``path`` with one commit per (tag, {file: text}), each tagged."""
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q")
    git(path, "config", "user.email", "hostile@example.com")
    git(path, "config", "user.name", "hostile inputs")
    for tag, files in commits:
        for name, text in files.items():
            (path / name).write_text(text)
        git(path, "add", "-A")
        git(path, "commit", "-q", "-m", tag)
        git(path, "tag", tag)
    return path


def worktrees(repo: Path) -> int:
    return git(repo, "worktree", "list", "--porcelain").count("worktree ")


# --------------------------------------------------------------------------------------------------------------------
# classification

PROGRESS = re.compile(r"^perflab [^:]+: .*\belapsed\b")  # perflab sweep: 3/6 cases, 0:10 elapsed ...; perflab ab of x.py: ...
TB_START = "Traceback (most recent call last)"
PERFLAB_FRAME = re.compile(r'File "[^"]*[/\\]perflab[/\\][^"]*"')


def perflab_traceback(text: str) -> str | None:
    """The first line of a traceback whose frames are in perflab's own files (``.../perflab/...``), else None: each
    traceback block runs from its header through the indented frame lines after it."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if TB_START not in line:
            continue
        j = i + 1
        while j < len(lines) and (lines[j].startswith(" ") or lines[j].startswith("\t")):
            if PERFLAB_FRAME.search(lines[j]):
                end = j
                while end < len(lines) and lines[end].startswith((" ", "\t")):
                    end += 1
                return (lines[end] if end < len(lines) else lines[j]).strip()
            j += 1
    return None


def stderr_lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.strip() and not PROGRESS.match(ln)]


def one_line_exit_2(d: Done) -> str | None:
    """None where ``d`` ended with exit code 2 and one line on stderr; else what it did instead."""
    lines = stderr_lines(d.err)
    if d.rc == 2 and len(lines) == 1:
        return None
    return f"exit {d.rc}, {len(lines)} stderr line(s)"


@dataclass
class Record:
    name: str
    expected: str
    check: str
    outcome: str = "ok"
    rc: int | None = None
    first_stderr: str = ""
    seconds: float = 0.0
    detail: list = field(default_factory=list)
    commands: list = field(default_factory=list)


class Judge:
    """Collects one input's findings over its commands; the outcome is the worst one found."""

    ORDER = ["hang", "traceback", "data_loss", "bad_exit", "wrong", "skipped", "ok"]

    def __init__(self, record: Record):
        self.r = record
        self.found = set()

    def saw(self, d: Done, *, one_line: bool = False) -> Done:
        """Note a command: its hang, perflab's traceback, and (``one_line``) exit 2 with one stderr line."""
        lines = stderr_lines(d.err)
        entry = {"argv": d.argv, "rc": d.rc, "seconds": round(d.seconds, 2), "hang": d.hang,
                 "stderr_first": lines[0][:300] if lines else "", "stderr_lines": len(lines),
                 "stderr_tail": d.err[-1500:], "stdout_tail": d.out[-600:]}
        self.r.commands.append(entry)
        if self.r.rc is None or d.rc != 0:  # the record shows the first command's, or the first failing one's
            if self.r.rc in (None, 0):
                self.r.rc, self.r.first_stderr = d.rc, entry["stderr_first"]
        self.r.seconds += d.seconds
        if d.hang:
            self.flag("hang", f"{' '.join(d.argv[:3])}...: no end in the timeout")
        tb = perflab_traceback(d.err) or perflab_traceback(d.out)
        if tb:
            self.flag("traceback", f"perflab's traceback: {tb}")
        if one_line and not d.hang:
            bad = one_line_exit_2(d)
            if bad:
                self.flag("bad_exit", f"{' '.join(d.argv)}: {bad}")
        return d

    def flag(self, outcome: str, why: str) -> None:
        self.found.add(outcome)
        self.r.detail.append(f"{outcome}: {why}")

    def wrong_unless(self, ok: bool, why: str) -> bool:
        if not ok:
            self.flag("wrong", why)
        return ok

    def loss_unless(self, ok: bool, why: str) -> bool:
        if not ok:
            self.flag("data_loss", why)
        return ok

    def skip(self, why: str) -> None:
        self.flag("skipped", why)

    def finish(self) -> Record:
        self.r.outcome = next((o for o in self.ORDER if o in self.found), "ok")
        self.r.seconds = round(self.r.seconds, 2)
        return self.r


def tree(path: Path) -> dict:
    """Every file under ``path`` (relative name: size, mtime_ns) - what was stored, to compare after."""
    if path.is_file():
        st = path.stat()
        return {".": (st.st_size, st.st_mtime_ns)}
    return {str(p.relative_to(path)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(path.rglob("*")) if p.is_file()}


def tree_changes(before: dict, after: dict) -> list[str]:
    gone = [k for k in before if k not in after]
    changed = [k for k in before if k in after and after[k] != before[k]]
    return [f"gone: {k}" for k in gone] + [f"changed: {k}" for k in changed]


def load(path: Path):
    try:
        return json.loads(path.read_text())
    except Exception:  # noqa: BLE001 - a damaged file is a finding, not a crash of this script
        return None


def wide(**extra) -> dict:
    return dict(COLUMNS="1000", **extra)


# --------------------------------------------------------------------------------------------------------------------
# the inputs: each a function(tmp: Path, judge: Judge); registered with its expectation and check


INPUTS: list[tuple[str, str, str, Callable]] = []


def hostile(name: str, expected: str, check: str):
    def register(fn):
        INPUTS.append((name, expected, check, fn))
        return fn
    return register


def bad_run_args(tmp: Path, j: Judge, *args, prog: str = "prog.py") -> Done:
    """``perflab run ARGS --out o -- prog``: one line, exit 2, nothing created in --out."""
    (tmp / "prog.py").write_text(train(8))
    d = j.saw(perflab(["run", *args, "--out", tmp / "o", "--", prog], tmp), one_line=True)
    j.loss_unless(not (tmp / "o").exists(), f"--out {tmp / 'o'} was created by a refused run")
    return d


INDEP = """\
import os, sys, torch
torch.set_num_threads(1)
rank = int(os.environ.get("RANK", "0"))
stop = int(sys.argv[2]) if len(sys.argv) > 2 else -1
m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 4))
opt = torch.optim.AdamW(m.parameters(), lr=0.01)
for i in range(int(sys.argv[1])):
    if rank == 1 and i == stop:
        print(f"rank 1 stops at step {i}", flush=True)
        os._exit(0)
    m(torch.randn(8, 16)).sum().backward(); opt.step(); opt.zero_grad()
print("last line")
"""
NPROC_RUN = ["--skip", "5", "--steps", "8", "--trace", "1", "--trace-warmup", "1"]


@hostile("01-stale-rank-report", "rank 1 not credited with the first run's steps",
         "second run into the same --out, rank 1 os._exit(0) at step 15 (before its report): o/rank1/rank.json's run_id == "
         "run.json's run_id, or run.json/stderr say rank 1 ended early/failed; and run.json's ranks do not hold the first run's "
         "rank 1 figures")
def stale_rank(tmp, j):
    (tmp / "indep.py").write_text(INDEP)
    first = j.saw(perflab(["run", "--nproc", "2", *NPROC_RUN, "--out", "o", "--", "indep.py", "40"], tmp))
    if first.rc != 0 or not (tmp / "o" / "rank1" / "rank.json").exists():
        j.skip(f"--nproc 2 on the CPU did not run here (exit {first.rc}): {(stderr_lines(first.err) or [''])[-1][:200]}")
        return
    old = load(tmp / "o" / "rank1" / "rank.json") or {}
    second = j.saw(perflab(["run", "--nproc", "2", *NPROC_RUN, "--out", "o", "--", "indep.py", "40", "15"], tmp))
    run = load(tmp / "o" / "run.json") or {}
    rank1 = load(tmp / "o" / "rank1" / "rank.json") or {}
    fresh = rank1.get("run_id") and rank1.get("run_id") == run.get("run_id") and rank1.get("run_id") != old.get("run_id")
    said = re.search(r"rank 1\b[^\n]*(ended|exited|failed|early|no report|partial|missing)", second.err) is not None
    j.r.detail.append(f"first run_id {old.get('run_id')}, second run.json run_id {run.get('run_id')}, rank1 run_id {rank1.get('run_id')}, "
                      f"rank 1 said ended early: {said}, second exit {second.rc}")
    if second.hang:  # the hang is the finding; what a run killed mid-way left is not judged
        return
    j.wrong_unless(bool(run), "no run.json after the second run")
    j.wrong_unless(fresh or said, "rank 1 credited with the first run's report: rank1/rank.json's run_id is not the second run's "
                   "and nothing says rank 1 ended early")


@hostile("02a-nproc-20-digits", "one line, exit 2, nothing created", "--nproc 100000000000000000000: one line, exit 2, no --out")
def nproc_huge(tmp, j):
    bad_run_args(tmp, j, "--nproc", "100000000000000000000")


@hostile("02b-nproc-1e6", "one line, exit 2, nothing created", "--nproc 1000000: one line, exit 2, no --out, no hang")
def nproc_million(tmp, j):
    bad_run_args(tmp, j, "--nproc", "1000000")


@hostile("03-os-exit-in-trace", "run.json with the timed steps (partial)",
         "os._exit(0) at iteration 10 (2 skipped, 6 timed, 1 between, 1 warm-up, traced): run.json exists, partial, timing.steps == 6")
def os_exit(tmp, j):
    (tmp / "prog.py").write_text(train(40, "    if i == 10:\n        os._exit(0)"))
    j.saw(perflab(["run", "--skip", "2", "--steps", "6", "--trace-warmup", "1", "--trace", "3", "--out", "o", "--", "prog.py"], tmp))
    run = load(tmp / "o" / "run.json")
    if j.wrong_unless(run is not None, "no readable run.json after os._exit in the traced steps"):
        j.wrong_unless(run.get("partial") is True and (run.get("timing") or {}).get("steps") == 6,
                       f"run.json partial={run.get('partial')} timing.steps={(run.get('timing') or {}).get('steps')} (expected partial, 6)")


@hostile("04-failing-rank", "one line naming rank 1, its exit code, its last stderr line; no ChildFailedError",
         "--nproc 2, rank 1 raises RuntimeError at step 3: a 'perflab: rank 1 exited with code 1 ... RuntimeError: rank one gives up' "
         "line; no ChildFailedError/'perflab FAILED' in stderr; exit non-zero")
def failing_rank(tmp, j):
    (tmp / "prog.py").write_text(train(20, "    if i == 3 and os.environ.get('RANK') == '1':\n        raise RuntimeError('rank one gives up')"))
    d = j.saw(perflab(["run", "--nproc", "2", "--skip", "1", "--steps", "6", "--trace", "0", "--out", "o", "--", "prog.py"], tmp, timeout=180))
    lines = [ln for ln in d.err.splitlines() if ln.startswith("perflab:") and "rank 1" in ln]
    j.r.detail.append(f"perflab's rank lines: {lines[:3]}")
    j.wrong_unless(d.rc not in (0, None), f"exit {d.rc} for a failed rank")
    j.wrong_unless("ChildFailedError" not in d.err and "perflab FAILED" not in d.err, "torchrun's ChildFailedError report in stderr")
    j.wrong_unless(len(lines) == 1 and re.search(r"code 1\b", lines[0]) is not None and "RuntimeError: rank one gives up" in lines[0],
                   f"no single line naming rank 1, code 1 and its last words: {lines}")


@hostile("05-bimodal-steps", "median inside its own 95% CI; a bimodal flag",
         "steps alternating sleep 0.4 ms / 45 ms, 24 timed: run.json timing.median_ms within timing.ci95_ms, flags hold 'bimodal'; "
         "(ours) the CI does not reach past 2x the slowest step or below half the fastest")
def bimodal(tmp, j):
    (tmp / "prog.py").write_text(train(30, "    time.sleep(0.0004 if i % 2 else 0.045)"))
    j.saw(perflab(["run", "--skip", "2", "--steps", "24", "--trace", "0", "--out", "o", "--", "prog.py"], tmp))
    run = load(tmp / "o" / "run.json")
    if not j.wrong_unless(run is not None, "no run.json"):
        return
    t = run.get("timing") or {}
    ci = t.get("ci95_ms") or t.get("ci_ms")
    flags = [f.get("flag") for f in run.get("flags") or []]
    j.r.detail.append(f"median_ms {t.get('median_ms')}, ci95_ms {ci}, ci_level {t.get('ci_level')}, flags {flags}")
    j.wrong_unless(bool(ci) and ci[0] <= t.get("median_ms", -1) <= ci[1], f"median {t.get('median_ms')} outside its CI {ci}")
    j.wrong_unless("bimodal" in flags, f"no bimodal flag: {flags}")
    samples = t.get("samples_ms") or []
    if ci and samples:
        j.wrong_unless(ci[1] <= 2 * max(samples) and ci[0] >= min(samples) / 2,
                       f"the CI {ci[0]:.3f}-{ci[1]:.3f} ms reaches far past the steps ({min(samples):.3f}-{max(samples):.3f} ms)")


@hostile("06-step-in-thread", "steps found", "--step step, step() called only in a threading.Thread: run.json timing.steps > 0")
def step_in_thread(tmp, j):
    (tmp / "prog.py").write_text(textwrap.dedent("""\
        import threading, torch
        torch.set_num_threads(1)
        w = torch.randn(64, 64)
        def step(x):
            return (x @ w).relu().sum()
        def worker():
            for i in range(14):
                step(torch.randn(8, 64))
        t = threading.Thread(target=worker)
        t.start(); t.join()
        print("last line")
    """))
    d = j.saw(perflab(["run", "--step", "step", "--skip", "2", "--steps", "6", "--trace", "0", "--out", "o", "--", "prog.py"], tmp))
    run = load(tmp / "o" / "run.json")
    steps = ((run or {}).get("timing") or {}).get("steps")
    j.r.detail.append(f"exit {d.rc}, timing.steps {steps}")
    j.wrong_unless(bool(steps), f"no steps found (timing.steps {steps})")


INFLATED = """\
import torch
torch.set_num_threads(1)
w = [torch.randn(4, 4, requires_grad=True) for _ in range(4)]
opt = torch.optim.SGD(w, lr=0.001)
for i in range(16):
    x = torch.randn(4, 4)
    for _ in range(150):  # many tiny operators: the profiler's cost per operator dwarfs their work
        x = (x @ w[_ % 4]).tanh()
    x.sum().backward()
    opt.step(); opt.zero_grad()
print("last line")
"""
TIME_FIGURE = re.compile(r"([\d][\d,]*(?:\.\d+)?) ?(µs|us|ms)")


def as_ms(number: str, unit: str) -> float:
    value = float(number.replace(",", ""))
    return value / 1000 if unit in ("µs", "us") else value


@hostile("07-inflated-verdict", "no operator time above the untraced step; the verdict once",
         "many tiny operators (strongly inflated traced steps): run.json verdict.busy_ms <= the untraced step; the 'verdict:' line "
         "quotes no operator time (a figure before 'in operators'/after 'operators ran') above the untraced step; the verdict's "
         "sentence appears once in stderr (COLUMNS=1000)")
def inflated(tmp, j):
    (tmp / "prog.py").write_text(INFLATED)
    d = j.saw(perflab(["run", "--skip", "2", "--steps", "4", "--trace", "2", "--trace-warmup", "1", "--out", "o", "--", "prog.py"], tmp, env=wide()))
    run = load(tmp / "o" / "run.json")
    if not j.wrong_unless(run is not None, "no run.json"):
        return
    v = run.get("verdict") or {}
    untraced = max(x for x in (v.get("step_ms"), (run.get("timing") or {}).get("median_ms"), (run.get("loop") or {}).get("mean_ms")) if x)
    inflation = (run.get("traced") or {}).get("inflation")
    j.r.detail.append(f"inflation {inflation}, untraced step {untraced:.3f} ms, verdict.busy_ms {v.get('busy_ms')}, verdict {v.get('message')}")
    if v.get("busy_ms") is not None:
        j.wrong_unless(v["busy_ms"] <= untraced * 1.001, f"verdict.busy_ms {v['busy_ms']:.3f} > the untraced step {untraced:.3f} ms")
    verdict_lines = [ln for ln in d.err.splitlines() if ln.startswith("verdict:")]
    for ln in verdict_lines:
        for m in re.finditer(r"([\d][\d,]*(?:\.\d+)?) ?(µs|us|ms) (?:in|of) (?:torch's )?operators|operators (?:ran|took|busy)(?: for)? "
                             r"([\d][\d,]*(?:\.\d+)?) ?(µs|us|ms)", ln):
            number, unit = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
            ms = as_ms(number, unit)
            j.wrong_unless(ms <= untraced * 1.001, f"the verdict quotes operator time {number} {unit} > the untraced step {untraced:.3f} ms")
    sentence = (v.get("message") or "")[:60]
    if sentence:
        count = d.err.count(sentence)
        j.wrong_unless(count <= 1, f"the verdict's sentence printed {count} times")
    j.wrong_unless(len(verdict_lines) <= 1, f"{len(verdict_lines)} 'verdict:' lines")


@hostile("08a-nproc-2-1", "scaling over 2 (the first count)", "--nproc 2,1: run.json's scaling base is 2, or the output says 'over 2'")
def nproc_list(tmp, j):
    (tmp / "prog.py").write_text(train(14))
    d = j.saw(perflab(["run", "--nproc", "2,1", *SHORT, "--out", "o", "--", "prog.py"], tmp, timeout=240, env=wide()))
    bases = []  # every "base" of a scaling section in the JSON files under o
    for path in sorted((tmp / "o").rglob("*.json")) if (tmp / "o").exists() else []:
        doc = load(path)
        if isinstance(doc, dict) and isinstance(doc.get("scaling"), dict):
            bases.append((str(path.relative_to(tmp)), doc["scaling"].get("base")))
    said = re.findall(r"scaling over (\d+) rank", d.err)
    j.r.detail.append(f"exit {d.rc}, scaling sections (file, base): {bases}, 'scaling over N rank' said: {said}")
    if d.rc != 0 and not said and not bases:
        j.skip(f"--nproc 2,1 did not run here (exit {d.rc}): {(stderr_lines(d.err) or [''])[-1][:200]}")
        return
    j.wrong_unless(bool(said or bases), "no scaling section found")
    j.wrong_unless(all(n == "2" for n in said) and all(b == 2 for _, b in bases), f"scaling over {said}, bases {bases} (2 expected)")


@hostile("08b-nproc-0", "one line, exit 2, no directory left", "--nproc 0: one line, exit 2, --out not created")
def nproc_zero(tmp, j):
    bad_run_args(tmp, j, "--nproc", "0")


@hostile("09-no-shapes", "no 'no FLOP formula' wording", "--no-shapes: neither stdout nor stderr nor run.json says 'no FLOP formula'")
def no_shapes(tmp, j):
    (tmp / "prog.py").write_text(train(12))
    d = j.saw(perflab(["run", "--no-shapes", *SHORT, "--out", "o", "--", "prog.py"], tmp, env=wide()))
    text = d.out + d.err + ((tmp / "o" / "run.json").read_text() if (tmp / "o" / "run.json").exists() else "")
    j.wrong_unless(d.rc == 0, f"exit {d.rc}")
    j.wrong_unless("no FLOP formula" not in text, "'no FLOP formula' said under --no-shapes")


for _value in ("100", "inf", "nan", "1"):
    def _limit(tmp, j, value=_value):
        bad_run_args(tmp, j, "--inflation-limit", value)
    hostile(f"10-inflation-limit-{_value}", "one line, exit 2", f"--inflation-limit {_value}: one line, exit 2, --out not created")(_limit)


@hostile("11-report-empty-sqlite", "one line, exit 2; the 0-byte file left 0 bytes",
         "perflab report DIR where DIR/results.sqlite is 0 bytes: one line, exit 2, the file still 0 bytes and nothing else created")
def report_empty(tmp, j):
    (tmp / "store").mkdir()
    (tmp / "store" / "results.sqlite").write_bytes(b"")
    before = tree(tmp / "store")
    j.saw(perflab(["report", "store"], tmp), one_line=True)
    size = (tmp / "store" / "results.sqlite").stat().st_size if (tmp / "store" / "results.sqlite").exists() else None
    j.loss_unless(size == 0, f"results.sqlite is now {size} bytes (was 0)")
    after = tree(tmp / "store")
    j.wrong_unless(set(after) == set(before), f"files created: {sorted(set(after) - set(before))}")


def bench_rows(tmp: Path, j: Judge, name: str = "rows.jsonl") -> Path | None:
    d = j.saw(perflab(["bench", "--model", "test:tiny", "--device", "cpu", "--batch-size", "1", "--input-size", "32", "--min-time", "0.05",
                       "--warmup", "1", "--repeats", "5", "--out", name], tmp))
    if d.rc != 0 or not (tmp / name).exists():
        j.flag("wrong", f"bench --out {name} failed (exit {d.rc}): {(stderr_lines(d.err) or [''])[-1][:200]}")
        return None
    return tmp / name


def works_or_points_elsewhere(j: Judge, d: Done, what: str) -> None:
    said = d.out + d.err
    j.wrong_unless("perflab sweep" not in said, f"{what}: tells the user to run perflab sweep: {(stderr_lines(d.err) or [''])[0][:200]}")
    if d.rc != 0:
        j.wrong_unless(d.rc == 2 and len(stderr_lines(d.err)) == 1, f"{what}: failed without one line and exit 2 (exit {d.rc})")
        j.wrong_unless(re.search(r"perflab \w+|use |run |instead", stderr_lines(d.err)[0] if stderr_lines(d.err) else "") is not None,
                       f"{what}: refused without saying what to run instead")


@hostile("12a-results-of-bench-file", "works, or says what to run instead (not perflab sweep)",
         "perflab results rows.jsonl (bench --out): exit 0, or one line exit 2 naming another command; never 'perflab sweep'")
def results_bench(tmp, j):
    rows = bench_rows(tmp, j)
    if rows:
        before = tree(rows)
        d = j.saw(perflab(["results", rows.name], tmp))
        works_or_points_elsewhere(j, d, "results of a bench file")
        j.loss_unless(not tree_changes(before, tree(rows)), "the bench file changed")


@hostile("12b-report-of-run-dir", "works, or says what to run instead (not perflab sweep)",
         "perflab report RUN_DIR (a perflab run --out): exit 0 (report.html), or one line exit 2 naming another command; never 'perflab sweep'; "
         "run.json unchanged")
def report_run(tmp, j):
    (tmp / "prog.py").write_text(train(12))
    j.saw(perflab(["run", *SHORT, "--out", "o", "--", "prog.py"], tmp))
    if not (tmp / "o" / "run.json").exists():
        j.flag("wrong", "perflab run wrote no run.json")
        return
    before = tree(tmp / "o" / "run.json")
    d = j.saw(perflab(["report", "o"], tmp))
    works_or_points_elsewhere(j, d, "report of a run directory")
    j.loss_unless(not tree_changes(before, tree(tmp / "o" / "run.json")), "run.json changed")


SPEC = """\
name: hostile_tiny
description: one tiny CPU case, for the CSV export
defaults:
  device: cpu
  batch_size: 1
  input_size: 32
harness:
  warmup: 1
  min_time: 0.05
  repeats: 5
  timeout_s: 120
grid:
  model: [test:tiny]
"""


def as_float(text: str) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


@hostile("13-csv-flops-column", "a 'flops' column holds FLOPs, not GMACs",
         "perflab results STORE --format csv of a one-case CPU sweep: a column named flops equals 2*gmacs*1e9 (where gmacs exists) and is "
         "not the GMAC figure; gflops, where present, is 2*gmacs")
def csv_flops(tmp, j):
    import csv
    import io
    (tmp / "spec.yaml").write_text(SPEC)
    d = j.saw(perflab(["sweep", "spec.yaml", "--out", "store"], tmp))
    if d.rc != 0:
        j.flag("wrong", f"the sweep failed (exit {d.rc}): {(stderr_lines(d.err) or [''])[-1][:200]}")
        return
    c = j.saw(perflab(["results", "store", "--format", "csv"], tmp))
    rows = list(csv.DictReader(io.StringIO(c.out)))
    header = c.out.splitlines()[0].split(",") if c.out.strip() else []
    flop_cols = [h for h in header if "flop" in h.lower() or "mac" in h.lower()]
    j.r.detail.append(f"flop-ish columns {flop_cols}; first row {({k: rows[0].get(k) for k in flop_cols} if rows else None)}")
    if not j.wrong_unless(bool(rows), "no CSV rows"):
        return
    for row in rows:
        gmacs, flops, gflops = as_float(row.get("gmacs")), as_float(row.get("flops")), as_float(row.get("gflops"))
        if "flops" in row:
            if gmacs:
                j.wrong_unless(abs(flops - 2 * gmacs * 1e9) <= 0.02 * 2 * gmacs * 1e9 if flops is not None else False,
                               f"flops {row.get('flops')} is not 2*gmacs*1e9 (gmacs {gmacs})")
            else:
                j.wrong_unless(flops is None or flops > 1e3, f"flops {row.get('flops')} looks like a G-figure")
        if gflops is not None and gmacs:
            j.wrong_unless(abs(gflops - 2 * gmacs) <= 0.02 * 2 * gmacs, f"gflops {gflops} is not 2*gmacs ({gmacs})")


@hostile("14-analyze-80-columns", "no line over 80 columns; figures intact",
         "perflab analyze TRACE at COLUMNS=80 (a perflab run's trace): no line wider than 80; every numeric table cell of the --wide "
         "output appears whole in the 80-column output")
def analyze_narrow(tmp, j):
    (tmp / "prog.py").write_text(train(12))
    j.saw(perflab(["run", *SHORT, "--out", "o", "--", "prog.py"], tmp))
    trace = tmp / "o" / "trace.json.gz"
    if not trace.exists():
        j.flag("wrong", "perflab run wrote no trace.json.gz")
        return
    narrow = j.saw(perflab(["analyze", trace], tmp, env={"COLUMNS": "80"}))
    full = j.saw(perflab(["--wide", "analyze", trace], tmp, env={"COLUMNS": "80"}))
    text = narrow.out + narrow.err
    too_wide = [ln for ln in text.splitlines() if len(ln) > 80]
    j.wrong_unless(narrow.rc == 0, f"analyze exit {narrow.rc}")
    j.wrong_unless(not too_wide, f"{len(too_wide)} lines wider than 80, e.g. {too_wide[0][:120]!r}" if too_wide else "")
    cells = set()
    for ln in full.out.splitlines():
        for cell in re.split(r"[│┃|]", ln):
            cell = cell.strip()
            if re.fullmatch(r"[\d][\d,]*(\.\d+)?%?", cell) and len(cell) >= 3:
                cells.add(cell)
    narrow_cells = set()
    for ln in text.splitlines():
        narrow_cells.update(c.strip() for c in re.split(r"[│┃|]", ln))
    missing = sorted(c for c in cells if c not in narrow_cells and c not in text)
    j.r.detail.append(f"{len(cells)} numeric cells in the wide output; missing from the 80-column one: {missing[:10]}")
    j.wrong_unless(bool(cells), "no numeric table cell in the wide output to check")
    j.wrong_unless(not missing, f"figures split or lost at 80 columns: {missing[:10]}")


RUN_BAD = [
    ("skip-neg", ["--skip", "-1"]),
    ("steps-0", ["--steps", "0"]),
    ("trace-warmup-neg", ["--trace-warmup", "-1"]),
    ("stall-factor-1", ["--stall-factor", "1"]),
    ("batch-size-0", ["--batch-size", "0"]),
    ("seq-len-alone", ["--seq-len", "4"]),
    ("input-not-a-name", ["--input", "not a name!"]),
    ("step-empty", ["--step", ""]),
]
for _name, _args in RUN_BAD:
    def _bad(tmp, j, args=_args):
        bad_run_args(tmp, j, *args)
    hostile(f"15-run-{_name}", "one line, exit 2, nothing created", f"perflab run {' '.join(_args) or repr('')} -- prog.py: one line, exit 2, --out not created")(_bad)


@hostile("15-run-no-such-program", "one line, exit 2, nothing created", "perflab run -- nothere.py: one line, exit 2, --out not created")
def no_program(tmp, j):
    bad_run_args(tmp, j, prog="nothere.py")


@hostile("15-run-directory-program", "one line, exit 2, nothing created", "perflab run -- adir/ (a directory): one line, exit 2, --out not created")
def dir_program(tmp, j):
    (tmp / "adir").mkdir()
    bad_run_args(tmp, j, prog="adir")


# ab of a program: matmul-sized steps kept tiny; "fail" in argv, or FAIL in work.py, raises before the first step
AB_PROG = """\
import sys, torch
torch.set_num_threads(1)
from work import FAIL
if FAIL or "fail" in sys.argv:
    raise RuntimeError("told to fail")
def step(x, w):
    (x @ w).sum().backward()
    w.grad = None
x = torch.randn(64, 64); w = torch.randn(64, 64, requires_grad=True)
for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 30):
    step(x, w)
print("last line")
"""
AB_RUN = ["--step", "step", "--skip", "2", "--steps", "6"]


def ab_repo(tmp: Path) -> Path:
    return new_repo(tmp / "code", [("c1", {"train.py": AB_PROG, "work.py": "FAIL = False\n"}),
                                   ("c2", {"work.py": "FAIL = True  # B fails\n"})])


def ab_bad(tmp: Path, j: Judge, args: list, *, cwd_repo: bool = True) -> Done:
    repo = ab_repo(tmp)
    git(repo, "checkout", "-q", "c1")  # the working tree's program runs (--a-args/--b-args sides run it in place)
    d = j.saw(perflab(["ab", *args[:args.index("--")], "--out", tmp / "abo", *args[args.index("--"):]], repo if cwd_repo else tmp), one_line=True)
    j.wrong_unless(worktrees(repo) == 1, f"git worktree list shows {worktrees(repo)} worktrees (1 expected)")
    return d


for _name, _args in (("rounds-1", ["--a-args", "1", "--b-args", "2", "--rounds", "1"]),
                     ("rounds-1e9", ["--a-args", "1", "--b-args", "2", "--rounds", "1000000000"]),
                     ("repo-nonexistent", ["--repo", "/nonexistent", "--a", "x", "--b", "y"])):
    def _ab(tmp, j, args=_args):
        ab_bad(tmp, j, [*args, "--", "train.py"])
    hostile(f"16-ab-{_name}", "one line, exit 2, no worktree left", f"perflab ab {' '.join(_args)} -- train.py: one line, exit 2, "
            "no --out, git worktree list shows only the main one")(_ab)


@hostile("16-ab-a-args-alone", "runs: side B is the program as given (the help says so), no worktree left",
         "perflab ab --a-args 30 --rounds 2 -- train.py: exit 0, side A's args '30', side B's none (the program as given), --json "
         "holds both; git worktree list shows only the main one")
def ab_a_args_alone(tmp, j):
    repo = ab_repo(tmp)
    git(repo, "checkout", "-q", "c1")
    d = j.saw(perflab(["ab", "--a-args", "30", *AB_RUN, "--rounds", "2", "--out", tmp / "abo", "--json", "--", "train.py"], repo))
    j.wrong_unless(d.rc == 0, f"exit {d.rc}")
    try:
        sides = {s["name"]: s["version"].get("args") for s in json.loads(d.out)["sides"]}
    except (ValueError, KeyError, TypeError) as exc:
        sides = {"unreadable": str(exc)}
    j.r.detail.append(f"sides' args: {sides}")
    j.wrong_unless(sides.get("A") == "30" and not sides.get("B"), f"sides' args {sides}: A '30' and B none expected")
    j.wrong_unless(worktrees(repo) == 1, f"git worktree list shows {worktrees(repo)} worktrees (1 expected)")


@hostile("16-ab-side-b-fails", "one line naming side B and its exit status, exit 2, no worktree left",
         "perflab ab --repo R --a c1 --b c2 --rounds 2 -- train.py, train.py raising at c2: one line, exit 2, naming B and 'status 1'; "
         "git worktree list shows only the main one")
def ab_b_fails(tmp, j):
    d = ab_bad(tmp, j, ["--repo", ".", "--a", "c1", "--b", "c2", *AB_RUN, "--rounds", "2", "--", "train.py"])
    line = (stderr_lines(d.err) or [""])[0]
    j.wrong_unless(re.search(r"\bB\b", line) is not None and "status 1" in line, f"the line does not name side B and status 1: {line[:200]}")


TRACK_PROG = """\
import sys, time, torch
torch.set_num_threads(1)
def step(x, w):
    (x @ w).sum().backward()
    w.grad = None
    time.sleep(0.05)
x = torch.randn(64, 64); w = torch.randn(64, 64, requires_grad=True)
for _ in range(400):  # about 20 s: SIGINT lands while it runs
    step(x, w)
print("last line")
"""


@hostile("17-sigint-track", "exit 130 or 2, no traceback, only the main worktree after 2 s",
         "SIGINT (to the process group, as Ctrl-C) 3 s into perflab track --repo R --revs c1,c2 -- prog.py: exit 130 or 2, no perflab "
         "traceback, git worktree list in R shows only the main worktree 2 s later, no process of the run left")
def sigint_track(tmp, j):
    repo = new_repo(tmp / "code", [("c1", {"prog.py": TRACK_PROG}), ("c2", {"prog.py": TRACK_PROG.replace("0.05", "0.051")})])
    environ = dict(os.environ, PYTHONPATH=str(ROOT / "src"), PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    args = ["track", "--repo", str(repo), "--revs", "c1,c2", "--step", "step", "--skip", "2", "--steps", "4", "--rounds", "2",
            "--out", str(tmp / "tr"), "--", "prog.py"]
    t0 = time.monotonic()
    # SIGINT at its default in the child: a script started in the background (``&`` in a non-interactive shell) inherits
    # SIGINT ignored, which Python keeps, and the Ctrl-C below would test nothing (perflab ran on to exit 0 that way)
    proc = subprocess.Popen([PY, "-m", "perflab", *args], cwd=repo, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, errors="replace", start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(3.0)
    seen = worktrees(repo)
    below = descendants(proc.pid)
    os.killpg(proc.pid, signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=60)
        hang = False
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        hang = True
    d = j.saw(Done(args, proc.returncode, out, err, time.monotonic() - t0, hang))
    time.sleep(2.0)
    left = worktrees(repo)
    still = alive(below)
    j.r.detail.append(f"worktrees 3 s in: {seen}; after: {left}; exit {d.rc}; processes below perflab at the signal {len(below)}, "
                      f"alive 2 s after its exit: {still}")
    j.wrong_unless(d.rc in (130, 2, -2), f"exit {d.rc} after SIGINT (130 or 2 expected)")
    j.wrong_unless(left == 1, f"git worktree list shows {left} worktrees 2 s after the exit")
    j.wrong_unless(not still, f"processes of the run still alive 2 s after perflab exited: {still}")
    for p in still:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


@hostile("18-loud-program-exits-3", "the program's exit code; run.json complete",
         "a program printing ~4 MB to stdout, exiting 3 after the traced steps: perflab exits 3, run.json not partial, its traced section there")
def loud_exit(tmp, j):
    (tmp / "prog.py").write_text(train(14, "    print(('x' * 199 + chr(10)) * 1500, end='')", "sys.stdout.flush()\nsys.exit(3)"))
    d = j.saw(perflab(["run", *SHORT, "--out", "o", "--", "prog.py"], tmp))
    run = load(tmp / "o" / "run.json")
    j.r.detail.append(f"exit {d.rc}, stdout {len(d.out)} chars, run.json partial {None if run is None else run.get('partial')}")
    j.wrong_unless(d.rc == 3, f"exit {d.rc}, the program's was 3")
    if j.wrong_unless(run is not None, "no run.json"):
        j.wrong_unless(run.get("partial") is False and (run.get("traced") or {}).get("steps"),
                       f"run.json partial={run.get('partial')}, traced={bool(run.get('traced'))}")


# --------------------------------------------------------------------------------------------------------------------
# our own, in the same spirit


def a_run(tmp: Path, j: Judge, out: str = "o") -> Path | None:
    (tmp / "prog.py").write_text(train(12))
    j.saw(perflab(["run", *SHORT, "--out", out, "--", "prog.py"], tmp))
    return tmp / out if (tmp / out / "run.json").exists() else None


@hostile("x1-compare-truncated-run-json", "one line, exit 2", "perflab compare a/run.json b/run.json, b's truncated mid-JSON: one line, exit 2")
def compare_truncated(tmp, j):
    o = a_run(tmp, j)
    if not o:
        j.flag("wrong", "perflab run wrote no run.json")
        return
    (tmp / "b").mkdir()
    text = (o / "run.json").read_text()
    (tmp / "b" / "run.json").write_text(text[: len(text) // 2])
    j.saw(perflab(["compare", o / "run.json", tmp / "b" / "run.json"], tmp), one_line=True)


@hostile("x2-report-run-json-format-99", "one line, exit 2, run.json untouched",
         "perflab report DIR whose run.json says \"format\": 99: one line, exit 2, run.json unchanged")
def report_format_99(tmp, j):
    o = a_run(tmp, j)
    if not o:
        j.flag("wrong", "perflab run wrote no run.json")
        return
    doc = json.loads((o / "run.json").read_text())
    doc["format"] = 99
    (o / "run.json").write_text(json.dumps(doc))
    before = tree(o / "run.json")
    j.saw(perflab(["report", o], tmp), one_line=True)
    j.loss_unless(not tree_changes(before, tree(o / "run.json")), "run.json changed")


@hostile("x3-report-damaged-run-json-only", "one line, exit 2, nothing changed",
         "perflab report DIR holding only a damaged run.json ('{\"format\": 1, \"timing\": '): one line, exit 2, the file unchanged")
def report_damaged(tmp, j):
    (tmp / "d").mkdir()
    (tmp / "d" / "run.json").write_text('{"format": 1, "timing": ')
    before = tree(tmp / "d")
    j.saw(perflab(["report", "d"], tmp), one_line=True)
    j.loss_unless(not tree_changes(before, tree(tmp / "d")), "the directory's files changed")


@hostile("x4-results-of-run-dir", "works, or says what to run instead (not perflab sweep)",
         "perflab results RUN_DIR (a perflab run --out): exit 0, or one line exit 2 naming another command; never 'perflab sweep'")
def results_run(tmp, j):
    o = a_run(tmp, j)
    if o:
        d = j.saw(perflab(["results", o], tmp))
        works_or_points_elsewhere(j, d, "results of a run directory")


@hostile("x5-analyze-truncated-gz", "one line, exit 2", "perflab analyze of a trace.json.gz cut in half: one line, exit 2")
def analyze_truncated(tmp, j):
    data = gzip.compress(json.dumps({"traceEvents": [{"ph": "X", "name": f"op{i}", "ts": i, "dur": 1, "pid": 1, "tid": 1} for i in range(2000)]}).encode())
    (tmp / "t.json.gz").write_bytes(data[: len(data) // 2])
    j.saw(perflab(["analyze", "t.json.gz"], tmp), one_line=True)


@hostile("x6-run-out-is-a-file", "one line, exit 2, the file untouched",
         "perflab run --out FILE (an existing regular file): one line, exit 2 before the program runs, the file unchanged")
def out_is_file(tmp, j):
    (tmp / "prog.py").write_text(train(8))
    (tmp / "keep.txt").write_text("precious\n")
    before = tree(tmp / "keep.txt")
    j.saw(perflab(["run", *SHORT, "--out", "keep.txt", "--", "prog.py"], tmp), one_line=True)
    j.loss_unless(not tree_changes(before, tree(tmp / "keep.txt")), "keep.txt changed or gone")


@hostile("x7-bad-arg-into-existing-run", "one line, exit 2, the earlier run kept",
         "perflab run --steps 0 --out O where O holds an earlier run: one line, exit 2, every file of the earlier run unchanged")
def bad_into_existing(tmp, j):
    o = a_run(tmp, j)
    if not o:
        j.flag("wrong", "perflab run wrote no run.json")
        return
    before = tree(o)
    j.saw(perflab(["run", "--steps", "0", "--out", o, "--", "prog.py"], tmp), one_line=True)
    j.loss_unless(not tree_changes(before, tree(o)), "; ".join(tree_changes(before, tree(o))))


@hostile("x8-results-damaged-store", "one line, exit 2, the store untouched",
         "perflab results DIR whose results.sqlite is 4 KiB of garbage: one line, exit 2, the file unchanged")
def results_garbage(tmp, j):
    (tmp / "s").mkdir()
    (tmp / "s" / "results.sqlite").write_bytes(b"SQLite format 3\x00" + bytes(range(256)) * 16)
    before = tree(tmp / "s")
    j.saw(perflab(["results", "s"], tmp), one_line=True)
    j.loss_unless(not tree_changes(before, tree(tmp / "s")), "; ".join(tree_changes(before, tree(tmp / "s"))))


@hostile("x9-stalls-said-once", "each flag's sentence once on stderr",
         "a plain perflab run: no flag's message (run.json flags) appears more than once in stderr (COLUMNS=1000)")
def flags_once(tmp, j):
    (tmp / "prog.py").write_text(train(14, "    time.sleep(0.02 if i == 4 else 0)"))
    d = j.saw(perflab(["run", *SHORT, "--out", "o", "--", "prog.py"], tmp, env=wide()))
    run = load(tmp / "o" / "run.json") or {}
    for f in run.get("flags") or []:
        sentence = (f.get("message") or "")[:60]
        if sentence:
            n = d.err.count(sentence)
            j.wrong_unless(n <= 1, f"flag {f.get('flag')}'s sentence printed {n} times on stderr")


# --------------------------------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    global TIMEOUT
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write every input's record here (JSON)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these inputs (a name, or its leading part: 15 runs every 15-...)")
    parser.add_argument("--timeout", type=float, default=TIMEOUT, help="seconds per perflab command before it is a hang (default 120)")
    parser.add_argument("--list", action="store_true", help="list the inputs and exit")
    args = parser.parse_args(argv)
    TIMEOUT = args.timeout
    chosen = [i for i in INPUTS if not args.only or any(i[0] == n or i[0].startswith(n + "-") or i[0].startswith(n) for n in args.only)]
    if args.list:
        for name, expected, check, _ in chosen:
            print(f"{name:34} {expected}\n{'':34} {check}")
        return 0
    records = []
    t_all = time.monotonic()
    for name, expected, check, fn in chosen:
        record = Record(name, expected, check)
        judge = Judge(record)
        tmp = Path(tempfile.mkdtemp(prefix=f"hostile-{name}-"))
        try:
            fn(tmp, judge)
        except Exception as exc:  # noqa: BLE001 - this script's own failure, recorded, never a crash of the measurement
            judge.flag("wrong", f"the harness failed: {type(exc).__name__}: {exc}")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        judge.finish()
        records.append(record)
        print(f"[{record.seconds:6.1f}s] {name}: {record.outcome}" + (f"  ({record.detail[0][:140]})" if record.outcome != "ok" and record.detail else ""),
              file=sys.stderr, flush=True)
    total = time.monotonic() - t_all
    print_table(records)
    counts = {}
    for r in records:
        counts[r.outcome] = counts.get(r.outcome, 0) + 1
    print(f"\n{len(records)} inputs in {total:.0f} s: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        doc = {"script": "benchmarks/hostile_cpu.py", "python": PY, "timeout_s": TIMEOUT, "seconds": round(total, 1), "counts": counts,
               "inputs": [vars(r) for r in records]}
        for entry in doc["inputs"]:  # keep the file small: tails only where something is not ok
            if entry["outcome"] == "ok":
                for c in entry["commands"]:
                    c.pop("stderr_tail", None)
                    c.pop("stdout_tail", None)
        args.out.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
        print(f"written: {args.out}")
    return 0


def print_table(records) -> None:
    head = ("input", "expected", "outcome", "exit", "first stderr line", "s")
    rows = [(r.name, r.expected[:38], r.outcome, str(r.rc), (r.first_stderr or "")[:70], f"{r.seconds:.1f}") for r in records]
    widths = [max(len(x[i]) for x in [head, *rows]) for i in range(len(head))]
    for row in [head, tuple("-" * w for w in widths), *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        pass
    sys.exit(0)
