"""One rank exercising the gradsync Python API on torch tensors and NumPy arrays, every result
checked against a locally computed reference. Exit status 0 when all pass."""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "client", "python"))
import gradsync  # noqa: E402


def expect(condition, what):
    if not condition:
        raise AssertionError(what)


def main():
    comm = gradsync.init()
    rank, size = gradsync.rank(), gradsync.size()
    contributions = [torch.arange(1000, dtype=torch.float64) * (r + 1) for r in range(size)]

    # Ordinary tensors (staged), every op.
    for op, reduce in (("sum", lambda xs: sum(xs)), ("avg", lambda xs: sum(xs) / size),
                       ("max", lambda xs: torch.stack(xs).max(0).values),
                       ("min", lambda xs: torch.stack(xs).min(0).values),
                       ("prod", lambda xs: torch.stack(xs).prod(0))):
        t = contributions[rank].clone()
        gradsync.allreduce(t, name=f"op.{op}", op=op)
        expect(torch.allclose(t, reduce(contributions)), f"allreduce {op}")

    # The bitwise ops, on integers: every rank's bits in, bit by bit.
    bits = [(torch.arange(1000, dtype=torch.int64) * (2 * r + 3)) % 1024 - 512 for r in range(size)]
    for op, combine in (("band", torch.bitwise_and), ("bor", torch.bitwise_or),
                        ("bxor", torch.bitwise_xor)):
        for dtype in (torch.int32, torch.int64):
            t = bits[rank].to(dtype, copy=True)
            gradsync.allreduce(t, name=f"op.{op}.{dtype}", op=op)
            expected = bits[0]
            for b in bits[1:]:
                expected = combine(expected, b)
            expect(torch.equal(t, expected.to(dtype)), f"allreduce {op} {dtype}")

    # Every dtype, out of place, asynchronous, several in flight.
    handles = []
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32,
                  torch.int64):
        source = (torch.arange(257) % 7 + rank).to(dtype)
        out = torch.empty_like(source)
        handles.append((gradsync.allreduce(source, name=f"dtype.{dtype}", out=out,
                                           async_op=True), out, dtype))
    for handle, out, dtype in handles:
        handle.wait()
        expected = sum((torch.arange(257) % 7 + r) for r in range(size)).to(dtype)
        expect(torch.equal(out, expected), f"allreduce {dtype}")

    # Zero-copy tensors in shared memory.
    shared = comm.empty((64, 64))
    shared.fill_(rank + 1.0)
    gradsync.allreduce(shared, name="shared")
    expect(bool((shared == size * (size + 1) / 2).all()), "allreduce on shared memory")

    # NumPy arrays.
    array = np.full(100, rank + 1, dtype=np.float32)
    gradsync.allreduce(array, name="numpy", op="max")
    expect(bool((array == size).all()), "allreduce on numpy")

    # Where the other nodes reach this node's daemon (its listener here is on loopback).
    expect(gradsync.node_address().startswith("127.0.0."), "node_address")

    # Broadcast and allgather.
    b = torch.full((33,), float(rank))
    gradsync.broadcast(b, root=size - 1, name="bcast")
    expect(bool((b == size - 1).all()), "broadcast")
    gathered = gradsync.allgather(torch.full((5,), rank, dtype=torch.int64), name="gather")
    expect(gathered.tolist() == [[r] * 5 for r in range(size)], "allgather")

    # Reduce-scatter: block b of every rank's tensor, reduced, lands on rank b; torch and numpy,
    # into a new tensor and into a given one.
    blocks = torch.stack([torch.arange(7, dtype=torch.float32) * (b + 1) + rank
                          for b in range(size)])
    mine = gradsync.reduce_scatter(blocks, name="scatter", op="sum")
    expected = torch.arange(7, dtype=torch.float32) * (rank + 1) * size + sum(range(size))
    expect(mine.shape == (7,) and bool((mine == expected).all()), "reduce_scatter")
    out = np.zeros((2, 3), dtype=np.int64)
    gradsync.reduce_scatter(np.full((size, 2, 3), rank + 1, dtype=np.int64),
                            name="scatter.numpy", op="max", out=out)
    expect(bool((out == size).all()), "reduce_scatter on numpy into out")
    # All-to-all: block b of rank s's tensor lands as block s on rank b.
    sent = torch.stack([torch.full((2, 3), 10 * rank + b, dtype=torch.int32) for b in range(size)])
    got = gradsync.alltoall(sent, name="exchange")
    expect(got.shape == sent.shape and
           all(bool((got[s] == 10 * s + rank).all()) for s in range(size)), "alltoall")
    try:
        gradsync.alltoall(sent, name="exchange.in_place", out=sent)
        expect(False, "alltoall in place raises")
    except gradsync.InvalidArgumentError as e:
        expect("never in place" in str(e), f"alltoall's error says why: {e}")
    try:
        gradsync.reduce_scatter(torch.zeros(size + 1, 2), name="scatter.bad")
        expect(False, "reduce_scatter of the wrong first dimension raises")
    except gradsync.InvalidArgumentError as e:
        expect("one block per rank" in str(e), f"reduce_scatter's error names the rule: {e}")

    # A group runs as one unit.
    tensors = [torch.full((10,), float(rank + i)) for i in range(4)]
    with comm.group():
        group_handles = [gradsync.allreduce(t, name=f"group.{i}", async_op=True)
                         for i, t in enumerate(tensors)]
    for h in group_handles:
        h.wait()
    for i, t in enumerate(tensors):
        expect(bool((t == sum(r + i for r in range(size))).all()), "grouped allreduce")

    # A group of different collectives runs as one unit too.
    scatter_in = torch.stack([torch.full((5,), float(rank + b)) for b in range(size)])
    exchange_in = torch.stack([torch.full((3,), 100 * rank + b, dtype=torch.int32)
                               for b in range(size)])
    summed = torch.full((4,), float(rank))
    with comm.group():
        handles = [gradsync.reduce_scatter(scatter_in, name="group.scatter", async_op=True),
                   gradsync.alltoall(exchange_in, name="group.exchange", async_op=True),
                   gradsync.allreduce(summed, name="group.sum", async_op=True)]
    scattered, exchanged, _ = [h.wait() for h in handles]
    expect(bool((scattered == sum(r + rank for r in range(size))).all()), "grouped reduce_scatter")
    expect(all(bool((exchanged[s] == 100 * s + rank).all()) for s in range(size)),
           "grouped alltoall")
    expect(bool((summed == sum(range(size))).all()), "grouped allreduce beside them")

    # Errors are exceptions carrying the daemon's message.
    try:
        gradsync.allreduce(torch.ones(10 + rank), name="mismatch")
        expect(size == 1, "a mismatch went unnoticed")
    except gradsync.MismatchError as error:
        expect("mismatch" in str(error) and "count" in str(error), f"message: {error}")
    try:
        gradsync.allreduce(torch.ones(3), op="median")
        expect(False, "unknown op accepted")
    except gradsync.InvalidArgumentError:
        pass
    try:
        gradsync.allreduce(torch.ones(3), op="bxor")
        expect(False, "a bitwise op on floats was accepted")
    except gradsync.InvalidArgumentError as error:
        expect("bxor reduces integers only, not float32" in str(error), f"message: {error}")

    # A job setting the daemon does not know is refused, naming it.
    try:
        gradsync.Communicator(job=f"{comm.job}.codec", wire_codec="fp8")
        expect(False, "an unknown wire codec was accepted")
    except gradsync.InvalidArgumentError as error:
        expect("GRADSYNC_WIRE_CODEC" in str(error), f"message: {error}")
    try:
        gradsync.Communicator(job=f"{comm.job}.algorithm", algorithm="tree")
        expect(False, "an unknown algorithm was accepted")
    except gradsync.InvalidArgumentError as error:
        expect("GRADSYNC_ALGO must be auto, ring, rhd, direct" in str(error), f"message: {error}")

    # Nothing waits once every call is over: no rank calls anything after the barrier, and the
    # daemon answers with what waits when asked, not when it last looked.
    gradsync.barrier()
    expect(comm.waiting_for() == "", "the job waits for nothing once every call is over")
    gradsync.shutdown()
    print(f"rank {rank}: API checks passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
