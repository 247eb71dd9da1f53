"""The backend's calls on tensors in gradsync's shared memory (gradsync.torch.use_shared_memory,
set by backend_worker.py --shared-memory before anything is allocated): each call whose tensors
lie there whole, dense and of a type gradsync reduces as it is runs on them in place, copying
nothing through staging memory, and its result equals exact arithmetic's; a call that must
convert or pack its tensors is staged as before, with the same results. Every output is a view
into a larger tensor whose other elements hold a sentinel: no call writes outside its output."""
import os

import torch
import torch.distributed as dist

import gradsync.torch

# Reduced by gradsync as they are (the narrower integers and bool travel as int32: staged).
AS_THEY_ARE = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32,
               torch.int64]
COUNT = 40_000
SENTINEL = 99


def inputs(rank, count, dtype, salt=0):
    generator = torch.Generator().manual_seed(7919 * rank + count + salt)
    return torch.randint(-3, 4, (count,), generator=generator).to(dtype)


def total(ranks, count, dtype, salt=0):
    return sum(inputs(r, count, dtype, salt).double() for r in ranks).to(dtype)


class Guarded:
    """`count` elements in the middle of a tensor three times as long, the rest a sentinel."""

    def __init__(self, count, dtype, fill=None):
        self.whole = torch.full((3 * count,), SENTINEL, dtype=dtype)
        self.count = count
        self.view = self.whole[count:2 * count]
        if fill is not None:
            self.view.copy_(fill)

    def untouched_around(self):
        return bool(torch.all(self.whole[:self.count] == SENTINEL) and
                    torch.all(self.whole[2 * self.count:] == SENTINEL))


