"""The ViT: timm's parameter names, FLOPs against the analytic formula, token schedules, reduction semantics."""

import math

import pytest
import torch

from perflab.measure.flops import count_flops, count_params
from perflab.models import ViTConfig, VisionTransformer, build_model, load_timm_state_dict, token_schedule
from perflab.models.token_reduction import reduce_tokens
from perflab.spec import Case, validate_case


def analytic_vit_flops(cfg: ViTConfig, batch: int) -> int:
    """Real FLOPs (2 per multiply-add) of one forward, written out independently of the model code."""
    D, P, hidden = cfg.dim, cfg.patch_size, cfg.hidden_dim
    n_patches = (cfg.img_size // P) ** 2
    flops = 2 * n_patches * (cfg.in_chans * P * P) * D  # patch embedding conv
    rates = dict(cfg.reduction)
    n = n_patches + 1
    for i in range(cfg.depth):
        flops += 2 * n * D * 3 * D + 2 * n * D * D  # qkv + proj
        flops += 2 * n * n * D * 2  # q·kᵀ and attn·v over all heads
        if i in rates:
            if cfg.attn == "sdpa":
                flops += 2 * n * D  # CLS-row scores q_cls·kᵀ (explicit attention has them already)
            kept = math.ceil(rates[i] * (n - 1))
            if kept < n - 1:
                fused = 1 if cfg.fuse_dropped else 0
                n = 1 + kept + fused
        flops += 2 * n * D * hidden * 2  # fc1 + fc2 on the tokens left
    flops += 2 * D * cfg.num_classes  # head on the CLS token
    return batch * flops


def model_flops(case: Case) -> int:
    model, _ = build_model(validate_case(case))
    x = torch.randn(case.batch_size, 3, case.input_size, case.input_size)
    with torch.inference_mode():
        return count_flops(lambda: model(x))


@pytest.mark.parametrize(
    "case",
    [
        Case("deit_tiny_patch16_224", device="cpu"),
        Case("deit_tiny_patch16_224", input_size=96, batch_size=3, device="cpu"),
        Case("topk_deit_tiny_patch16_224", keep_rate=(0.1,), reduction_loc=(3, 6, 9), device="cpu", batch_size=2),
        Case("evit_deit_small_patch16_224", keep_rate=(0.7, 0.5), reduction_loc=(2, 8), input_size=160, device="cpu"),
        Case("topk_deit_tiny_patch16_224", keep_rate=(0.3,), reduction_loc=(0,), attn="explicit", device="cpu"),
    ],
    ids=lambda c: c.label(),
)
def test_counted_flops_equal_the_analytic_formula(case):
    from perflab.models.registry import parse_model_name, vit_config_for

    cfg = vit_config_for(parse_model_name(case.model), case.input_size, case.keep_rate, case.reduction_loc, case.attn)
    assert model_flops(case) == analytic_vit_flops(cfg, case.batch_size)


@pytest.mark.parametrize(
    "model,size,kw,gmacs",
    [
        ("deit_base_patch16_224", 224, {}, 17.58),
        ("topk_deit_base_patch16_224", 224, dict(keep_rate=(0.1,), reduction_loc=(3, 6, 9)), 5.55),
        ("deit_base_patch16_224", 448, {}, 78.5),
        ("topk_deit_base_patch16_224", 448, dict(keep_rate=(0.1,), reduction_loc=(3, 6, 9)), 24.7),
    ],
)
def test_deit_base_gmacs_match_the_published_figures(model, size, kw, gmacs):
    from perflab.models.registry import parse_model_name, vit_config_for

    case = validate_case(Case(model, input_size=size, device="cpu", **kw))
    cfg = vit_config_for(parse_model_name(model), size, case.keep_rate, case.reduction_loc, "sdpa")
    measured = analytic_vit_flops(cfg, 1) / 2e9
    assert measured == pytest.approx(gmacs, rel=0.005)


def test_deit_base_gmacs_counted_by_the_flop_counter():
    gmacs = model_flops(Case("deit_base_patch16_224", device="cpu")) / 2e9
    assert gmacs == pytest.approx(17.58, rel=0.005)


@pytest.mark.parametrize(
    "size,rates,locs,fuse,expected",
    [
        (224, (0.1,), (3, 6, 9), False, [197, 21, 3, 2]),
        (448, (0.1,), (3, 6, 9), False, [785, 80, 9, 2]),
        (224, (0.1,), (3, 6, 9), True, [197, 22, 5, 3]),
        (224, (0.7,), (3, 6, 9), True, [197, 140, 100, 72]),  # EViT-DeiT-S's own schedule
        (224, (1.0,), (3,), False, [197, 197]),
    ],
)
def test_token_schedule_compounds_keep_rates(size, rates, locs, fuse, expected):
    cfg = ViTConfig.from_name("deit_base_patch16_224", img_size=size, reduction=tuple(zip(locs, rates * len(locs))), fuse_dropped=fuse)
    assert token_schedule(cfg) == expected


@pytest.mark.parametrize("method,expected", [("topk", [197, 21, 3, 2]), ("evit", [197, 22, 5, 3])])
def test_real_forward_sees_the_scheduled_tokens(method, expected):
    case = validate_case(Case(f"{method}_deit_tiny_patch16_224", keep_rate=(0.1,), reduction_loc=(3, 6, 9), device="cpu"))
    model, _ = build_model(case)
    model.tokens_seen = []
    with torch.inference_mode():
        model(torch.randn(2, 3, 224, 224))
    assert model.tokens_seen == expected


def naive_reduce(x, scores, keep_rate, fuse):
    """Token by token: rank patch tokens by score, keep the best, fuse the rest by their scores."""
    B, N, C = x.shape
    keep = math.ceil(keep_rate * (N - 1))
    out = []
    for b in range(B):
        order = sorted(range(N - 1), key=lambda j: -float(scores[b, j]))
        kept, dropped = order[:keep], order[keep:]
        rows = [x[b, 0]] + [x[b, 1 + j] for j in kept]
        if fuse:
            rows.append(sum(x[b, 1 + j] * scores[b, j] for j in dropped))
        out.append(torch.stack(rows))
    return torch.stack(out)


@pytest.mark.parametrize("fuse", [False, True])
def test_reduce_tokens_keeps_the_best_scored_tokens(fuse):
    torch.manual_seed(1)
    x = torch.randn(3, 50, 8, dtype=torch.float64)
    scores = torch.rand(3, 49, dtype=torch.float64).softmax(-1)
    got = reduce_tokens(x, scores, 0.25, fuse)
    want = naive_reduce(x, scores, 0.25, fuse)
    assert got.shape == want.shape == (3, 1 + 13 + int(fuse), 8)
    torch.testing.assert_close(got[:, 0], want[:, 0])
    # Kept tokens come out unsorted: compare them as sets (sorted by their first feature).
    torch.testing.assert_close(got[:, 1:14].sort(dim=1).values, want[:, 1:14].sort(dim=1).values)
    if fuse:
        torch.testing.assert_close(got[:, -1], want[:, -1])


def test_sdpa_and_explicit_attention_compute_the_same_model():
    torch.manual_seed(0)
    kw = dict(img_size=96, reduction=((1, 0.3), (3, 0.5)))
    a = VisionTransformer(ViTConfig.from_name("deit_tiny_patch16_224", attn="sdpa", **kw)).eval()
    b = VisionTransformer(ViTConfig.from_name("deit_tiny_patch16_224", attn="explicit", **kw)).eval()
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 3, 96, 96)
    with torch.inference_mode():
        torch.testing.assert_close(a(x), b(x), atol=1e-5, rtol=1e-4)


