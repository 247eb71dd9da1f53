#!/usr/bin/python3
"""Elastic DDP training over gradsync: survives its workers' restarts by resuming from the last
checkpoint, as torchrun's elastic launch expects.

    python3 -m gradsync.run --nnodes 1:2 --nproc_per_node 2 --max_restarts 3 \\
        --rdzv_backend gradsync --rdzv_endpoint HOST:PORT --rdzv_id JOB \\
        examples/train_elastic.py --checkpoint /shared/ckpt.pt --steps 200

(gradsync.run is torchrun with a rendezvous that lets the survivors of a lost node re-form in
seconds rather than 15 s: docs/python.md, "Elastic training". Plain torchrun works too.)

When a worker fails (or a node is lost: every other rank's gradsync call then fails within the
peer timeout), torchrun stops the workers, re-forms the group, possibly with another world size,
and starts them again. Each start loads the checkpoint, if there is one, and goes on from its
step: the process group is a new gradsync job, formed on whatever nodes are there.

The pattern, in torch.distributed.elastic's conventions:
  - every start calls init_process_group, loads the latest checkpoint and trains from its step;
  - rank 0 writes the checkpoint (model, optimizer, step) to a temporary file and renames it
    into place, so a failure while writing leaves the previous one whole;
  - the data of step s depends on s and the rank alone, so a resumed run sees what it would
    have seen.
To try it out: --crash-at S makes rank 1 fail at step S in the first run only
(TORCHELASTIC_RESTART_COUNT 0), and --step-seconds slows each step down, so that there is time
to stop a node by hand. At the end rank 0 prints a digest of the parameters.
"""
import time

LAUNCHED = time.monotonic()  # before PyTorch's import: a restart's cost includes it

import argparse  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "client",
                                "python"))
import gradsync.torch  # noqa: E402,F401  (registers the "gradsync" backend)


def batch(rank, step, batch_size):
    """Rank `rank`'s batch of step `step`: the same whenever it is asked for."""
    generator = torch.Generator().manual_seed(1_000_003 * step + rank)
    x = torch.randn(batch_size, 32, generator=generator)
    return x, (x[:, :8].sum(dim=1) > 0).long()


def load(path, model, optimizer):
    """The step to go on from: the checkpoint's, or 0 without one."""
    if not os.path.exists(path):
        return 0
    state = torch.load(path)
    model.module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return state["step"]


def save(path, model, optimizer, step):
    temporary = f"{path}.{os.getpid()}.tmp"
    torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                "step": step}, temporary)
    os.replace(temporary, path)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--crash-at", type=int, default=0)
    parser.add_argument("--step-seconds", type=float, default=0)
    args = parser.parse_args()

    imported = time.monotonic()
    dist.init_process_group("gradsync")  # a new gradsync job on every start
    formed = time.monotonic()
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 2)),
                broadcast_buffers=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    start = load(args.checkpoint, model, optimizer)
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if os.environ.get("LOCAL_RANK", "0") == "0":  # one line a node
        print(f"start {restarts}: rank {rank} of {dist.get_world_size()}, from step {start} "
              f"(imports {imported - LAUNCHED:.2f} s, process group {formed - imported:.2f} s, "
              f"model and checkpoint {time.monotonic() - formed:.2f} s)", flush=True)

    for step in range(start + 1, args.steps + 1):
        if step == args.crash_at and rank == 1 and restarts == 0:
            raise SystemExit(f"rank 1 fails at step {step}, as asked (--crash-at)")
        x, y = batch(rank, step, args.batch_size)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        time.sleep(args.step_seconds)
        if step % args.checkpoint_every == 0:
            if rank == 0:
                save(args.checkpoint, model, optimizer, step)
            dist.barrier()  # nobody goes on before the checkpoint is whole

    if rank == 0:
        digest = sum(float(p.double().sum()) for p in model.parameters())
        print(f"done: {args.steps} steps, parameter digest {digest!r}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
