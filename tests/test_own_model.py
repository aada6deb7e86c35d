"""Your own model in every stage (issue 15): file.py:NAME, package.module:NAME and hf:DIR references, their families,
numbers that match perflab's own models, one-line errors, sweeps that import a spec's model, and the by-module view."""

import json
from pathlib import Path

import pytest
import torch

from cli_util import ROOT, run_cli
from perflab import api, cli
from perflab.errors import PerflabError
from perflab.models.lm import LMConfig, forward_flops, param_count
from perflab.spec import Case, validate_case

MODELS = ROOT / "tests" / "data" / "models"
COURSE = "tests/data/models/course_lm.py"
TINY = dict(d_model=64, num_layers=2, num_heads=4, d_ff=256)  # gpt_small's layout at a CPU-test size
FAST = dict(device="cpu", warmup=0, iters=3, repeats=3, min_time=0.05)


@pytest.fixture(autouse=True)
def _from_the_repo_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # relative references are read against the working directory


def test_a_course_lm_file_has_gpt_smalls_parameters_and_flops_and_runs_every_lm_workload():
    rows = api.bench(model=f"{COURSE}:small", model_args=TINY, seq_len=32, batch_size=2,
                     workload=["forward", "train_forward", "forward_backward", "train_step"], **FAST)
    config = LMConfig(d_model=64, d_ff=256, n_layers=2, n_heads=4)
    forward = forward_flops(config, batch=2, seq=32)
    passes = {"forward": 1, "train_forward": 1, "forward_backward": 3, "train_step": 3}
    assert [r["status"] for r in rows] == ["ok"] * 4, [r.get("message") for r in rows]
    for row in rows:
        assert row["family"] == "lm" and row["flops_source"] == "counted" and "flops_analytic" not in row
        assert row["params"] == param_count(config)["total"] == 1_411_392  # the built-in GPT at the same dimensions
        counted = row["gflops_per_batch"] * 1e9
        assert counted == pytest.approx(passes[row["workload"]] * forward, rel=0.02)
        assert row["items_per_step"] == 64 and row["tokens_per_s"] > 0
        assert row["model_source"]["sha1"] and row["model_source"]["path"].endswith("course_lm.py")
    # the same dimensions through perflab's GPT: the same parameter count, and counted FLOPs within 2% of each other
    (builtin,) = api.bench(model="gpt_small", model_args={"d_model": 64, "n_layers": 2, "n_heads": 4, "d_ff": 256},
                           seq_len=32, batch_size=2, workload="forward", **FAST)
    assert builtin["params"] == rows[0]["params"]
    assert rows[0]["gflops_per_batch"] == pytest.approx(builtin["gflops_per_batch"], rel=0.02)


def test_the_case_id_holds_the_reference_and_its_model_args():
    a = validate_case(Case(f"{COURSE}:small", workload="forward", seq_len=16, model_args=TINY, device="cpu"))
    b = validate_case(Case(f"{COURSE}:small", workload="forward", seq_len=16, model_args=dict(TINY, d_ff=128), device="cpu"))
    assert a.family == "lm" and a.to_dict()["model"] == f"{COURSE}:small" and a.to_dict()["family"] == "lm"
    assert a.id != b.id and a.id == Case.from_dict(a.to_dict()).id
    assert "family" not in validate_case(Case("gpt_small", device="cpu")).to_dict()  # built-in ids are what they were


@pytest.mark.parametrize("reference,family", [
    (f"{COURSE}:small", "lm"),                        # an nn.Embedding first
    ("tests/data/models/tiny_vision.py:PatchNet", "classify"),  # a 3-channel Conv2d first
    ("tests/data/models/fast_decoder.py:Transformer.from_name", "decode"),  # gpt-fast's setup_caches
])
def test_the_family_is_inferred_from_what_the_module_is(reference, family):
    args = {"name": "tinier"} if "fast_decoder" in reference else {}
    assert validate_case(Case(reference, model_args=args, device="cpu")).family == family


def test_a_package_module_reference_and_an_object_from_a_notebook(monkeypatch):
    monkeypatch.syspath_prepend(str(MODELS))
    case = validate_case(Case("tiny_vision:PatchNet", input_size=32, device="cpu"))
    assert case.family == "classify"
    from tiny_vision import PatchNet

    rows = api.bench(model=PatchNet(dim=16), input_size=32, batch_size=3, **FAST)
    assert rows[0]["status"] == "ok" and rows[0]["model"].startswith("object:PatchNet") and rows[0]["family"] == "classify"
    assert rows[0]["params"] == sum(p.numel() for p in PatchNet(dim=16).parameters())


