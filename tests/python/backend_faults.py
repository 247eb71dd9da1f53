"""Faults through the "gradsync" backend: bad input gets a clear error on every rank involved
and leaves the group usable; a rank that dies makes the others' pending calls raise in time."""
import datetime
import os
import time

import torch
import torch.distributed as dist

import gradsync
from backend_point_to_point import check_point_to_point_faults

DEATH_BOUND_S = 10


def raises(expect, what, words, call):
    """Runs call; expects a RuntimeError or ValueError whose message holds every word."""
    try:
        call()
    except (RuntimeError, ValueError) as error:
        message = str(error)
        expect(all(w in message for w in words), f"{what}: error names {words}: {message!r}")
        return
    expect(False, f"{what}: no error")


def check_bad_input(expect):
    rank, world = dist.get_rank(), dist.get_world_size()
    # Shapes and dtypes that differ between ranks: the daemon's mismatch error, on every rank.
    raises(expect, "mismatched shapes", ["gradsync", "allreduce"],
           lambda: dist.all_reduce(torch.ones(10 + rank)))
    raises(expect, "mismatched dtypes", ["gradsync", "allreduce"],
           lambda: dist.all_reduce(torch.ones(10, dtype=torch.float32 if rank else torch.float64)))
    # Caught before anything is sent, on every rank alike.
    # A device no backend serves is refused by PyTorch's dispatcher before any backend; a
    # layout gradsync does not carry, by gradsync.
    raises(expect, "a tensor on the meta device", ["allreduce", "Meta"],
           lambda: dist.all_reduce(torch.empty(4, device="meta")))
    raises(expect, "a sparse tensor", ["gradsync", "Sparse"],
           lambda: dist.all_reduce(torch.ones(4).to_sparse()))
    raises(expect, "PREMUL_SUM of integers", ["gradsync", "PREMUL_SUM", "floating-point"],
           lambda: dist.all_reduce(torch.ones(4, dtype=torch.int64),
                                   op=dist._make_nccl_premul_sum(2.0)))
    raises(expect, "a bitwise op on floats", ["gradsync", "BAND", "integer and bool tensors"],
           lambda: dist.all_reduce(torch.ones(4), op=dist.ReduceOp.BAND))
    # Complex all_reduce PyTorch turns into real pairs itself; _reduce_scatter_base it hands on.
    raises(expect, "an unsupported dtype", ["gradsync", "ComplexFloat"],
           lambda: dist._reduce_scatter_base(torch.empty(2, dtype=torch.complex64),
                                             torch.ones(2 * world, dtype=torch.complex64)))
    # All-to-all split sizes that do not match between ranks, or do not add up: every rank
    # names the same rank, as every rank checks every rank's table.
    last = world - 1
    raises(expect, "all_to_all splits that do not match",
           ["alltoall_base", f"rank {last} sends 1 row to rank 0, which expects 2 from it"],
           lambda: dist.all_to_all_single(
               torch.empty(world + (rank == 0)), torch.ones(world),
               output_split_sizes=[1] * last + [1 + (rank == 0)], input_split_sizes=[1] * world))
    raises(expect, "all_to_all splits that do not add up",
           ["alltoall_base", f"rank {last}'s input split sizes add up to {world + 1} rows",
            f"its input has {world}"],
           lambda: dist.all_to_all_single(
               torch.empty(world), torch.ones(world), output_split_sizes=[1] * world,
               input_split_sizes=[1] * last + [1 + (rank == last)]))
    raises(expect, "all_to_all with one split size too many",
           ["alltoall_base", f"rank 0 passed {world + 1} input split sizes for a group of {world}"],
           lambda: dist.all_to_all_single(
               torch.empty(world), torch.ones(world), output_split_sizes=[1] * world,
               input_split_sizes=[1] * world + [0] * (rank == 0)))
    raises(expect, "all_to_all splits in another dtype on one rank",
           ["alltoall_base", f"rank {last}'s tensors are Double, rank 0's Float"],
           lambda: dist.all_to_all_single(
               torch.empty(world, dtype=torch.float64 if rank == last else torch.float32),
               torch.ones(world, dtype=torch.float64 if rank == last else torch.float32),
               output_split_sizes=[1] * world, input_split_sizes=[1] * world))
    # Ranks whose calls differ: every rank is told at once, not at the timeout.
    raises(expect, "split sizes on one rank only", ["alltoall_base", "disagree"],
           lambda: dist.all_to_all_single(
               torch.empty(world), torch.ones(world),
               *(([1] * world, [1] * world) if rank == 0 else ())))
    raises(expect, "a broadcast beside all_reduces", ["disagree", "broadcast", "allreduce"],
           lambda: dist.broadcast(torch.ones(3), src=0) if rank == last
           else dist.all_reduce(torch.ones(3)))
    check_point_to_point_faults(expect, raises)
    raises(expect, "a subgroup naming a rank outside the world", ["rank"],
           lambda: dist.new_group([0, world]))
    # A call that times out because another rank never makes it says, from the daemon, which
    # rank that is (on a group of its own: a timeout leaves its group unusable).
    waiting = dist.new_group(list(range(world)), timeout=datetime.timedelta(seconds=3))
    if rank == 0:
        raises(expect, "a timeout names the ranks it waits for",
               ["allreduce timed out", "the daemon:", "job rank(s) " +
                ", ".join(str(r) for r in range(1, world)), "have not submitted it"],
               lambda: dist.all_reduce(torch.ones(4), group=waiting))
    dist.barrier()
    # The group still works after all of that.
    tensor = torch.full((5,), float(rank))
    dist.all_reduce(tensor)
    expect(torch.equal(tensor, torch.full((5,), float(sum(range(world))))),
           "an allreduce after the errors")
    return 0


