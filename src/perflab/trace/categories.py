"""Kernel categories from ONE ordered rule table, and readable short kernel names.

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
    ("norm", r"layer_?norm|rms_?norm|batch_?norm|group_?norm|instance_?norm|\bnorm_kernel"),
    # The token-reduction ops (top-k, sort, gather/scatter/index) before copy/elementwise, whose templates
    # they can mention.
    ("sort_topk_index", r"topk|bitonicsort|radixsort|radix_sort|segmented_sort|sort_|_sort|sortkeys|gather|scatter|"
                        r"index|argmax|argmin|nonzero|masked_select|embedding"),
    # Data movement inside the GPU: copies and dtype casts, concatenation (CatArrayBatchedCopy).
    ("copy", r"copy_kernel|direct_copy|catarray|\bcopy<|_copy\b|transpose|permute"),
    ("reduction", r"reduce|sum_functor|mean|nll_loss|cross_entropy|\bnorm_|argmax|cumsum|cumprod|scan"),
    ("elementwise", r"elementwise|multi_tensor_apply|functor|fill|clamp|where|unrolled|vectorized|pointwise|activation|"
                    r"gelu|relu|silu|sigmoid|tanh|dropout|rsqrt|exp|mul|add"),
)
_COMPILED = tuple((category, re.compile(pattern, re.IGNORECASE)) for category, pattern in RULES)


@lru_cache(maxsize=None)
def categorize(name: str, kind: str = "kernel") -> str:
    """The category of one GPU activity (see RULES)."""
    if kind in ("memcpy", "memset"):
        return kind
    for category, pattern in _COMPILED:
        if pattern.search(name):
            return category
    return "other"


# --- short names -------------------------------------------------------------------------------------------

_ANONYMOUS = re.compile(r"\(anonymous namespace\)::")
# Names that say nothing on their own: show the kernel's template argument or qualifier with them.
_GENERIC = {"kernel", "kernel2", "globalkernel", "device_kernel", "kernel_entry", "entry"}
# Hints about the operation, searched in a kernel's template arguments (first found wins).
_HINTS = (
    re.compile(r"(\w+?)_kernel_cuda\b"),                  # bfloat16_copy_kernel_cuda, direct_copy_kernel_cuda
    re.compile(r"(\w+?)CUDAKernelImpl"),                  # GeluCUDAKernelImpl, GeluBackwardCUDAKernelImpl
    re.compile(r"launch_(\w+?)\("),                        # launch_clamp_scalar(...)
    re.compile(r"CUDAFunctor_(\w+?)<"),                   # CUDAFunctor_add<float>
    re.compile(r"::(\w+?)Ops<"),                           # MeanOps, NormTwoOps
    re.compile(r"::(\w+?)_functor<"),                      # sum_functor
    re.compile(r"::(?!(?:A|B)?Unary|Binary|Ternary|Pointwise|Unary)(\w+?)Functor<"),  # MulFunctor, FillFunctor, LerpFunctor
    re.compile(r"std::(multiplies|divides|plus|minus)<"),
    re.compile(r"at::native::(?!TensorList|OpaqueType)([A-Z]\w*?)<"),  # at::native::Sqrt<float>, at::native::Copy<float, float>
)
_STD_OPS = {"multiplies": "mul", "divides": "div", "plus": "add", "minus": "sub"}


def _camel_to_snake(text: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", text).lower()


def _split_top_level(name: str) -> tuple[str, str]:
    """(text outside all <> and () brackets, text of the first top-level <...> argument list)."""
    outside, first_template = [], None
    depth, start = 0, 0
    for i, ch in enumerate(name):
        if ch in "<(":
            if depth == 0 and ch == "<" and first_template is None:
                start = i + 1
            if depth == 0:
                outside.append(" ")
            depth += 1
        elif ch in ">)" and depth > 0:
            depth -= 1
            if depth == 0 and ch == ">" and first_template is None:
                first_template = name[start:i]
        elif depth == 0:
            outside.append(ch)
    return "".join(outside), first_template or ""


@lru_cache(maxsize=None)
def short_name(name: str) -> str:
    """A readable kernel name: no return type, namespaces, template or call arguments, plus an op hint.

    ``void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(...)...>(...)``
    becomes ``vectorized_elementwise_kernel (gelu)``; names without C++ syntax (``nvjet_sm90_tst_...``,
    ``triton_poi_fused_...``, ``Memcpy DtoH (Device -> Pinned)``) are kept as they are.
    """
    if "<" not in name and "::" not in name and not name.startswith("void "):
        plain = name.split("(", 1)[0].strip() if not name.startswith(("Memcpy", "Memset")) else name
        return plain or name
    text = _ANONYMOUS.sub("", name)
    outside, template = _split_top_level(text)
    words = outside.split()
    qualified = words[-1] if words else text
    parts = [p for p in qualified.split("::") if p]
    base = parts[-1] if parts else qualified
    if base.lower() in _GENERIC:
        if template and re.fullmatch(r"[\w]+", template.strip()):
            return template.strip()  # cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>
        if len(parts) > 1:
            base = f"{parts[-2]}::{base}"  # internal::gemvx::kernel → gemvx::kernel
    hint = _op_hint(template)
    # "mul" must not hide in "multi_tensor_apply_kernel": compare whole words
    return f"{base} ({hint})" if hint and hint.lower() not in base.lower().split("_") else base


def _op_hint(template: str) -> str:
    if not template:
        return ""
    for pattern in _HINTS:
        match = pattern.search(template)
        if match:
            word = match.group(1)
            return _STD_OPS.get(word, _camel_to_snake(word).strip("_"))
    return ""