def timm_vit_keys(depth: int) -> set[str]:
    keys = {"cls_token", "pos_embed", "patch_embed.proj.weight", "patch_embed.proj.bias", "norm.weight", "norm.bias", "head.weight", "head.bias"}
    per_block = ["norm1.weight", "norm1.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight", "attn.proj.bias",
                 "norm2.weight", "norm2.bias", "mlp.fc1.weight", "mlp.fc1.bias", "mlp.fc2.weight", "mlp.fc2.bias"]
    return keys | {f"blocks.{i}.{k}" for i in range(depth) for k in per_block}


@pytest.mark.parametrize("name,depth,params", [("deit_tiny_patch16_224", 12, 5_717_416), ("deit_base_patch16_224", 12, 86_567_656)])
def test_parameter_names_and_counts_match_timm(name, depth, params):
    model = VisionTransformer(ViTConfig.from_name(name))
    assert set(model.state_dict()) == timm_vit_keys(depth)
    assert count_params(model) == (params, params)


def test_state_dict_made_for_224_loads_into_a_448_model():
    src = VisionTransformer(ViTConfig.from_name("deit_tiny_patch16_224"))
    dst = VisionTransformer(ViTConfig.from_name("deit_tiny_patch16_224", img_size=448))
    load_timm_state_dict(dst, src.state_dict())
    assert dst.pos_embed.shape == (1, 785, 192)
    torch.testing.assert_close(dst.pos_embed[:, 0], src.pos_embed[:, 0])  # the CLS position is kept as is
    # A constant grid stays constant under interpolation: checks the resampling's layout (rows vs columns).
    sd = src.state_dict()
    sd["pos_embed"] = torch.cat([sd["pos_embed"][:, :1], torch.arange(196.0).reshape(14, 14).T.reshape(1, 196, 1).expand(1, 196, 192) * 0 + 2.5], 1)
    load_timm_state_dict(dst, sd)
    torch.testing.assert_close(dst.pos_embed[:, 1:], torch.full((1, 784, 192), 2.5), atol=1e-5, rtol=0)


@pytest.mark.parametrize("name,kw", [("deit_tiny_patch16_224", {}), ("topk_deit_tiny_patch16_224", dict(keep_rate=(0.1,), reduction_loc=(3, 6, 9))),
                                     ("evit_deit_tiny_patch16_224", dict(keep_rate=(0.5,), reduction_loc=(2,)))])
def test_torch_compile_traces_each_model_as_one_graph(name, kw):
    """A graph break per block made compile:reduce-overhead slower than eager on the GPU (3.1 vs 2.8 ms)."""
    import torch._dynamo as dynamo

    model, _ = build_model(validate_case(Case(name, device="cpu", **kw)))
    with torch.no_grad():
        explained = dynamo.explain(model)(torch.randn(2, 3, 224, 224))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), [b.reason for b in explained.break_reasons]
