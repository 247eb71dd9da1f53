#!/usr/bin/python3
"""Trains a small convolutional network with PyTorch DDP, gradients averaged by gradsyncd.

    torchrun --nproc_per_node 4 examples/train_ddp.py          (with a gradsyncd running)
    torchrun --nproc_per_node 4 examples/train_ddp.py --backend hook
    scripts/demo --pytorch                                      (starts one for you)

--backend gradsync (the default): torch.distributed's backend "gradsync", DDP unchanged.
--backend hook: a Gloo process group, with gradsync's DDP communication hook.
--backend gloo: no gradsync at all, for comparison.
--shared-memory (with --backend gradsync): the model and DDP's buckets in gradsync's shared
memory, where the backend reduces them in place (docs/python.md).

The data set is synthetic and deterministic: 28x28 single-channel images whose label is which
of ten fixed smooth patterns they correlate with most, so the loss goes down. The gradsync lines
are marked.
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "client",
                                "python"))
import gradsync.torch  # noqa: E402


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(32 * 7 * 7, 128), nn.ReLU(),
                                        nn.Linear(128, 10))

    def forward(self, x):
        return self.classifier(self.features(x))


def batches(rank, batch_size, steps):
    """This rank's shard of the synthetic data set, `steps` batches of (images, labels)."""
    patterns = torch.nn.functional.avg_pool2d(
        torch.randn(10, 1, 28, 28, generator=torch.Generator().manual_seed(7)), 7, 1, 3)
    generator = torch.Generator().manual_seed(100 + rank)
    for _ in range(steps):
        x = torch.randn(batch_size, 1, 28, 28, generator=generator)
        yield x, (x.flatten(1) @ patterns.flatten(1).T).argmax(dim=1)


def train(model, optimizer, batch_size, steps):
    """Trains on this rank's shard; rank 0 prints the loss and the samples/s of all ranks."""
    rank, world = dist.get_rank(), dist.get_world_size()
    start = time.perf_counter()
    for step, (x, y) in enumerate(batches(rank, batch_size, steps), start=1):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        if rank == 0 and (step % 10 == 0 or step == 1):
            rate = step * batch_size * world / (time.perf_counter() - start)
            print(f"step {step:4d}  loss {loss.item():.4f}  {rate:8.0f} samples/s", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--backend", choices=["gradsync", "hook", "gloo"], default="gradsync")
    parser.add_argument("--shared-memory", action="store_true",
                        help="tensors of 64 KiB or more in gradsync's shared memory")
    args = parser.parse_args()
    if args.shared_memory:
        if args.backend != "gradsync":
            parser.error("--shared-memory serves the backend gradsync only")
        # gradsync: before the model and DDP allocate, so that DDP's buckets are reduced in place.
        gradsync.torch.use_shared_memory(64 << 10)

    # gradsync: one word, and every collective of the process group runs in the node's daemon.
    dist.init_process_group("gradsync" if args.backend == "gradsync" else "gloo")
    world = dist.get_world_size()
    torch.manual_seed(0)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    model = DDP(Net(), broadcast_buffers=False)
    if args.backend == "hook":
        # gradsync: the bucket allreduce goes through the node's daemon.
        model.register_comm_hook(gradsync.torch.GradsyncState(), gradsync.torch.allreduce_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    train(model, optimizer, args.batch_size, args.steps)
    if args.backend == "hook":
        gradsync.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
