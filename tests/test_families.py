"""Workload families: cases keep the ids earlier versions gave them, stores written then stay readable, and
each family owns its shape fields (a field of another family is one clear error)."""

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from perflab import api
from perflab.errors import PerflabError
from perflab.spec import Case, convert_field, validate_case
from perflab.workloads import family_of, parse_bytes

REPORT = Path(__file__).resolve().parents[1] / "docs" / "reports" / "token_reduction"


def test_stored_cases_of_perflab_0_1_keep_their_ids():
    # The committed H200 store was written before workload families existed: every stored row's case, read
    # back through today's Case, must hash to the id it was stored under.
    conn = sqlite3.connect(REPORT / "results.sqlite")
    rows = [(case_id, json.loads(text)) for case_id, text in conn.execute("SELECT case_id, row_json FROM results")]
    assert len(rows) == 72
    for case_id, row in rows:
        assert "workload" not in row["case"] and "seq_len" not in row["case"]
        case = Case.from_dict(row["case"])
        assert case.family == "classify" and case.workload == "forward"
        assert case.id == case_id
        assert validate_case(case).id == case_id


def test_a_store_of_perflab_0_1_reports_every_case(tmp_path):
    out = tmp_path / "tr"
    shutil.copytree(REPORT, out)
    text = api.report(out, n_boot=100).read_text()
    assert "72 cases: 72 ok." in text
    assert "not run" not in text
    assert len(api.results(out)) == 72


def test_family_of_model_names():
    assert family_of("deit_base_patch16_224").name == "classify"
    assert family_of("topk_deit_base_patch16_224").name == "classify"
    assert family_of("timm:resnet50").name == "classify"
    assert family_of("gpt_small").name == "lm"
    assert family_of("llama3_8b").name == "decode"


def test_the_model_registry_and_the_families_read_the_same_name_prefixes():
    """models.registry finds perflab's own language-model configs by prefix without importing the workloads; the
    family each config's name implies is the one its registry kind builds for."""
    from perflab.models.llama import llama_configs
    from perflab.models.lm import lm_configs
    from perflab.models.registry import parse_model_name

    for configs, kind, family in ((lm_configs, "lm", "lm"), (llama_configs, "llama", "decode")):
        for name in configs:
            assert (parse_model_name(name).family, family_of(name).name) == (kind, family)
    with pytest.raises(PerflabError, match="unknown language model config 'gpt_smal'; did you mean gpt_small"):
        parse_model_name("gpt_smal")


def test_family_defaults_fill_unset_fields():
    vit = Case("deit_tiny_patch16_224")
    assert (vit.input_size, vit.batch_size, vit.workload) == (224, 1, "forward")
    lm = Case("gpt_small")
    assert (lm.seq_len, lm.batch_size, lm.workload, lm.input_size) == (128, 4, "forward", None)
    dec = Case("llama3_8b")
    assert (dec.workload, dec.context_len, dec.prompt_len, dec.batch_size) == ("decode", 512, None, 1)
    gen = Case("llama3_8b", workload="generate")
    assert (gen.prompt_len, gen.new_tokens, gen.context_len) == (128, 128, None)


def test_a_case_serialises_to_its_family_fields_only():
    lm = Case("gpt_small", seq_len=256, workload="train_step", model_args={"d_ff": 2048})
    d = lm.to_dict()
    assert {"input_size", "keep_rate", "reduction_loc", "context_len", "prompt_len"}.isdisjoint(d)
    assert d["seq_len"] == 256 and d["workload"] == "train_step" and d["model_args"] == {"d_ff": 2048}
    assert Case.from_dict(d) == lm and Case.from_dict(d).id == lm.id
    vit = Case("deit_tiny_patch16_224").to_dict()
    assert "workload" not in vit and "seq_len" not in vit and vit["keep_rate"] == []
    capped = Case("gpt_small", max_memory=24 * 2**30).to_dict()
    assert capped["max_memory"] == 24 * 2**30


@pytest.mark.parametrize("field, value, message", [
    ("batch_size", "four", "batch_size: expected int | null, got 'four'"),
    ("batch_size", 2.5, "batch_size: expected int | null, got 2.5"),
    ("seq_len", [128], "seq_len: expected int | null, got [128]"),
    ("layers_only", "yes", "layers_only: expected bool, got 'yes'"),
    ("max_memory", "lots", "max_memory: expected a size such as 24GiB"),
])
def test_field_types_are_checked_by_msgspec(field, value, message):
    with pytest.raises(PerflabError, match=message.replace("|", r"\|").replace("[", r"\[").replace("]", r"\]")):
        convert_field(field, value)


def test_unknown_fields_are_refused():
    with pytest.raises(PerflabError, match="unknown case field"):
        Case.from_dict({"model": "gpt_small", "seqlen": 128})


def test_sizes_parse_to_bytes():
    assert parse_bytes("24GiB") == 24 * 2**30
    assert parse_bytes("24GB") == 24 * 10**9
    assert parse_bytes("512 MiB") == 512 * 2**20
    assert parse_bytes("2.5e10") == 25_000_000_000
    for bad in ("-1GiB", "x", "0"):
        with pytest.raises(ValueError):
            parse_bytes(bad)


def test_a_field_of_another_family_is_one_clear_error():
    with pytest.raises(PerflabError, match="--seq-len does not apply to deit_tiny_patch16_224, a model of the classify family"):
        validate_case(Case("deit_tiny_patch16_224", seq_len=128, device="cpu"))
    with pytest.raises(PerflabError, match="has no workload 'decode'; choose forward; decode is a workload of the decode family"):
        validate_case(Case("deit_tiny_patch16_224", workload="decode", device="cpu"))
