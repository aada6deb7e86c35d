"""An ImageNet-style trainer, written as pytorch/examples' imagenet/main.py is (argparse, a torchvision model, a
DataLoader with workers, SGD, `Data` and `Time` meters), on synthetic images: each sample is made on the CPU as a JPEG
decode and its augmentations would be (``--decode-ms`` of CPU work a sample, then a random crop, a flip, a
normalisation), so its loader's speed is set by its workers. Not a perflab program: it never imports perflab.

It logs its own meters each step to ``--log`` (JSON lines: the wait for the batch, the whole iteration), the clock
perflab's figures are held against. ``--traceml`` wraps each step in TraceML's ``trace_step`` (``traceml run``);
``--spawn`` starts its one rank with ``torch.multiprocessing.spawn``, as main.py does with --multiprocessing-distributed.

    python benchmarks/programs/imagenet_synthetic.py --arch resnet18 -b 256 -j 4 --steps 60 --log own.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class SyntheticImages(Dataset):
    """Random images, each made with ``decode_ms`` of CPU work first (what decoding a JPEG costs), then augmented."""

    def __init__(self, n: int, size: int, decode_ms: float, classes: int = 1000):
        self.n, self.size, self.decode_ms, self.classes = n, size, decode_ms, classes
        self.mean = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
        self.std = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        raw = torch.randint(0, 256, (3, self.size + 32, self.size + 32), dtype=torch.uint8, generator=g)
        end = time.perf_counter() + self.decode_ms / 1000
        while time.perf_counter() < end:  # the decode: CPU work, as a JPEG's is
            pass
        top, left = torch.randint(0, 33, (2,), generator=g).tolist()
        img = raw[:, top:top + self.size, left:left + self.size].float().div_(255)
        if torch.rand((), generator=g) < 0.5:
            img = img.flip(-1)
        return (img - self.mean) / self.std, int(torch.randint(0, self.classes, (), generator=g))


class AverageMeter:
    def __init__(self):
        self.sum, self.count, self.val = 0.0, 0, 0.0

    def update(self, val):
        self.val, self.sum, self.count = val, self.sum + val, self.count + 1


def tiny_net(classes: int) -> nn.Module:
    """A small CNN for CPU runs (torchvision's models where torchvision imports)."""
    return nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, classes))


def main_worker(rank: int, args) -> None:
    device = torch.device("cuda", rank) if torch.cuda.is_available() else torch.device("cpu")
    if args.spawn:
        import torch.distributed as dist

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=1)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if args.arch == "tiny":
        model = tiny_net(1000)
    else:
        import torchvision.models as models

        model = models.__dict__[args.arch]()
    model = model.to(device)
    if args.spawn:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank] if device.type == "cuda" else None)
    criterion = nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=0.9, weight_decay=1e-4)
    dataset = SyntheticImages(args.batch_size * (args.steps + 8), args.image_size, args.decode_ms)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers, pin_memory=device.type == "cuda",
                        persistent_workers=args.workers > 0)
    traceml = None
    if args.traceml:
        import traceml_ai as traceml

        traceml.init(mode="auto")
    batch_time, data_time = AverageMeter(), AverageMeter()
    log = open(args.log, "w") if args.log and rank == 0 else None
    model.train()
    end = time.perf_counter()
    for i, (images, target) in enumerate(loader):
        if i >= args.steps:
            break
        data_time.update(time.perf_counter() - end)
        step = traceml.trace_step(model) if traceml else _nothing()
        with step:
            images = images.to(device, non_blocking=True)
            target = target.to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.amp):
                loss = criterion(model(images), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if i % args.print_freq == 0:
            loss.item()  # the example prints its loss meter every print_freq steps
        if device.type == "cuda" and args.sync_meter:
            torch.cuda.synchronize()
        batch_time.update(time.perf_counter() - end)
        if log:
            log.write(json.dumps({"step": i, "data_ms": data_time.val * 1e3, "batch_ms": batch_time.val * 1e3}) + "\n")
            log.flush()
        end = time.perf_counter()
    if log:
        log.close()
    print(f"trained {batch_time.count} steps: Time {batch_time.sum / batch_time.count * 1e3:.3f} ms, "
          f"Data {data_time.sum / data_time.count * 1e3:.3f} ms", flush=True)
    if args.spawn:
        import torch.distributed as dist

        dist.destroy_process_group()


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-a", "--arch", default="resnet18")
    parser.add_argument("-b", "--batch-size", type=int, default=256)
    parser.add_argument("-j", "--workers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--decode-ms", type=float, default=2.0, help="CPU work a sample takes to make (a JPEG's decode)")
    parser.add_argument("--amp", action="store_true", help="bf16 autocast")
    parser.add_argument("--print-freq", type=int, default=10)
    parser.add_argument("--sync-meter", action="store_true", help="synchronise before reading the Time meter (every step)")
    parser.add_argument("--log", default=None, help="JSON lines of the Data and Time meters, one a step")
    parser.add_argument("--spawn", action="store_true", help="start the rank with torch.multiprocessing.spawn (one rank)")
    parser.add_argument("--traceml", action="store_true", help="wrap each step in TraceML's trace_step")
    args = parser.parse_args()
    if args.spawn:
        torch.multiprocessing.spawn(main_worker, nprocs=1, args=(args,))
    else:
        main_worker(0, args)


if __name__ == "__main__":
    main()
