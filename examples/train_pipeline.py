#!/usr/bin/python3
"""Pipeline parallelism (GPipe's schedule) with data parallelism beside it, over the backend
"gradsync": the model's layers are cut into --stages stages, consecutive ranks run one pipeline
(rank r is stage r % stages of replica r // stages), and each batch goes through it in
micro-batches. Activations travel forward and their gradients back with send, recv and isend;
then each stage averages its gradients with the same stage of the other replicas (a process
group per stage), and steps.

    torchrun --nproc_per_node 4 examples/train_pipeline.py                (with a gradsyncd)
    torchrun --nproc_per_node 4 examples/train_pipeline.py --check        (also trains the whole
                                                                            model in one process
                                                                            on every replica's
                                                                            data, and checks that
                                                                            each stage ends equal)
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "client",
                                "python"))
import gradsync.torch  # noqa: E402,F401  (registers the backend)
from train_ddp import Net, batches  # noqa: E402


def layers_of(net):
    return list(net.features) + list(net.classifier)


def stage_bounds(layer_count, stages):
    """[begin, end) of each stage's layers: contiguous, as even as they divide."""
    return [(layer_count * s // stages, layer_count * (s + 1) // stages) for s in range(stages)]


class Stage:
    """This rank's part of one pipeline: its layers, and the shapes of what it receives from
    the stage before it and sends to the stage after it (every rank builds the whole model from
    one seed, so every rank knows every boundary's shape)."""

    def __init__(self, stage, stages, micro_batch):
        torch.manual_seed(0)
        layers = layers_of(Net())
        begin, end = stage_bounds(len(layers), stages)[stage]
        shapes = [torch.Size([micro_batch, 1, 28, 28])]
        with torch.no_grad():
            x = torch.zeros(shapes[0])
            for layer in layers:
                x = layer(x)
                shapes.append(x.shape)
        self.module = nn.Sequential(*layers[begin:end])
        self.input_shape, self.output_shape = shapes[begin], shapes[end]
        self.first, self.last = stage == 0, stage == stages - 1


def train_pipeline(args):
    rank, world = dist.get_rank(), dist.get_world_size()
    stage_index, replica = rank % args.stages, rank // args.stages
    replicas = world // args.stages
    # Every rank creates every stage's group (new_group is collective); it uses its own.
    groups = [dist.new_group([r * args.stages + s for r in range(replicas)])
              for s in range(args.stages)]
    micro = args.batch_size // args.micro_batches
    stage = Stage(stage_index, args.stages, micro)
    params = list(stage.module.parameters())
    # A stage of layers without parameters (pooling, flattening) only passes values on.
    optimizer = torch.optim.SGD(params, lr=args.lr, momentum=0.9) if params else None
    before, after = rank - 1, rank + 1  # the neighbouring stages of this pipeline
    for step, (x, y) in enumerate(batches(replica, args.batch_size, args.steps), start=1):
        for p in params:
            p.grad = None
        inputs, outputs, sends, losses = [], [], [], []
        for m in range(args.micro_batches):  # forward, every micro-batch
            if stage.first:
                received = x[m * micro:(m + 1) * micro]
            else:
                received = torch.empty(stage.input_shape)
                dist.recv(received, src=before)
                received.requires_grad_()
            output = stage.module(received)
            inputs.append(received)
            outputs.append(output)
            if stage.last:
                target = y[m * micro:(m + 1) * micro]
                losses.append(nn.functional.cross_entropy(output, target) / args.micro_batches)
            else:
                sends.append(dist.isend(output.detach(), dst=after))
        for m in reversed(range(args.micro_batches)):  # backward, in reverse
            if stage.last:
                losses[m].backward()
            else:
                gradient = torch.empty(stage.output_shape)
                dist.recv(gradient, src=after)
                outputs[m].backward(gradient)
            if not stage.first:
                sends.append(dist.isend(inputs[m].grad, dst=before))
        for work in sends:
            work.wait()
        for p in params:  # the average over the replicas of this stage
            dist.all_reduce(p.grad, group=groups[stage_index])
            p.grad.div_(replicas)
        if optimizer is not None:
            optimizer.step()
        if stage.last and replica == 0 and (step % 10 == 0 or step == 1):
            print(f"step {step:4d}  loss {sum(l.item() for l in losses):.4f}", flush=True)
    return params


def train_whole(args, replicas):
    """The same training in one process: the whole model on every replica's batch at once."""
    torch.manual_seed(0)
    net = Net()
    optimizer = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9)
    streams = [batches(r, args.batch_size, args.steps) for r in range(replicas)]
    for parts in zip(*streams):
        optimizer.zero_grad()
        x = torch.cat([x for x, _ in parts])
        y = torch.cat([y for _, y in parts])
        nn.functional.cross_entropy(net(x), y).backward()
        optimizer.step()
    return net


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--check", action="store_true",
                        help="train the whole model in one process too (float64) and fail "
                             "unless each stage ends equal to its layers there")
    args = parser.parse_args()
    if args.check:
        torch.set_default_dtype(torch.float64)
    torch.set_num_threads(1)
    dist.init_process_group("gradsync")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world % args.stages or args.batch_size % args.micro_batches:
        raise SystemExit(f"{world} ranks do not cut into pipelines of {args.stages} stages, or "
                         f"a batch of {args.batch_size} into {args.micro_batches} micro-batches")
    params = train_pipeline(args)
    status = 0
    if args.check:
        layers = layers_of(train_whole(args, world // args.stages))
        begin, end = stage_bounds(len(layers), args.stages)[rank % args.stages]
        reference = list(nn.Sequential(*layers[begin:end]).parameters())
        worst = max(((a.detach() - b.detach()).abs().max() / b.detach().abs().max()).item()
                    for a, b in zip(params, reference)) if params else 0.0
        print(f"rank {rank}: stage {rank % args.stages} vs one process: max relative "
              f"difference {worst:.1e}", flush=True)
        status = 0 if len(params) == len(reference) and worst <= 1e-6 else 1
    dist.destroy_process_group()
    sys.exit(status)


if __name__ == "__main__":
    main()
