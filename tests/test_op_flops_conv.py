"""Convolution FLOPs counted from a trace (analysis.op_flops): a small ResNet-like model's training step traced on the
CPU with record_shapes, its count from the Kineto file held against torch.utils.flop_counter's count of the same step
and against the layers' own shapes, forward and backward apart."""

from __future__ import annotations

import json
from contextlib import nullcontext

import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils.flop_counter import FlopCounterMode

from perflab.analysis.op_flops import count_op_flops
from perflab.program.report import run_report_checks
from perflab.trace.kineto import load_kineto

BATCH, CLASSES = 2, 10


class BasicBlock(nn.Module):
    """ResNet's two 3×3 convolutions, with a strided 1×1 convolution on the shortcut where the block downsamples."""

    def __init__(self, channels_in: int, channels_out: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(channels_in, channels_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels_out)
        self.conv2 = nn.Conv2d(channels_out, channels_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels_out)
        self.downsample = None
        if stride != 1 or channels_in != channels_out:
            self.downsample = nn.Sequential(nn.Conv2d(channels_in, channels_out, 1, stride=stride, bias=False), nn.BatchNorm2d(channels_out))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + (x if self.downsample is None else self.downsample(x)))


class SmallResNet(nn.Module):
    """A 32×32 image through a strided stem, two basic blocks (the second downsampling), a grouped, a depthwise and a
    dilated convolution, a grouped transposed convolution back up, and a 1-d convolution over the flattened positions."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU())  # 16×16
        self.layer1 = BasicBlock(16, 16)
        self.layer2 = BasicBlock(16, 32, stride=2)  # 8×8
        self.grouped = nn.Conv2d(32, 32, 3, padding=1, groups=4, bias=False)
        self.depthwise = nn.Conv2d(32, 32, 3, padding=1, groups=32)
        self.dilated = nn.Conv2d(32, 32, 3, padding=2, dilation=2)
        self.up = nn.ConvTranspose2d(32, 16, 3, stride=2, padding=1, output_padding=1, groups=2)  # 16×16
        self.temporal = nn.Conv1d(16, 8, 5, stride=2, padding=2)  # 256 positions → 128
        self.head = nn.Linear(8, CLASSES)

    def forward(self, images):
        x = self.layer2(self.layer1(self.stem(images)))
        x = torch.relu(self.dilated(torch.relu(self.depthwise(torch.relu(self.grouped(x))))))
        x = torch.relu(self.up(x))
        x = torch.relu(self.temporal(x.flatten(2)))
        return self.head(x.mean(dim=2))


def training_step(model, optimizer, images, labels, ranges: bool = False):
    """One step; ``ranges``: the forward and the backward each in a named range (for the trace's windows)."""
    with record_function("forward") if ranges else nullcontext():
        loss = nn.functional.cross_entropy(model(images), labels)
    with record_function("backward") if ranges else nullcontext():
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def layer_flops(model, images) -> dict[str, tuple[int, int, int]]:
    """Per convolution and linear layer, from its weight and its output's shape as it ran (forward hooks, no formula
    for an output size): (forward FLOPs, groups, whether its input needs a gradient)."""
    found = {}

    def hook(module, inputs, output):
        weight, (x,) = module.weight, inputs
        if isinstance(module, nn.Linear):
            flops = 2 * x.shape[0] * weight.numel()
        else:
            # the multiply-adds slide the weight over the output's positions, a transposed one's over its input's
            positions = (x if module.transposed else output).shape[2:].numel()
            flops = 2 * x.shape[0] * weight.numel() * positions
        found[name_of[module]] = (flops, getattr(module, "groups", 1), x.requires_grad)

    name_of = {m: n for n, m in model.named_modules() if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.ConvTranspose2d, nn.Linear))}
    handles = [m.register_forward_hook(hook) for m in name_of]
    model(images)
    for h in handles:
        h.remove()
    return found


@pytest.fixture(scope="module")
def step(tmp_path_factory):
    """The model, its step's inputs, the trace of one step (written as the Kineto JSON perflab reads) and torch's count
    of the same step."""
    torch.manual_seed(0)
    model = SmallResNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    images, labels = torch.randn(BATCH, 3, 32, 32), torch.randint(0, CLASSES, (BATCH,))
    training_step(model, optimizer, images, labels)  # warm-up: lazy initialisation out of the traced step
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        training_step(model, optimizer, images, labels, ranges=True)
    path = tmp_path_factory.mktemp("conv") / "step.json"
    prof.export_chrome_trace(str(path))
    with FlopCounterMode(display=False) as counter:
        loss = nn.functional.cross_entropy(model(images), labels)
    torch_forward = counter.get_total_flops()
    with FlopCounterMode(display=False) as counter:
        loss.backward()
    torch_backward = counter.get_total_flops()
    return {"model": model, "images": images, "path": path, "torch_forward": torch_forward, "torch_backward": torch_backward}


def window(trace, name: str) -> tuple[int, int]:
    (row,) = trace.ranges[trace.ranges["name"].astype(str) == name].itertuples()
    return int(row.start_ns), int(row.end_ns) + 1


