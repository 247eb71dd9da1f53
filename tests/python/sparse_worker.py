"""One rank of the top-k codec's DDP test: trains a small classifier with DDP and the gradsync
hook, the job's f32 allreduces across nodes through the top-k codec (--topk-percent), and checks
what sparse training must keep: every rank's model the same to the bit after every step (the
codec's choice and result are the same everywhere), and the loss going down (what a chunk
does not send now, it sends later).

Run by tests/python/run_ranks.py with --nodes 2. Exit status 0: both held.
"""
import argparse
import math
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "client", "python"))
import gradsync  # noqa: E402
import gradsync.torch  # noqa: E402


def model():
    torch.manual_seed(42)
    return nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 64), nn.ReLU(), nn.Linear(64, 10))


def batches(rank, steps, batch_size):
    """Each rank its own shard of a task the model can learn in a few dozen steps: the label
    is which of ten fixed directions the image leans to most."""
    directions = torch.randn(28 * 28, 10, generator=torch.Generator().manual_seed(7))
    generator = torch.Generator().manual_seed(1234 + rank)
    for _ in range(steps):
        x = torch.randn(batch_size, 1, 28, 28, generator=generator)
        yield x, (x.flatten(1) @ directions).argmax(dim=1)


def same_on_every_rank(net, world):
    """Whether every rank holds the same parameters, to the bit (gathered over Gloo)."""
    flat = torch.cat([p.detach().flatten() for p in net.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    return all(torch.equal(g, gathered[0]) for g in gathered)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--bucket-cap-mb", type=float, default=0.1)
    parser.add_argument("--topk-percent", type=float, default=25)
    parser.add_argument("--init-file", required=True)
    args = parser.parse_args()

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{args.init_file}", rank=rank,
                            world_size=world)
    codec = f"topk:{args.topk_percent:g}"
    comm = gradsync.init(wire_codec=codec)
    net = model()
    ddp = DDP(net, bucket_cap_mb=args.bucket_cap_mb, broadcast_buffers=False)
    ddp.register_comm_hook(gradsync.torch.GradsyncState(comm), gradsync.torch.allreduce_hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for step, (x, y) in enumerate(batches(rank, args.steps, args.batch_size)):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if not same_on_every_rank(net, world):
            print(f"rank {rank}: the ranks' parameters differ after step {step}", flush=True)
            return 1
    # The codec is on: of a tensor of 8 chunks (of 8192 floats), each larger than the one
    # before, the result holds the sum of the last ceil(8 * percent / 100), zeros before them.
    chunk = 8192
    probe = (torch.arange(8, dtype=torch.float32) + 1).repeat_interleave(chunk)
    expected = probe * world
    expected[: (8 - math.ceil(8 * args.topk_percent / 100)) * chunk] = 0
    gradsync.allreduce(probe, name="probe")
    if not torch.equal(probe, expected):
        print(f"rank {rank}: {codec}: the probe's result is not its top chunks' sum", flush=True)
        return 1
    quarter = max(1, args.steps // 4)
    first = sum(losses[:quarter]) / quarter
    last = sum(losses[-quarter:]) / quarter
    print(f"rank {rank}: {codec}: loss {first:.4f} -> {last:.4f} (first and last "
          f"quarter of {args.steps} steps); parameters the same on every rank", flush=True)
    gradsync.shutdown()
    dist.destroy_process_group()
    return 0 if last < 0.95 * first else 1


if __name__ == "__main__":
    sys.exit(main())
