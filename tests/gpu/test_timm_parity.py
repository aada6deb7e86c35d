"""Our ViT loads timm's DeiT/ViT weights with strict=True and computes the same function."""

import pytest
import torch

timm = pytest.importorskip("timm")

from perflab.models import ViTConfig, VisionTransformer, load_timm_state_dict


@pytest.mark.parametrize("name,size", [("deit_base_patch16_224", 224), ("deit_base_patch16_224", 448), ("vit_large_patch16_224", 224)])
def test_outputs_match_timm_fp32(name, size):
    torch.manual_seed(0)
    ref = timm.create_model(name, pretrained=False, img_size=size).cuda().eval()
    ours = VisionTransformer(ViTConfig.from_name(name, img_size=size)).cuda().eval()
    load_timm_state_dict(ours, ref.state_dict())
    x = torch.randn(4, 3, size, size, device="cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    with torch.no_grad():
        expected, got = ref(x), ours(x)
    rel = (got - expected).norm() / expected.norm()
    assert rel < 1e-4, f"relative error {rel:.2e}"


def test_explicit_attention_matches_sdpa_on_timm_weights():
    ref = timm.create_model("deit_base_patch16_224", pretrained=False).cuda().eval()
    ours = VisionTransformer(ViTConfig.from_name("deit_base_patch16_224", attn="explicit")).cuda().eval()
    load_timm_state_dict(ours, ref.state_dict())
    x = torch.randn(2, 3, 224, 224, device="cuda")
    with torch.no_grad():
        rel = (ours(x) - ref(x)).norm() / ref(x).norm()
    assert rel < 1e-4


def test_pos_embed_resampled_from_224_weights_to_448():
    ref224 = timm.create_model("deit_base_patch16_224", pretrained=False).eval()
    ref448 = timm.create_model("deit_base_patch16_224", pretrained=False, img_size=448).eval()
    # timm resamples position embeddings with its own helper; ours must give the same tensor.
    from timm.layers import resample_abs_pos_embed

    expected = resample_abs_pos_embed(ref224.pos_embed, new_size=(28, 28), num_prefix_tokens=1)
    ours = VisionTransformer(ViTConfig.from_name("deit_base_patch16_224", img_size=448)).eval()
    load_timm_state_dict(ours, ref224.state_dict())
    assert ours.pos_embed.shape == ref448.pos_embed.shape
    torch.testing.assert_close(ours.pos_embed.data, expected, atol=1e-6, rtol=1e-5)
