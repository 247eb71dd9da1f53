#!/usr/bin/python3
"""PyTorch's Gloo allreduce (or, with -c broadcast, broadcast from rank 0; with -c allgather,
all_gather of each rank's block into a list of tensors; with -c alltoall, all_to_all_single;
PyTorch 1.13's Gloo has no reduce-scatter) measured the way gradsync-bench
measures: per-iteration time of the slowest rank, median over iterations, nccl-tests'
algbw/busbw. One process per rank, identity from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
(torch.distributed's env:// rendezvous):

    RANK=0 WORLD_SIZE=2 MASTER_ADDR=198.18.0.1 MASTER_PORT=29500 \\
        /usr/bin/python3 bench/gloo_allreduce.py -b 8 -e 64M -f 4 -n 20 -w 5 --json out.json
"""
import sys
import time

import torch
import torch.distributed as dist

import peer_common


def prepare(kind, count, rank, ranks):
    """For one size: the collective to time (a function of no arguments), a reset of its input
    before each run, and the count of its result's elements that are wrong."""
    if kind == "allgather":
        # PyTorch 1.13's Gloo has no all_gather into one tensor: a list, as DDP users call it.
        block = torch.empty(count // ranks, dtype=torch.float32)
        outputs = [torch.empty_like(block) for _ in range(ranks)]
        return (lambda: dist.all_gather(outputs, block), lambda: block.fill_(rank + 1),
                lambda: sum(int(torch.count_nonzero(out != r + 1)) for r, out in enumerate(outputs)))
    if kind == "alltoall":
        data = torch.empty(count, dtype=torch.float32)
        out = torch.empty_like(data)
        expected = torch.arange(1, ranks + 1, dtype=torch.float32).repeat_interleave(count // ranks)
        return (lambda: dist.all_to_all_single(out, data), lambda: data.fill_(rank + 1),
                lambda: int(torch.count_nonzero(out != expected)))
    if kind == "reduce_scatter":
        raise SystemExit("gloo_allreduce.py: this PyTorch's Gloo has no reduce-scatter")
    data = torch.empty(count, dtype=torch.float32)
    if kind == "broadcast":
        run, expected = (lambda: dist.broadcast(data, src=0)), 1  # rank 0's value
    else:
        run, expected = (lambda: dist.all_reduce(data)), ranks * (ranks + 1) / 2
    return run, lambda: data.fill_(rank + 1), lambda: int(torch.count_nonzero(data != expected))


def main():
    args = peer_common.parse_args()
    dist.init_process_group("gloo", init_method="env://")
    rank, ranks = dist.get_rank(), dist.get_world_size()
    rows = []
    if rank == 0:
        peer_common.print_header(f"# PyTorch {torch.__version__} Gloo {args.c}, {ranks} ranks, "
                                 f"float, {'sum, ' if args.c == 'allreduce' else ''}{args.n} iterations")
    for count in peer_common.counts(args, ranks):
        collective, reset, count_wrong = prepare(args.c, count, rank, ranks)
        for _ in range(args.w):
            reset()
            collective()
        dist.barrier()
        times = []
        for _ in range(args.n):
            reset()
            start = time.perf_counter()
            collective()
            times.append((time.perf_counter() - start) * 1e6)
        slowest = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        wrong = torch.tensor([count_wrong()])
        dist.all_reduce(wrong)
        rows.append(peer_common.row(count, slowest.tolist(), ranks, int(wrong), args.c))
        if rank == 0:
            peer_common.print_row(rows[-1])
    if rank == 0 and args.json:
        peer_common.write_json(args.json, "gloo", ranks, rows)
    dist.destroy_process_group()
    return 0 if all(r["wrong"] == 0 for r in rows) else 2


if __name__ == "__main__":
    sys.exit(main())
