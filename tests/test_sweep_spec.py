"""Experiment specs: YAML → cases, comparisons and break-even entries; bad specs name the file and key."""

import json
from collections import Counter
from pathlib import Path

import pytest

from perflab.errors import PerflabError
from perflab.sweep.spec import Experiment, read_experiment, parse_experiment, parse_input_sizes

ROOT = Path(__file__).resolve().parents[1]
TINY = "deit_tiny_patch16_224"
TOPK_TINY = "topk_deit_tiny_patch16_224"


def test_token_reduction_spec_is_the_seed_sweep_72_cases():
    e = read_experiment(ROOT / "experiments" / "token_reduction.yaml")
    assert len(e.cases) == 72
    assert len({c.id for c in e.cases}) == 72
    assert Counter(c.model for c in e.cases) == {"deit_base_patch16_224": 36, "topk_deit_base_patch16_224": 36}
    assert Counter((c.dtype, c.mode) for c in e.cases) == {(d, m): 18 for d in ("bf16", "fp32") for m in ("eager", "cudagraph")}
    points = Counter((c.input_size, c.batch_size) for c in e.cases)
    assert points == {**{(224, b): 8 for b in (1, 2, 4, 8, 16)}, **{(448, b): 8 for b in (1, 2, 4, 8)}}
    for c in e.cases:
        assert c.device == "cuda" and (c.warmup, c.min_time, c.repeats) == (10, 1.0, 20)
        if c.model.startswith("topk_"):
            assert (c.keep_rate, c.reduction_loc) == ((0.1,), (3, 6, 9))
        else:  # keep rates in defaults apply to the reducing model only
            assert (c.keep_rate, c.reduction_loc) == ((), ())
    rows = [{"case": c.to_dict()} for c in e.cases]
    by_name = {c.name: c for c in e.comparisons}
    assert len(by_name["token_reduction"].pairs(rows)) == 36  # every TR case has its baseline
    assert len(by_name["cuda_graph"].pairs(rows)) == 36  # every cudagraph case has its eager twin
    assert e.timeout_s == 600 and e.out == "runs/token_reduction"


def test_smoke_spec_is_a_small_cpu_sweep_with_a_breakeven():
    e = read_experiment(ROOT / "experiments" / "smoke.yaml")
    assert len(e.cases) >= 12
    assert {c.device for c in e.cases} == {"cpu"}
    assert {c.model for c in e.cases} == {TINY, TOPK_TINY}
    (b,) = e.breakevens
    assert [c.input_size for c in b.baseline] == [64, 96, 128, 160]
    assert {c.id for c in b.cases} <= {c.id for c in e.cases}  # the break-even's cases are in the sweep
    assert len(e.cases) == 12 + 2  # the grid's batch-size-1 cases are shared, only 160 px is new


def test_grid_keep_rates_apply_to_reducing_models_and_duplicates_run_once():
    e = parse_experiment({"defaults": {"device": "cpu", "reduction_loc": [3, 6, 9]},
                          "grid": {"model": [TINY, TOPK_TINY], "keep_rate": [0.1, 0.25]}}, "x.yaml")
    assert [(c.model, c.keep_rate) for c in e.cases] == [(TINY, ()), (TOPK_TINY, (0.1,)), (TOPK_TINY, (0.25,))]


def test_grid_list_explicit_cases_and_round_trip():
    e = parse_experiment({
        "defaults": {"device": "cpu", "model": TINY},
        "harness": {"warmup": 1, "iters": 5, "timeout_s": 30},
        "grid": [{"input_size": [64]}, {"input_size": [96], "batch_size": [1, 2]}],
        "cases": [{"input_size": 128, "dtype": "bf16"}, {"input_size": 64}],  # the second repeats the grid's
    }, "x.yaml")
    assert [(c.input_size, c.batch_size, c.dtype) for c in e.cases] == [(64, 1, "fp32"), (96, 1, "fp32"), (96, 2, "fp32"), (128, 1, "bf16")]
    assert all(c.warmup == 1 and c.iters == 5 for c in e.cases) and e.timeout_s == 30
    again = Experiment.from_json(e.to_json())
    assert [c.id for c in again.cases] == [c.id for c in e.cases]