def check_rank_dies():
    """Rank 1 leaves in the middle of a collective; the others must raise within the bound,
    then the daemon serves a new job of the survivors. Exit 3: the expected error came."""
    rank, world = dist.get_rank(), dist.get_world_size()
    dist.all_reduce(torch.ones(8))  # everyone is in
    if rank == 1:
        dist.all_reduce(torch.ones(1 << 20), async_op=True)
        os._exit(9)
    start = time.monotonic()
    try:
        for _ in range(3):
            dist.all_reduce(torch.ones(1 << 20))
            time.sleep(0.1)
    except RuntimeError as error:
        waited = time.monotonic() - start
        print(f"rank {rank}: raised after {waited:.1f} s: {error}", flush=True)
        if waited > DEATH_BOUND_S:
            print(f"rank {rank}: slower than {DEATH_BOUND_S} s", flush=True)
            return 1
    else:
        print(f"rank {rank}: no error although rank 1 died", flush=True)
        return 1
    survivors = [r for r in range(world) if r != 1]
    with gradsync.Communicator(job=f"after-{os.environ['GRADSYNC_JOB']}",
                               rank=survivors.index(rank), world_size=len(survivors),
                               local_rank=survivors.index(rank),
                               local_world_size=len(survivors)) as comm:
        tensor = torch.ones(4)
        comm.allreduce(tensor)
        if not torch.equal(tensor, torch.full((4,), float(len(survivors)))):
            print(f"rank {rank}: the next job's allreduce is wrong: {tensor}", flush=True)
            return 1
    return 3


def check_point_to_point_rank_dies():
    """Rank 1 leaves while every other rank waits to receive from it: each receive, and a send
    to it after, must raise within the bound. Only the last rank exchanged a message with it before (their pair's job
    holds both); the others' pairs with it never saw it, on its node and across nodes. Exit 3:
    the expected error came."""
    rank, world = dist.get_rank(), dist.get_world_size()
    greeted = world - 1
    if rank == 1:
        dist.send(torch.full((4,), 1.0), dst=greeted)
        dist.barrier()
        time.sleep(0.5)  # the others are in their receives
        os._exit(9)
    if rank == greeted:
        greeting = torch.zeros(4)
        dist.recv(greeting, src=1)
        if not torch.equal(greeting, torch.full((4,), 1.0)):
            print(f"rank {rank}: the greeting from rank 1 is wrong: {greeting}", flush=True)
            return 1
    dist.barrier()
    start = time.monotonic()
    try:
        dist.recv(torch.empty(1 << 20), src=1)
    except RuntimeError as error:
        waited = time.monotonic() - start
        print(f"rank {rank}: raised after {waited:.1f} s: {error}", flush=True)
        if waited > DEATH_BOUND_S or "recv from rank 1" not in str(error):
            print(f"rank {rank}: slower than {DEATH_BOUND_S} s, or not naming the call", flush=True)
            return 1
    else:
        print(f"rank {rank}: no error although rank 1 died", flush=True)
        return 1
    # A send to it fails as well, also where the two never exchanged.
    start = time.monotonic()
    try:
        dist.send(torch.ones(4), dst=1)
    except RuntimeError as error:
        waited = time.monotonic() - start
        if waited > DEATH_BOUND_S or "send to rank 1" not in str(error):
            print(f"rank {rank}: the send raised after {waited:.1f} s: {error}", flush=True)
            return 1
        return 3
    print(f"rank {rank}: a send to rank 1 succeeded although it died", flush=True)
    return 1


def check_exit_with_a_call_in_flight():
    """Rank 0 leaves the interpreter with a call in flight whose future has a Python callback:
    the package's exit hook runs the call to its end first (the callback with it), and the
    process exits as it asked, rather than aborting in the interpreter's finalization."""
    rank, world = dist.get_rank(), dist.get_world_size()
    dist.barrier()
    if rank == 0:
        tensor = torch.ones(1 << 16)
        work = dist.all_reduce(tensor, async_op=True)

        def check(future):
            # The process's status comes from here: os._exit, as a callback cannot raise
            # SystemExit.
            correct = bool(torch.all(future.value()[0] == world))
            print(f"rank 0: the callback ran; the sum is {'right' if correct else 'wrong'}",
                  flush=True)
            if not correct:
                os._exit(1)

        work.get_future().then(check)
        return 0  # leaves with the allreduce in flight: the other ranks join it later
    time.sleep(1.0)
    tensor = torch.ones(1 << 16)
    dist.all_reduce(tensor)
    return 0 if bool(torch.all(tensor == world)) else 1
