#!/usr/bin/python3
"""One rank of a DASO run over the gradsync backend (run_ranks.py starts them, on two nodes).

    --check sync     B = 1, S = 0: DASO trains to the parameters synchronous DDP trains to
    --check cycling  B = 4: a node's ranks agree every step; with S = 0 every rank agrees after
                     each global merge; with S = 1 the stale merges run and training goes on
    --check dies     rank 1 dies mid-training: every other rank's step fails within 10 s
"""
import argparse
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))
import gradsync.torch  # noqa: E402

PEER_FAILED = 3  # what run_ranks.py expects of the ranks a failing rank takes down


def expect(condition, what):
    if not condition:
        print(f"rank {dist.get_rank()}: FAILED: {what}", flush=True)
        sys.exit(1)


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))


def batch(rank, step):
    generator = torch.Generator().manual_seed(7919 * step + rank)
    x = torch.randn(8, 16, generator=generator)
    return x, (x[:, :4].argmax(dim=1))


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def all_agree(model, group):
    """Whether every rank of `group` holds exactly the parameters this one holds."""
    mine = flat(model)
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, mine, group=group)
    return all(torch.equal(mine, other) for other in gathered)


def train_step(model, optimizer, rank, step):
    x, y = batch(rank, step)
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()


def check_sync(rank, steps):
    ddp = DDP(make_model(), broadcast_buffers=False)
    ddp_optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    model = make_model()
    daso = gradsync.torch.DASO(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                               total_epochs=1, warmup_epochs=0, cooldown_epochs=0,
                               max_global_skip=1, max_stale_steps=0, downcast=None)
    for step in range(1, steps + 1):
        ddp_optimizer.zero_grad()
        train_step(ddp, ddp_optimizer, rank, step)
        train_step(model, daso, rank, step)
    expect(daso.merges == steps, f"a global merge every step ({daso.merges} of {steps})")
    difference = (flat(model) - flat(ddp.module)).abs().max().item()
    expect(torch.allclose(flat(model), flat(ddp.module), rtol=1e-4, atol=1e-6),
           f"DASO with B = 1, S = 0 trains to DDP's parameters (largest difference {difference})")


def check_cycling(rank, steps):
    for stale in (0, 1):
        model = make_model()
        daso = gradsync.torch.DASO(model, torch.optim.SGD(model.parameters(), lr=0.05),
                                   total_epochs=1, warmup_epochs=0, cooldown_epochs=0,
                                   max_global_skip=4, max_stale_steps=stale)
        merges = 0
        for step in range(1, steps + 1):
            train_step(model, daso, rank, step)
            expect(all_agree(model, daso.local_group),
                   f"S = {stale}: the node's ranks agree after step {step}")
            if daso.merges > merges:
                merges = daso.merges
                if stale == 0:
                    expect(all_agree(model, None),
                           f"S = 0: every rank agrees after the global merge of step {step}")
        # Started every 4th step, each merged S steps after it started.
        expected = (steps - stale) // 4
        expect(merges == expected, f"S = {stale}: {expected} global merges, not {merges}")
        expect(daso.state_summary() == {"epoch": 0, "phase": "cycling", "global_skip": 4,
                                        "stale_steps": stale, "merges": merges},
               f"S = {stale}: the state summary: {daso.state_summary()}")
        expect(bool(torch.isfinite(flat(model)).all()), f"S = {stale}: finite parameters")


def check_dies(rank, steps):
    model = make_model()
    daso = gradsync.torch.DASO(model, torch.optim.SGD(model.parameters(), lr=0.05),
                               total_epochs=1, warmup_epochs=0, cooldown_epochs=0,
                               max_global_skip=2, max_stale_steps=1)
    last = time.monotonic()
    try:
        for step in range(1, steps + 1):
            if rank == 1 and step == 5:
                os._exit(1)  # dies, as a crashed process does
            train_step(model, daso, rank, step)
            last = time.monotonic()
    except RuntimeError as error:
        waited = time.monotonic() - last
        print(f"rank {rank}: failed after {waited:.1f} s: {error}", flush=True)
        return PEER_FAILED if waited < 10 else 1
    print(f"rank {rank}: trained on without rank 1", flush=True)
    return 1


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--init-file", required=True)
    parser.add_argument("--check", required=True, choices=["sync", "cycling", "dies"])
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    try:
        gradsync.torch._backend.load_extension()
    except ImportError as error:
        print(f"skipped: {error}", flush=True)
        return 77
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group("gradsync", init_method=f"file://{args.init_file}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    if args.check == "sync":
        check_sync(rank, args.steps)
    elif args.check == "cycling":
        check_cycling(rank, args.steps)
    else:
        return check_dies(rank, args.steps)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
