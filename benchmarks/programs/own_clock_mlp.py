"""The own-clock program of benchmarks/own_clock_cpu.py: each iteration timed by the program itself; argv: iterations, the JSON to write."""
import json, sys, time
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
own = []
for i in range(int(sys.argv[1])):
    t0 = time.perf_counter()
    model(torch.randn(64, 256)).square().mean().backward()
    opt.step()
    opt.zero_grad()
    time.sleep(0.01)
    own.append((time.perf_counter() - t0) * 1e3)
json.dump(own, open(sys.argv[2], "w"))
