"""The experiment file's typed schema: the committed specs validate against its JSON Schema, decode to the same
case ids as before the schema, and the spec's way from api.sweep into sweep/spec.py is short."""

import json
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from perflab import spec_schema
from perflab.errors import PerflabError
from perflab.sweep.spec import read_experiment, parse_experiment
from perflab.workloads import FAMILIES

ROOT = Path(__file__).resolve().parents[1]
SPECS = sorted((ROOT / "experiments").glob("*.yaml"))
TINY = "deit_tiny_patch16_224"


@pytest.fixture(scope="module")
def validator():
    schema = spec_schema.json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize("path", SPECS, ids=[p.name for p in SPECS])
def test_committed_specs_validate_against_the_json_schema(path, validator):
    errors = list(validator.iter_errors(yaml.safe_load(path.read_text())))
    assert errors == []


def test_the_json_schema_refuses_what_the_decoder_refuses(validator):
    for bad in ({"grdi": {"model": [TINY]}}, {"grid": {"model": [TINY], "batch_size": "abc"}},
                {"defaults": {"dtype": "bf17"}}, {"harness": {"ncu_top": -2}},
                {"comparisons": {"c": {"baseline": TINY}}}, {"grid": {"model": [TINY], "batch_size": []}},
                {"grid": {"model": ["gpt_small"], "parallel": ["pp"]}}, {"defaults": {"parallel": "ddp:reshard=false"}},
                {"grid": {"model": ["gpt_small"], "world_size": [2, 0]}}):
        assert list(validator.iter_errors(bad)), bad
        with pytest.raises(PerflabError):
            spec_schema.decode(bad, "x.yaml")


def test_every_family_field_is_in_the_schema():
    schema = spec_schema.json_schema()["$defs"]
    for family in FAMILIES.values():
        for name in [*family.fields, *family.variants]:
            for struct in ("CaseFields", "GridBlock", "CaseFilter"):
                assert name in schema[struct]["properties"], (struct, name)
    assert schema["GridBlock"]["properties"]["seq_len"]["description"] == "a list of integers"
    for name in ("parallel", "world_size"):  # every case's, as the common fields
        assert all(name in schema[struct]["properties"] for struct in ("CaseFields", "GridBlock", "CaseFilter", "CaseValues"))
    assert schema["CaseFields"]["properties"]["world_size"]["minimum"] == 1


def test_case_ids_are_those_of_the_hand_written_parser():
    """tests/data/experiment_ids.json was written by perflab before the typed schema (main at 3be703e; lm_parallel.yaml by
    issue 27's branch at 90f4d65, its hand-written parser; lm_sizes.yaml's last 120, its capped grid, appended by issue 23)."""
    expected = json.loads((ROOT / "tests" / "data" / "experiment_ids.json").read_text())
    assert sorted(expected) == [p.name for p in SPECS]
    for path in SPECS:
        e = read_experiment(path)
        got = {"cases": [c.id for c in e.cases], "breakeven": [[c.id for c in b.cases] for b in e.breakevens],
               "comparisons": [c.to_json() for c in e.comparisons]}
        assert got == expected[path.name], path.name


def test_errors_name_the_key_path_inside_lists_and_mappings():
    cases = [
        ({"harness": {"ncu_top": 1, "ncu_where": {"batch_size": [1, "a"]}}, "grid": {"model": [TINY]}},
         "x.yaml: harness.ncu_where.batch_size[1]: expected an integer, got 'a'"),
        ({"grid": {"model": [TINY]}, "comparisons": {"ok": {"baseline": TINY, "variant": {"batch_size": 2}},
                                                     "bad": {"baseline": {"batch_size": "x"}, "variant": TINY}}},
         "x.yaml: comparisons.bad.baseline.batch_size: expected an integer, got 'x'"),
        ({"grid": [{"model": [TINY]}, {"model": [TINY], "dtype": ["bf17"]}]},
         "x.yaml: grid[1].dtype: unknown dtype 'bf17'; choose one of fp32, tf32, bf16, fp16"),
        ({"cases": [{"model": "gpt_small", "optimizer": 3}]}, "x.yaml: cases[0].optimizer: expected an optimizer name, got 3"),
        ({"breakeven": [{"model": TINY, "input_sizes": [64, 96, 128]}]},
         "x.yaml: breakeven[0].variant: missing; a break-even needs model, variant and input_sizes"),
        ({"grid": {"model": [TINY], "batch_size": True}}, "x.yaml: grid.batch_size: expected a list of integers, got True"),
        ({"grid": [{"model": ["gpt_small"]}, {"model": ["gpt_small"], "parallel": ["ddp", "tp"]}]},
         "x.yaml: grid[1].parallel: unknown mode 'tp'; choose ddp or fsdp (options after a colon, e.g. ddp:bucket_cap_mb=100)"),
        ({"defaults": {"parallel": "ddp:bucket_cap_mb=x"}, "grid": {"model": ["gpt_small"]}},
         "x.yaml: defaults.parallel: bucket_cap_mb takes a float, got 'x'"),
        ({"cases": [{"model": "gpt_small", "world_size": 0}]}, "x.yaml: cases[0].world_size: expected a whole number of ranks, 1 or more, got 0"),
    ]
    for spec, message in cases:
        with pytest.raises(PerflabError) as info:
            parse_experiment(spec, "x.yaml")
        assert str(info.value) == message


def test_spec_schema_command_writes_the_schema(tmp_path, capsys):
    from perflab.cli import main

    path = tmp_path / "spec.schema.json"
    main(["spec-schema", "--out", str(path)])  # returns on success; failures exit
    assert json.loads(path.read_text()) == spec_schema.json_schema()
    with pytest.raises(SystemExit) as info:
        main(["spec-schema", "--out", str(tmp_path / "missing" / "x.json")])
    assert info.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_api_sweeps_spec_enters_sweep_spec_at_most_twice():
    """The spec's way from api.sweep: read, decoded once, expanded; it does not climb back into sweep/spec.py."""
    from perflab import api

    spec_file = str(ROOT / "src" / "perflab" / "sweep" / "spec.py")
    entries = []

    def watch(frame, event, arg):
        if event == "call" and frame.f_code.co_filename == spec_file:
            caller = frame.f_back
            if caller is None or caller.f_code.co_filename != spec_file:
                entries.append(frame.f_code.co_name)

    sys.setprofile(watch)
    try:
        experiment = api._experiment(ROOT / "experiments" / "smoke.yaml")
    finally:
        sys.setprofile(None)
    assert len(experiment.cases) == 14
    assert 1 <= len(entries) <= 2, entries