def test_a_gpt_fast_style_decoder_runs_decode_and_generate():
    decode, = api.bench(model="tests/data/models/fast_decoder.py:Transformer.from_name", model_args={"name": "tiny"},
                        workload="decode", context_len=16, batch_size=2, **FAST)
    generate, = api.bench(model="tests/data/models/fast_decoder.py:Transformer.from_name", model_args={"name": "tiny"},
                          workload="generate", prompt_len=8, new_tokens=4, **FAST)
    assert decode["status"] == "ok" and generate["status"] == "ok", (decode.get("message"), generate.get("message"))
    assert decode["family"] == generate["family"] == "decode" and decode["items_per_step"] == 2 and generate["items_per_step"] == 4
    # The same bytes as perflab's own Llama of these shapes, to the byte: every weight once, the embedding's two
    # gathered rows only, the whole cache read and the new token's K and V written.
    from perflab.models.llama import LlamaConfig, decode_bytes

    expected = decode_bytes(LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=512, ffn_dim=128, norm_eps=1e-6),
                            batch=2, context_len=16, dtype_bytes=4)
    assert (decode["bytes_weights"], decode["bytes_kv_read"], decode["bytes_kv_write"], decode["bytes_per_step"]) == (
        expected["weights"], expected["kv_read"], expected["kv_write"], expected["total"])
    assert decode["bytes_weights"] == (decode["params"] - 512 * 64 + 2 * 64) * 4  # the table's 512 rows, less the 2 gathered
    assert generate["tpot_ms"] > 0 and generate["ttft_ms"] > 0


def test_a_tied_embedding_is_read_in_full_once_by_the_head_and_its_gathered_rows_besides():
    from perflab.workloads.decode import decoder_step_bytes

    import importlib.util

    spec = importlib.util.spec_from_file_location("fast_decoder", ROOT / "tests" / "data" / "models" / "fast_decoder.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    untied, tied = module.Transformer.from_name("tiny"), module.Transformer.from_name("tiny")
    tied.output.weight = tied.tok_embeddings.weight
    for model in (untied, tied):
        model.setup_caches(2, 17)
    a, b = decoder_step_bytes(untied, 2), decoder_step_bytes(tied, 2)
    table = 512 * 64 * 4
    assert a["bytes_weights"] == b["bytes_weights"]  # tied: the head's full read and the 2 rows, as untied
    params = sum(p.numel() for p in untied.parameters()) * 4
    assert a["bytes_weights"] == params - table + 2 * 64 * 4
    assert a["bytes_kv_write"] * 17 == a["bytes_kv_read"]


def test_a_caches_positions_are_found_in_any_layout_by_the_length_it_was_allocated():
    # The same cache (batch 2, 4 KV heads, 24 positions allocated, head_dim 8, fp32) in three layouts: gpt-fast's
    # (batch, heads, positions, head_dim), positions second, and two layers stacked in a fifth dimension. A step at
    # context 16 reads 17 positions of each and writes one; by hand, one position of a (2, 4, 8) slice is 256 bytes.
    from perflab.workloads.decode import decoder_step_bytes

    class Decoder(torch.nn.Module):
        def __init__(self, shape):
            super().__init__()
            self.proj = torch.nn.Linear(8, 8, bias=False)
            self.register_buffer("k_cache", torch.zeros(shape))
            self.register_buffer("v_cache", torch.zeros(shape))

    weights = 8 * 8 * 4
    for shape, layers in (((2, 4, 24, 8), 1), ((2, 24, 4, 8), 1), ((2, 2, 4, 24, 8), 2)):
        got = decoder_step_bytes(Decoder(shape), 2, positions=17, cache_positions=24)
        assert got == {"bytes_weights": weights, "bytes_kv_read": 2 * 17 * 256 * layers, "bytes_kv_write": 2 * 256 * layers,
                       "bytes_per_step": weights + 2 * 18 * 256 * layers}, shape
    # a tensor whose positions nothing tells (3-D, no allocated length given) is read whole, with no write
    whole = decoder_step_bytes(Decoder((2, 24, 32)), 2, positions=17)
    assert (whole["bytes_kv_read"], whole["bytes_kv_write"]) == (2 * 2 * 24 * 32 * 4, 0)


@pytest.fixture(scope="module")
def transformers():
    return pytest.importorskip("transformers")


def test_an_hf_config_directory_runs_forward_and_train_step_with_exact_parameters(transformers):
    from perflab.models.llama import LlamaConfig
    from perflab.models.llama import param_count as llama_params

    rows = api.bench(model="hf:tests/data/models/tiny-llama", workload=["forward", "train_step"], seq_len=16, batch_size=2, **FAST)
    expected = llama_params(LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=512, ffn_dim=128))["total"]
    for row in rows:
        assert row["status"] == "ok", row.get("message")
        assert row["family"] == "lm" and row["params"] == row["params_total"] == expected
        assert abs(row["flops_counted_vs_analytic"]) < 0.02  # counted vs perflab's Llama formula
    assert rows[1]["flops_analytic"] == 3 * rows[0]["flops_analytic"]


