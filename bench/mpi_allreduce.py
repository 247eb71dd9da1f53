#!/usr/bin/python3
"""Open MPI's MPI_Allreduce (or, with -c broadcast, MPI_Bcast from rank 0; with -c allgather,
MPI_Allgather; with -c reduce_scatter, MPI_Reduce_scatter_block; with -c alltoall,
MPI_Alltoall) measured the way gradsync-bench measures: per-iteration time of the slowest
rank, median over iterations, nccl-tests' algbw/busbw. Run under mpirun:

    mpirun -np 2 /usr/bin/python3 bench/mpi_allreduce.py -b 8 -e 64M -f 4 -n 20 -w 5 --json out.json
"""
import sys
import time

import numpy as np
from mpi4py import MPI

import peer_common


def prepare(comm, kind, count, rank, ranks):
    """For one size: the collective to time, the buffer to reset before each run (a
    broadcast's result must come from the root again), and the count of its result's
    elements that are wrong."""
    if kind == "allgather":
        send = np.empty(count // ranks, dtype=np.float32)
        recv = np.empty(count, dtype=np.float32)
        expected = np.repeat(np.arange(1, ranks + 1, dtype=np.float32), count // ranks)
        return (lambda: comm.Allgather(send, recv), send,
                lambda: int(np.count_nonzero(recv != expected)))
    if kind == "reduce_scatter":
        send = np.empty(count, dtype=np.float32)
        recv = np.empty(count // ranks, dtype=np.float32)
        return (lambda: comm.Reduce_scatter_block(send, recv, op=MPI.SUM), send,
                lambda: int(np.count_nonzero(recv != ranks * (ranks + 1) / 2)))
    if kind == "alltoall":
        send = np.empty(count, dtype=np.float32)
        recv = np.empty(count, dtype=np.float32)
        expected = np.repeat(np.arange(1, ranks + 1, dtype=np.float32), count // ranks)
        return (lambda: comm.Alltoall(send, recv), send,
                lambda: int(np.count_nonzero(recv != expected)))
    send = np.empty(count, dtype=np.float32)
    if kind == "broadcast":
        return (lambda: comm.Bcast(send, root=0), send,
                lambda: int(np.count_nonzero(send != 1)))  # rank 0's value
    recv = np.empty(count, dtype=np.float32)
    return (lambda: comm.Allreduce(send, recv, op=MPI.SUM), send,
            lambda: int(np.count_nonzero(recv != ranks * (ranks + 1) / 2)))


def main():
    args = peer_common.parse_args()
    comm = MPI.COMM_WORLD
    rank, ranks = comm.Get_rank(), comm.Get_size()
    rows = []
    if rank == 0:
        peer_common.print_header(
            f"# Open MPI {args.c}, {ranks} ranks, float, "
            f"{'sum, ' if args.c in ('allreduce', 'reduce_scatter') else ''}{args.n} iterations")
    for count in peer_common.counts(args, ranks):
        collective, input_, count_wrong = prepare(comm, args.c, count, rank, ranks)
        for _ in range(args.w):
            input_.fill(rank + 1)
            collective()
        comm.Barrier()
        times = []
        for _ in range(args.n):
            input_.fill(rank + 1)
            start = time.perf_counter()
            collective()
            times.append((time.perf_counter() - start) * 1e6)
        slowest = np.array(times)
        comm.Allreduce(MPI.IN_PLACE, slowest, op=MPI.MAX)
        wrong = int(comm.allreduce(count_wrong(), op=MPI.SUM))
        rows.append(peer_common.row(count, slowest.tolist(), ranks, wrong, args.c))
        if rank == 0:
            peer_common.print_row(rows[-1])
    if rank == 0 and args.json:
        peer_common.write_json(args.json, "openmpi", ranks, rows)
    return 0 if all(r["wrong"] == 0 for r in rows) else 2


if __name__ == "__main__":
    sys.exit(main())
