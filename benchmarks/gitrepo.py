"""The benchmarks' git helpers: ``git -C REPO ARGS`` and an empty repository with a committer of its own."""

from __future__ import annotations

import subprocess
from pathlib import Path


def git(repo, *args) -> str:
    """``git -C repo ARGS``, its output stripped (raises on failure)."""
    return subprocess.run(["git", "-C", str(repo), *map(str, args)], check=True, capture_output=True, text=True).stdout.strip()


def new_repo(path: Path) -> Path:
    """An empty git repository at ``path`` (made), with a committer of its own."""
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q")
    git(path, "config", "user.email", "perflab@example.com")
    git(path, "config", "user.name", "perflab benchmark")
    return path