def test_an_hf_causal_lm_decodes_through_transformers_static_cache(transformers):
    decode, = api.bench(model="hf:tests/data/models/tiny-llama", workload="decode", context_len=16, batch_size=2, **FAST)
    assert decode["status"] == "ok" and decode["family"] == "decode", decode.get("message")
    cache = 2 * 2 * (2 * 2 * 17 * 16) * 4  # keys and values · layers · batch · kv heads · positions · head dim · fp32
    assert decode["bytes_kv_read"] == cache and decode["bytes_kv_write"] == cache // 17
    assert decode["bytes_weights"] == (decode["params"] - 512 * 64 + 2 * 64) * 4  # the embedding's 2 gathered rows


def _cli_error(capsys, *argv):
    with pytest.raises(SystemExit) as exit_:
        cli.main(list(argv))
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert exit_.value.code == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("model,args,fragments", [
    ("tests/data/models/nope.py:Net", [], ["model file", "nope.py not found"]),
    (f"{COURSE}:Nope", [], ["has no attribute 'Nope'", "it defines", "TransformerLM"]),
    (f"{COURSE}:NOT_A_MODEL", [], ["is a int, not an nn.Module subclass or a function that returns one"]),
    (f"{COURSE}:not_a_module", [], ["returned a str, not an nn.Module"]),
    (f"{COURSE}:broken", [], ["raised ValueError: with its reason on the last line"]),
    (f"{COURSE}:TransformerLM", ["--model-arg", "depth=3"], ["--model-arg depth", "has no argument 'depth'", "it takes vocab_size"]),
    ("hf:tests/data/models", [], ["no config.json in"]),
    (f"{COURSE}:small", ["--family", "decode"], ["setup_caches"]),
    ("tests/data/models/tiny_vision.py:PatchNet", ["--family", "lm"], ["nn.Embedding", "Conv2d"]),
    ("tests/data/models/tiny_vision.py:Mystery", [], ["cannot tell which inputs", "--family"]),
    ("gpt_small", ["--family", "classify"], ["lm family", "--family classify does not apply"]),
])
def test_every_bad_reference_is_one_line_and_exit_2(capsys, model, args, fragments):
    line = _cli_error(capsys, "bench", "--model", model, "--device", "cpu", "--iters", "1", "--repeats", "1", "--warmup", "0", *args)
    assert line.startswith("perflab: error: ")
    for fragment in fragments:
        assert fragment in line, line


