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
    # (the fill judged is the untraced busy share where GPM or NVML read one, else the traced kernels')
    assert 0 < verdict["kernel_fill"] <= 1 and (verdict["verdict"] == "GPU-bound") == (verdict["fill"] >= 0.85)
    assert verdict["verdict"] != "launch-bound" or verdict["fill"] < 0.85


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


SLOW_LOADER = """
import json, sys, time
import torch
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):
    def __len__(self):
        return 64 * 60
    def __getitem__(self, i):
        if i % 64 == 0:
            time.sleep(0.020)  # each batch waits 20 ms: more than its step's GPU work
        return torch.randn(1024), 0

model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
own = []
it = iter(DataLoader(Slow(), batch_size=64))
for i in range(40):
    t0 = time.perf_counter()
    x, _ = next(it)
    t1 = time.perf_counter()
    loss = model(x.cuda(non_blocking=True)).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    running = loss.item()  # the running loss, read each step: a synchronising call
    own.append({"data_ms": (t1 - t0) * 1e3, "iteration_ms": (time.perf_counter() - t0) * 1e3})
json.dump(own, open(sys.argv[1], "w"))
"""


def test_a_loader_slower_than_the_gpu_is_input_bound_and_its_item_is_named(tmp_path):
    prog = tmp_path / "slow.py"
    prog.write_text(textwrap.dedent(SLOW_LOADER))
    own_path = tmp_path / "own.json"
    assert api.run([str(prog), str(own_path)], skip=5, steps=20, trace=3, out_dir=tmp_path / "out") == 0
    report = json.loads((tmp_path / "out" / "run.json").read_text())
    loop, verdict = report["loop"], report["verdict"]
    assert verdict["verdict"] == "input-bound", verdict["message"]
    own = json.loads(own_path.read_text())[5:24]  # the timed steps but the last (perflab starts its profiler in it)
    own_share = sum(s["data_ms"] for s in own) / sum(s["iteration_ms"] for s in own)
    samples, exposed = report["timing"]["samples_ms"][:-1], loop["per_step"]["exposed_input_ms"][:-1]
    # the exposed wait is the part of the program's own data wait the GPU spent idle: never more, and nearly all of it here
    assert sum(exposed) / sum(samples) <= own_share + 0.02 and sum(exposed) / sum(samples) > own_share - 0.1
    assert sum(samples) / len(samples) == __import__("pytest").approx(sum(s["iteration_ms"] for s in own) / len(own), rel=0.03)
    site = loop["sync"]["sites"][0]
    line = prog.read_text().splitlines().index("    running = loss.item()  # the running loss, read each step: a synchronising call") + 1
    assert site["site"] == f"{prog}:{line} (<module>)" and site["per_step"] == 1.0
    assert (report["verdict_evidence"]["sync_idle"] or {}).get("calls_per_step") >= 1.0
