"""Kernel categories from ONE ordered rule table (readable kernel names: perflab.analysis.names).

Rules are case-insensitive regular expressions searched in the full kernel name; the first match wins.
The order carries meaning, so each rule says why it sits where it does. memcpy and memset come from the
activity kind, not the name.
"""

from __future__ import annotations

import re
from functools import lru_cache

CATEGORIES = (
    "gemm", "attention", "softmax", "norm", "sort_topk_index", "copy", "reduction", "elementwise",
    "memcpy", "memset", "communication", "triton_fused", "other",
)

# (category, pattern): searched in order, first match wins.
RULES: tuple[tuple[str, str], ...] = (
    # NCCL first: its kernel names mention reductions and copies that later rules would claim.
    ("communication", r"nccl"),
    # Inductor names a kernel after every op it fused ("triton_poi_fused__scaled_dot_product_efficient_attention_
    # ...view_3" is a pointwise prologue), so the op words in a triton name must not reach the rules below.
    # Only the template kernels are what their name says: mm/addmm/bmm templates are GEMMs.
    ("gemm", r"^triton_tem_fused_(?:\w*_)?(?:mm|addmm|bmm|baddbmm|convolution)(?:_|$)"),
    ("attention", r"^triton_tem_fused_.*(?:flex_attention|attention)"),
    ("triton_fused", r"^triton_"),
    # Before gemm: the mem-efficient attention kernel is a cutlass kernel ("fmha_cutlassF_...").
    ("attention", r"flash_fwd|flash_bwd|flash::|fmha|pytorch_flash|efficient_attention|attentionkernel|"
                  r"_sdpa|sdpa_|flash_attn|flashattn|scaled_dot_product|decode_attention|paged_attention"),
    # cuBLAS/cuBLASLt/cutlass GEMMs and their helper kernels (split-K reduction, epilogue, beta scaling);
    # implicit-GEMM convolutions are GEMMs too.
    ("gemm", r"gemm|cutlass|cublas|nvjet|xmma|gemv|splitkreduce|scal_kernel|wgmma|cudnn.*conv|conv.*sgemm|"
             r"implicit_convolve|dot_kernel"),
    ("softmax", r"softmax"),
    # cuDNN's batch norm kernels are bn_fw_*/bn_bw_* (a ResNet's: bn_bw_1C11_kernel_new, bn_fw_tr_1C11_kernel_NCHW)
    ("norm", r"layer_?norm|rms_?norm|batch_?norm|group_?norm|instance_?norm|\bnorm_kernel|\bbn_(?:fw|bw)_"),
    # The token-reduction ops (top-k, sort, gather/scatter/index) before copy/elementwise, whose templates
    # they can mention.
    ("sort_topk_index", r"topk|bitonicsort|radixsort|radix_sort|segmented_sort|sort_|_sort|sortkeys|gather|scatter|"
                        r"index|argmax|argmin|nonzero|masked_select|embedding"),
    # Data movement inside the GPU: copies and dtype casts, concatenation (CatArrayBatchedCopy).
    # cuDNN's layout changes around a convolution (nchwToNhwcKernel, nhwcToNchwKernel) are copies too.
    ("copy", r"copy_kernel|direct_copy|catarray|\bcopy<|_copy\b|transpose|permute|nchwtonhwc|nhwctonchw"),
    ("reduction", r"reduce|sum_functor|mean|nll_loss|cross_entropy|\bnorm_|argmax|cumsum|cumprod|scan"),
    ("elementwise", r"elementwise|multi_tensor_apply|functor|fill|clamp|where|unrolled|vectorized|pointwise|activation|"
                    r"gelu|relu|silu|sigmoid|tanh|dropout|rsqrt|exp|mul|add"),
)
_COMPILED = tuple((category, re.compile(pattern, re.IGNORECASE)) for category, pattern in RULES)

# A CPU-only trace's work is torch's operators (kind cpu_op); their aten names and autograd nodes first, then RULES.
BACKWARD_NODE = re.compile(r"^autograd::engine::evaluate_function: ")
CPU_OP_RULES: tuple[tuple[str, str], ...] = (
    ("gemm", r"^aten::(mm|addmm|bmm|baddbmm|addbmm|matmul|linear|convolution|_convolution|conv[123]d|mkldnn_\w+)$|"
             r"^(Mm|Addmm|Bmm|Baddbmm|Convolution|Linear|MkldnnLinear)Backward"),
    ("attention", r"scaled_dot_product|^ScaledDotProduct|flash_attention|multi_head_attention|_transformer_encoder_layer"),
)
_CPU_OP_COMPILED = tuple((category, re.compile(pattern)) for category, pattern in CPU_OP_RULES)


@lru_cache(maxsize=None)
def categorize(name: str, kind: str = "kernel") -> str:
    """The category of one GPU activity (see RULES)."""
    if kind in ("memcpy", "memset"):
        return kind
    if kind == "cpu_op":
        name = BACKWARD_NODE.sub("", name)
        for category, pattern in _CPU_OP_COMPILED:
            if pattern.search(name):
                return category
    for category, pattern in _COMPILED:
        if pattern.search(name):
            return category
    return "other"
