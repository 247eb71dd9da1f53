"""Point-to-point calls through the "gradsync" backend (backend_worker.py --check p2p): send,
recv, isend, irecv and batch_isend_irecv, every received tensor compared with what its sender
computes from its own rank (the inputs are a function of the rank)."""
import datetime
import time

import torch
import torch.distributed as dist

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int8,
          torch.bool, torch.complex64]
SIZES = [1, 7, 1000, 40_003]


def message(source, target, count, dtype, salt=0):
    """What `source` sends `target`: small integers, distinct per pair, size and salt."""
    generator = torch.Generator().manual_seed(10_000 * source + 100 * target + 17 * count + salt)
    if dtype == torch.bool:
        return torch.randint(0, 2, (count,), generator=generator).bool()
    if dtype == torch.complex64:
        pairs = torch.randint(-3, 4, (count, 2), generator=generator).float()
        return pairs.view(torch.complex64).flatten()
    return torch.randint(-3, 4, (count,), generator=generator).to(dtype)


def equal(a, b):
    a, b = a.cpu(), b.cpu()
    return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))


def check_point_to_point(expect, device, shared_memory):
    """`shared_memory`: CPU tensors of 4 KiB and more lie in gradsync's shared memory, and
    messages of them are sent and received where they lie, staging nothing."""
    rank, world = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % world, (rank - 1) % world

    def received(count, dtype):
        return torch.empty(count, dtype=dtype, device=device)

    # A ring, every rank sending first: no rank waits for another's receive to be posted.
    for dtype in DTYPES:
        for count in SIZES:
            out = received(count, dtype)
            sending = dist.isend(message(rank, right, count, dtype).to(device), dst=right)
            receiving = dist.irecv(out, src=left)
            sending.wait()
            receiving.wait()
            expect(receiving.is_completed(), f"irecv completed after wait {dtype} {count}")
            expect(equal(out, message(left, rank, count, dtype)), f"ring {dtype} {count}")

    # Blocking calls in pairs: the even rank sends first, the odd one receives first.
    partner = rank ^ 1
    if partner < world:
        for count in (5, 100_000):
            out = received(count, torch.float32)
            mine = message(rank, partner, count, torch.float32).to(device)
            if rank % 2 == 0:
                dist.send(mine, dst=partner)
                dist.recv(out, src=partner)
            else:
                dist.recv(out, src=partner)
                dist.send(mine, dst=partner)
            expect(equal(out, message(partner, rank, count, torch.float32)),
                   f"send and recv with rank {partner}, {count}")

    # Tags: rank 0 sends rank 1 three tags, twice each; rank 1 receives the tags in another
    # order. Each tag's messages arrive in their order, whatever the other tags do.
    if world > 1 and rank in (0, 1):
        tags = [5, 1, 3]
        if rank == 0:
            works = [dist.isend(message(0, 1, 9, torch.int64, salt=10 * tag + n).to(device), dst=1,
                                tag=tag) for n in range(2) for tag in tags]
            for work in works:
                work.wait()
        else:
            outs = {}
            works = []
            for tag in reversed(tags):
                for n in range(2):
                    outs[tag, n] = received(9, torch.int64)
                    works.append(dist.irecv(outs[tag, n], src=0, tag=tag))
            for work in works:
                work.wait()
            expect(all(equal(outs[tag, n], message(0, 1, 9, torch.int64, salt=10 * tag + n))
                       for tag in tags for n in range(2)), "messages matched by tag, in order")

    # batch_isend_irecv around the ring both ways.
    outs = [received(33, torch.float64) for _ in range(2)]
    operations = [dist.P2POp(dist.isend, message(rank, right, 33, torch.float64).to(device), right),
                  dist.P2POp(dist.isend, message(rank, left, 33, torch.float64).to(device), left),
                  dist.P2POp(dist.irecv, outs[0], left),
                  dist.P2POp(dist.irecv, outs[1], right)]
    for work in dist.batch_isend_irecv(operations):
        work.wait()
    expect(equal(outs[0], message(left, rank, 33, torch.float64))
           and equal(outs[1], message(right, rank, 33, torch.float64)), "batch_isend_irecv")

    # Every rank with every other at once: a lane per peer busy together.
    peers = [r for r in range(world) if r != rank]
    outs = {peer: received(1000, torch.float32) for peer in peers}
    operations = [dist.P2POp(dist.irecv, outs[peer], peer) for peer in peers]
    operations += [dist.P2POp(dist.isend, message(rank, peer, 1000, torch.float32).to(device), peer)
                   for peer in reversed(peers)]
    for work in dist.batch_isend_irecv(operations):
        work.wait()
    expect(all(equal(outs[peer], message(peer, rank, 1000, torch.float32)) for peer in peers),
           "every rank with every other")

    # Into a strided tensor (every other element of a longer one): the others untouched.
    buffer = torch.full((2 * 500,), -7.0, device=device)
    receiving = dist.irecv(buffer[0::2], src=left)
    dist.send(message(rank, right, 500, torch.float32).to(device), dst=right)
    receiving.wait()
    expect(equal(buffer[0::2], message(left, rank, 500, torch.float32))
           and bool((buffer[1::2] == -7.0).all()), "recv into a strided tensor")

    # A receive pending across the group's collectives: they complete while it waits (its
    # sender sends only after two more collectives).
    if world > 1:
        last = world - 1
        out = received(64, torch.float32)
        pending = dist.irecv(out, src=last) if rank == 0 else None
        for _ in range(2):
            total = torch.ones(3, device=device)
            dist.all_reduce(total)
            expect(equal(total, torch.full((3,), float(world))), "all_reduce beside a pending recv")
        if rank == last:
            dist.send(message(last, 0, 64, torch.float32).to(device), dst=0)
        if pending is not None:
            pending.wait()
            expect(equal(out, message(last, 0, 64, torch.float32)), "the pending recv's message")

    if shared_memory and partner < world:
        process_group = dist.distributed_c10d._get_default_group()
        out = torch.zeros(100_000)
        before = process_group.staged_bytes
        if rank % 2 == 0:
            dist.send(message(rank, partner, 100_000, torch.float32), dst=partner)
        else:
            dist.recv(out, src=partner)
            expect(equal(out, message(partner, rank, 100_000, torch.float32)),
                   "a message in shared memory")
        staged = process_group.staged_bytes - before
        expect(staged == 0, f"a message in shared memory staged {staged} bytes")

    # Zero elements: nothing to move, on both sides alike.
    if partner < world:
        empty = received(0, torch.float32)
        if rank % 2 == 0:
            dist.send(empty, dst=partner)
        else:
            dist.recv(empty, src=partner)

    # Inside a subgroup (ranks in reverse order): peers named by their global ranks.
    members = list(range(world - 1, -1, -1))
    group = dist.new_group(members)
    if world > 1:
        out = received(50, torch.int32)
        receiving = dist.irecv(out, src=left, group=group)
        dist.send(message(rank, right, 50, torch.int32).to(device), dst=right, group=group)
        receiving.wait()
        expect(equal(out, message(left, rank, 50, torch.int32)), "ring in a subgroup")
    dist.barrier()


