#!/usr/bin/python3
"""Open MPI's MPI_Allreduce measured the way gradsync-bench measures: per-iteration time of the
slowest rank, median over iterations, nccl-tests' algbw/busbw. Run under mpirun:

    mpirun -np 2 /usr/bin/python3 bench/mpi_allreduce.py -b 8 -e 64M -f 4 -n 20 -w 5 --json out.json
"""
import sys
import time

import numpy as np
from mpi4py import MPI

import peer_common


def main():
    args = peer_common.parse_args()
    comm = MPI.COMM_WORLD
    rank, ranks = comm.Get_rank(), comm.Get_size()
    rows = []
    if rank == 0:
        peer_common.print_header(
            f"# Open MPI MPI_Allreduce, {ranks} ranks, float, sum, {args.n} iterations")
    for count in peer_common.counts(args):
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
        rows.append(peer_common.row(count, slowest.tolist(), ranks, wrong))
        if rank == 0:
            peer_common.print_row(rows[-1])
    if rank == 0 and args.json:
        peer_common.write_json(args.json, "openmpi", ranks, rows)
    return 0 if all(r["wrong"] == 0 for r in rows) else 2


if __name__ == "__main__":
    sys.exit(main())
