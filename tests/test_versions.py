"""perflab ab, track and compare of stored runs (issue 40), on a temporary git repository holding a model file at three
commits: c1, c2 (a comment changed) and c3 (the model's matmul done twice: the step's work nearly doubles). A fourth
commit, c4, on a side branch, changes the spec's batch size (its case ids differ); a fifth, c5, on another, renames the
model's class (model.py:Net no longer loads there).

The timings are CPU timings on a small shared machine, so the cases are sized for a clear signal: one 256-token
512-wide matmul (134 MFLOP) against a 13 MFLOP patch embedding, one intra-op thread, the timing thread unpinned."""

import hashlib
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from cli_util import assert_progress_lines, git, new_repo, run_cli_here

MODEL = '''"""A toy classifier whose work is a square matmul over its patch tokens (perflab's ab and track tests)."""
import torch.nn as nn


class Net(nn.Module):
    def __init__(self, dim: int = 512, patch: int = 4, classes: int = 10):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, kernel_size=patch, stride=patch)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.head = nn.Linear(dim, classes)

    def forward(self, images):
        x = self.patch_embed(images).flatten(2).transpose(1, 2)
        x = self.proj(x)
        return self.head(x.mean(dim=1))
'''
C2 = MODEL.replace('class Net(nn.Module):', '# c2: a comment, nothing else\nclass Net(nn.Module):')
C3 = C2.replace("x = self.proj(x)", "x = self.proj(self.proj(x))")
SPEC = """name: toy
defaults: {device: cpu, input_size: 64, batch_size: BATCH}
harness: {warmup: 2, iters: 40, repeats: 8}
grid:
  model: [model.py:Net]
"""
CASE = ["--model", "model.py:Net", "--input-size", "64", "--device", "cpu", "--iters", "40", "--repeats", "8", "--warmup", "2", "--no-pin"]


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    path = new_repo(tmp_path_factory.mktemp("versions") / "models")
    for tag, text in (("c1", MODEL), ("c2", C2), ("c3", C3)):
        (path / "model.py").write_text(text)
        (path / "spec.yaml").write_text(SPEC.replace("BATCH", "1"))
        git(path, "add", "model.py", "spec.yaml")
        git(path, "commit", "-q", "-m", tag)
        git(path, "tag", tag)
    git(path, "checkout", "-q", "-b", "wider")
    (path / "spec.yaml").write_text(SPEC.replace("BATCH", "2"))
    git(path, "commit", "-q", "-am", "c4")
    git(path, "tag", "c4")
    git(path, "checkout", "-q", "-b", "renamed", "c3")  # c5: the model's class renamed, so model.py:Net no longer loads
    (path / "model.py").write_text(C3.replace("class Net(", "class Network("))
    git(path, "commit", "-q", "-am", "c5")
    git(path, "tag", "c5")
    git(path, "checkout", "-q", "c3")
    return path


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the workers' timings, not the other tests', on a 2-core machine


def sha(repo, rev) -> str:
    return git(repo, "rev-parse", f"{rev}^{{commit}}")


def skip_if_the_host_was_busy(rows: list[dict], verdict: str, expected: str) -> None:
    """A timing claim cannot be tested where perflab's own host checks say most processes ran on a busy or drifting host
    (another job on a shared 2-core machine): skip then, saying so, if the verdict is not the expected one."""
    flags = [f for row in rows for f in row.get("process_flags") or []]
    busy = sum(any(x in ("host_contention", "host_drift") for x in f) for f in flags)
    if verdict != expected and busy * 2 >= len(flags):
        pytest.skip(f"{busy} of {len(flags)} processes ran on a busy host (host_contention/host_drift): the verdict was {verdict}")


def stored(out) -> tuple[list[dict], dict]:
    from perflab.sweep.store import Store

    with Store.open(out) as store:
        return store.rows(), store.environments()


def block_ratios_by_round(a: dict, b: dict) -> list[float]:
    """B/A per round of a blocks-paired run, worked out here from the stored samples: per process, the median on logs over
    its interleaved rounds of B's block ÷ A's block of the same round."""
    def keyed(row):
        return {(p, r): v for v, p, r in zip(row["samples_ms"], row["sample_processes"], row["sample_rounds"])}

    ka, kb = keyed(a), keyed(b)
    assert set(ka) == set(kb) and len(ka) == len(a["samples_ms"])  # one block a side in each interleaved round
    per_round: dict[int, list[float]] = {}
    for key in ka:
        per_round.setdefault(key[0], []).append(kb[key] / ka[key])
    return [math.exp(statistics.median(math.log(x) for x in per_round[p])) for p in sorted(per_round)]


