"""Finding one's way in: perflab --version, perflab models, dir(perflab), and how to add timm."""

import json

import pytest

import perflab
from cli_util import assert_one_line_error, run_cli_here


def test_version_prints_the_package_version():
    r = run_cli_here("--version")
    assert r.returncode == 0 and r.stdout == f"perflab {perflab.__version__}\n" and r.stderr == ""


def test_perflab_alone_prints_the_help_with_every_command():
    help_text = run_cli_here("--help").stdout
    for args in ((), ("--wide",)):
        r = run_cli_here(*args)
        assert r.returncode == 0 and r.stderr == "" and r.stdout == help_text  # it printed nothing before
    assert help_text.startswith("Usage: perflab") and " bench " in help_text and " models " in help_text


def test_models_lists_every_built_in_model_the_families_and_the_reference_forms(monkeypatch):
    from perflab.models.llama import llama_configs
    from perflab.models.lm import lm_configs
    from perflab.models.vit import vit_configs
    from perflab.workloads import FAMILIES

    monkeypatch.setenv("COLUMNS", "100")
    r = run_cli_here("models")
    assert r.returncode == 0, r.stderr
    assert max(len(line) for line in r.stdout.splitlines()) <= 100
    first_cells = [line.split("│")[1].strip() for line in r.stdout.splitlines() if line.startswith("│")]
    for name in [*vit_configs, *lm_configs, *llama_configs]:
        assert name in first_cells, name
    for family in FAMILIES:
        assert family in first_cells
    for form in ("topk_<vit>", "evit_<vit>", "timm:<name>", "path/to/file.py:NAME", "package.module:NAME", "hf:DIR_OR_ID"):
        assert form in first_cells, form
    assert "pip install timm" in r.stdout and "pip install 'perflab[hf]'" in r.stdout
    catalog = json.loads(run_cli_here("models", "--json").stdout)
    by_family = {f["name"]: f for f in catalog["families"]}
    assert list(by_family["lm"]["models"]) == list(lm_configs) and by_family["lm"]["workloads"] == list(FAMILIES["lm"].workloads)
    assert by_family["classify"]["models"]["deit_tiny_patch16_224"] == "dim 192, depth 12, heads 3"


def test_dir_lists_the_public_api_and_each_name_resolves():
    names = dir(perflab)
    for name in ("bench", "profile", "analyze", "compare", "explain", "make_cases", "model_catalog", "results", "api",
                 "__version__"):
        assert name in names
    assert not [n for n in names if n.startswith("_") and n != "__version__"]  # no internals
    from perflab import api

    for name in names:
        if name not in ("api", "__version__"):
            assert getattr(perflab, name) is getattr(api, name)


def test_a_timm_model_without_timm_says_how_to_add_it(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "timm", None)  # import timm fails as where it is not installed
    r = run_cli_here("bench", "--model", "timm:deit_tiny_patch16_224", "--device", "cpu", "--iters", "1", "--repeats", "1")
    assert_one_line_error(r, "timm models need timm", "pip install timm")
