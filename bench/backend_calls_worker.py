"""One rank of bench/backend-calls: torch.distributed calls through the "gradsync" backend and
through Gloo, in interleaved rounds in one process, each result compared with Gloo's. Rank 0
writes the JSON (--json): per call, size and skew, the median over rounds of each round's
median time of the slowest rank.

all_reduce: a float32 tensor of the size, summed in place.
all_to_all_single with split sizes:
The splits: rank s sends rank t a block of size / world bytes times a factor drawn once from
[1 - skew, 1 + skew] (the same on every rank), the factors scaled to a mean of 1; skew 0 gives
equal blocks, passed as split sizes all the same. Skew hotN: every rank sends rank 0 (a popular
expert) N times what it sends each other rank, as mixture-of-experts routing does. `equal` rows: all_to_all_single without split sizes, gradsync's one-stage
path, for the cost of the split-size stage.

send_recv: each rank and its partner (rank ^ 1) exchange a float32 tensor of the size, an
isend and an irecv each way (an even world).

Every row runs a third way: through gradsync on tensors allocated in its
shared memory (gradsync.torch.use_shared_memory), which the backend reduces and exchanges where
they lie instead of staging them (`gradsync_shared_ms`).

Below 1 MiB each timed iteration runs the call back to back enough times to fill about 1 MiB
(200 at most), and a call's time is the iteration's over that count: one call of a few bytes
takes less time than the ranks take to leave the barrier before it together.
"""
import argparse
import datetime
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "client", "python"))
import gradsync.torch  # noqa: E402,F401  (registers the backend)

ROW_FLOATS = 4  # a row of the exchanged tensors: 16 bytes


def splits(world, size, skew, seed):
    """Rows from each rank to each (a world x world list), `size` bytes per sender on average
    whatever the skew, so that every skew moves the same bytes in all."""
    generator = torch.Generator().manual_seed(seed)
    factors = torch.rand(world, world, generator=generator) * 2 * skew + (1 - skew)
    factors /= factors.mean()
    mean_rows = size / (ROW_FLOATS * 4) / world
    return (factors * mean_rows).round().long().tolist()


def hot_splits(world, size, heat):
    """As splits, with every rank sending rank 0 (a popular expert) `heat` times what it sends
    each other rank."""
    factors = torch.ones(world, world)
    factors[:, 0] = heat
    factors /= factors.mean()
    mean_rows = size / (ROW_FLOATS * 4) / world
    return (factors * mean_rows).round().long().tolist()


def split_matrix(world, size, skew):
    """The rows from each rank to each for a --skews entry: "equal", a number, or hotN."""
    if skew == "equal":
        block = splits(world, size, 0, seed=size)[0][0]
        return [[block] * world for _ in range(world)]
    if skew.startswith("hot"):
        return hot_splits(world, size, float(skew[3:]))
    return splits(world, size, float(skew), seed=size)


