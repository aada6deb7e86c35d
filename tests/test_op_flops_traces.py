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
    "cpu_only.json.gz": (0, 0, 0, None, "9dfd0deac1262a08"),
    "ranks_cpu/ddp_gloo_rank0.json.gz": (0, 0, 0, None, "e9ea9a1a17917e8f"),
    "ranks_cpu/ddp_gloo_rank1.json.gz": (0, 0, 0, None, "e9ea9a1a17917e8f"),
    # CUDA only (perflab run's accounted pass on a GPU): no operators, so nothing counted; its FLOPs come from the pass with shapes
    "run/nanogpt_cuda_only_h200.json.gz": (0, 0, 0, None, "d54f094f220c3abf"),
    "run/nanogpt_ddp_cuda_only_h200_rank0.json.gz": (0, 0, 0, None, "d54f094f220c3abf"),
    "run/nanogpt_ddp_cuda_only_h200_rank1.json.gz": (0, 0, 0, None, "d54f094f220c3abf"),
    "run/nanogpt_ddp_rank0_h100.json.gz": (32201785737216, 513, 32201785737216, "bf16", "ee1d414b90070284"),
    "run/nanogpt_ddp_rank1_h100.json.gz": (32201785737216, 513, 32201785737216, "bf16", "8825704eb9a0370d"),
    "run/nanogpt_h100.json.gz": (32201785737216, 513, 32201785737216, "bf16", "053eda00c6b20514"),
    "traces/by_module_lm_forward.json.gz": (3435738955776, 255, 3435738955776, "fp32", "92c49243706283cc"),
    "traces/compile_block.json.gz": (2516582400, 15, 2516582400, "fp32", "a9fa5465bc7f4ad6"),
    "traces/cudagraph_vit.json.gz": (0, 0, 0, None, "d54f094f220c3abf"),
    "traces/decode_cudagraph.json.gz": (0, 0, 0, None, "32c1b24715483a52"),
    "traces/eager_vit.json.gz": (3734148096, 195, 3734148096, "bf16", "a6cc9a9adb971ed5"),  # its patch embedding counted since convolutions are
    "traces/lm_train_step_compile.json.gz": (29553065984, 74, 29553065984, "bf16", "93787cff21ab6bd7"),
    "traces/lm_train_step_explicit.json.gz": (29418848256, 90, 29418848256, "bf16", "6bf76c66cabd1ba7"),
    "traces/reduce_overhead.json.gz": (0, 0, 0, None, "efb7159e224a2bda"),
    "traces/train_step.json.gz": (414449664, 15, 414449664, "fp32", "4a53d3830a138f4d"),
    "traces/two_streams.json.gz": (274877906944, 16, 274877906944, "fp32", "0bd988c35c097c98"),
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
    assert counted.conv_by_dtype == {"bf16": 173_408_256}  # the convolutions' FLOPs apart (their precision's peak may differ)
    # before, conv2d and the three ops below it were named uncounted and its cuDNN kernels were 19% of the heavy GPU time
    assert counted.uncounted_ops == {} and counted.uncounted_heavy_share == 0.0 and counted.complete