def test_a_resnets_training_step_counts_as_torchs_flop_counter_forward_and_backward(step):
    trace = load_kineto(step["path"], ops=True)
    whole = count_op_flops(trace.ops)
    forward = count_op_flops(trace.ops, window=window(trace, "forward"))
    backward = count_op_flops(trace.ops, window=window(trace, "backward"))
    layers = layer_flops(step["model"], step["images"])
    assert len(layers) == 12  # eleven convolutions (nine 2-d, the transposed one, the 1-d one) and the head
    forward_flops = sum(flops for flops, _, _ in layers.values())
    # backward: the weight's gradient of every layer, the input's where it needs one (not the images: the stem's input)
    backward_flops = sum(flops * (1 + needs_grad) for flops, _, needs_grad in layers.values())
    assert forward.flops == forward_flops == step["torch_forward"] == 12_771_648
    assert backward.flops == backward_flops == 25_100_928
    assert whole.flops == forward.flops + backward.flops  # the optimizer's step does no counted work
    # torch 2.13's counter counts a grouped convolution's weight gradient as if ungrouped, ``groups`` times its
    # multiply-adds (grouped ×4, depthwise ×32, the transposed ×2); a torch that divides by groups agrees exactly
    over = sum((groups - 1) * flops for flops, groups, _ in layers.values())
    per_weight_element = 2 * BATCH * 8 * 8  # the three slide their weights over 8×8 positions (the transposed one: its input's)
    assert over == per_weight_element * (3 * 32 * 8 * 9 + 31 * 32 * 1 * 9 + 1 * 32 * 8 * 9) == 4_644_864
    assert step["torch_backward"] - backward.flops in (over, 0)
    assert forward.by_op.keys() == {"aten::convolution", "aten::addmm"} and backward.by_op.keys() == {"aten::convolution_backward", "aten::mm"}
    assert forward.counted_calls == 12 and backward.counted_calls == 11 + 2  # each convolution once; the head's two mm
    assert whole.uncounted_ops == {} and whole.complete and whole.dtype == "fp32"
    # the convolutions' share, apart (their fp32 runs on TF32 by cuDNN's default): all but the head's linear layer
    head = layers["head"][0]
    convs = sum(flops * (2 + needs_grad) for name, (flops, _, needs_grad) in layers.items() if name != "head")
    assert whole.conv_by_dtype == {"fp32": convs} and convs == whole.flops - 3 * head


def test_convolutions_traced_without_their_arguments_are_named_uncounted_not_zero(step, tmp_path):
    document = json.loads(step["path"].read_text())
    for event in document["traceEvents"]:
        event.get("args", {}).pop("Concrete Inputs", None)
    stripped = tmp_path / "no_values.json"
    stripped.write_text(json.dumps(document))
    trace = load_kineto(stripped, ops=True)
    counted = count_op_flops(trace.ops)
    layers = layer_flops(step["model"], step["images"])
    head = layers["head"][0]
    assert counted.flops == head * 3  # the head's addmm and its backward's two mm: shapes suffice for a matmul
    # every convolution's forward and backward call (the stem's backward computes its weight's gradient alone)
    assert counted.uncounted_ops["aten::convolution"] == 11 and counted.uncounted_ops["aten::convolution_backward"] == 11
    assert not counted.complete
    (check,) = [c for c in run_report_checks({"flops": counted.to_dict()}) if c["flag"] == "flops_incomplete"]
    assert "aten::convolution ×11" in check["message"] and check["message"].startswith("FLOPs are a lower bound")
    assert [c for c in run_report_checks({"flops": count_op_flops(load_kineto(step["path"], ops=True).ops).to_dict()})
            if c["flag"] == "flops_incomplete"] == []


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")
def test_three_d_same_padded_and_unbatched_convolutions_count_as_torchs_flop_counter(tmp_path):
    torch.manual_seed(0)
    layers = [(nn.Conv3d(2, 4, (1, 3, 3), stride=(1, 2, 1), padding=(0, 1, 2), dilation=(1, 1, 2)), (2, 2, 3, 9, 9)),
              (nn.Conv2d(4, 6, 4, padding="same"), (2, 4, 9, 9)),  # an even kernel: ATen pads the input unevenly first
              (nn.Conv1d(3, 5, 3, stride=2), (3, 17)),  # one unbatched sample: ATen adds the batch dimension
              (nn.ConvTranspose1d(4, 6, 5, stride=3, padding=2, output_padding=1, dilation=2), (2, 4, 7))]
    inputs = [torch.randn(shape, requires_grad=True) for _, shape in layers]

    def forward_and_backward():
        sum(layer(x).sum() for (layer, _), x in zip(layers, inputs)).backward()

    forward_and_backward()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        forward_and_backward()
    prof.export_chrome_trace(str(tmp_path / "step.json"))
    counted = count_op_flops(load_kineto(tmp_path / "step.json", ops=True).ops)
    with FlopCounterMode(display=False) as counter:
        forward_and_backward()
    # forward, then the input's and the weight's gradients alike (3×): 2 × batch × weight elements × output positions
    # (3-d: 3·5·9 positions; same: 9·9; unbatched: 8; transposed: the input's 7)
    by_hand = 3 * 2 * (2 * 72 * 135 + 2 * 384 * 81 + 1 * 45 * 8 + 2 * 120 * 7)
    assert counted.flops == counter.get_total_flops() == by_hand == 502_128  # ungrouped: torch's count is the real one
    assert counted.counted_calls == 8 and counted.uncounted_ops == {}
