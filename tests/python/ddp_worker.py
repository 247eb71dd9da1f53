"""One rank of the DDP tests: trains the same model on the same data twice, with DDP over Gloo
and with DDP + the gradsync hook, and checks that both end equal, step by step.

Run by tests/python/run_ranks.py with RANK, WORLD_SIZE, GRADSYNC_* (or srun's variables) in the
environment: the rank and world size are the ones gradsync takes from it.
Exit status 0: equal; 1: not equal; 3: the expected exception (--raise-at) reached this rank;
77: --cuda where PyTorch sees no CUDA device, --shared-memory where the backend is not built.
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "client", "python"))
import gradsync  # noqa: E402
import gradsync.torch  # noqa: E402


class SmallCNN(nn.Module):
    def __init__(self, unused_branch=False):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc1 = nn.Linear(16 * 7 * 7, 64)
        self.fc2 = nn.Linear(64, 10)
        # Parameters that get no gradient: DDP must be told (find_unused_parameters=True).
        self.unused = nn.Linear(64, 64) if unused_branch else None

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.max_pool2d(x, 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


SKIPPED = 77  # run_ranks.py and ctest: this rank cannot run here


class IntentionalFailure(RuntimeError):
    """Raised by the rank that fails on purpose (--raise-at)."""


def batches(rank, steps, batch_size, device):
    """A synthetic, deterministic data set: each rank its own shard."""
    generator = torch.Generator().manual_seed(1234 + rank)
    for _ in range(steps):
        x = torch.randn(batch_size, 1, 28, 28, generator=generator)
        # Learnable labels: which of the first ten pixels is brightest.
        y = x.flatten(1)[:, :10].argmax(dim=1)
        yield x.to(device), y.to(device)


def train(args, rank, use_gradsync, comm, device):
    torch.manual_seed(42)
    model = SmallCNN(unused_branch=args.unused).to(device)
    ddp = DDP(model, device_ids=[device] if device.type == "cuda" else None,
              bucket_cap_mb=args.bucket_cap_mb, find_unused_parameters=args.unused,
              broadcast_buffers=False)
    if use_gradsync:
        hook = {"allreduce": gradsync.torch.allreduce_hook,
                "fp16": gradsync.torch.fp16_compress_hook,
                "bf16": gradsync.torch.bfloat16_compress_hook}[args.hook]
        ddp.register_comm_hook(gradsync.torch.GradsyncState(comm), hook)
    elif args.hook == "fp16":
        # The reference compresses the same way. (PyTorch's bf16 hook needs NCCL: the bf16
        # run is compared with full precision, within a bf16 tolerance.)
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    losses = []
    start = time.perf_counter()
    for step, (x, y) in enumerate(batches(rank, args.steps, args.batch_size, device)):
        if use_gradsync and step == args.raise_at and rank == args.raising_rank:
            raise IntentionalFailure(f"rank {rank} fails on purpose at step {step}")
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())  # on a GPU, waits for the step's work
    elapsed = time.perf_counter() - start
    params = [p.detach().clone() for p in model.parameters()]
    return params, losses, args.steps * args.batch_size / elapsed


def relative_error(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp(min=1e-12)).item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--bucket-cap-mb", type=float, default=25)
    parser.add_argument("--unused", action="store_true")
    parser.add_argument("--hook", default="allreduce", choices=["allreduce", "fp16", "bf16"])
    parser.add_argument("--tolerance", type=float, default=1e-5)
    parser.add_argument("--raise-at", type=int, default=-1)
    parser.add_argument("--raising-rank", type=int, default=1)
    parser.add_argument("--init-file", required=True)
    # Float64 training: the comparison with Gloo then measures the communication, not how one
    # rounding difference in float32 grows once a max-pool tie flips.
    parser.add_argument("--double", action="store_true")
    # The model, data and gradients on a GPU (each rank on device LOCAL_RANK mod the count): the
    # hook hands the daemon CUDA buckets through IPC; Gloo's reference copies them to the host.
    parser.add_argument("--cuda", action="store_true")
    # Every tensor in gradsync's shared memory (gradsync.torch.use_shared_memory): the hook
    # reduces DDP's buckets where they lie, staging none.
    parser.add_argument("--shared-memory", action="store_true")
    args = parser.parse_args()

    comm = gradsync.init()
    if args.shared_memory:
        # After init: the communicator already open attaches the heap as well.
        try:
            gradsync.torch.use_shared_memory(1)
        except ImportError as error:
            print(f"skipped: {error}", flush=True)
            return SKIPPED
    rank, world = comm.rank, comm.size
    device = torch.device("cpu")
    if args.cuda:
        if not torch.cuda.is_available():
            print(f"rank {rank}: skipped: this PyTorch sees no CUDA device", flush=True)
            return SKIPPED
        device = torch.device("cuda", comm.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        # The same kernels for both runs: the comparison measures the communication.
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    torch.set_num_threads(1)
    if args.double:
        torch.set_default_dtype(torch.float64)
    dist.init_process_group("gloo", init_method=f"file://{args.init_file}", rank=rank,
                            world_size=world)
    if args.raise_at < 0:
        gloo_params, gloo_losses, gloo_rate = train(args, rank, False, comm, device)
    try:
        params, losses, rate = train(args, rank, True, comm, device)
    except IntentionalFailure:
        raise
    except Exception as error:  # gradsync's error, possibly wrapped by autograd
        if args.raise_at < 0:
            raise
        print(f"rank {rank}: {type(error).__name__}: {error}", flush=True)
        return 3
    if args.raise_at >= 0:
        print(f"rank {rank}: finished although rank {args.raising_rank} failed", flush=True)
        return 1

    worst_param = max(relative_error(p, q) for p, q in zip(params, gloo_params))
    worst_loss = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, gloo_losses))
    print(f"rank {rank}: losses {losses[0]:.4f} -> {losses[-1]:.4f}; max relative difference "
          f"from Gloo: parameters {worst_param:.2e}, loss {worst_loss:.2e}; "
          f"{rate:.0f} samples/s (Gloo {gloo_rate:.0f})", flush=True)
    ok = worst_param <= args.tolerance and worst_loss <= args.tolerance
    if args.shared_memory:
        # The package's own call on a tensor in shared memory runs in place too.
        tensor = torch.full((1 << 16,), float(rank + 1))
        gradsync.allreduce(tensor, name="package_call", op="sum")
        expected = world * (world + 1) / 2
        if not gradsync.torch.in_shared_memory(tensor) or not bool((tensor == expected).all()):
            print(f"rank {rank}: gradsync.allreduce in shared memory: {tensor[:4].tolist()}, "
                  f"expected {expected}", flush=True)
            ok = False
    if args.shared_memory and comm._staging_all:
        print(f"rank {rank}: the hook or the package's call staged through "
              f"{len(comm._staging_all)} buffers; the tensors are all in shared memory",
              flush=True)
        ok = False
    gradsync.shutdown()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
