"""Models perflab can measure: a timm-compatible ViT/DeiT with optional token reduction, and timm models."""

from perflab.models.registry import build_model, expected_tokens, model_names, parse_model_name
from perflab.models.vit import ViTConfig, VisionTransformer, load_timm_state_dict, token_schedule, vit_configs

__all__ = [
    "ViTConfig",
    "VisionTransformer",
    "build_model",
    "expected_tokens",
    "load_timm_state_dict",
    "model_names",
    "parse_model_name",
    "token_schedule",
    "vit_configs",
]
