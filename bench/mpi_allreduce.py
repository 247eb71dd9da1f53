#!/usr/bin/python3
"""Open MPI's MPI_Allreduce measured the way gradsync-bench measures: per-iteration time of the
slowest rank, median over iterations, nccl-tests' algbw/busbw. Run under mpirun:

    mpirun -np 2 /usr/bin/python3 bench/mpi_allreduce.py -b 8 -e 64M -f 4 -n 20 -w 5 --json out.json
"""
import argparse
import json
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI


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
    comm = MPI.COMM_WORLD
    rank, ranks = comm.Get_rank(), comm.Get_size()
    rows = []
    if rank == 0:
        print(f"# Open MPI MPI_Allreduce, {ranks} ranks, float, sum, {args.n} iterations")
        print(f"# {'size':>10} {'count':>12} {'time':>10} {'algbw':>8} {'busbw':>8} {'#wrong':>7}")
    nbytes = args.b
    while nbytes <= args.e:
        count = max(1, nbytes // 4)
        send = np.full(count, rank + 1, dtype=np.float32)
        recv = np.empty(count, dtype=np.float32)
        for _ in range(args.w):
            comm.Allreduce(send, recv, op=MPI.SUM)
        comm.Barrier()
        times = []
        for _ in range(args.n):
            start = time.perf_counter()
            comm.Allreduce(send, recv, op=MPI.SUM)
            times.append((time.perf_counter() - start) * 1e6)
        slowest = np.array(times)
        comm.Allreduce(MPI.IN_PLACE, slowest, op=MPI.MAX)
        expected = ranks * (ranks + 1) / 2
        wrong = int(comm.allreduce(int(np.count_nonzero(recv != expected)), op=MPI.SUM))
        median = statistics.median(slowest.tolist())
        algbw = count * 4 / median / 1e3
        busbw = algbw * 2 * (ranks - 1) / ranks
        rows.append({"bytes": count * 4, "count": count, "time_us": median,
                     "algbw_gbps": algbw, "busbw_gbps": busbw, "wrong": wrong})
        if rank == 0:
            print(f"  {count * 4:>10} {count:>12} {median:>10.2f} {algbw:>8.2f} {busbw:>8.2f} {wrong:>7}")
            sys.stdout.flush()
        nbytes *= args.f
    if rank == 0 and args.json:
        with open(args.json, "w") as out:
            json.dump({"system": "openmpi", "ranks": ranks, "rows": rows}, out, indent=2)
    return 0 if all(r["wrong"] == 0 for r in rows) else 2


if __name__ == "__main__":
    sys.exit(main())