def check_in_place(group, ranks, label, expect):
    """`group`: a gradsync process group of `ranks` (global ranks); None for the world."""
    rank = dist.get_rank(group)
    world = len(ranks)
    me = ranks[rank]
    process_group = group if group is not None else dist.distributed_c10d._get_default_group()

    def check(call, result, expected, what, in_place):
        before = process_group.staged_bytes
        call()
        staged = process_group.staged_bytes - before
        expect(torch.equal(result.view, expected), f"{label} {what}")
        expect(result.untouched_around(), f"{label} {what} wrote outside its output")
        if in_place:
            expect(staged == 0, f"{label} {what} staged {staged} bytes; its tensors are in "
                   "shared memory")
        else:
            expect(staged > 0, f"{label} {what} was not staged")

    for dtype in AS_THEY_ARE:
        element = torch.empty(0, dtype=dtype).element_size()
        # An odd count of 2-byte elements is not whole 4-byte words: what moves bytes as words
        # stages it.
        for count in (COUNT, COUNT + 1):
            whole_words = count * element % 4 == 0
            tensor = Guarded(count, dtype, inputs(me, count, dtype))
            expect(gradsync.torch.in_shared_memory(tensor.view),
                   f"{label} a {dtype} tensor of {count} elements is in shared memory")
            check(lambda: dist.all_reduce(tensor.view, group=group), tensor,
                  total(ranks, count, dtype), f"all_reduce {dtype} {count}", True)

            root = world - 1
            tensor = Guarded(count, dtype, inputs(me, count, dtype))
            check(lambda: dist.broadcast(tensor.view, src=ranks[root], group=group), tensor,
                  inputs(ranks[root], count, dtype), f"broadcast {dtype} {count}", whole_words)

            block = count // world // 2 * 2 + (count % 2)  # odd counts stay odd
            mine = inputs(me, block, dtype)
            gathered = Guarded(block * world, dtype)
            block_words = block * element % 4 == 0
            check(lambda: dist.all_gather_into_tensor(gathered.view, mine, group=group), gathered,
                  torch.cat([inputs(r, block, dtype) for r in ranks]),
                  f"_allgather_base {dtype} {block}", block_words)

            whole = inputs(me, block * world, dtype, salt=1)
            out = Guarded(block, dtype)
            check(lambda: dist.reduce_scatter_tensor(out.view, whole, group=group), out,
                  total(ranks, block * world, dtype, salt=1)[rank * block:(rank + 1) * block],
                  f"_reduce_scatter_base {dtype} {block}", True)

            sent = inputs(me, block * world, dtype, salt=2)
            received = Guarded(block * world, dtype)
            check(lambda: dist.all_to_all_single(received.view, sent, group=group), received,
                  torch.cat([inputs(r, block * world, dtype, salt=2)[rank * block:(rank + 1) * block]
                             for r in ranks]),
                  f"all_to_all_single {dtype} {block}", block_words)

    # Outputs that overlap their inputs other than as the in place layouts gradsync knows:
    # the receive side is staged, and the results are as if the input had been read first.
    block = COUNT // world
    both = inputs(me, block * world, torch.float32, salt=3)
    expected = torch.cat([inputs(r, block * world, torch.float32, salt=3)[rank * block:
                                                                          (rank + 1) * block]
                          for r in ranks])
    dist.all_to_all_single(both, both, group=group)
    expect(torch.equal(both, expected), f"{label} all_to_all_single into its own input")
    # The same with split sizes (the uneven path), blocks of a different size for each pair,
    # into a guarded output and into its own input.
    sizes = [[1000 + 37 * s + 11 * t for t in range(world)] for s in range(world)]
    sent = [inputs(r, sum(sizes[s]), torch.float32, salt=5) for s, r in enumerate(ranks)]
    expected = torch.cat([sent[s].split(sizes[s])[rank] for s in range(world)])
    received = Guarded(expected.numel(), torch.float32)
    dist.all_to_all_single(received.view, sent[rank], [sizes[s][rank] for s in range(world)],
                           sizes[rank], group=group)
    expect(torch.equal(received.view, expected) and received.untouched_around(),
           f"{label} all_to_all_single with split sizes")
    square = [[1000 + 37 * ((s - t) % world) for t in range(world)] for s in range(world)]
    both = inputs(me, sum(square[rank]), torch.float32, salt=6)
    expected = torch.cat([inputs(r, sum(square[s]), torch.float32, salt=6).split(square[s])[rank]
                          for s, r in enumerate(ranks)])
    dist.all_to_all_single(both, both, [square[s][rank] for s in range(world)], square[rank],
                           group=group)
    expect(torch.equal(both, expected), f"{label} all_to_all_single with split sizes into its "
           "own input")
    whole = inputs(me, block * world, torch.float32, salt=4)
    other = (rank + 1) % world
    out = whole[other * block:(other + 1) * block]  # another rank's block of the input
    expected = total(ranks, block * world, torch.float32, salt=4)[rank * block:(rank + 1) * block]
    dist.reduce_scatter_tensor(out, whole, group=group)
    expect(torch.equal(out, expected), f"{label} _reduce_scatter_base into another rank's block")

    # A child the process forks (a DataLoader's worker) allocates from PyTorch's own memory and
    # leaves the parent's shared tensors alone when it lets go of them.
    inherited = inputs(me, COUNT, torch.float32)
    child = os.fork()
    if child == 0:
        fresh = torch.ones(COUNT)
        own = not gradsync.torch.in_shared_memory(fresh) and float(fresh.sum()) == COUNT
        del inherited, fresh
        os._exit(0 if own else 1)
    _, status = os.waitpid(child, 0)
    expect(status == 0, f"{label} a forked child's tensors came from PyTorch's memory "
           f"(status {status})")
    later = torch.full((COUNT,), 2.0)
    expect(gradsync.torch.in_shared_memory(later) and torch.equal(inherited, inputs(me, COUNT,
           torch.float32)), f"{label} the parent's shared tensors are intact after the child")
    before = process_group.staged_bytes
    dist.all_reduce(later, group=group)
    expect(process_group.staged_bytes == before and bool(torch.all(later == 2.0 * world)),
           f"{label} all_reduce in place after a fork")

    try:
        gradsync.torch.use_shared_memory(-1)
        expect(False, f"{label} use_shared_memory(-1) was taken")
    except ValueError as error:
        expect("negative" in str(error), f"{label} use_shared_memory(-1) says why: {error}")

    # Staged all the same: a type reduced as another, a strided tensor.
    narrow = Guarded(COUNT, torch.int8, inputs(me, COUNT, torch.int8))
    check(lambda: dist.all_reduce(narrow.view, group=group), narrow,
          total(ranks, COUNT, torch.int8), "all_reduce int8 (reduced as int32)", False)
    strided = inputs(me, 2 * COUNT, torch.float32)[::2]
    before = process_group.staged_bytes
    dist.all_reduce(strided, group=group)
    expect(process_group.staged_bytes > before, f"{label} all_reduce of a strided view was staged")
    expect(torch.equal(strided, total(ranks, 2 * COUNT, torch.float32)[::2]),
           f"{label} all_reduce strided")
