#!/usr/bin/python3
"""PyTorch's Gloo allreduce measured the way gradsync-bench measures: per-iteration time of the
slowest rank, median over iterations, nccl-tests' algbw/busbw. One process per rank, identity
from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (torch.distributed's env:// rendezvous):

    RANK=0 WORLD_SIZE=2 MASTER_ADDR=198.18.0.1 MASTER_PORT=29500 \\
        /usr/bin/python3 bench/gloo_allreduce.py -b 8 -e 64M -f 4 -n 20 -w 5 --json out.json
"""
import argparse
import json
import statistics
import sys
import time

import torch
import torch.distributed as dist


def size(text):
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * scale[text[-1]] if text[-1] in scale else int(text)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("-b", type=size, default=8)
    parser.add_argument("-e", type=size, default=64 << 20)
    parser.add_argument("-f", type=int, default=2)
    parser.add_argument("-n", type=int, default=20)
    parser.add_argument("-w", type=int, default=5)
    parser.add_argument("--json")
    args = parser.parse_args()
    dist.init_process_group("gloo", init_method="env://")
    rank, ranks = dist.get_rank(), dist.get_world_size()
    rows = []
    if rank == 0:
        print(f"# PyTorch {torch.__version__} Gloo allreduce, {ranks} ranks, float, sum, "
              f"{args.n} iterations")
        print(f"# {'size':>10} {'count':>12} {'time':>10} {'algbw':>8} {'busbw':>8} {'#wrong':>7}")
    nbytes = args.b
    while nbytes <= args.e:
        count = max(1, nbytes // 4)
        data = torch.empty(count, dtype=torch.float32)
        for _ in range(args.w):
            data.fill_(rank + 1)
            dist.all_reduce(data)
        dist.barrier()
        times = []
        for _ in range(args.n):
            data.fill_(rank + 1)
            start = time.perf_counter()
            dist.all_reduce(data)
            times.append((time.perf_counter() - start) * 1e6)
        slowest = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        expected = ranks * (ranks + 1) / 2
        wrong = torch.tensor([int(torch.count_nonzero(data != expected))])
        dist.all_reduce(wrong)
        median = statistics.median(slowest.tolist())
        algbw = count * 4 / median / 1e3
        busbw = algbw * 2 * (ranks - 1) / ranks
        rows.append({"bytes": count * 4, "count": count, "time_us": median,
                     "algbw_gbps": algbw, "busbw_gbps": busbw, "wrong": int(wrong)})
        if rank == 0:
            print(f"  {count * 4:>10} {count:>12} {median:>10.2f} {algbw:>8.2f} {busbw:>8.2f} "
                  f"{int(wrong):>7}")
            sys.stdout.flush()
        nbytes *= args.f
    if rank == 0 and args.json:
        with open(args.json, "w") as out:
            json.dump({"system": "gloo", "ranks": ranks, "rows": rows}, out, indent=2)
    dist.destroy_process_group()
    return 0 if all(r["wrong"] == 0 for r in rows) else 2


if __name__ == "__main__":
    sys.exit(main())
