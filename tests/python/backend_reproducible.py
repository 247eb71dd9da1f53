"""GRADSYNC_ALGO=direct through the backend (decision 0029): float32 sums whose bits depend on
the order of their additions (inputs of every magnitude from 2^-20 to 2^20), reduced whole,
cut in two and reduced one part after the other, and cut in three issued together (which the
daemons may fuse), each compared to the bit with the nodes' sums added in node order, each
node's sum its ranks' inputs added in local rank order."""
import os

import torch
import torch.distributed as dist

COUNT = 300007


def inputs_of(rank):
    generator = torch.Generator().manual_seed(1000 + rank)
    mantissa = torch.rand(COUNT, generator=generator) * 2 - 1
    exponent = torch.randint(-20, 21, (COUNT,), generator=generator)
    return torch.ldexp(mantissa, exponent.to(torch.float32)).to(torch.float32)


def node_order_sum(world, per_node):
    total = None
    for first in range(0, world, per_node):
        node = inputs_of(first)
        for local in range(1, per_node):
            node = node + inputs_of(first + local)
        total = node if total is None else total + node
    return total


def check_reproducible(expect):
    expect(os.environ.get("GRADSYNC_ALGO") == "direct", "run with GRADSYNC_ALGO=direct")
    rank, world = dist.get_rank(), dist.get_world_size()
    per_node = int(os.environ["LOCAL_WORLD_SIZE"])
    expected = node_order_sum(world, per_node)
    mine = inputs_of(rank)

    whole = mine.clone()
    dist.all_reduce(whole)
    cut = mine.clone()
    for part in (cut[:100003], cut[100003:]):
        dist.all_reduce(part)
    together = mine.clone()
    works = [dist.all_reduce(part, async_op=True)
             for part in (together[:7], together[7:150001], together[150001:])]
    for work in works:
        work.wait()
    for how, result in (("whole", whole), ("cut in two", cut),
                        ("cut in three, together", together)):
        differing = int((result != expected).sum())
        print(f"rank {rank}: {how}: {differing} of {COUNT} not the node-order sum", flush=True)
        expect(differing == 0, f"{how}: the node-order sum to the bit ({differing} differ)")
    return 0
