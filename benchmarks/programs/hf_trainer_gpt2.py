"""transformers' Trainer on a GPT-2-sized model, as its users write it: a model from its config, a Dataset of token ids,
TrainingArguments, ``trainer.train()``. Random weights and synthetic tokens (nothing is downloaded). Not a perflab
program: it never imports perflab.

Its own clock is a TrainerCallback: the host's time from one ``on_step_end`` to the next, logged per step to ``--log``
(JSON lines), which perflab's step is held against.

    python benchmarks/programs/hf_trainer_gpt2.py --steps 60 --batch-size 8 --seq-len 1024 --log own.jsonl
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments


class Tokens(Dataset):
    def __init__(self, n: int, seq_len: int, vocab: int):
        self.n, self.seq_len, self.vocab = n, seq_len, vocab

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        ids = torch.randint(0, self.vocab, (self.seq_len,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids.clone()}


class StepClock(TrainerCallback):
    """The host's time from one step's end to the next's."""

    def __init__(self, path):
        self.log = open(path, "w") if path else None
        self.last = None

    def on_step_end(self, args, state, control, **kwargs):
        now = time.perf_counter()
        if self.last is not None and self.log:
            self.log.write(json.dumps({"step": state.global_step, "step_ms": (now - self.last) * 1e3}) + "\n")
            self.log.flush()
        self.last = now


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--log", default=None)
    parser.add_argument("--no-nan-filter", action="store_true", help="logging_nan_inf_filter=False: no isnan/isinf check of the loss "
                        "each step (a synchronising call)")
    parser.add_argument("--out", default="/tmp/hf_trainer_out")
    args = parser.parse_args()
    config = GPT2Config(n_layer=args.layers, n_embd=args.width, n_head=args.heads, n_positions=max(1024, args.seq_len))
    model = GPT2LMHeadModel(config)
    cuda = torch.cuda.is_available()
    training = TrainingArguments(output_dir=args.out, per_device_train_batch_size=args.batch_size, max_steps=args.steps, bf16=cuda,
                                 logging_steps=10, report_to="none", save_strategy="no", dataloader_num_workers=args.workers,
                                 learning_rate=3e-4, disable_tqdm=True, use_cpu=not cuda, logging_nan_inf_filter=not args.no_nan_filter)
    trainer = Trainer(model=model, args=training, train_dataset=Tokens(args.batch_size * (args.steps + 2), args.seq_len, config.vocab_size),
                      callbacks=[StepClock(args.log)])
    trainer.train()


if __name__ == "__main__":
    main()
