"""How a workload runs: device, precision, inputs, and execution mode (eager, torch.compile, CUDA graph)."""
