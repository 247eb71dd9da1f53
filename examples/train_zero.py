#!/usr/bin/python3
"""DDP with ZeroRedundancyOptimizer over the backend "gradsync": each rank keeps the optimizer
state of its shard of the parameters only, and broadcasts its updated shard after each step.

    torchrun --nproc_per_node 4 examples/train_zero.py         (with a gradsyncd running)
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "client",
                                "python"))
import gradsync.torch  # noqa: E402,F401  (registers the backend)
from train_ddp import Net, train  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()

    dist.init_process_group("gradsync")
    torch.manual_seed(0)
    model = DDP(Net(), broadcast_buffers=False)
    optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,
                                        lr=1e-3)
    train(model, optimizer, args.batch_size, args.steps)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
