#!/usr/bin/python3
"""Sharded data parallelism (ZeRO-3's pattern, as FSDP runs it) on host memory over the backend
"gradsync": each rank owns 1/world of the flattened parameters and their optimizer state. Every
step gathers the whole parameters (_all_gather_base), runs forward and backward, reduces the
gradients so that each rank gets the average of its own shard only (_reduce_scatter_base), and
updates that shard. PyTorch 1.13's Gloo has neither call, and its FSDP does not run on CPU.

    torchrun --nproc_per_node 4 examples/train_sharded.py            (with a gradsyncd running)
    torchrun --nproc_per_node 4 examples/train_sharded.py --check    (also trains with DDP and
                                                                       checks both end equal)

--shared-memory puts the flat parameters and gradients in gradsync's shared memory, where the
gathers and reductions run in place (docs/python.md).
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "client",
                                "python"))
import gradsync.torch  # noqa: E402,F401  (registers the backend)
from train_ddp import Net, batches  # noqa: E402


class ShardedModel:
    """A module whose parameters live as one flat buffer, 1/world of it owned by this rank."""

    def __init__(self, module):
        self.module = module
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        params = list(module.parameters())
        total = sum(p.numel() for p in params)
        self.shard_size = -(-total // self.world)  # padded so every shard is equal
        self.flat = torch.zeros(self.shard_size * self.world)
        offset = 0
        for p in params:
            self.flat[offset:offset + p.numel()] = p.detach().flatten()
            p.data = self.flat[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
        self.params = params
        own = slice(self.rank * self.shard_size, (self.rank + 1) * self.shard_size)
        self.shard = nn.Parameter(self.flat[own].clone())

    def gather_parameters(self):
        dist._all_gather_base(self.flat, self.shard.detach())

    def reduce_gradients(self):
        grads = torch.zeros_like(self.flat)
        offset = 0
        for p in self.params:
            if p.grad is not None:
                grads[offset:offset + p.numel()] = p.grad.flatten()
            offset += p.numel()
        self.shard.grad = torch.empty(self.shard_size)
        dist._reduce_scatter_base(self.shard.grad, grads)
        self.shard.grad.div_(self.world)


def train_sharded(args, rank):
    torch.manual_seed(0)
    model = ShardedModel(Net())
    optimizer = torch.optim.SGD([model.shard], lr=args.lr, momentum=0.9)
    for step, (x, y) in enumerate(batches(rank, args.batch_size, args.steps), start=1):
        model.gather_parameters()
        for p in model.params:
            p.grad = None
        loss = nn.functional.cross_entropy(model.module(x), y)
        loss.backward()
        model.reduce_gradients()
        optimizer.step()
        if rank == 0 and (step % 10 == 0 or step == 1):
            print(f"step {step:4d}  loss {loss.item():.4f}", flush=True)
    model.gather_parameters()
    return [p.detach().clone() for p in model.params]


def train_ddp(args, rank):
    torch.manual_seed(0)
    model = DDP(Net(), broadcast_buffers=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    for x, y in batches(rank, args.batch_size, args.steps):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    return [p.detach().clone() for p in model.module.parameters()]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--check", action="store_true",
                        help="train with DDP too (float64) and fail unless both end equal")
    parser.add_argument("--shared-memory", action="store_true",
                        help="tensors of 64 KiB or more in gradsync's shared memory")
    args = parser.parse_args()
    if args.check:
        torch.set_default_dtype(torch.float64)
    if args.shared_memory:
        # gradsync: before the model is built, so that its flat buffers are reduced in place.
        gradsync.torch.use_shared_memory(64 << 10)

    dist.init_process_group("gradsync")
    rank = dist.get_rank()
    sharded = train_sharded(args, rank)
    status = 0
    if args.check:
        reference = train_ddp(args, rank)
        worst = max(((a - b).abs().max() / b.abs().max()).item()
                    for a, b in zip(sharded, reference))
        print(f"rank {rank}: sharded vs DDP: max relative difference {worst:.1e}", flush=True)
        status = 0 if worst <= 1e-6 else 1
    dist.destroy_process_group()
    sys.exit(status)


if __name__ == "__main__":
    main()
