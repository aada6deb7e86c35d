"""lm training variants: --optimizer (fused, foreach, in_backward, in_backward_stream) against torch's for-loop
AdamW, and --checkpoint-activations against the plain forward; their case fields and per-pass costs."""

import pytest
import torch
import torch.nn.functional as F

from perflab.errors import PerflabError
from perflab.models.lm import GPT, LMConfig
from perflab.runtime.modes import make_step
from perflab.runtime.workload import build, step_context
from perflab.spec import Case, validate_case
from perflab.workloads.lm import ADAMW_LR, LM, lm_pass_costs

TINY = dict(d_model=64, d_ff=96, n_layers=2, n_heads=4, vocab_size=97, context_length=32)


def tiny_case(**kw) -> Case:
    base = dict(model="gpt_small", workload="train_step", seq_len=16, batch_size=2, device="cpu", warmup=0, iters=1, repeats=1, model_args=TINY)
    return validate_case(Case(**{**base, **kw}))


def reference_params(case: Case, steps: int) -> dict:
    """The same model, inputs and loss, stepped by torch.optim.AdamW(fused=False, foreach=False)."""
    built = build(case)
    model, idx, targets = built.model, built.extra["inputs"], built.extra["targets"]
    opt = torch.optim.AdamW(model.parameters(), lr=ADAMW_LR, fused=False, foreach=False)
    for _ in range(steps):
        logits = model(idx)
        F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.fixture(scope="module")
def reference():
    case = tiny_case()
    initial = {n: p.detach().clone() for n, p in build(case).model.named_parameters()}
    return initial, reference_params(case, steps=2)


@pytest.mark.parametrize("optimizer", [None, "fused", "foreach", "in_backward", "in_backward_stream"])
def test_every_optimizer_gives_torchs_adamw_parameters_after_two_steps(optimizer, reference):
    initial, expected = reference
    case = tiny_case(optimizer=optimizer)
    built = build(case)
    with step_context(case, built):
        step = make_step(built, "eager")
        step()
        step()
    got = {n: p.detach() for n, p in built.model.named_parameters()}
    assert got.keys() == expected.keys()
    moved = max((expected[n] - initial[n]).abs().max().item() for n in expected)
    assert moved > 1e-4 * 0.5  # Adam's first steps move each weight by about lr: the comparison below can see a missed step
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=1e-6, msg=lambda m: f"{optimizer} {name}: {m}")
    if optimizer in ("in_backward", "in_backward_stream"):
        assert all(p.grad is None for p in built.model.parameters())  # each hook frees its gradient after the update
        assert len(built.optimizer.state) == len(expected)  # one AdamW state per parameter, seen by the memory breakdown


def test_checkpointing_gives_the_same_loss_and_gradients():
    plain_cfg = LMConfig.from_name("gpt_small", **TINY)
    ckpt_cfg = LMConfig.from_name("gpt_small", **TINY, checkpoint_activations=True)
    torch.manual_seed(0)
    plain = GPT(plain_cfg)
    ckpt = GPT(ckpt_cfg)
    ckpt.load_state_dict(plain.state_dict())
    idx = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(1))
    targets = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(2))
    calls = []
    block_forward = ckpt.layers[0].forward  # counted by wrapping: forward hooks do not fire in the recompute

    def counted(*args):
        calls.append(1)
        return block_forward(*args)

    ckpt.layers[0].forward = counted
    losses = []
    for model in (plain, ckpt):
        logits = model(idx)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        loss.backward()
        losses.append(loss.detach())
    assert len(calls) == 2  # the checkpointed block ran its forward again in the backward
    torch.testing.assert_close(losses[1], losses[0], rtol=0, atol=0)
    for (name, a), (_, b) in zip(plain.named_parameters(), ckpt.named_parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-6, atol=1e-7, msg=lambda m: f"{name}: {m}")


def test_live_tensor_bytes_counts_each_new_storage_until_it_is_freed():
    from perflab.measure.memory import LiveTensorBytes

    weight = torch.ones(2**16)  # 256 KiB, made before the mode: never counted, nor are its views
    tracker = LiveTensorBytes()
    with tracker:
        x = torch.ones(2**18)  # 1 MiB
        y = x * 2  # 1 MiB more
        view = y[:10]
        y.add_(1)  # in place: no new memory
        _ = weight.view(-1)[:5]
        assert tracker.current == 2 * 2**20
        del y
        assert tracker.current == 2 * 2**20  # the view keeps y's storage alive
        del view
        assert tracker.current == 2**20
        z = x + 1
        del z
    assert tracker.peak == 2 * 2**20 and tracker.current == 2**20


MEMORY_DIMS = {"d_model": 128, "d_ff": 512, "n_heads": 4, "vocab_size": 512}


