"""`perflab sweep` with bad input: one stderr line naming the file and key, exit status 2, the store untouched."""

import hashlib

import pytest

from cli_util import assert_one_line_error, run_cli_here
from perflab.sweep.store import Store


def snapshot(directory):
    """Every file under a directory with the hash of its bytes (but the lock a refused sweep may take)."""
    return {p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file() and p.name != "sweep.lock"}


@pytest.fixture
def stored_dir(tmp_path):
    out = tmp_path / "run"
    with Store.create(out) as store:
        store.put({"case_id": "abc", "status": "ok", "model": "test:tiny"}, "env")
    return out


BAD = [  # (spec text, what the one line must say); the in-process tests (test_sweep_spec.py) cover many more
    ("grid:\n  model: [deit_tiny_patch16_224\n  batch_size: [1]\n", ["bad.yaml: YAML syntax error at line 3, column 13"]),
    ("grid:\n  model: [deit_tiny_patch16_224]\n  batch_size: abc\n", ["bad.yaml: grid.batch_size: expected a list of integers, got 'abc'"]),
    ("defaults: {device: cpu}\ngrid:\n  model: [deit_tiny_patch16_22]\n", ["bad.yaml: grid.model: unknown model 'deit_tiny_patch16_22'", "did you mean deit_tiny_patch16_224"]),
]


def test_bad_spec_is_one_line_exit_2_and_the_store_is_untouched(tmp_path, stored_dir):
    spec = tmp_path / "bad.yaml"
    before = snapshot(stored_dir)
    for text, fragments in BAD:
        spec.write_text(text)
        r = run_cli_here("sweep", spec, "--out", stored_dir, "--resume")
        assert_one_line_error(r, *fragments)
        assert snapshot(stored_dir) == before
    fresh = tmp_path / "fresh"
    r = run_cli_here("sweep", spec, "--out", fresh)
    assert_one_line_error(r, *BAD[-1][1])
    assert not fresh.exists()  # validation comes before the store is created


def test_existing_results_need_resume_and_bad_flags_are_one_line(tmp_path, stored_dir):
    spec = tmp_path / "ok.yaml"
    spec.write_text("defaults: {device: cpu, input_size: 32, iters: 2, repeats: 2}\ncases:\n  - {model: 'test:tiny'}\n")
    before = snapshot(stored_dir)
    r = run_cli_here("sweep", spec, "--out", stored_dir)
    assert_one_line_error(r, f"{stored_dir} already holds 1 stored result(s); pass --resume")
    r = run_cli_here("sweep", spec, "--out", stored_dir, "--gpus", "0,x")
    assert_one_line_error(r, "--gpus: expected GPU indices like 0,1, got '0,x'")
    r = run_cli_here("sweep", tmp_path / "missing.yaml", "--out", stored_dir)
    assert_one_line_error(r, "missing.yaml: no such spec file")
    r = run_cli_here("results", tmp_path / "nowhere")
    assert_one_line_error(r, "no results store (results.sqlite) here")
    assert snapshot(stored_dir) == before


def test_cuda_spec_without_a_gpu_is_refused_before_the_store(tmp_path):
    from cli_util import ROOT

    r = run_cli_here("sweep", ROOT / "experiments" / "token_reduction.yaml", "--out", tmp_path / "tr")
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        has_cuda = False
    if has_cuda:
        pytest.skip("this machine has a GPU")
    assert_one_line_error(r, "token_reduction.yaml: the spec's cases run on CUDA, which is not available here")
    assert not (tmp_path / "tr").exists()
