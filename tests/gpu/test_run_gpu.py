"""perflab run on a GPU: a CUDA training program timed with CUDA events, its kernels accounted to the ns, its FLOPs from
the traced operators against the formula, MFU and MBU against this GPU's measured peaks; a compiled function."""

from __future__ import annotations

import json
import textwrap

from perflab import api

TRAIN = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
x = torch.randn(256, 1024, device="cuda")
for i in range(40):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(x).float().square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
"""
# forward 2 matmuls; backward: the input gradient of the second only (x needs none), and both weight gradients
FLOPS = 2 * 256 * 1024 * 4096 * (2 + 1 + 2)


def test_a_cuda_training_loop_is_timed_with_events_and_explained(tmp_path):
    prog = tmp_path / "train.py"
    prog.write_text(textwrap.dedent(TRAIN))
    assert api.run([str(prog)], skip=5, steps=20, trace=3, out_dir=tmp_path / "out") == 0
    report = json.loads((tmp_path / "out" / "run.json").read_text())
    assert report["device"] == "cuda" and report["timing"]["steps"] == 20
    assert report["flops"]["flops_per_step"] == FLOPS and report["flops"]["dtype"] == "bf16"
    acc = report["accounting"]["accounting_ns"]
    assert acc["wall_ns"] == acc["busy_ns"] + acc["host_bound_ns"] + acc["kernel_gap_ns"] + acc["other_ns"]
    util = report["utilisation"]
    assert 0 < util["mfu"] < 1 and util["peak_tflops"] > 100 and util["bytes_per_step"] == 4 * (2 * 1024 * 4096 + 4096 + 1024)
    assert report["floors"]["binding"] in ("compute", "memory", "launch", "host")
    assert report["recorded"]["peak_allocated_bytes"] > 0
    # the traced steps timed by the same clock, and a verdict that agrees with the kernel fill it prints
    traced, verdict = report["traced"], report["verdict"]
    assert len(traced["step_ms_each"]) == 3 and traced["inflation"] == traced["step_ms"] / report["timing"]["median_ms"]
    assert 0 < verdict["kernel_fill"] <= 1 and (verdict["verdict"] == "GPU-bound") == (verdict["kernel_fill"] >= 0.85)
    assert verdict["verdict"] != "launch-bound" or verdict["kernel_fill"] < 0.85


def test_a_compiled_step_is_attributed_to_its_compiled_regions(tmp_path):
    prog = tmp_path / "compiled.py"
    prog.write_text(textwrap.dedent(TRAIN.replace("opt = ", "model = torch.compile(model)\nopt = ")))
    assert api.run([str(prog)], skip=8, steps=10, trace=2, out_dir=tmp_path / "out") == 0
    report = json.loads((tmp_path / "out" / "run.json").read_text())
    compiled, phases = report["compiled"], report["recorded"]["compile_phases"]
    # forward and backward compiled; the fused AdamW (not compiled by the program) is what runs eagerly
    assert compiled and compiled["compiled_share"] > 0.3 and "FusedAdam" in compiled["eager_top"][0]["name"], compiled
    assert phases["timed"]["frames"] == 0, phases
    assert not [f for f in report["flags"] if f["flag"] in ("compiled_while_timed", "fell_back_to_eager")], report["flags"]