def test_without_transformers_an_hf_reference_says_how_to_install_it(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_transformers(name, *args, **kwargs):
        if name == "transformers" or name.startswith("transformers."):
            raise ImportError("No module named 'transformers'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_transformers)
    with pytest.raises(PerflabError, match=r"pip install 'perflab\[hf\]'"):
        api.bench(model="hf:tests/data/models/tiny-llama", workload="forward", seq_len=8, **FAST)


def test_the_real_cli_measures_a_file_model(tmp_path):
    result = run_cli("bench", "--model", f"{COURSE}:small", "--model-arg", "d_model=32", "--model-arg", "num_layers=1", "--model-arg", "num_heads=2",
                     "--model-arg", "d_ff=64", "--seq-len", "8", "--device", "cpu", "--iters", "2", "--repeats", "2", "--warmup", "0", "--format", "json",
                     cwd=ROOT)
    assert result.returncode == 0, result.stderr
    (row,) = [json.loads(line) for line in result.stdout.splitlines()]
    assert row["status"] == "ok" and row["family"] == "lm" and row["case"]["model_args"]["d_model"] == 32


def test_a_sweep_spec_naming_a_file_relative_to_it_runs_in_subprocess_workers(tmp_path):
    spec = _spec_dir(tmp_path)
    summary = api.sweep(spec / "own.yaml", tmp_path / "out")
    rows = {r["case"]["model_args"].get("d_ff"): r for r in api.results(tmp_path / "out")}
    assert summary.counts == {"ok": 2, "error": 1}, [r.get("message") for r in rows.values()]
    assert rows[64]["family"] == "lm" and rows[64]["model"] == "models/mylm.py:small"
    assert rows[None]["status"] == "error" and "importing" in rows[None]["message"] and "ZeroDivisionError" in rows[None]["message"]


def _spec_dir(tmp_path: Path) -> Path:
    """A spec beside its own model folder (the sweep runs from another directory), and a model that fails to import."""
    spec = tmp_path / "project"
    (spec / "models").mkdir(parents=True)
    (spec / "models" / "mylm.py").write_text((MODELS / "course_lm.py").read_text())
    # The driver never imports a model whose family the spec states; the worker does, and this one fails there.
    (spec / "models" / "flaky.py").write_text("import torch.nn as nn\n\nresult = 1 / 0\n")
    (spec / "own.yaml").write_text(
        "name: own\ndefaults: {device: cpu, seq_len: 8, batch_size: 1, family: lm}\n"
        "harness: {warmup: 0, iters: 2, repeats: 2, timeout_s: 300}\n"
        "grid: {model: [models/mylm.py:small], model_args: [{d_model: 32, num_layers: 1, num_heads: 2, d_ff: 64},"
        " {d_model: 32, num_layers: 1, num_heads: 2, d_ff: 128}]}\n"
        "cases:\n  - {model: models/flaky.py:Net}\n")
    return spec


def test_grouped_query_attention_is_counted_with_the_query_heads():
    # transformers' Llama with fewer key/value heads calls SDPA with enable_gqa on a GPU; torch's formula asserts equal heads
    from torch.utils import flop_counter

    from perflab.measure.flops import _gqa

    q, kv = (2, 8, 128, 64), (2, 2, 512, 64)
    forward = _gqa(flop_counter.sdpa_flop_count, 0)
    assert forward(q, kv, kv) == flop_counter.sdpa_flop_count(q, (2, 8, 512, 64), (2, 8, 512, 64)) == 2 * 2 * 8 * 128 * 512 * (64 + 64)
    backward = _gqa(flop_counter.sdpa_backward_flop_count, 1)
    full = (2, 8, 512, 64)
    assert backward(q, q, kv, kv) == flop_counter.sdpa_backward_flop_count(q, q, full, full) > 2 * forward(q, kv, kv)


def test_the_cuda_attention_formulas_count_through_the_flop_counter_as_it_calls_them():
    # FlopCounterMode wraps custom formulas itself (tensors → shapes, out_shape=...): the GPU ops' entries must take that
    from torch.utils import flop_counter

    from perflab.measure.flops import _extra_formulas

    registry = flop_counter.FlopCounterMode(display=False, custom_mapping=_extra_formulas()).flop_registry
    q, kv = torch.empty(2, 8, 128, 64, device="meta"), torch.empty(2, 2, 512, 64, device="meta")
    flash = registry[torch.ops.aten._scaled_dot_product_flash_attention]
    assert flash(q, kv, kv, out_val=(q,)) == 2 * 2 * 8 * 128 * 512 * (64 + 64)
    backward = registry[torch.ops.aten._scaled_dot_product_efficient_attention_backward]
    full = (2, 8, 512, 64)
    assert backward(q, q, kv, kv, None, q, out_val=(q, kv, kv, None)) == flop_counter.sdpa_backward_flop_count(tuple(q.shape), tuple(q.shape), full, full)


def test_an_hf_decoder_writes_each_step_at_its_position_however_many_steps_run(transformers):
    # transformers 5's static cache writes at a running count of tokens, not at the cache_position it is given:
    # repeated steps ran off the cache's end after 17 steps (a device-side assert on a GPU). Each step must write
    # at its own position, every time.
    from perflab.runtime.workload import build

    case = validate_case(Case(model="hf:tests/data/models/tiny-llama", workload="decode", context_len=16, batch_size=2, device="cpu"))
    built = build(case)
    step = built.make_step(built.model)
    with torch.no_grad():
        for _ in range(40):
            step()
    keys = built.model.cache.layers[0].keys
    assert keys.shape[2] == 24  # the 17 positions needed, rounded up to a multiple of 8 (the padding is masked)
    assert keys[:, :, 16].abs().sum() > 0 and keys[:, :, :16].abs().sum() == 0
    decode, = api.bench(model="hf:tests/data/models/tiny-llama", workload="decode", context_len=16, batch_size=2, device="cpu",
                        warmup=2, iters=40, repeats=4)
    assert decode["status"] == "ok", decode.get("message")


def test_a_gpt_fast_style_decoder_in_the_lm_family_is_one_line(capsys):
    line = _cli_error(capsys, "bench", "--model", "tests/data/models/fast_decoder.py:Transformer.from_name", "--model-arg", "name=tiny",
                      "--family", "lm", "--workload", "forward", "--seq-len", "8", "--device", "cpu", "--iters", "1")
    assert "follows gpt-fast's decode convention" in line and "--family decode" in line


class NanLM(torch.nn.Module):
    """An LM whose logits are NaN (a bad init, an overflow): it runs, and its rows must say the numbers are garbage."""

    def __init__(self, vocab_size: int = 64, dim: int = 16):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab_size, dim)
        self.head = torch.nn.Linear(dim, vocab_size)

    def forward(self, idx):
        return self.head(self.embed(idx)) * float("nan")


def test_a_model_whose_output_is_nan_is_flagged_non_finite():
    rows = api.bench(model=NanLM, family="lm", workload=["forward", "train_step"], seq_len=8, batch_size=2, **FAST)
    for row in rows:
        assert row["status"] == "ok" and "non_finite" in row["flags"], row["flags"]
        assert any("NaN or Inf" in w for w in row["warnings"])
    fine = api.bench(model=f"{COURSE}:small", model_args=TINY, workload="train_step", seq_len=8, batch_size=2, **FAST)
    assert "non_finite" not in fine[0]["flags"]


def test_an_hf_size_below_one_is_one_line(capsys, transformers):
    line = _cli_error(capsys, "bench", "--model", "hf:tests/data/models/tiny-llama", "--model-arg", "num_hidden_layers=-1",
                      "--workload", "forward", "--seq-len", "8", "--device", "cpu", "--iters", "1")
    assert line == "perflab: error: --model-arg num_hidden_layers: a size must be a whole number, 1 or more, got -1"


def test_an_hf_decode_past_the_configs_positions_is_refused_as_perflabs_llama_is(capsys, transformers):
    line = _cli_error(capsys, "bench", "--model", "hf:tests/data/models/tiny-llama", "--workload", "decode", "--context-len", "5000",
                      "--device", "cpu", "--iters", "1")
    assert line == ("perflab: error: context 5000 + 1 new token = 5001 positions is longer than hf:tests/data/models/tiny-llama's "
                    "max_position_embeddings of 512")
    own = _cli_error(capsys, "bench", "--model", "llama2_7b", "--workload", "decode", "--context-len", "5000", "--device", "cpu", "--iters", "1")
    assert own == "perflab: error: context 5000 + 1 new token = 5001 positions is longer than llama2_7b's max_seq_len of 4096"


def test_your_own_lm_file_trains_data_parallel_with_counted_flops_and_its_source():
    """A course LM file under DDP on two gloo ranks (issue 27: "works for your own model"): the ranks agree, each rank
    all-reduces its fp32 gradients, and with no FLOP formula the row counts rank 0's step (3 × the forward's FLOPs per
    rank for a train step, both ranks in the batch's total)."""
    from perflab.measure.parallel import run_parallel_case

    case = Case(model=f"{COURSE}:small", model_args=dict(TINY, num_layers=1), seq_len=16, batch_size=2, workload="train_step",
                device="cpu", warmup=1, iters=2, repeats=2, min_time=0.05, parallel="ddp", world_size=2)
    row = run_parallel_case(case, single=False)
    assert row["status"] == "ok", row.get("message")
    config = LMConfig(d_model=64, d_ff=256, n_layers=1, n_heads=4)
    assert row["params"] == param_count(config)["total"] and row["ranks_agree"] is True
    assert row["comm_bus_bytes"] == row["grad_bytes"] == 4 * row["params"]  # 2(N−1)/N = 1 at N = 2
    assert row["flops_source"] == "counted" and "flops_analytic" not in row
    assert row["gflops_per_batch"] * 1e9 == pytest.approx(2 * 3 * forward_flops(config, batch=2, seq=16), rel=0.02)
    assert row["model_source"]["sha1"] and row["model_source"]["path"].endswith("course_lm.py")
