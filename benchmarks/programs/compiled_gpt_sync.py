"""A plain compiled GPT-2 training loop that synchronises every step, as a user writes it: a GPT-2 small from
transformers' config (random weights), ``torch.compile``, fused AdamW, bf16 autocast, and ``loss.item()`` each step
for the running loss it prints. Not a perflab program: it never imports perflab.

Its own clock: the host's time per iteration (the ``.item()`` each step makes it the step's), logged to ``--log``.
``--no-sync`` reads the loss every ``--log-every`` steps instead: the same loop without the per-step synchronisation.

    python benchmarks/programs/compiled_gpt_sync.py --steps 200 --log own.jsonl
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--no-sync", action="store_true")
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--log", default=None)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = GPT2Config(n_layer=args.layers, n_embd=args.width, n_head=args.heads, n_positions=max(1024, args.seq_len))
    model = GPT2LMHeadModel(config).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=device == "cuda")
    forward = model if args.no_compile else torch.compile(model)
    data = torch.randint(0, config.vocab_size, (args.batch_size * 64, args.seq_len))
    log = open(args.log, "w") if args.log else None
    running = 0.0
    last = time.perf_counter()
    for step in range(args.steps):
        batch = data[(step * args.batch_size) % len(data):][:args.batch_size].to(device, non_blocking=True)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            loss = forward(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if not args.no_sync:
            running += loss.item()  # the running loss, read every step: it waits for the GPU
        elif step % args.log_every == 0:
            running += loss.item()
        now = time.perf_counter()
        if log:
            log.write(json.dumps({"step": step, "step_ms": (now - last) * 1e3}) + "\n")
        last = now
    if log:
        log.close()
    print(f"{args.steps} steps, mean loss {running / args.steps:.3f}", flush=True)


if __name__ == "__main__":
    main()
