"""FLOPs of traced steps, counted from the operators the profiler recorded with their shapes (``record_shapes``).

What a user's program runs is not perflab's to rebuild, so its FLOPs come from its trace: every operator call of a
matrix-multiply, attention or convolution kind whose input shapes were recorded is counted with the formula torch's
own ``torch.utils.flop_counter`` uses (2 FLOPs per multiply-add):

    mm [M,K]·[K,N], addmm (bias, [M,K], [K,N])        2·M·K·N
    bmm [B,M,K]·[B,K,N], baddbmm (input, b1, b2)      2·B·M·K·N
    scaled-dot-product attention q [B,Hq,S,D], k [B,Hkv,Skv,D], v [B,Hkv,Skv,Dv]
        forward  2·B·Hq·S·Skv·(D + Dv);  backward (grad_out, q, k, v, ...)  2·B·Hq·S·Skv·(3·D + 2·Dv)
    convolution x [N,Cin,*in], weight [Cout,Cin/groups,*k] (transposed: [Cin,Cout/groups,*k]), 1d to 3d
        forward  2·N·|weight|·|out| (transposed: 2·N·|weight|·|in|), |out| from stride, padding, dilation (``Concrete
        Inputs``);  backward: that once for the input's gradient and once for the weight's, as the output mask asks
        (torch's counter counts a grouped weight gradient ``groups`` times; the multiply-adds are those of the forward)

An operator is counted only where no operator around it was (``aten::linear`` → ``aten::addmm`` counts the
addmm once; a fused attention op, not the kernels' own inner calls). This sees eager operators and the operators a
compiled graph calls (inductor calls ``aten::mm`` and the attention ops as extern kernels); it does not see a Triton
matmul template (``compile:max-autotune``) or a CUDA graph's replay, whose operators ran at capture. What it did not
see is measured too: the GPU time of matrix-multiply, convolution and attention kernels launched from no counted operator
(``uncounted_heavy_share``), and heavy operators with no formula here (a fused encoder layer, a custom op) or whose
recorded shapes or arguments do not fit their formula (a convolution traced without ``Concrete Inputs``), named. No torch.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from perflab.analysis.intervals import interval_at

MM = re.compile(r"^aten::(mm|addmm|_addmm_activation)$")
BMM = re.compile(r"^aten::(bmm|baddbmm)$")
SDPA_FORWARD = re.compile(r"^aten::_scaled_dot_product_(flash_attention|efficient_attention|cudnn_attention|flash_attention_for_cpu|"
                          r"fused_attention_overrideable)$")
SDPA_BACKWARD = re.compile(r"^aten::_scaled_dot_product_(flash_attention|efficient_attention|cudnn_attention|flash_attention_for_cpu|"
                           r"fused_attention_overrideable)_backward$")
# the convolution every conv1d/2d/3d and conv_transpose call reaches, with one argument list: (input, weight, bias, stride,
# padding, dilation, transposed, output_padding, groups, ...); the backends' own ops below it (cudnn_convolution,
# mkldnn_convolution, ...) order their arguments each its own way and are covered by it
CONV_FORWARD = re.compile(r"^aten::(convolution|_convolution|convolution_overrideable)$")
# its gradients: (grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed, output_padding, groups,
# output_mask)
CONV_BACKWARD = "aten::convolution_backward"
# Ops that do a matmul's kind of work, by name (torch's own namespaces): where one has no formula, a count misses
# FLOPs. measure.flops reads the same rule while it counts a step in a dispatch mode.
HEAVY_NAME = re.compile(r"(^|_)(mm|bmm|addmm|baddbmm|addbmm|matmul|linear|conv\d*d|convolution|einsum|gemm|rnn|lstm|gru)(_|$)"
                        r"|attention|transformer|multi_head")
BUILTIN_NAMESPACES = ("aten", "prims", "prim", "profiler", "c10d", "_c10d_functional", "_dtensor", "inductor")
# a custom operator (a library's or the user's own namespace): heavy or not, the count cannot know, so it is named
CUSTOM_OP = re.compile(r"^(?!(aten|prims|prim|inductor|profiler|c10d|_c10d_functional|_dtensor|autograd|torch|cuda|record_param_comms)::)"
                       r"\w+::\w+$")
COMPLETE_SHARE = 0.05  # heavy kernels' GPU time from no counted operator up to this share: still complete (split-K reductions)


def heavy_without_formula(name: str) -> bool:
    """An operator the count cannot count that may do heavy work: a matmul's kind of op of torch's own namespaces with
    no formula here, or any custom operator."""
    if has_formula(name):
        return False
    namespace, _, short = name.partition("::")
    return bool((namespace in BUILTIN_NAMESPACES and HEAVY_NAME.search(short)) or CUSTOM_OP.match(name))


HEAVY_CATEGORIES = ("gemm", "attention")
# inductor names a kernel after the ops it fused: one that fused a matmul does a matmul's work (a decode step's GEMV is
# often a reduction kernel "triton_red_fused_..._mm_...")
HEAVY_TRITON = re.compile(r"^triton_\w*?fused_(\w*_)?(mm|addmm|bmm|baddbmm|convolution|_scaled_dot_product\w*)(_|$)")


@dataclass
class OpFlops:
    """FLOPs of the traced steps counted from their operators, and what the count could not see."""

    flops: int  # over the whole window given
    steps: int
    counted_calls: int
    by_op: dict[str, int] = field(default_factory=dict)  # FLOPs per operator name
    by_dtype: dict[str, int] = field(default_factory=dict)  # FLOPs per input dtype (bf16, fp16, fp32, ...)
    uncounted_ops: dict[str, int] = field(default_factory=dict)  # heavy operators with no formula (or no shapes): calls
    heavy_gpu_ns: int = 0  # GPU time of matmul, convolution and attention kernels in the window
    uncounted_heavy_gpu_ns: int = 0  # of it, launched from no counted operator
    shapes_recorded: bool = True
    # of by_dtype, the convolutions' FLOPs: cuDNN runs fp32 convolutions on TF32 tensor cores by torch's default
    # (torch.backends.cudnn.allow_tf32), fp32 matmuls not (torch.backends.cuda.matmul.allow_tf32): their peaks differ
    conv_by_dtype: dict[str, int] = field(default_factory=dict)

    @property
    def per_step(self) -> float:
        return self.flops / max(self.steps, 1)

    @property
    def dtype(self) -> str | None:
        """The dtype most of the FLOPs ran in (the matmul peak to hold them against)."""
        return max(self.by_dtype, key=self.by_dtype.get) if self.by_dtype else None

    @property
    def uncounted_heavy_share(self) -> float | None:
        """The share of the matmul, convolution and attention kernels' GPU time the count did not see (None on the CPU)."""
        return self.uncounted_heavy_gpu_ns / self.heavy_gpu_ns if self.heavy_gpu_ns else None

    @property
    def known(self) -> bool:
        """Whether the count saw enough to give a figure: operators' shapes were recorded and it counted some, or the
        step has no heavy work at all."""
        return self.shapes_recorded and (self.flops > 0 or self.complete)

    @property
    def complete(self) -> bool:
        """The count saw every heavy operator: nothing uncounted, no heavy kernel time from outside a counted operator
        (within 5% of it: a few kernels, such as cuBLAS's split-K reductions, run beside their GEMM)."""
        share = self.uncounted_heavy_share
        return self.shapes_recorded and not self.uncounted_ops and (share is None or share <= COMPLETE_SHARE)

    def to_dict(self) -> dict:
        return {"flops": self.flops, "flops_per_step": self.per_step, "steps": self.steps, "counted_calls": self.counted_calls,
                "by_op": self.by_op, "by_dtype": self.by_dtype, "conv_by_dtype": self.conv_by_dtype, "dtype": self.dtype, "uncounted_ops": self.uncounted_ops, "heavy_gpu_ns": self.heavy_gpu_ns,
                "uncounted_heavy_gpu_ns": self.uncounted_heavy_gpu_ns, "uncounted_heavy_share": self.uncounted_heavy_share,
                "shapes_recorded": self.shapes_recorded, "complete": self.complete, "known": self.known}