def activation_bytes(dtype: str, checkpoint: bool, layers: int) -> dict:
    from perflab.measure.memory import step_memory

    return step_memory(validate_case(Case("gpt_small", workload="train_step", seq_len=128, batch_size=4, device="cpu", dtype=dtype,
                                          layers=layers, model_args=MEMORY_DIMS, checkpoint_activations=checkpoint)))


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_checkpointing_lowers_the_peak_and_each_block_keeps_only_its_input(dtype):
    """Measured by counting live tensor bytes (the CPU has no allocator statistics; measure.memory). A checkpointed
    block leaves exactly its input alive for the backward, B·T·d fp32 (the residual stream stays fp32 under autocast),
    and under bf16 autocast its weights' bf16 casts too, held by autocast's cache until the forward's autocast region
    ends (they are re-cast when the backward recomputes the block); a plain block leaves all it saves for the backward."""
    b, t, d, d_ff = 4, 128, MEMORY_DIMS["d_model"], MEMORY_DIMS["d_ff"]
    plain = [activation_bytes(dtype, False, layers) for layers in (2, 3)]
    ckpt = [activation_bytes(dtype, True, layers) for layers in (2, 3)]
    per_block = ckpt[1]["activation_bytes"] - ckpt[0]["activation_bytes"]
    cast_weights = 2 * (4 * d * d + 3 * d * d_ff) if dtype == "bf16" else 0
    assert per_block == b * t * d * 4 + cast_weights
    assert plain[1]["activation_bytes"] - plain[0]["activation_bytes"] > 6 * per_block
    for p, c in zip(plain, ckpt):
        assert p["held"] == c["held"]  # the same parameters, optimizer state and inputs
        assert p["peak"] - c["peak"] > 0.3 * p["activation_bytes"]  # the peak drops by at least 30% of the plain forward's activations
        assert c["activation_bytes"] < p["activation_bytes"] / 3


def test_checkpointing_through_the_workload():
    built = build(tiny_case(workload="forward_backward", checkpoint_activations=True))
    assert built.model.config.checkpoint_activations


def test_training_variants_are_serialised_only_when_set():
    plain = Case("gpt_small", workload="train_step", device="cpu")
    assert "optimizer" not in plain.to_dict() and "checkpoint_activations" not in plain.to_dict()
    assert plain.id == Case("gpt_small", workload="train_step", device="cpu", optimizer=None, checkpoint_activations=False).id
    variant = Case("gpt_small", workload="train_step", device="cpu", optimizer="in_backward", checkpoint_activations=True)
    assert variant.to_dict()["optimizer"] == "in_backward" and variant.to_dict()["checkpoint_activations"] is True
    assert variant.id != plain.id and Case.from_dict(variant.to_dict()) == variant
    assert "opt:in_backward" in variant.label() and "ckpt" in variant.label()


@pytest.mark.parametrize("kw,match", [
    (dict(model="gpt_small", workload="train_step", optimizer="sgd"), "unknown optimizer 'sgd'"),
    (dict(model="gpt_small", workload="forward_backward", optimizer="fused"), "--optimizer applies to the train_step"),
    (dict(model="llama3_8b", workload="decode", optimizer="fused"), "--optimizer applies"),
    (dict(model="gpt_small", workload="forward", checkpoint_activations=True), "--checkpoint-activations applies"),
    (dict(model="gpt_small", workload="train_step", model_args={"checkpoint_activations": 1}), "no such dimension"),
])
def test_bad_training_variants_are_one_line_errors(kw, match):
    with pytest.raises(PerflabError, match=match):
        validate_case(Case(device="cpu", **kw))


def test_pass_costs_add_up_to_the_step_bytes_and_three_forwards():
    case = validate_case(Case("gpt_large", workload="train_step", seq_len=512, batch_size=4, dtype="bf16", device="cpu"))
    params = 969_397_760
    row = {"params": params}
    costs = lm_pass_costs(case, row)
    assert list(costs) == ["forward", "backward", "optimizer"]
    f = costs["forward"]["flops"]
    assert costs["backward"]["flops"] == 2 * f and costs["optimizer"]["flops"] == 0
    assert f * 3 == LM().analytic(case)["flops_analytic"]
    assert sum(c["bytes"] for c in costs.values()) == LM().min_bytes(case, row) == params * (3 * 2 + 4 + 28)
    assert costs["optimizer"]["bytes"] == 28 * params == 27_143_137_280  # the 27.1 GB per step
    moved = lm_pass_costs(case.__class__(**{**case.__dict__, "optimizer": "in_backward"}), row)
    assert list(moved) == ["forward", "backward"] and moved["backward"]["bytes"] == costs["backward"]["bytes"] + 28 * params
    ckpt = lm_pass_costs(case.__class__(**{**case.__dict__, "checkpoint_activations": True}), row)
    assert ckpt["backward"]["flops"] == 3 * f
