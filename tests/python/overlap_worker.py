"""One rank of the forward-overlap test (docs/priority.md): trains one model with
gradsync.torch.overlap_forward and a copy of it with each gradient averaged through gradsync
before a plain optimizer step, on this rank's own data, and checks that every step's loss and
the final parameters are the same. Then, through the torch.distributed backend, a collective
inside gradsync.torch.priority and DDP with allreduce_hook given no state (the default group,
each bucket at its index's priority), against the same synchronous average.

Run by tests/python/run_ranks.py (--worker overlap_worker.py). Exit status 0: equal."""
import argparse
import copy
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "client", "python"))
import gradsync  # noqa: E402
import gradsync.torch  # noqa: E402


def model():
    torch.manual_seed(1)
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Flatten(), nn.Linear(8 * 8 * 8, 32), nn.ReLU(), nn.Linear(32, 4))


def batches(rank, steps):
    generator = torch.Generator().manual_seed(100 + rank)
    return [(torch.randn(16, 1, 8, 8, generator=generator),
             torch.randint(0, 4, (16,), generator=generator)) for _ in range(steps)]


def averaged_step(net, optimizer, average, x, y):
    """The reference: the loss, every gradient averaged over the ranks, then the step."""
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(net(x), y)
    loss.backward()
    for name, param in net.named_parameters():
        average(name, param.grad)
    optimizer.step()
    return loss.item()


def check(condition, what):
    if not condition:
        print(f"rank {os.environ.get('RANK')}: FAILED: {what}", flush=True)
        sys.exit(1)


def overlap(steps):
    comm = gradsync.init()
    overlapped, reference = model(), model()
    overlap_opt = gradsync.torch.overlap_forward(
        overlapped, torch.optim.SGD(overlapped.parameters(), lr=0.05, momentum=0.9))
    reference_opt = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
    for step, (x, y) in enumerate(batches(comm.rank, steps)):
        overlap_opt.zero_grad()
        loss = nn.functional.cross_entropy(overlapped(x), y)
        loss.backward()
        overlap_opt.step()
        expected = averaged_step(
            reference, reference_opt,
            lambda name, grad: comm.allreduce(grad, name=f"reference.{name}", op="avg"), x, y)
        check(loss.item() == expected, f"step {step}: loss {loss.item()} with overlap, "
              f"{expected} without")
    overlap_opt.synchronize()
    for (name, a), (_, b) in zip(overlapped.named_parameters(), reference.named_parameters()):
        check(torch.equal(a, b), f"parameter {name} differs after {steps} steps")
    print(f"rank {comm.rank}: overlap_forward matched the synchronous average over {steps} "
          "steps", flush=True)

    # Two backwards in one step would average a gradient twice: refused, naming the cause.
    net = model()
    opt = gradsync.torch.overlap_forward(net, torch.optim.SGD(net.parameters(), lr=0.05),
                                         comm=comm)
    x, y = batches(comm.rank, 1)[0]
    nn.functional.cross_entropy(net(x), y).backward()
    try:
        nn.functional.cross_entropy(net(x), y).backward()
        check(False, "a second backward in one step was not refused")
    except RuntimeError as error:
        check("second backward" in str(error), f"the refusal says why: {error}")
    opt.step()
    opt.synchronize()


def backend(init_file, steps, rank, size):
    # A job name of its own, agreed through the store: the name of the job that just ended
    # would be taken again across nodes at once.
    os.environ.pop("GRADSYNC_JOB", None)
    dist.init_process_group("gradsync", init_method=f"file://{init_file}", rank=rank,
                            world_size=size)
    group = dist.distributed_c10d._get_default_group()
    tensor = torch.full((1000,), float(rank + 1))
    with gradsync.torch.priority(3):
        check(group.priority == 3, "the group's priority inside gradsync.torch.priority")
        dist.all_reduce(tensor)
    check(group.priority == 0, "the group's priority restored after it")
    check(torch.all(tensor == size * (size + 1) / 2), "all_reduce at priority 3")

    net = model()
    reference = copy.deepcopy(net)
    ddp = DDP(net, bucket_cap_mb=0.01)  # several buckets, each at its own priority
    ddp.register_comm_hook(None, gradsync.torch.allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    reference_opt = torch.optim.SGD(reference.parameters(), lr=0.05)
    def average(_name, grad):
        dist.all_reduce(grad)
        grad.div_(size)
    for step, (x, y) in enumerate(batches(rank, steps)):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        expected = averaged_step(reference, reference_opt, average, x, y)
        check(abs(loss.item() - expected) <= 1e-6 * abs(expected),
              f"DDP step {step}: loss {loss.item()}, {expected} without DDP")
    for (name, a), (_, b) in zip(net.named_parameters(), reference.named_parameters()):
        check(torch.allclose(a, b, rtol=1e-5, atol=1e-7), f"DDP parameter {name} differs")
    print(f"rank {rank}: DDP with allreduce_hook(None) matched over {steps} steps",
          flush=True)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--init-file", required=True)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    overlap(args.steps)
    rank, size = gradsync.rank(), gradsync.size()
    gradsync.shutdown()  # the backend's default group is a job of the same name
    backend(args.init_file, args.steps, rank, size)


if __name__ == "__main__":
    main()
