"""A case's fields are declared once (perflab.spec.CASE_FIELDS); every list of them is that table's, and these exact sets
fail when a Case field lacks its declaration or a list made elsewhere disagrees with it (issue 53)."""

import inspect
from dataclasses import MISSING, fields
from typing import List, Optional

from perflab import api, spec_schema
from perflab.cli_flags import CASE_FLAGS, CASE_PER_VALUE, LIST_VALUED
from perflab.spec import ARGUMENT_DEFAULT, AXES, CASE_FIELDS, DEFAULT, FLAG, PARALLEL_FIELDS, SHAPE_FIELDS, TRAINING_VARIANTS, Case
from perflab.workloads import FAMILIES

# Declared not to be a flag of the case-flag group: each command has its own --model; --parallel and --world-size are
# flags of the commands that run ranks.
NOT_IN_GROUP = {"model", "parallel", "world_size"}
AXIS_FIELDS = ("model", "input_size", "batch_size", "dtype", "mode", "workload", "seq_len", "prompt_len", "context_len", "new_tokens")
LIST_FIELDS = set(AXIS_FIELDS) | {"keep_rate", "reduction_loc"}


def test_every_case_field_is_declared_once_with_its_default():
    assert [f.name for f in fields(Case)] == [
        "model", "workload", "input_size", "batch_size", "keep_rate", "reduction_loc", "seq_len", "prompt_len", "context_len",
        "new_tokens", "layers", "layers_only", "model_args", "attn", "dtype", "mode", "device", "max_memory", "warmup", "min_time",
        "iters", "repeats", "seed", "family", "optimizer", "checkpoint_activations", "parallel", "world_size"]
    assert set(CASE_FIELDS) == {f.name for f in fields(Case)}
    assert all(name == f.name for name, f in CASE_FIELDS.items())
    assert {f.name: f.default for f in fields(Case)} == {name: f.default for name, f in CASE_FIELDS.items()}
    assert Case.__dataclass_fields__["model"].default is MISSING and "model" not in DEFAULT
    assert (DEFAULT["warmup"], DEFAULT["min_time"], DEFAULT["repeats"], DEFAULT["iters"]) == (10, 1.0, 20, None)


def test_every_case_field_has_a_flag_of_the_group_or_is_declared_not_one():
    in_group = {name for name, f in CASE_FIELDS.items() if f.in_group}
    assert in_group == set(CASE_FIELDS) - NOT_IN_GROUP
    # the group's parameters: the fields' names, but --model-arg's (NAME=VALUE, repeatable)
    assert set(CASE_FLAGS) == in_group - {"model_args"} | {"model_arg"}
    assert list(CASE_FLAGS) == [CASE_FIELDS["model_args" if p == "model_arg" else p].param for p in CASE_FLAGS]
    for name in in_group:
        f = CASE_FIELDS[name]
        annotation, option = CASE_FLAGS[f.param]
        assert (option.param_decls, option.help, option.default) == ((FLAG[name],), f.help, f.flag_default), name
    assert FLAG["model_args"] == "--model-arg" and FLAG["checkpoint_activations"] == "--checkpoint-activations"
    # the types the flags took before they were made from the table
    assert {p: a for p, (a, _) in CASE_FLAGS.items()} == {
        "input_size": List[int], "batch_size": List[int], "keep_rate": List[float], "reduction_loc": List[int], "workload": List[str],
        "seq_len": List[int], "prompt_len": List[int], "context_len": List[int], "new_tokens": List[int], "layers": Optional[int],
        "layers_only": bool, "model_arg": List[str], "max_memory": Optional[str], "family": Optional[str], "attn": str,
        "dtype": List[str], "mode": List[str], "device": str, "warmup": int, "min_time": float, "iters": Optional[int], "repeats": int,
        "seed": int, "optimizer": Optional[str], "checkpoint_activations": bool}


def test_the_list_valued_fields_and_the_axes_of_make_cases():
    assert {name for name, f in CASE_FIELDS.items() if f.list_valued} == LIST_FIELDS
    assert AXES == AXIS_FIELDS  # slowest first: the order the cases come out in
    assert set(LIST_VALUED) == LIST_FIELDS - NOT_IN_GROUP
    assert set(CASE_PER_VALUE) == set(AXIS_FIELDS) - NOT_IN_GROUP
    assert set(api._MULTI) == LIST_FIELDS - {"model"}  # cases_for_model's one value as a list of one


def test_make_cases_takes_every_field_with_its_declared_default():
    params = inspect.signature(api.make_cases).parameters
    assert set(params) == set(CASE_FIELDS)
    assert {name: p.default for name, p in params.items() if name != "model"} == ARGUMENT_DEFAULT
    assert params["model"].default is inspect.Parameter.empty
    assert {name for name, p in params.items() if "Sequence" in str(p.annotation)} == LIST_FIELDS
    assert (ARGUMENT_DEFAULT["dtype"], ARGUMENT_DEFAULT["device"], ARGUMENT_DEFAULT["input_size"], ARGUMENT_DEFAULT["model_args"]) == (
        ("fp32",), "auto", (), None)
    # breakeven_experiment's timing and precision defaults are make_cases'
    breakeven = inspect.signature(api.breakeven_experiment).parameters
    for name in ("dtype", "mode", "device", "keep_rate", "reduction_loc", "attn", "warmup", "min_time", "iters", "repeats"):
        assert breakeven[name].default == ARGUMENT_DEFAULT[name], name


def test_cases_for_model_takes_one_value_of_each_list_valued_field():
    one = {"input_size": 32, "batch_size": 2, "dtype": "fp32", "mode": "eager", "keep_rate": 0.5, "reduction_loc": 3}
    (case,) = api.cases_for_model("topk_deit_tiny_patch16_224", device="cpu", **one)
    assert (case.input_size, case.batch_size, case.keep_rate, case.reduction_loc) == (32, 2, (0.5,), (3,))


def test_the_spec_schema_and_the_families_use_the_declared_fields():
    assert set(spec_schema.case_field_specs()) == set(CASE_FIELDS)
    assert all(spec is CASE_FIELDS[name].spec for name, spec in spec_schema.case_field_specs().items())
    owners = {name: f.owners for name, f in CASE_FIELDS.items() if f.owners}
    assert owners == {
        "input_size": ("classify",), "keep_rate": ("classify",), "reduction_loc": ("classify",), "model_args": ("classify", "lm", "decode"),
        "workload": ("lm", "decode"), "seq_len": ("lm",), "layers": ("lm", "decode"), "optimizer": ("lm",),
        "checkpoint_activations": ("lm",), "prompt_len": ("decode",), "context_len": ("decode",), "new_tokens": ("decode",),
        "layers_only": ("decode",)}
    for family in FAMILIES.values():
        assert set(family.fields) | set(family.variants) <= set(CASE_FIELDS), family.name
    assert SHAPE_FIELDS == {"workload": None, "input_size": None, "keep_rate": (), "reduction_loc": (), "seq_len": None, "prompt_len": None,
                            "context_len": None, "new_tokens": None, "layers": None, "layers_only": False, "model_args": ()}
    assert list(SHAPE_FIELDS) == [f.name for f in fields(Case) if f.name in SHAPE_FIELDS]
    assert TRAINING_VARIANTS == {"optimizer": None, "checkpoint_activations": False}
    assert PARALLEL_FIELDS == {"parallel": None, "world_size": 1}
