#!/usr/bin/python3
"""Classification by a small convolutional network on several nodes, synchronised by DDP or by
DASO (gradsync.torch.DASO), over the backend "gradsync".

    torchrun --nnodes 2 --nproc_per_node 2 ... examples/train_daso.py --sync daso
    torchrun --nnodes 2 --nproc_per_node 2 ... examples/train_daso.py --sync ddp

The data set is train_ddp.py's: synthetic and deterministic, each sample labelled by which of
ten smooth patterns it correlates with most; each rank trains on a shard of its own and every
rank evaluates the same held-out set. After every epoch rank 0 prints its held-out accuracy and
the training time so far (evaluation left out); at the end, the wall time and, given the node
daemon's metrics address (--metrics HOST:PORT), the bytes this node sent to the other nodes.
--backend gloo runs DDP over Gloo instead (the peer bench/daso measures against); --json PATH
writes rank 0's figures there.
"""
import argparse
import json
import logging
import os
import re
import sys
import time
import urllib.request

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "client",
                                "python"))
import gradsync.torch  # noqa: E402
from train_ddp import Net, batches  # noqa: E402


def sent_across_nodes(metrics):
    """What this node's daemon has sent to other node daemons so far, in bytes (0: unknown)."""
    if not metrics:
        return 0
    text = urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10).read().decode()
    return sum(float(value) for value in
               re.findall(r"^gradsync_peer_sent_bytes_total\{[^}]*\} (\S+)$", text, re.M))


def accuracy(model):
    """On a held-out set, the same on every rank (a seed no training rank uses)."""
    with torch.no_grad():
        correct = total = 0
        for x, y in batches(rank=10_000, batch_size=256, steps=4):
            correct += (model(x).argmax(dim=1) == y).sum().item()
            total += len(y)
    return correct / total


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sync", choices=["ddp", "daso"], default="daso")
    parser.add_argument("--backend", choices=["gradsync", "gloo"], default="gradsync")
    parser.add_argument("--json", default="", help="rank 0 writes its figures to this file")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--steps-per-epoch", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-global-skip", type=int, default=8)
    parser.add_argument("--warmup-epochs", type=int, default=2)
    parser.add_argument("--cooldown-epochs", type=int, default=2)
    parser.add_argument("--metrics", default="", help="this node's daemon's metrics HOST:PORT")
    args = parser.parse_args()

    if args.backend == "gloo" and args.sync == "daso":
        parser.error("DASO runs over the gradsync backend")
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")  # DASO's decisions
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    net = Net()
    if args.sync == "ddp":
        model = DDP(net, broadcast_buffers=False)
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    else:
        model = net
        optimizer = gradsync.torch.DASO(
            net, torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9),
            total_epochs=args.epochs, warmup_epochs=args.warmup_epochs,
            cooldown_epochs=args.cooldown_epochs, max_global_skip=args.max_global_skip)
    # The learning rate falls along a cosine to 0 over the run, as long runs' schedules do.
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(
        optimizer.optimizer if args.sync == "daso" else optimizer, T_max=args.epochs)
    sent_before = sent_across_nodes(args.metrics)
    start = time.perf_counter()
    evaluating = 0.0  # seconds spent on held-out accuracy, left out of the training time
    epochs = []
    data = batches(rank + 100 * args.seed, args.batch_size, args.epochs * args.steps_per_epoch)
    for epoch in range(args.epochs):
        total = 0.0
        for _ in range(args.steps_per_epoch):
            x, y = next(data)
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            total += loss.item()
        if args.sync == "daso":
            state = optimizer.state_summary()
            spacing = f"  {state['phase']}, B {state['global_skip']}, S {state['stale_steps']}"
            average = optimizer.epoch_end(total / args.steps_per_epoch)
        else:
            spacing, average = "", total / args.steps_per_epoch
        schedule.step()
        if rank == 0:
            evaluated = time.perf_counter()
            epochs.append({"epoch": epoch + 1, "loss": average, "accuracy": accuracy(net),
                           "seconds": evaluated - start - evaluating, "daso": spacing.strip(),
                           "sent_bytes": sent_across_nodes(args.metrics) - sent_before})
            evaluating += time.perf_counter() - evaluated
            print(f"epoch {epoch + 1:3d}  loss {average:.4f}  accuracy "
                  f"{epochs[-1]['accuracy']:.4f}  {epochs[-1]['seconds']:.1f} s{spacing}",
                  flush=True)
    if args.sync == "daso":
        optimizer.finish()
    dist.barrier()
    seconds = time.perf_counter() - start - evaluating
    steps = args.epochs * args.steps_per_epoch
    sent = sent_across_nodes(args.metrics) - sent_before
    if rank == 0:
        final = accuracy(net)
        print(f"{args.sync}: accuracy {final:.4f}, {seconds:.2f} s, "
              f"{sent / steps:.0f} bytes a step sent to other nodes from this node, "
              f"{world} ranks", flush=True)
        if args.json:
            with open(args.json, "w") as out:
                json.dump({"sync": args.sync, "backend": args.backend, "seed": args.seed,
                           "ranks": world, "steps": steps, "accuracy": final,
                           "seconds": seconds, "epochs": epochs}, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