def op_flops(name: str, dims: tuple | None, values: tuple | None = None) -> int | None:
    """FLOPs of one call of operator ``name`` with input shapes ``dims`` (``Trace.ops``' ``input_shapes``: a shape per
    input) and its arguments' values ``values`` (``concrete_inputs``: read for a convolution's stride, padding, dilation,
    transposed and output mask); None when it has no formula or what was recorded does not fit it."""
    if not dims:
        return None
    try:
        if CONV_FORWARD.match(name):
            return conv_forward_flops(dims, values)
        if name == CONV_BACKWARD:
            return conv_backward_flops(dims, values)
        if MM.match(name):
            a, b = (dims[0], dims[1]) if name == "aten::mm" else (dims[1], dims[2])
            (m, k), (k2, n) = a, b
            return 2 * m * k * n if k == k2 else None
        if BMM.match(name):
            a, b = (dims[0], dims[1]) if name == "aten::bmm" else (dims[1], dims[2])
            (batch, m, k), (batch2, k2, n) = a, b
            return 2 * batch * m * k * n if k == k2 and batch == batch2 else None
        if SDPA_FORWARD.match(name):
            (b, hq, s, d), (_, _, skv, _), (_, _, _, dv) = dims[0], dims[1], dims[2]
            return 2 * b * hq * s * skv * (d + dv)
        if SDPA_BACKWARD.match(name):
            _, (b, hq, s, d), (_, _, skv, _), (_, _, _, dv) = dims[0], dims[1], dims[2], dims[3]
            return 2 * b * hq * s * skv * (3 * d + 2 * dv)
    except (TypeError, ValueError, IndexError):
        return None
    return None


