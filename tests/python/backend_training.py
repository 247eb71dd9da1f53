"""Training through the "gradsync" default group with no hook (DDP's own allreduce, then
ZeroRedundancyOptimizer's broadcasts), each run compared with the same run over a Gloo group of
the same ranks. Float64, so that the comparison measures the communication."""
import time

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_worker import SmallCNN, batches, relative_error

TOLERANCE = 1e-6


def train(group, steps, zero, device):
    rank = dist.get_rank()
    torch.manual_seed(42)
    model = SmallCNN().to(device)
    device_ids = [device.index] if device.type == "cuda" else None
    ddp = DDP(model, device_ids=device_ids, process_group=group, broadcast_buffers=False)
    if zero:
        optimizer = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.SGD,
                                            process_group=group, lr=0.05, momentum=0.9)
    else:
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    staged = group_staged_bytes(group)
    start = time.perf_counter()
    for x, y in batches(rank, steps, 16, device):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        optimizer.step()
    elapsed = (time.perf_counter() - start) / steps
    if staged is not None:
        staged = group_staged_bytes(group) - staged
    return [p.detach().clone() for p in model.parameters()], elapsed, staged


def group_staged_bytes(group):
    """The bytes a gradsync process group staged so far; None for another backend's."""
    if group is None or group == dist.group.WORLD:
        group = dist.distributed_c10d._get_default_group()
    return getattr(group, "staged_bytes", None)


def check_training(steps, expect, device, in_shared_memory=False):
    """On `device` (the host, or a GPU: there Gloo's run is on the GPU too). With
    `in_shared_memory` (every tensor allocated in gradsync's shared memory), DDP's steps stage
    nothing through gradsync: its buckets are reduced where they lie."""
    torch.set_default_dtype(torch.float64)
    torch.backends.cudnn.deterministic = True
    gloo = dist.new_group(backend="gloo")
    rank = dist.get_rank()
    for zero in (False, True):
        name = "ZeroRedundancyOptimizer" if zero else "DDP"
        ours, our_step, staged = train(dist.group.WORLD, steps, zero, device)
        if in_shared_memory and not zero:
            expect(staged == 0, f"DDP's steps staged {staged} bytes; their buckets are in "
                   "shared memory")
        theirs, their_step, _ = train(gloo, steps, zero, device)
        worst = max(relative_error(p, q) for p, q in zip(ours, theirs))
        print(f"rank {rank}: {name} over gradsync vs Gloo after {steps} steps: max relative "
              f"difference {worst:.1e}; {our_step * 1e3:.1f} ms a step (Gloo "
              f"{their_step * 1e3:.1f})", flush=True)
        expect(worst <= TOLERANCE, f"{name} parameters within {TOLERANCE} of Gloo's ({worst:.1e})")
    return 0