def test_breakeven_section_expands_lists_into_analyses():
    e = parse_experiment({"defaults": {"device": "cpu", "keep_rate": 0.5, "reduction_loc": [3, 6, 9]},
                          "breakeven": {"model": TINY, "variant": TOPK_TINY, "input_sizes": "64:128:32", "mode": ["eager", "compile"]}}, "x.yaml")
    assert len(e.breakevens) == 2 and len(e.cases) == 12
    b = e.breakevens[0]
    assert [c.input_size for c in b.variant] == [64, 96, 128]
    assert b.variant[0].keep_rate == (0.5,) and b.baseline[0].keep_rate == ()


def test_input_size_ranges():
    assert parse_input_sizes("160:640:32") == list(range(160, 641, 32))
    assert len(parse_input_sizes("160:640:32")) == 16
    assert parse_input_sizes("224,448") == [224, 448]
    assert parse_input_sizes([224, 448]) == [224, 448]
    with pytest.raises(PerflabError, match="start:stop:step"):
        parse_input_sizes("160:640")


def test_mode_comparison_pairs_each_model_with_itself():
    e = parse_experiment({"defaults": {"device": "cpu", "keep_rate": 0.5, "reduction_loc": [3, 6, 9]},
                          "grid": {"model": [TINY, TOPK_TINY], "mode": ["eager", "compile"]},
                          "comparisons": {"graphs": {"baseline": {"mode": "eager"}, "variant": {"mode": "compile"}}}}, "x.yaml")
    pairs = e.comparisons[0].pairs([{"case": c.to_dict()} for c in e.cases])
    assert sorted((b["case"]["model"], v["case"]["model"]) for b, v in pairs) == [(TINY, TINY), (TOPK_TINY, TOPK_TINY)]
    assert e.comparisons[0].labels == ("eager", "compile")


BAD_SPECS = [
    ({"grdi": {"model": [TINY]}}, "x.yaml: grdi: unknown key; did you mean grid?"),
    ({"grid": {"model": [TINY], "batchsize": [1]}}, "x.yaml: grid.batchsize: unknown key; did you mean batch_size?"),
    ({"grid": {"model": [TINY], "batch_size": "abc"}}, "x.yaml: grid.batch_size: expected a list of integers, got 'abc'"),
    ({"grid": {"model": [TINY], "batch_size": [1, "a"]}}, "x.yaml: grid.batch_size: expected a list of integers"),
    ({"grid": {"model": [TINY], "batch_size": []}}, "x.yaml: grid.batch_size: empty list"),
    ({"grid": {}}, "x.yaml: grid: empty grid"),
    ({"grid": {"model": ["deit_bsae_patch16_224"]}}, "x.yaml: grid.model: unknown model 'deit_bsae_patch16_224'; did you mean deit_base_patch16_224"),
    ({"defaults": {"model": TINY, "dtype": "bf17"}}, "x.yaml: defaults.dtype: unknown dtype 'bf17'"),
    ({"defaults": {"model": TINY}}, "x.yaml: no cases"),
    ({"grid": {"model": [TINY], "input_size": [100]}}, "x.yaml: grid.input_size: deit_tiny_patch16_224 100px bs1 fp32 eager: input size 100 is not divisible"),
    ({"grid": {"model": [TOPK_TINY], "keep_rate": [0.5], "reduction_loc": [3, 6, 9]}}, "x.yaml: grid.reduction_loc: expected a list of location lists"),
    ({"defaults": {"keep_rate": 0.5, "reduction_loc": [3]}, "grid": {"model": [TINY]}}, "x.yaml: defaults.keep_rate: no model in this spec reduces tokens"),
    ({"harness": {"timeout_s": -1}, "grid": {"model": [TINY]}}, "x.yaml: harness.timeout_s: expected a positive number"),
    ({"harness": {"warmup": 1}, "defaults": {"warmup": 2}, "grid": {"model": [TINY]}}, "x.yaml: defaults.warmup: also set under harness"),
    ({"grid": {"model": [TINY]}, "comparisons": {"c": {"baseline": TINY, "variant": TOPK_TINY}}}, "x.yaml: comparisons.c: no case matches both sides"),
    ({"breakeven": {"model": TINY, "variant": TOPK_TINY, "input_sizes": [64, 96]}}, "x.yaml: breakeven.input_sizes: a quadratic cost fit needs at least 3"),
    ({"breakeven": {"model": TINY, "variant": TOPK_TINY, "input_sizes": "64-128"}}, "x.yaml: breakeven.input_sizes: expected start:stop:step"),
    (["a list"], "x.yaml: the spec must be a mapping"),
    ({"harness": {"ncu_top": -2}, "grid": {"model": [TINY]}}, "x.yaml: harness.ncu_top: expected a whole number of kernels"),
    ({"harness": {"ncu_top": 3, "ncu_where": {"batch": 1}}, "grid": {"model": [TINY]}}, "x.yaml: harness.ncu_where.batch: unknown key; did you mean batch_size?"),
    ({"harness": {"ncu_top": 3, "ncu_where": {"batch_size": "one"}}, "grid": {"model": [TINY]}}, "x.yaml: harness.ncu_where.batch_size: expected an integer"),
]