def conv_forward_flops(dims: tuple, values: tuple | None) -> int | None:
    """A convolution (``aten::convolution``'s arguments): 2 × batch × the weight's elements × the output's positions, or
    for a transposed one the input's (its weight [C_in, C_out/groups, k...] slides over the input). The weight holds
    C_in/groups channels per output channel, so a grouped or depthwise convolution needs no groups of its own here."""
    (x, w), arguments = dims[:2], _arguments(values)
    if arguments is None or len(x) != len(w) or len(x) < 3:
        return None
    stride, padding, dilation, transposed = arguments[3:7]
    if not isinstance(transposed, bool):
        return None
    if transposed:
        return 2 * x[0] * math.prod(w) * math.prod(x[2:])
    spatial = len(x) - 2
    stride, padding, dilation = (_per_dimension(v, spatial) for v in (stride, padding, dilation))
    out = [(size + 2 * pad - dil * (k - 1) - 1) // s + 1
           for size, pad, dil, k, s in zip(x[2:], padding, dilation, w[2:], stride, strict=True)]
    return 2 * x[0] * math.prod(w) * math.prod(out) if min(out) > 0 else None


def conv_backward_flops(dims: tuple, values: tuple | None) -> int | None:
    """``aten::convolution_backward``: the input's gradient and the weight's, each where its output mask asks for it,
    each as many multiply-adds as the forward convolution (the same products, summed over other indices). The bias's
    gradient is a sum, not counted (as an addmm's bias is not). torch.utils.flop_counter (2.13) counts a grouped
    convolution's weight gradient ``groups`` times over (as if ungrouped); here it is counted once."""
    (grad_out, x, w), arguments = dims[:3], _arguments(values)
    if arguments is None or len(x) != len(w) or len(x) < 3 or len(arguments) < 11:
        return None
    transposed, mask = arguments[7], arguments[10]
    if not isinstance(transposed, bool) or not isinstance(mask, tuple):
        return None
    positions = x[2:] if transposed else grad_out[2:]  # the output of the convolution as computed forward
    return 2 * x[0] * math.prod(w) * math.prod(positions) * (bool(mask[0]) + bool(mask[1]))


def _per_dimension(value, spatial: int) -> tuple:
    """A stride, padding or dilation per spatial dimension (ATen takes one value for them all as well)."""
    value = value if isinstance(value, tuple) else (value,)
    return value * spatial if len(value) == 1 else value


@functools.lru_cache(maxsize=4096)
def _arguments(values: tuple | None) -> tuple | None:
    """An operator's ``Concrete Inputs`` as Python values ("[2, 2]" → (2, 2), "False" → False, "1" → 1; a tensor's "" →
    None); None where they were not recorded (a trace without them cannot tell a convolution's stride)."""
    if not values:
        return None
    return tuple(map(_argument, values))


def _argument(text):
    if not isinstance(text, str) or not text:
        return None
    if text in ("True", "False"):
        return text == "True"
    if text.startswith("["):
        items = [item.strip() for item in text.strip("[]").split(",") if item.strip()]
        return tuple(_argument(item) for item in items)
    try:
        return int(text)
    except ValueError:
        return text


DTYPES = {"c10::BFloat16": "bf16", "c10::Half": "fp16", "float": "fp32", "double": "fp64", "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8"}


def input_dtype(types: tuple | None) -> str:
    """The dtype of an operator's first tensor input, from the profiler's ``Input type`` (``Trace.ops``' ``input_types``;
    perflab's names: bf16, fp32)."""
    first = next((t for t in types or () if t and t not in ("Scalar", "ScalarList", "TensorList", "GenericList")), "unknown")
    return DTYPES.get(first, str(first))


def has_formula(name: str) -> bool:
    return bool(MM.match(name) or BMM.match(name) or SDPA_FORWARD.match(name) or SDPA_BACKWARD.match(name) or CONV_FORWARD.match(name)
                or name == CONV_BACKWARD)