def test_ab_calls_the_doubled_matmul_slower_with_a_paired_ci_that_excludes_1(repo, tmp_path, monkeypatch):
    out = tmp_path / "ab"
    monkeypatch.setenv("PERFLAB_PROGRESS_S", "0.5")
    result = run_cli_here("ab", "--repo", repo, "--a", "c2", "--b", "c3", *CASE, "--rounds", "3", "--no-aa", "--out", out, "--json")
    assert result.returncode == 0, result.stderr
    lines = assert_progress_lines(result.stderr, "ab", 3, "processes")  # stderr a pipe: a line every 0.5 s, each with its round
    assert all(line.endswith((": starting", ": done")) or ": round " in line for line in lines), lines
    report = json.loads(result.stdout)
    (case,) = report["cases"]
    rounds = [(r["version"]["name"], r["process_medians_ms"], r["process_flags"]) for r in stored(out)[0]]
    assert report["aa"] is None and case["floor"]["source"] == "rounds"  # no A/A pair: the floor is B/A's own spread
    skip_if_the_host_was_busy(stored(out)[0], case["verdict"], "slower")
    assert report["pairing"] == "blocks"  # the default for revisions
    assert case["verdict"] == "slower" and case["ratio"]["basis"] == "blocks" and case["ratio"]["units"] == 3, (case, rounds)
    assert case["ratio"]["level"] == 0.95 and 1.0 < case["ratio"]["low"] <= case["ratio"]["ratio"] <= case["ratio"]["high"]
    assert [v["commit"] for v in report["versions"]] == [sha(repo, "c2"), sha(repo, "c3")]

    rows, environments = stored(out)
    by_side = {r["version"]["name"]: r for r in rows}
    assert sorted(by_side) == ["A", "B"] and {r["case_id"] for r in rows} == {case["case_id"]}
    for side, tag in (("A", "c2"), ("B", "c3")):
        r = by_side[side]
        # each side ran its own revision's file, checked out in a worktree of its own, both in one process a round
        assert r["model_source"]["sha1"] == hashlib.sha1(git(repo, "show", f"{tag}:model.py").encode() + b"\n").hexdigest()
        assert r["version"]["commit"] == sha(repo, tag) and r["processes"] == 3 and len(r["process_medians_ms"]) == 3
        assert r["version"]["pairing"] == "blocks"
        assert environments[r["env_key"]]["commit"] == sha(repo, tag) and environments[r["env_key"]]["torch"]
    # the ratio: the geometric mean over the rounds of each round's median block ratio, B's block ÷ A's beside it
    paired = block_ratios_by_round(by_side["A"], by_side["B"])
    assert case["ratio"]["ratio"] == pytest.approx(math.prod(paired) ** (1 / len(paired)))
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1  # the versions' worktrees are gone
    # a second ab into the same store would mix its rows with these: refused, the store as it was
    again = run_cli_here("ab", "--repo", repo, "--a", "c2", "--b", "c3", *CASE, "--out", out)
    assert again.returncode == 2 and "already holds 2 row(s) of these versions" in again.stderr  # --no-aa: A's and B's
    assert len(stored(out)[0]) == 2


