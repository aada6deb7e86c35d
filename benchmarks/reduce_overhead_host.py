"""What compile:reduce-overhead costs per call on the host, beside a plain CUDA graph: deit_tiny bs1 bf16 in three modes
(api.bench, held timing), then k-tensor stacks of tiny Linear layers, then cProfile of the compiled call.
Run on a GPU: PYTHONPATH=src OUT=DIR python benchmarks/reduce_overhead_host.py (writes DIR/ro_probe.json)."""
import cProfile
import io
import json
import os
import pstats
import time

import torch

from perflab import api
from perflab.measure.host import held_timing
from perflab.models.registry import build_model
from perflab.spec import Case, validate_case
from perflab.workloads.base import image_batch

out = os.environ.get("OUT", ".")
res = {}
cases = api.make_cases(model=["deit_tiny_patch16_224"], batch_size=[1], dtype=["bf16"], mode=["eager", "cudagraph", "compile:reduce-overhead"],
                       device="cuda", min_time=1.0, repeats=5)
rows = api.bench(cases)
for r in rows:
    res[r["mode"]] = {k: r.get(k) for k in ("median_ms", "host_held_ms", "device_ms", "host_issue_ms", "status", "message")}
    print(r["mode"], res[r["mode"]], flush=True)

def per_call(fn, n=300):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e3

# tiny models with k parameter tensors: host per call under reduce-overhead
probe = {}
for k in (2, 16, 64, 152, 256):
    torch._dynamo.reset()
    layers = torch.nn.Sequential(*[torch.nn.Linear(8, 8, bias=False) for _ in range(k)]).cuda().to(torch.bfloat16)
    x = torch.randn(1, 8, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        f = torch.compile(layers, mode="reduce-overhead")
        step = lambda: f(x)
        wall = per_call(step)
        held = held_timing(step, "cuda", wall / 1e3)
        g = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()  # warm up on a side stream before capture, as torch.cuda.graph asks
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                layers(x)
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            layers(x)
        gwall = per_call(g.replay)
        gheld = held_timing(g.replay, "cuda", gwall / 1e3)
    probe[k] = dict(ro_wall_ms=wall, ro_host_ms=held.host_s and held.host_s * 1e3, ro_dev_ms=held.device_s and held.device_s * 1e3,
                    graph_wall_ms=gwall, graph_host_ms=gheld.host_s and gheld.host_s * 1e3, graph_dev_ms=gheld.device_s and gheld.device_s * 1e3)
    print(k, probe[k], flush=True)
res["probe"] = probe

# where the compiled deit_tiny call spends its host time
torch._dynamo.reset()
case = validate_case(Case("deit_tiny_patch16_224", batch_size=1, dtype="bf16", device="cuda"))
net, _ = build_model(case)
net = net.cuda().eval().to(torch.bfloat16)
x = image_batch(1, 224, "cuda", 0).to(torch.bfloat16)
n_params = len(list(net.parameters())) + len(list(net.buffers()))
with torch.no_grad():
    f = torch.compile(net, mode="reduce-overhead")
    step = lambda: f(x)
    wall = per_call(step)
    held = held_timing(step, "cuda", wall / 1e3)
    res["deit_tiny_direct"] = dict(tensors=n_params, wall_ms=wall, host_ms=held.host_s and held.host_s * 1e3, dev_ms=held.device_s and held.device_s * 1e3)
    print(res["deit_tiny_direct"], flush=True)
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(200):
        f(x)
    torch.cuda.synchronize()
    profile.disable()
    for order, lines in (("tottime", 18), ("cumtime", 25)):
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats(order).print_stats(lines)
        print(text.getvalue()[:6000])
with open(f"{out}/ro_probe.json", "w") as f:
    json.dump(res, f, indent=1, default=str)