def count_op_flops(ops: pd.DataFrame, window: tuple[int, int] | None = None, steps: int = 1, kernels: pd.DataFrame | None = None) -> OpFlops:
    """FLOPs of the operators (``Trace.ops``) that start inside ``window`` (all of them when None), each counted only
    where no operator around it was; ``kernels`` (the KernelTable, GPU traces): the heavy kernels' GPU time launched
    from no counted operator."""
    if ops is None or len(ops) == 0:
        return OpFlops(0, steps, 0, shapes_recorded=False)
    start = ops["start_ns"].to_numpy()
    inside = np.ones(len(ops), dtype=bool) if window is None else (start >= window[0]) & (start < window[1])
    names = ops["name"].astype(str).to_numpy()
    parent = ops["parent"].to_numpy()
    shapes = ops["input_shapes"].to_numpy()
    types = ops["input_types"].to_numpy()
    values = ops["concrete_inputs"].to_numpy()
    by_dtype: dict[str, int] = {}
    conv_by_dtype: dict[str, int] = {}
    counted = np.zeros(len(ops), dtype=bool)
    covered = np.zeros(len(ops), dtype=bool)  # an operator around it was counted
    total, calls, by_op, uncounted = 0, 0, {}, {}
    heavy_rows: list[int] = []
    any_shapes = False
    for i in np.argsort(ops["depth"].to_numpy(), kind="stable").tolist():  # parents before children
        p = parent[i]
        covered[i] = p >= 0 and (counted[p] or covered[p])
        if covered[i] or not inside[i]:
            continue
        name = names[i]
        any_shapes = any_shapes or shapes[i] is not None
        if has_formula(name):
            flops = op_flops(name, shapes[i], values[i])
            if flops is not None:
                counted[i] = True
                total += flops
                calls += 1
                by_op[name] = by_op.get(name, 0) + flops
                dtype = input_dtype(types[i])
                by_dtype[dtype] = by_dtype.get(dtype, 0) + flops
                if CONV_FORWARD.match(name) or name == CONV_BACKWARD:
                    conv_by_dtype[dtype] = conv_by_dtype.get(dtype, 0) + flops
                continue
            uncounted[name] = uncounted.get(name, 0) + 1
        elif heavy_without_formula(name):
            heavy_rows.append(i)
    # a heavy operator with no formula whose own operators were counted (aten::linear → aten::addmm) was seen
    below = _counted_below(parent, counted, ops["depth"].to_numpy())
    for i in heavy_rows:
        if not below[i]:
            uncounted[names[i]] = uncounted.get(names[i], 0) + 1
    result = OpFlops(int(total), steps, calls, by_op, by_dtype, uncounted, shapes_recorded=any_shapes, conv_by_dtype=conv_by_dtype)
    if kernels is not None and len(kernels) and not kernels["kind"].astype(str).eq("cpu_op").all():
        result.heavy_gpu_ns, result.uncounted_heavy_gpu_ns = _uncounted_heavy_time(ops, counted, kernels, window)
    return result


def _counted_below(parent: np.ndarray, counted: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """Per operator, whether an operator inside it was counted (children before parents: one pass)."""
    below = np.zeros(len(parent), dtype=bool)
    for i in np.argsort(-depth, kind="stable").tolist():
        if (counted[i] or below[i]) and parent[i] >= 0:
            below[parent[i]] = True
    return below


def _uncounted_heavy_time(ops: pd.DataFrame, counted: np.ndarray, kernels: pd.DataFrame, window) -> tuple[int, int]:
    """(GPU ns of matmul, convolution and attention kernels in the window, of it those launched outside every counted operator)."""
    names = kernels["name"].astype(str)
    is_heavy = kernels["category"].astype(str).isin(HEAVY_CATEGORIES) | names.str.match(HEAVY_TRITON.pattern)
    heavy = kernels[is_heavy & (kernels["kind"].astype(str) == "kernel")]
    launch = heavy["launch_start_ns"].to_numpy()
    when = np.where(launch >= 0, launch, heavy["start_ns"].to_numpy())
    if window is not None:
        keep = (when >= window[0]) & (when < window[1])
        heavy, launch, when = heavy[keep], launch[keep], when[keep]
    dur = heavy["dur_ns"].to_numpy()
    total = int(dur.sum())
    if not total:
        return 0, 0
    tids = heavy["launch_tid"].to_numpy()
    seen = np.zeros(len(heavy), dtype=bool)
    op_tid = ops["tid"].to_numpy()
    for tid in np.unique(tids[launch >= 0]).tolist():
        rows = counted & (op_tid == tid)
        starts, ends = ops["start_ns"].to_numpy()[rows], ops["end_ns"].to_numpy()[rows]
        order = np.argsort(starts)
        starts, ends = starts[order], ends[order]
        mine = np.flatnonzero((tids == tid) & (launch >= 0))
        # counted operators never nest (one inside another is covered, not counted), so the last one starting before
        # the launch is the only one that can hold it
        seen[mine[interval_at(starts, ends, launch[mine], closed=True) >= 0]] = True
    return total, int(dur[~seen].sum())
