#!/usr/bin/python3
"""DDP with ZeroRedundancyOptimizer over the backend "gradsync": each rank keeps the optimizer
state of its shard of the parameters only, and broadcasts its updated shard after each step.

    torchrun --nproc_per_node 4 examples/train_zero.py         (with a gradsyncd running)
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "client",
                                "python"))
import gradsync.torch  # noqa: E402,F401  (registers the backend)
from train_ddp import Net, batches  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()

    dist.init_process_group("gradsync")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(Net(), broadcast_buffers=False)
    optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,
                                        lr=1e-3)
    start = time.perf_counter()
    for step, (x, y) in enumerate(batches(rank, args.batch_size, args.steps), start=1):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        if rank == 0 and (step % 10 == 0 or step == 1):
            rate = step * args.batch_size * world / (time.perf_counter() - start)
            print(f"step {step:4d}  loss {loss.item():.4f}  {rate:8.0f} samples/s", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