def test_an_a_a_ab_times_both_revisions_interleaved_in_one_process_a_round_and_finds_no_change(repo, tmp_path):
    """c1 and c2 differ in a comment only. Each round is one process that imports both revisions' model.py (each from
    its own worktree) and a second copy of A's (the A/A pair the noise floor is measured from), and times their blocks
    next to each other; the A/A ratio comes out near 1. Asserted loosely (no slower/faster verdict, the ratio within
    10%, the CI reaching the ±5% band): a loaded 2-core box moves the blocks, but it moves A's and B's alike."""
    out = tmp_path / "aa"
    result = run_cli_here("ab", "--repo", repo, "--a", "c1", "--b", "c2", *CASE, "--rounds", "3", "--out", out, "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    (case,) = document["cases"]
    a, a2, b = sorted(stored(out)[0], key=lambda r: r["version"]["name"])
    assert (a["version"]["name"], a2["version"]["name"], b["version"]["name"]) == ("A", "A'", "B")
    assert a2["version"]["copy_of"] == "A" and document["aa"]["copy_of"] == "A" and [v["name"] for v in document["versions"]] == ["A", "B"]
    for row, tag in ((a, "c1"), (a2, "c1"), (b, "c2")):  # a file a version, though the code is the same
        assert row["model_source"]["sha1"] == hashlib.sha1(git(repo, "show", f"{tag}:model.py").encode() + b"\n").hexdigest()
    # the noise floor is the A/A pair's: the farthest bound of A'/A's CI from 1, stated with the smallest detectable change
    floor = case["floor"]
    assert floor["source"] == "A/A" and floor["aa"]["basis"] == "blocks" and floor["aa"]["units"] == 3
    assert floor["fraction"] == pytest.approx(max(floor["aa"]["high"], 1 / floor["aa"]["low"]) - 1)
    assert case["band"] == pytest.approx(max(0.05, floor["fraction"])) and case["detectable"] > 0
    # one fresh process a round, holding every version: the same pid and interleaved session on each side
    assert a["process_pids"] == b["process_pids"] == a2["process_pids"] and len(set(a["process_pids"])) == 3
    assert a["process_sessions"] == b["process_sessions"] and len(set(a["process_sessions"])) == 3
    # interleaved: in each process, the blocks in the order they began come in threes, one of each version in one
    # interleaved round, balanced: in each pair of interleaved rounds A goes before B once, as each row records
    for p in range(3):
        blocks = sorted((t, side, r) for side, row in (("A", a), ("B", b), ("A'", a2))
                        for t, q, r in zip(row["sample_started_s"], row["sample_processes"], row["sample_rounds"]) if q == p)
        assert len(blocks) == 3 * a["sample_processes"].count(p) and len(blocks) >= 24
        a_before_b = []
        for k in range(0, len(blocks), 3):
            sides = [s for _, s, r in blocks[k:k + 3] if r == k // 3]
            assert sorted(sides) == ["A", "A'", "B"], blocks
            a_before_b.append(sides.index("A") < sides.index("B"))
            assert a["process_positions"][p][k // 3] == sides.index("A") and b["process_positions"][p][k // 3] == sides.index("B")
        assert all(x != y for x, y in zip(a_before_b[0::2], a_before_b[1::2])), a_before_b  # each order, then its reverse
    order = document["order"]
    assert order["A before B"]["pairings"] == len(a["samples_ms"]) and abs(2 * order["A before B"]["count"] - len(a["samples_ms"])) <= 3
    written = run_cli_here("report", out)
    assert written.returncode == 0, written.stderr
    text = (out / "report.md").read_text()
    assert f"Order: A before B in {order['A before B']['count']} of {len(a['samples_ms'])} pairing(s)" in text
    assert "noise floor on this host ±" in text and "A': a second copy of A" in text
    ratio = case["ratio"]
    assert ratio["basis"] == "blocks" and ratio["units"] == 3
    assert ratio["ratio"] == pytest.approx(math.prod(block_ratios_by_round(a, b)) ** (1 / 3))
    assert case["verdict"] in ("no change", "inconclusive"), case
    assert 0.9 < ratio["ratio"] < 1.1 and ratio["low"] <= 1.05 and ratio["high"] >= 1 / 1.05, case


def test_pairing_processes_alternates_one_process_a_version_abba(repo, tmp_path):
    out = tmp_path / "processes"
    quick = CASE[:CASE.index("--iters")] + ["--iters", "12", "--repeats", "3", "--warmup", "1", "--no-pin"]
    result = run_cli_here("ab", "--repo", repo, "--a", "c2", "--b", "c3", *quick, "--rounds", "2", "--pairing", "processes",
                          "--out", out, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    (case,) = report["cases"]
    by_side = {r["version"]["name"]: r for r in stored(out)[0]}
    assert report["pairing"] == "processes" and {r["version"]["pairing"] for r in by_side.values()} == {"processes"}
    # A B, then B A: each in a process of its own (no pids or sessions shared to record)
    starts = sorted((t, side) for side in "AB" for t in by_side[side]["process_started_at"])
    assert [side for _, side in starts] == ["A", "B", "B", "A"]
    assert "process_pids" not in by_side["A"] and "process_sessions" not in by_side["B"]
    assert by_side["A"]["process_positions"] == [[0], [1]] and by_side["B"]["process_positions"] == [[1], [0]]  # the order, stored
    assert case["ratio"]["basis"] == "paired" and case["ratio"]["units"] == 2
    a, b = by_side["A"]["process_medians_ms"], by_side["B"]["process_medians_ms"]
    assert case["ratio"]["ratio"] == pytest.approx(math.sqrt(b[0] / a[0] * b[1] / a[1]))


def test_a_model_scope_keeps_each_versions_sibling_modules_apart(tmp_path):
    """Two revisions of a model file that imports a sibling module, in one process: each scope's model sees its own."""
    from perflab.models.reference import load_factory
    from perflab.references import ModelScope, parse_reference

    scopes = []
    for width in (8, 16):
        root = tmp_path / f"v{width}"
        root.mkdir()
        (root / "layers.py").write_text(f"WIDTH = {width}\n")
        (root / "model.py").write_text("import layers\n\ndef build():\n    return layers.WIDTH\n")
        scopes.append(ModelScope(root))
    built = []
    for scope in scopes + scopes:  # entered again: its modules come back
        with scope:
            built.append(load_factory(parse_reference("model.py:build"))())
            assert sys.modules["layers"].__file__ == str(scope.root / "layers.py")
        assert "layers" not in sys.modules and not any(str(tmp_path) in p for p in sys.path)
    assert built == [8, 16, 8, 16]


def test_track_finds_the_change_at_c3_and_none_at_c2_and_a_rerun_reuses_the_rows(repo, tmp_path, monkeypatch):
    out = tmp_path / "track"
    monkeypatch.setenv("PERFLAB_PROGRESS_S", "0.5")
    result = run_cli_here("track", "--repo", repo, "--range", "c1..c3", *CASE, "--rounds", "3", "--out", out, "--json")
    assert result.returncode == 0, result.stderr
    assert_progress_lines(result.stderr, "track", 3, "processes")
    report = json.loads(result.stdout)
    assert [v["commit"] for v in report["versions"]] == [sha(repo, t) for t in ("c1", "c2", "c3")]
    (series,) = report["cases"]
    c2, c3 = series["points"][1:]
    skip_if_the_host_was_busy(stored(out)[0], c3["step"]["verdict"], "slower")
    assert series["change_points"] == [c3["revision"]] and c3["key"] == f"commit:{sha(repo, 'c3')}"
    assert c3["step"]["verdict"] == "slower" and c3["step"]["ratio"]["low"] > 1.0 and c3["step"]["ratio"]["basis"] == "blocks"
    assert c2["step"]["verdict"] in ("no change", "inconclusive")  # a comment: no change point
    # the change point's cause: both sides profiled, the Δ by operator category with its CI, and the ab that reproduces it
    cause = c3["cause"]
    assert (cause["previous"], cause["revision"]) == (c2["revision"], c3["revision"]) and cause["error"] is None and cause["cpu_only"]
    assert set(cause["delta_by_category_ci_us"]) == set(cause["delta_by_category"])
    # doubled matmuls: more gemm time in B's profile, or, where this shared host's load swamped five traced steps a side,
    # no claim the other way (its interval reaches 0)
    _, gemm_high = cause["delta_by_category_ci_us"]["gemm"]
    assert cause["delta_by_category"]["gemm"] > 0 or gemm_high >= 0
    assert cause["reproduce"].startswith(f"perflab ab --a {c2['revision']} --b {c3['revision']} --repo {repo} --model model.py:Net")
    assert cause["reproduce"].endswith("--rounds 6") and "--range" not in cause["reproduce"] and "--out" not in cause["reproduce"]
    assert all(Path(t).is_file() for t in cause["traces"]) and c2["cause"] is None
    assert c3["step"]["floor"]["source"] == c2["step"]["floor"]["source"] == "A/A"  # c1 against a second copy of itself
    assert c3["step"]["floor"] == c2["step"]["floor"] and report["aa"]["copy_of"] == "c1"
    rows = stored(out)[0]
    assert len(rows) == 4 and report["pairing"] == "blocks"  # c1, c2, c3 and c1's copy
    assert len({tuple(r["process_pids"]) for r in rows}) == 1  # the revisions timed in one process a round

    again = run_cli_here("track", "--repo", repo, "--revs", "c1", "c2", "c3", *CASE, "--rounds", "3", "--out", out, "--json")
    assert again.returncode == 0, again.stderr
    rerun = json.loads(again.stdout)
    assert rerun["reused"] == 4 and rerun["cases"][0]["change_points"] == ["c3"]
    assert [p["median_ms"] for p in rerun["cases"][0]["points"]] == [p["median_ms"] for p in series["points"]]

    written = run_cli_here("report", out)
    assert written.returncode == 0, written.stderr
    text = (out / "report.md").read_text()
    assert "## By revision" in text and "### model.py:Net 64px bs1 fp32 eager: change points: c3 (slower" in text
    assert "Change point c3 against c2, both profiled: Δ +" in text and "Reproduce: perflab ab --a c2 --b c3" in text
    assert "(3 round(s), each round one process timing every version's cases interleaved, block by block)" in text
    assert (out / "revisions_0.png").stat().st_size > 1000 and "![model.py:Net 64px bs1 fp32 eager over revisions](revisions_0.png)" in text


def scaled(row: dict, k: float) -> dict:
    """A row as it would read were every step ``k`` times as long: each time in ms (and each sample) times ``k``."""
    def times(key, value):
        if key.endswith("_ms") or key == "samples_ms":
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return value * k
            if isinstance(value, list):
                return [v * k if isinstance(v, (int, float)) else v for v in value]
        return value
    return {key: times(key, value) for key, value in row.items()}


def test_compare_of_two_bench_out_files_gives_per_case_verdicts(repo, tmp_path):
    """compare's reading of two bench --out files (JSON lines, CSV) and its verdicts: one real bench run at c2, and the
    same rows as a run whose steps all took four times as long (the timing of two separate real runs is the question ab
    answers; this test is compare's arithmetic, so its B is exact). The within-run CI combines the two rows' own CIs on
    the log scale, worked out here from the files; on a quiet host it excludes 1 (slower), while on a loaded 2-core host
    a CPU row's own CI over 8 samples has spanned 19x (2.4-45.6 ms about 18.7), and then "inconclusive" is the answer."""
    from perflab.report.export import write_rows

    checkout = tmp_path / "c2"
    checkout.mkdir()
    (checkout / "model.py").write_text(git(repo, "show", "c2:model.py") + "\n")
    result = run_cli_here("bench", *CASE, "--batch-size", "1", "2", "--out", tmp_path / "a.jsonl", cwd=checkout)
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    write_rows([scaled(row, 4.0) for row in rows], tmp_path / "b.csv")
    files = [tmp_path / "a.jsonl", tmp_path / "b.csv"]
    result = run_cli_here("compare", *files, "--json")
    assert result.returncode == 0, result.stderr
    cases = json.loads(result.stdout)["cases"]
    assert [c["label"].split()[2] for c in cases] == ["bs1", "bs2"]
    z = statistics.NormalDist().inv_cdf(0.975)
    expected = []
    for case, row in zip(cases, sorted(rows, key=lambda r: r["batch_size"])):
        low, high = row["ci95_ms"]
        se = math.hypot(math.log(high / low), math.log(high / low)) / (2 * z)  # B's CI is A's scaled: as wide in logs
        half = z * se
        ratio = case["ratio"]
        assert ratio["ratio"] == pytest.approx(4.0, rel=1e-4) and ratio["basis"] == "within-run"  # (the CSV's decimals)
        assert ratio["low"] == pytest.approx(4.0 * math.exp(-half), rel=1e-3) and ratio["high"] == pytest.approx(4.0 * math.exp(half), rel=1e-3)
        unsteady = {"host_contention", "host_drift", "high_cv"} & set(row.get("flags") or [])  # a host that moved: held back
        expected.append("slower" if 4.0 * math.exp(-half) > 1.0 and not unsteady else "inconclusive")
        assert case["verdict"] == expected[-1], (case, row["ci95_ms"])
        assert case["verdict_text"].startswith(expected[-1]) and " · within-run" in case["verdict_text"]  # what its CI covers
        assert "does not cover between-process variance" in ratio["note"]
    if all(r["ci95_ms"][1] / r["ci95_ms"][0] < 2.0 and "high_cv" not in (r.get("flags") or []) for r in rows):  # a quiet host
        assert expected == ["slower", "slower"]
    table = run_cli_here("compare", *files)
    verdict_cells = [line.split("│")[-2].strip() for line in table.stdout.splitlines() if "model.py:Net" in line and "│" in line]
    assert table.returncode == 0 and [cell.split()[0] for cell in verdict_cells] == expected
    assert "does NOT cover between-process variance" in " ".join(table.stdout.split())  # a note wrapped to the width


@pytest.fixture
def no_torch_python(tmp_path):
    """An interpreter without torch: a bare virtual environment of this Python."""
    env = tmp_path / "bare"
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(env)], check=True)
    return env / "bin" / "python"


def test_bad_versions_are_one_line_each_and_write_nothing(repo, tmp_path, no_torch_python):
    out = tmp_path / "never"
    dirty = tmp_path / "dirty"
    git(tmp_path, "clone", "-q", str(repo), str(dirty))
    with open(dirty / "model.py", "a") as f:
        f.write("# not committed\n")
    cases = [
        (["ab", "--repo", repo, "--a", "c2", "--b", "no-such-rev", *CASE], "--b no-such-rev: no such revision in"),
        (["track", "--repo", repo, "--revs", "c1", "nope", *CASE], "--revs nope: no such revision in"),
        (["ab", "--repo", dirty, "--a", "c2", "--b", "c3", *CASE], "uncommitted changes to model.py; versions are committed revisions"),
        (["ab", "--python-a", no_torch_python, "--python-b", sys.executable, *CASE],
         f"--python-a {no_torch_python}: cannot import perflab and torch there (ModuleNotFoundError: No module named 'torch')"),
        (["ab", "--python-a", tmp_path / "nothing" / "python", "--python-b", sys.executable, *CASE], "no such interpreter"),
        (["ab", "--repo", repo, "--a", "c3", "--b", "c4", "--spec", repo / "spec.yaml"], "versions A and B give different case ids"),
        (["ab", "--repo", repo, "--a", "c2", *CASE], "give two versions"),
        (["ab", "--repo", repo, "--a", "c2", "--b", "c3", *CASE, "--rounds", "1"], "--rounds must be at least 2"),
        (["ab", "--python-a", sys.executable, "--python-b", sys.executable, *CASE, "--pairing", "blocks"],
         "--pairing blocks: interpreters (--python-a/--python-b) each run their own processes, so they can only pair processes"),
        (["track", "--repo", repo, "--revs", "c1", "c2", *CASE, "--pairing", "threads"], "--pairing: expected blocks or processes"),
        (["track", "--repo", tmp_path, "--revs", "c1", "c2", *CASE], "not a git work tree"),
        (["compare", tmp_path / "missing.csv", tmp_path / "other.jsonl"], "missing.csv: no such file"),
    ]
    for args, fragment in cases:
        # from the repository's directory: the interpreters' cases read model.py there
        result = run_cli_here(*args, "--out", out, cwd=repo) if args[0] != "compare" else run_cli_here(*args)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode == 2 and len(lines) == 1, (args, result.stderr)
        assert lines[0].startswith("perflab: error: ") and fragment in lines[0], (fragment, lines[0])
        assert not out.exists()
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1


QUICK = CASE[:CASE.index("--iters")] + ["--iters", "8", "--repeats", "4", "--warmup", "1", "--no-pin"]


def test_a_version_whose_model_fails_to_load_stores_its_own_error_row_and_the_other_its_measured_one(repo, tmp_path):
    """B's model file renames the class the reference names. With the family given (--family), nothing imports the model
    before its worker does, so in a blocks round (one process holds both versions) B's load fails there: B's row is B's
    error, A's is A's measurement (A timed without B), never A's row carrying B's message; the exit status is 1 (a case
    at a version failed, not compared). (Without --family the plan imports each revision's model and refuses c5 first.)"""
    out = tmp_path / "renamed"
    result = run_cli_here("ab", "--repo", repo, "--a", "c2", "--b", "c5", *QUICK, "--family", "classify", "--rounds", "2", "--out", out,
                          "--json")
    assert result.returncode == 1, result.stderr
    (case,) = json.loads(result.stdout)["cases"]
    assert case["verdict"] == "not compared" and (case["status_a"], case["status_b"]) == ("ok", "error"), case
    by_side = {r["version"]["name"]: r for r in stored(out)[0]}
    a, b = by_side["A"], by_side["B"]
    assert a["status"] == "ok" and not a.get("message") and a["median_ms"] > 0 and a["processes"] == 2
    assert a["version"]["commit"] == sha(repo, "c2") and b["version"]["commit"] == sha(repo, "c5")
    assert a["model_source"]["sha1"] == hashlib.sha1(git(repo, "show", "c2:model.py").encode() + b"\n").hexdigest()
    assert b["status"] == "error" and "has no attribute 'Net'" in b["message"], b
    last = [line for line in result.stderr.splitlines() if line.strip()][-1]
    assert last.startswith("1 case(s) failed at a version") and "B: " in last and "has no attribute 'Net'" in last and last.endswith("exit status 1")


def test_track_reuses_only_rows_measured_ok_and_stored_as_their_own_version(tmp_path):
    """A store planted with what the earlier defect wrote: an error row under A's key, and under B's key a row whose
    version is another's. Neither is reused: both are measured again and replace what is there; C's ok row is reused."""
    from perflab.spec import Case
    from perflab.sweep.store import Store
    from perflab.sweep.versions import Version, make_bench_experiment, to_run

    case = Case(model="model.py:Net", input_size=64, batch_size=1, device="cpu")
    experiment = make_bench_experiment("track", "test", [case], tmp_path)
    versions = [Version(name=n, kind="revision", key=f"commit:{n * 40}", python=sys.executable, commit=n * 40, env_key=f"env-{n}",
                        experiment=experiment) for n in "abc"]
    planted = {"a": dict(status="error", message="B's model failed", version={"key": versions[0].key}),
               "b": dict(status="ok", median_ms=1.0, version={"key": versions[0].key}),
               "c": dict(status="ok", median_ms=1.0, version={"key": versions[2].key})}
    with Store.create(tmp_path / "store") as store:
        for v in versions:
            store.put(dict(planted[v.name], case_id=case.id), v.env_key)
        todo, replace, reused = to_run(store, versions, reuse=True)
        assert todo == replace == {(case.id, versions[0].key), (case.id, versions[1].key)} and reused == 1
        todo, replace, reused = to_run(store, versions, reuse=False)  # ab: nothing reused
        assert len(todo) == 3 and reused == 0


@pytest.mark.parametrize("seed", [0, 1, 7, 12345])
def test_the_versions_order_is_balanced_each_first_half_the_rounds_and_a_linear_drift_cancels(seed):
    from perflab.measure.interleave import interleaved_order
    from perflab.sweep.versions import versions_order

    for n_rounds in (2, 4, 6, 10):
        for order in ("alternate", "random"):  # processes pairing: the versions' processes in each round
            for c in range(3):
                rounds = [versions_order(2, r, c, order, seed) for r in range(n_rounds)]
                assert all(sorted(o) == [0, 1] for o in rounds)
                assert [o[0] for o in rounds].count(0) == [o[0] for o in rounds].count(1) == n_rounds // 2, (order, rounds)
                # a drift linear in time: each version's slots over every pair of rounds sum the same
                for r in range(0, n_rounds, 2):
                    slots = {v: 2 * k + rounds[k].index(v) for k in (r, r + 1) for v in (0, 1)}
                    assert sum(2 * k + rounds[k].index(0) for k in (r, r + 1)) == sum(2 * k + rounds[k].index(1) for k in (r, r + 1)), slots
        # blocks pairing: two cases at two versions in one process (groups: the case), each interleaved round balanced
        order = interleaved_order([0, 0, 1, 1], n_rounds, seed, balanced=True)
        for members in ((0, 1), (2, 3)):
            firsts = [next(i for i in r if i in members) for r in order]
            assert firsts.count(members[0]) == firsts.count(members[1]) == n_rounds // 2, order
            assert all(r.index(members[1]) - r.index(members[0]) in (1, -1) for r in order)  # a case's versions adjacent
    # three versions (track): over 2n rounds each is first equally often, and each pair of rounds cancels a linear drift
    rounds = [versions_order(3, r, 0, "alternate", seed) for r in range(6)]
    assert [o[0] for o in rounds].count(0) == [o[0] for o in rounds].count(1) == [o[0] for o in rounds].count(2) == 2
    assert all(rounds[r].index(v) + rounds[r + 1].index(v) == 2 for r in (0, 2, 4) for v in range(3))


@pytest.mark.parametrize("n_versions", [2, 3])
def test_order_seed_draws_a_balanced_schedule_that_changes_with_the_seed(n_versions):
    """--order random in one process: each pair of interleaved rounds drawn and then reversed, so every seed gives a
    balanced schedule and different seeds give different ones; --order alternate is the same whatever the seed."""
    from perflab.measure.interleave import interleaved_order

    members = [0] * n_versions  # one case's versions: one group
    drawn = {seed: interleaved_order(members, 16, seed, balanced=True, drawn=True) for seed in (0, 1, 7, 12345)}
    assert len({tuple(map(tuple, order)) for order in drawn.values()}) == 4
    for order in drawn.values():
        assert all(order[r + 1] == order[r][::-1] for r in range(0, 16, 2))  # each pair: an order, then its reverse
        for v in range(n_versions):  # a drift linear in time falls alike on every version
            assert {order[r].index(v) + order[r + 1].index(v) for r in range(0, 16, 2)} == {n_versions - 1}
    alternate = {tuple(map(tuple, interleaved_order(members, 16, seed, balanced=True))) for seed in (0, 1, 7, 12345)}
    assert len(alternate) == 1


def test_rounds_out_of_bounds_are_one_line_before_anything_is_built(repo, tmp_path):
    from perflab.sweep.versions import MAX_ROUNDS

    out = tmp_path / "never"
    for args, fragment in (
        (["ab", "--repo", repo, "--a", "c2", "--b", "c3", *CASE, "--rounds", "1000000000"], "--rounds must be at least 2"),
        (["ab", "--repo", repo, "--a", "c2", "--b", "c3", *CASE, "--rounds", str(MAX_ROUNDS + 1)], f"and at most {MAX_ROUNDS}, got 101"),
        (["track", "--repo", repo, "--revs", "c1", "c2", *CASE, "--rounds", "0"], "--rounds must be at least 1 and at most"),
        (["track", "--repo", repo, "--revs", "c1", "c2", *CASE, "--rounds", "1000000000"], "got 1000000000"),
        (["ab", "--repo", repo, "--a", "c2", "--b", "c3", *CASE, "--order", "sideways"], "--order: expected alternate or random"),
        # balance: processes need each order and its reverse; a seed that draws nothing is refused, not ignored
        (["ab", "--repo", repo, "--a", "c2", "--b", "c3", *CASE, "--pairing", "processes", "--rounds", "3"],
         "--pairing processes: --rounds 3 cannot balance who goes first (each order is followed by its reverse, so one version "
         "would go first in 2 of 3); give an even number, 4"),
        (["track", "--repo", repo, "--revs", "c1", "c2", *CASE, "--pairing", "processes"], "--rounds 1 cannot balance"),
        (["track", "--repo", repo, "--revs", "c1", "c2", *CASE, "--profile-changes", "-1"],
         "--profile-changes: expected traced steps a side from 0 (none) to 100, got -1"),
        (["ab", "--repo", repo, "--a", "c2", "--b", "c3", *CASE, "--pairing", "processes", "--order-seed", "7"],
         "--order-seed 7: --order alternate draws nothing here (processes take turns"),
        (["ab", "--repo", repo, "--a", "c2", "--b", "c3", *CASE, "--order-seed", "7"],
         "--order-seed 7: --order alternate draws nothing here (one case's versions take turns"),
    ):
        result = run_cli_here(*args, "--out", out, cwd=repo)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode == 2 and len(lines) == 1 and fragment in lines[0], (args, result.stderr)
        assert not out.exists()
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1  # no revision was checked out


def plant_store(path, experiment: dict) -> bytes:
    """A store with one run's record (``experiment``) and one row; its bytes, to see that nothing is written to it."""
    from perflab.sweep.store import Store, store_path

    with Store.create(path) as store:
        store.begin_sweep(command="planted", spec_source="s", spec_text="", experiment=experiment, env_key="e", n_cases=1, n_skipped=0)
        store.put({"case_id": "x", "status": "ok", "median_ms": 1.0}, "e")
    return store_path(path).read_bytes()


def test_ab_and_track_refuse_a_store_of_another_kind_of_run_and_write_nothing(repo, tmp_path):
    from perflab.sweep.store import store_path

    sweep_store, ab_store = tmp_path / "sweep", tmp_path / "ab"
    stores = {sweep_store: plant_store(sweep_store, {"name": "smoke", "cases": []}),
              ab_store: plant_store(ab_store, {"name": "ab", "kind": "ab", "versions": [{"name": "A", "key": "a"}, {"name": "B", "key": "b"}]})}
    for args, out, fragment in (
        (["ab", "--repo", repo, "--a", "c2", "--b", "c3"], sweep_store, "holds the results of a sweep, not of ab"),
        (["track", "--repo", repo, "--revs", "c1", "c2"], sweep_store, "holds the results of a sweep, not of track"),
        (["track", "--repo", repo, "--revs", "c1", "c2"], ab_store, "holds the results of an ab run, not of track"),
    ):
        result = run_cli_here(*args, *CASE, "--out", out, cwd=repo)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode == 2 and len(lines) == 1 and fragment in lines[0] and "give" in lines[0], result.stderr
    for out, before in stores.items():
        assert store_path(out).read_bytes() == before and sorted(p.name for p in out.iterdir()) == ["results.sqlite"]


def test_a_full_disk_while_ab_stores_is_one_line_naming_the_store_and_what_it_keeps(repo, tmp_path, monkeypatch):
    """The store's row write fails as SQLite fails on a full disk, at B's row (A's is stored first): one line, exit 2,
    naming the store and the row kept; the store holds A's row."""
    import sqlite3

    from perflab.sweep.store import Store, store_path

    insert = Store._insert
    calls = []

    def full_after_one(self, *args, **kwargs):
        calls.append(args[0].get("version", {}).get("name"))
        if len(calls) > 1:
            raise sqlite3.OperationalError("database or disk is full")
        return insert(self, *args, **kwargs)

    monkeypatch.setattr(Store, "_insert", full_after_one)
    out = tmp_path / "full"
    result = run_cli_here("ab", "--repo", repo, "--a", "c1", "--b", "c2", *QUICK, "--rounds", "2", "--out", out, cwd=repo)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert lines[-1].startswith(f"perflab: error: {store_path(out)}: the disk is full (database or disk is full)"), lines
    assert "the 1 row(s) of this run stored before it" in lines[-1] and "another --out" in lines[-1]
    monkeypatch.setattr(Store, "_insert", insert)
    assert [r["version"]["name"] for r in stored(out)[0]] == [calls[0]]
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1


def test_a_second_ctrl_c_while_the_worktrees_are_removed_waits_for_them_and_a_half_made_one_goes_too(tmp_path, monkeypatch):
    """A SIGINTed track left its worktrees: Ctrl-C again while they were removed broke off the removal, and a worktree
    whose `git worktree add` the first Ctrl-C cut short stays locked ("initializing"), which `remove --force` and `prune`
    both leave. Removal now defers Ctrl-C until every worktree is gone (then raises it), and removes locked ones."""
    import os
    import signal

    from perflab.sweep import versions

    top = tmp_path / "repo"
    top.mkdir()
    for args in (("init", "-q"), ("config", "user.email", "a@b"), ("config", "user.name", "t"), ("commit", "-q", "--allow-empty", "-m", "c")):
        git(top, *args)
    real_run, removing, handler = versions._run, [], signal.getsignal(signal.SIGINT)

    def run_then_ctrl_c(cmd, *args, **kwargs):
        if cmd[3:5] == ["worktree", "remove"]:
            removing.append(cmd)
            os.kill(os.getpid(), signal.SIGINT)  # the user's second Ctrl-C, mid-removal
        return real_run(cmd, *args, **kwargs)

    monkeypatch.setattr(versions, "_run", run_then_ctrl_c)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal (a background job's shell ignores SIGINT)
    try:
        with pytest.raises(KeyboardInterrupt):
            with versions.Worktrees(top) as trees:
                first, second = trees.add("HEAD"), trees.add("HEAD")
                git(top, "worktree", "lock", "--reason", "initializing", str(second))  # as an add cut short leaves it
                raise KeyboardInterrupt  # the first Ctrl-C
        assert len(removing) == 2 and not first.exists() and not second.exists() and not trees.base.exists()
        assert git(top, "worktree", "list", "--porcelain").count("worktree ") == 1
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Ctrl-C is the interpreter's again
    finally:
        signal.signal(signal.SIGINT, handler)
