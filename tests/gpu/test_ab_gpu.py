"""perflab ab on a GPU (issue 40): an A/A test of two revisions that differ only in a comment, on the demo's launch-bound
case (deit_base_patch16_224, batch 1, bf16, eager), 3 rounds, each round one process timing A's and B's blocks next to
each other. A launch-bound step's median moved 1.5-1.9x between processes on the H100 hosts; paired block by block,
B/A must stay within a few percent of 1 in every round, and the verdict must be "no change" with its CI inside ±5%."""

from __future__ import annotations

import json
import subprocess

from cli_util import run_cli_here

CASE = ["--model", "deit_base_patch16_224", "--batch-size", "1", "--dtype", "bf16", "--mode", "eager", "--device", "cuda"]


def git(repo, *args) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def test_an_a_a_ab_of_a_launch_bound_case_finds_no_change_within_5_percent(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "perflab@example.com")
    git(repo, "config", "user.name", "perflab tests")
    for tag, comment in (("c1", "# the first version"), ("c2", "# the same code, another comment")):
        (repo / "notes.py").write_text(f"{comment}\nVALUE = 1\n")
        git(repo, "add", "notes.py")
        git(repo, "commit", "-q", "-m", tag)
        git(repo, "tag", tag)
    out = tmp_path / "ab"
    result = run_cli_here("ab", "--repo", repo, "--a", "c1", "--b", "c2", *CASE, "--rounds", "3", "--out", out, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    (case,) = report["cases"]
    ratio = case["ratio"]
    assert report["pairing"] == "blocks" and ratio["basis"] == "blocks" and ratio["units"] == 3
    assert case["verdict"] == "no change", case
    assert 1 / 1.05 <= ratio["low"] <= ratio["ratio"] <= ratio["high"] <= 1.05, case
    assert case["host_dependent"] and "launch-bound" in case["host_dependent"]  # labelled: its absolute times move with the host