@pytest.mark.parametrize("spec, message", BAD_SPECS, ids=[m.split(": ")[1] for _, m in BAD_SPECS])
def test_bad_specs_name_the_file_and_the_key(spec, message):
    with pytest.raises(PerflabError) as info:
        parse_experiment(spec, "x.yaml")
    text = str(info.value)
    assert message in text
    assert "\n" not in text


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("grid:\n  model: [deit_tiny_patch16_224\n  batch_size: [1]\n")
    with pytest.raises(PerflabError, match=r"broken\.yaml: YAML syntax error at line \d+, column \d+"):
        read_experiment(path)
    with pytest.raises(PerflabError, match="no such spec file"):
        read_experiment(tmp_path / "missing.yaml")


def test_api_sweep_validates_a_spec_dict_before_running():
    from perflab import api

    with pytest.raises(PerflabError, match="<spec dict>: no cases"):
        api.sweep({"defaults": {"model": TINY}})


def test_the_ncu_pass_goes_to_the_cases_ncu_where_names_and_reaches_every_worker(tmp_path):
    from perflab.sweep.runner import worker_args
    from perflab.sweep.worker import _matches

    spec = {"harness": {"ncu_top": 4, "ncu_where": {"batch_size": 1, "mode": ["eager", "cudagraph"]}},
            "grid": {"model": [TINY], "batch_size": [1, 8], "mode": ["eager", "compile"]}}
    experiment = parse_experiment(spec, "x.yaml")
    chosen = [(c.batch_size, c.mode) for c in experiment.cases if experiment.wants_ncu(c)]
    assert chosen == [(1, "eager")]
    args = worker_args(experiment, tmp_path)
    assert args[:2] == ["--ncu-top", "4"] and args[-2:] == ["--trace-dir", str((tmp_path / "traces").resolve())]
    where = json.loads(args[args.index("--ncu-where") + 1])
    assert where == {"batch_size": [1], "mode": ["eager", "cudagraph"]}
    assert [(c.batch_size, c.mode) for c in experiment.cases if _matches(c, where)] == chosen  # the worker decides the same
    again = Experiment.from_json(json.loads(json.dumps(experiment.to_json())))
    assert again.ncu_top == 4 and [c for c in again.cases if again.wants_ncu(c)] == [c for c in experiment.cases if experiment.wants_ncu(c)]
    assert worker_args(parse_experiment({"grid": {"model": [TINY]}}, "x.yaml"), tmp_path) == []