def check_point_to_point_faults(expect, raises):
    """Bad point-to-point calls: a clear error where they are made, the pair usable after."""
    rank, world = dist.get_rank(), dist.get_world_size()
    raises(expect, "send to itself", ["gradsync", "send", "not another rank"],
           lambda: dist.send(torch.ones(1), dst=rank))
    raises(expect, "recv from any rank", ["gradsync", "recvAnysource"],
           lambda: dist.recv(torch.ones(1)))
    partner = rank ^ 1
    if partner < world:
        # Sizes that differ between sender and receiver: both are told.
        if rank % 2 == 0:
            raises(expect, "a send of another size than its recv", ["gradsync", "send"],
                   lambda: dist.send(torch.ones(10), dst=partner))
        else:
            raises(expect, "a recv of another size than its send", ["gradsync", "recv"],
                   lambda: dist.recv(torch.ones(11), src=partner))
        out = torch.zeros(4)
        if rank % 2 == 0:
            dist.send(torch.full((4,), 2.0), dst=partner)
        else:
            dist.recv(out, src=partner)
            expect(equal(out, torch.full((4,), 2.0)), "a send and recv after a mismatch")
    # A receive whose sender never sends fails at the group's timeout.
    quick = dist.new_group(backend="gradsync", timeout=datetime.timedelta(seconds=3))
    if world > 1 and rank == 1:
        start = time.monotonic()
        raises(expect, "a recv that nobody sends", ["gradsync", "recv", "timed out"],
               lambda: dist.recv(torch.ones(1), src=0, group=quick))
        expect(time.monotonic() - start < 10, "the unanswered recv fails within its timeout")
    dist.barrier()
