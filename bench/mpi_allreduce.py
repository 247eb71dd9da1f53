#!/usr/bin/python3
"""Open MPI's MPI_Allreduce (or, with -c broadcast, MPI_Bcast from rank 0) measured the way
gradsync-bench measures: per-iteration time of the slowest rank, median over iterations,
nccl-tests' algbw/busbw. Run under mpirun:

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
            f"# Open MPI {args.c}, {ranks} ranks, float, sum, {args.n} iterations")
    broadcast = args.c == "broadcast"
    expected = 1 if broadcast else ranks * (ranks + 1) / 2  # rank 0's value, or the sum
    for count in peer_common.counts(args):
        send = np.full(count, rank + 1, dtype=np.float32)
        recv = send if broadcast else np.empty(count, dtype=np.float32)

        def collective():
            if broadcast:
                comm.Bcast(send, root=0)
            else:
                comm.Allreduce(send, recv, op=MPI.SUM)
        for _ in range(args.w):
            collective()
        comm.Barrier()
        times = []
        for _ in range(args.n):
            send.fill(rank + 1)  # a broadcast's result must come from the root again
            start = time.perf_counter()
            collective()
            times.append((time.perf_counter() - start) * 1e6)
        slowest = np.array(times)
        comm.Allreduce(MPI.IN_PLACE, slowest, op=MPI.MAX)
        wrong = int(comm.allreduce(int(np.count_nonzero(recv != expected)), op=MPI.SUM))
        rows.append(peer_common.row(count, slowest.tolist(), ranks, wrong, args.c))
        if rank == 0:
            peer_common.print_row(rows[-1])
    if rank == 0 and args.json:
        peer_common.write_json(args.json, "openmpi", ranks, rows)
    return 0 if all(r["wrong"] == 0 for r in rows) else 2


if __name__ == "__main__":
    sys.exit(main())
