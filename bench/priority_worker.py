"""One rank of bench/priority: an untrained torchvision ResNet-18 trained on random images,
its gradients averaged through gradsyncd, one way:

    --way priority   gradsync.torch.overlap_forward, the first layers' gradients first
    --way fifo       the same with every gradient at one priority, first in, first out
    --way ddp        DistributedDataParallel over the gradsync backend (no overlap with forward)
    --way compute    no communication at all: the step's compute alone

Rank 0 writes the mean step time over --steps steps after --warmup, as JSON, to --out."""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn as nn
import torchvision

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "client",
                                "python"))
import gradsync  # noqa: E402
import gradsync.torch  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--way", choices=["priority", "fifo", "ddp", "compute"], required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--image", type=int, default=64)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    rank = int(os.environ.get("RANK", "0"))
    generator = torch.Generator().manual_seed(rank)
    images = torch.randn(args.batch, 3, args.image, args.image, generator=generator)
    labels = torch.randint(0, 10, (args.batch,), generator=generator)

    step = optimizer
    if args.way in ("priority", "fifo"):
        step = gradsync.torch.overlap_forward(model, optimizer,
                                              priorities=args.way == "priority")
    elif args.way == "ddp":
        import torch.distributed as dist
        dist.init_process_group("gradsync")
        model = nn.parallel.DistributedDataParallel(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        step = optimizer

    times = []
    for i in range(args.warmup + args.steps):
        start = time.perf_counter()
        step.zero_grad()
        loss = nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        step.step()
        times.append(time.perf_counter() - start)
        if not torch.isfinite(loss):
            raise SystemExit(f"step {i}: loss {loss.item()}")
    if args.way in ("priority", "fifo"):
        step.synchronize()
    if rank == 0:
        measured = times[args.warmup:]
        with open(args.out, "w") as out:
            json.dump({"way": args.way, "step_seconds": sum(measured) / len(measured),
                       "steps": measured}, out)
    if args.way == "ddp":
        torch.distributed.destroy_process_group()
    elif args.way != "compute":
        gradsync.shutdown()


if __name__ == "__main__":
    main()