def repeats_for(size):
    """How many calls of `size` bytes one timed iteration runs (see the module's words)."""
    return max(1, min(200, (1 << 20) // max(size, 1)))


def timed(call, gloo, iterations, size):
    """The median over iterations of the slowest rank's time of one `call` of `size` bytes
    (seconds)."""
    repeats = repeats_for(size)
    times = []
    for _ in range(iterations):
        dist.barrier(group=gloo)
        start = time.perf_counter()
        for _ in range(repeats):
            call()
        times.append((time.perf_counter() - start) / repeats)
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=gloo)
    return statistics.median(slowest.tolist())


def with_speedup(row):
    row["gradsync_speedup"] = row["gloo_ms"] / row["gradsync_ms"]
    if "gradsync_shared_ms" in row:
        row["gradsync_shared_speedup"] = row["gloo_ms"] / row["gradsync_shared_ms"]
    return row


def in_shared_memory(make):
    """A tensor `make` allocates in gradsync's shared memory."""
    gradsync.torch.use_shared_memory(1)
    try:
        tensor = make()
    finally:
        gradsync.torch.use_shared_memory(0)
    if not gradsync.torch.in_shared_memory(tensor):
        raise SystemExit("a tensor meant for gradsync's shared memory is not there")
    return tensor


def allreduce_row(size, gloo, args):
    """all_reduce of `size` bytes both ways, timed on zeros (the sums stay zero however many
    times they run), then checked once on small integers (exact sums in any order)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    tensor = torch.zeros(size // 4)
    shared = in_shared_memory(lambda: torch.zeros(size // 4))
    ways = {"gradsync": lambda: dist.all_reduce(tensor),
            "gradsync_shared": lambda: dist.all_reduce(shared),
            "gloo": lambda: dist.all_reduce(tensor, group=gloo)}
    times = {way: [] for way in ways}
    for _ in range(args.rounds):
        for way, call in ways.items():
            times[way].append(timed(call, gloo, args.iterations, size))
    ours = torch.randint(-3, 4, (size // 4,), generator=torch.Generator().manual_seed(rank)).float()
    theirs = ours.clone()
    shared.copy_(ours)
    dist.all_reduce(ours)
    dist.all_reduce(shared)
    dist.all_reduce(theirs, group=gloo)
    if not torch.equal(ours, theirs) or not torch.equal(shared, theirs):
        raise SystemExit(f"rank {rank}: gradsync's all_reduce differs from Gloo's ({size} bytes)")
    return with_speedup({"call": "all_reduce", "bytes": size, "skew": None, "ranks": world,
                         **{f"{way}_ms": statistics.median(t) * 1e3 for way, t in times.items()}})


def send_recv_row(size, gloo, args):
    """An exchange of `size` bytes with the partner rank both ways, timed, then checked once on
    values that name the sender."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if world % 2:
        raise SystemExit("send_recv pairs the ranks: it needs an even number of them")
    partner = rank ^ 1
    message, out = torch.full((size // 4,), float(rank)), torch.empty(size // 4)
    shared_message = in_shared_memory(lambda: message.clone())
    shared_out = in_shared_memory(lambda: torch.empty(size // 4))

    def exchange(send, receive, group=None):
        works = [dist.isend(send, partner, group=group), dist.irecv(receive, partner, group=group)]
        for work in works:
            work.wait()

    ways = {"gradsync": lambda: exchange(message, out),
            "gradsync_shared": lambda: exchange(shared_message, shared_out),
            "gloo": lambda: exchange(message, out, gloo)}
    expected = torch.full((size // 4,), float(partner))
    for way, call in ways.items():
        (out if way != "gradsync_shared" else shared_out).zero_()
        call()
        if not torch.equal(out if way != "gradsync_shared" else shared_out, expected):
            raise SystemExit(f"rank {rank}: {way}'s send_recv delivered the wrong values "
                             f"({size} bytes)")
    times = {way: [] for way in ways}
    for _ in range(args.rounds):
        for way, call in ways.items():
            times[way].append(timed(call, gloo, args.iterations, size))
    return with_speedup({"call": "send_recv", "bytes": size, "skew": None, "ranks": world,
                         **{f"{way}_ms": statistics.median(t) * 1e3 for way, t in times.items()}})


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", default="allreduce,alltoall")
    parser.add_argument("--sizes", default="1M,16M,64M")
    parser.add_argument("--skews", default="0,0.5,0.9")
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gradsync", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    rows = []
    for text in args.sizes.split(","):
        size = int(text[:-1]) * scale[text[-1]] if text[-1] in scale else int(text)
        if "allreduce" in args.calls.split(","):
            rows.append(allreduce_row(size, gloo, args))
        if "sendrecv" in args.calls.split(","):
            rows.append(send_recv_row(size, gloo, args))
        if "alltoall" not in args.calls.split(","):
            continue
        for skew in ["equal"] + args.skews.split(","):
            matrix = split_matrix(world, size, skew)
            sends = matrix[rank]
            receives = [matrix[s][rank] for s in range(world)]
            source = torch.randn(sum(sends), ROW_FLOATS)
            ours = torch.empty(sum(receives), ROW_FLOATS)
            theirs = torch.empty(sum(receives), ROW_FLOATS)
            split_args = () if skew == "equal" else (receives, sends)
            ways = {
                "gradsync": lambda: dist.all_to_all_single(ours, source, *split_args),
                "gloo": lambda: dist.all_to_all_single(theirs, source, *split_args, group=gloo),
            }
            shared_source = in_shared_memory(lambda: source.clone())
            shared_out = in_shared_memory(lambda: torch.empty_like(ours))
            ways["gradsync_shared"] = lambda: dist.all_to_all_single(shared_out, shared_source,
                                                                     *split_args)
            times = {way: [] for way in ways}
            for _ in range(args.rounds):
                for way, call in ways.items():
                    times[way].append(timed(call, gloo, args.iterations, size))
            if not torch.equal(ours, theirs) or not torch.equal(shared_out, theirs):
                raise SystemExit(f"rank {rank}: gradsync's result differs from Gloo's "
                                 f"({size} bytes, skew {skew})")
            flat = [n for line in matrix for n in line]
            row = {"call": "all_to_all_single", "bytes": size, "skew": skew, "ranks": world,
                   "largest_over_mean_block": max(flat) / (sum(flat) / len(flat)),
                   **{f"{way}_ms": statistics.median(t) * 1e3 for way, t in times.items()}}
            rows.append(with_speedup(row))
    if rank == 0:
        with open(args.json, "w") as out:
            json.dump({"rows": rows}, out, indent=2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
