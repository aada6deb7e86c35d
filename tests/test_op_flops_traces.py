"""FLOPs counted from the recorded operators (analysis.op_flops) on every committed Kineto trace: the whole trace and its
steps' window, pinned as they were counted when op_flops parsed each operator's ``Input Dims`` text itself."""

import hashlib
import json
from pathlib import Path

import pytest

from perflab.analysis.op_flops import count_op_flops
from perflab.trace.kineto import load_kineto

DATA = Path(__file__).parent / "data"
# (FLOPs over the whole trace, counted calls, FLOPs inside the steps' window, the dtype most FLOPs ran in, a digest of
# both counts' every field: per operator and dtype, the uncounted operators, the heavy kernels' time)
COUNTED = {
    "cpu_only.json.gz": (0, 0, 0, None, "c48a2d8382a77867"),
    "ranks_cpu/ddp_gloo_rank0.json.gz": (0, 0, 0, None, "47f0a808b93646b1"),
    "ranks_cpu/ddp_gloo_rank1.json.gz": (0, 0, 0, None, "47f0a808b93646b1"),
    # CUDA only (perflab run's accounted pass on a GPU): no operators, so nothing counted; its FLOPs come from the pass with shapes
    "run/nanogpt_cuda_only_h200.json.gz": (0, 0, 0, None, "7a163f32f0c1952a"),
    "run/nanogpt_ddp_cuda_only_h200_rank0.json.gz": (0, 0, 0, None, "7a163f32f0c1952a"),
    "run/nanogpt_ddp_cuda_only_h200_rank1.json.gz": (0, 0, 0, None, "7a163f32f0c1952a"),
    "run/nanogpt_ddp_rank0_h100.json.gz": (32201785737216, 513, 32201785737216, "bf16", "9dd0c670346260f9"),
    "run/nanogpt_ddp_rank1_h100.json.gz": (32201785737216, 513, 32201785737216, "bf16", "665ae86966b6de01"),
    "run/nanogpt_h100.json.gz": (32201785737216, 513, 32201785737216, "bf16", "e2967040d44252df"),
    "traces/by_module_lm_forward.json.gz": (3435738955776, 255, 3435738955776, "fp32", "fcd83df4b6b91070"),
    "traces/compile_block.json.gz": (2516582400, 15, 2516582400, "fp32", "545e363af397c88f"),
    "traces/cudagraph_vit.json.gz": (0, 0, 0, None, "7a163f32f0c1952a"),
    "traces/decode_cudagraph.json.gz": (0, 0, 0, None, "63213dae6687e856"),
    "traces/eager_vit.json.gz": (3734148096, 195, 3734148096, "bf16", "10c31c882f795acf"),  # its patch embedding counted since convolutions are
    "traces/lm_train_step_compile.json.gz": (29553065984, 74, 29553065984, "bf16", "4b5d4b28aba188af"),
    "traces/lm_train_step_explicit.json.gz": (29418848256, 90, 29418848256, "bf16", "b8b79c3c0b9f261a"),
    "traces/reduce_overhead.json.gz": (0, 0, 0, None, "309ed3e2e8ceb1a3"),
    "traces/train_step.json.gz": (414449664, 15, 414449664, "fp32", "63a5b1db60b59cf0"),
    "traces/two_streams.json.gz": (274877906944, 16, 274877906944, "fp32", "d58e2344809b623f"),
}


def test_every_committed_trace_is_pinned():
    assert sorted(str(p.relative_to(DATA)) for p in DATA.rglob("*.json.gz")) == sorted(COUNTED)


@pytest.mark.parametrize("name", sorted(COUNTED))
def test_the_flops_of_every_committed_trace_are_unchanged(name):
    trace = load_kineto(DATA / name, ops=True)
    whole = count_op_flops(trace.ops, kernels=trace.kernels)
    window = (int(trace.steps["start_ns"].min()), int(trace.steps["end_ns"].max()) + 1) if len(trace.steps) else None
    steps = count_op_flops(trace.ops, window=window, steps=max(len(trace.steps), 1), kernels=trace.kernels)
    digest = hashlib.sha256(json.dumps([whole.to_dict(), steps.to_dict()], sort_keys=True).encode()).hexdigest()[:16]
    assert (whole.flops, whole.counted_calls, steps.flops, whole.dtype, digest) == COUNTED[name]


def test_a_vits_patch_embedding_convolution_is_counted_and_its_kernels_are_no_longer_uncounted():
    trace = load_kineto(DATA / "traces/eager_vit.json.gz", ops=True)
    counted = count_op_flops(trace.ops, kernels=trace.kernels)
    # 3 steps of a 192-wide ViT on one 224² image: a 16×16 stride-16 convolution from 3 channels onto 14×14 patches
    patch_embedding = 2 * 1 * 192 * 3 * 16 * 16 * 14 * 14
    assert counted.by_op["aten::convolution"] == 3 * patch_embedding == 173_408_256
    # before, conv2d and the three ops below it were named uncounted and its cuDNN kernels were 19% of the heavy GPU time
    assert counted.uncounted_ops == {} and counted.uncounted_heavy_share == 0.0 and counted.complete
