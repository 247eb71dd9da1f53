"""One rank of the torch.distributed backend tests: every dist.* call gradsync supports, run on
the "gradsync" default group and checked against Gloo's result (a group of the same ranks) or,
where 1.13's Gloo has no such call, against the result every rank computes from every rank's
input (the inputs are a function of the rank).

Run by tests/python/run_ranks.py. --check picks what to run:
  calls       every call (all_gather_into_tensor and reduce_scatter_tensor: the process group's
              _allgather_base and _reduce_scatter_base), every dtype, in place and not,
              synchronous and async_op, in the world and in subgroups; the object collectives
  ddp         DDP with no hook, then ZeroRedundancyOptimizer: parameters equal to Gloo's run
  reproducible  float32 allreduces with GRADSYNC_ALGO=direct, whole and cut: the nodes' sums
              in node order, to the bit (backend_reproducible.py)
  bad-input   mismatched shapes and dtypes, a tensor on an unsupported device, a subgroup with
              a rank outside the world, an unsupported op: a clear error on every rank, no hang
  p2p         send, recv, isend, irecv, batch_isend_irecv (backend_point_to_point.py)
  dies        rank 1 exits in the middle of a collective: the others raise within 10 s
  p2p-dies    rank 1 exits while the others wait to receive from it (only the last rank has
              exchanged with it before): they raise within 10 s
  exit        rank 0 leaves the interpreter with a call in flight whose future has a callback:
              it runs, and every rank exits 0
--shared-memory N allocates CPU tensors of N bytes or more in gradsync's shared memory
(gradsync.torch.use_shared_memory): calls then also checks that the calls on them run in place,
and ddp that DDP's buckets do.
--device cuda runs calls and ddp on CUDA tensors (each rank on GPU LOCAL_RANK % the GPUs), still
checked against Gloo on the host (calls) or Gloo on the GPU (ddp).
Exit status 0: as expected; 1: not; 3: the expected error reached this rank (--check dies).
"""
import argparse
import datetime
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "client", "python"))
import gradsync.torch  # noqa: E402,F401  (registers the backend)

REDUCED = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64,
           torch.uint8, torch.int8, torch.int16, torch.bool]
# Results Gloo does not compute exactly or at all: checked against exact arithmetic.
REFERENCE_ONLY = (torch.float16, torch.bfloat16, torch.int16, torch.bool)
# Moved as bytes only (broadcast, gathers, alltoall): any dtype.
MOVED = REDUCED + [torch.complex64]
OPS = {"sum": dist.ReduceOp.SUM, "product": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
       "max": dist.ReduceOp.MAX}
# Integer and bool tensors only.
BITWISE_OPS = {"band": dist.ReduceOp.BAND, "bor": dist.ReduceOp.BOR, "bxor": dist.ReduceOp.BXOR}
SIZES = [1, 7, 1000, 40_003]

failures = []
checked = [0]
DEVICE = [torch.device("cpu")]  # where the gradsync side's tensors lie (--device)


def on_device(tensor):
    """A copy of `tensor` where the gradsync side's tensors lie."""
    return tensor.to(DEVICE[0], copy=True)


def empty(count, dtype):
    return torch.empty(count, dtype=dtype, device=DEVICE[0])


def expect(condition, what):
    checked[0] += 1
    if not condition:
        failures.append(what)
        print(f"rank {dist.get_rank()}: FAILED {what}", flush=True)


def equal(a, b):
    a, b = a.cpu(), b.cpu()
    return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))


def values(rank, count, dtype, salt=0):
    """Rank `rank`'s input: small integers, so that every sum, product and average of up to 4
    ranks is exact in every dtype (float16 and bfloat16 included)."""
    generator = torch.Generator().manual_seed(1000 * rank + 17 * count + salt)
    if dtype == torch.bool:
        return torch.randint(0, 2, (count,), generator=generator).bool()
    if dtype == torch.complex64:
        return torch.randint(-3, 4, (count, 2), generator=generator).float().view(torch.complex64).flatten()
    low = 0 if dtype == torch.uint8 else -3
    return torch.randint(low, 4, (count,), generator=generator).to(dtype)


def reduce_reference(tensors, op):
    if op in BITWISE_OPS:
        combine = {"band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor}[op]
        result = tensors[0]
        for tensor in tensors[1:]:
            result = combine(result, tensor)
        return result
    stacked = torch.stack([t.double() for t in tensors])
    result = {"sum": stacked.sum(0), "product": stacked.prod(0), "min": stacked.min(0).values,
              "max": stacked.max(0).values, "avg": stacked.mean(0)}[op]
    return result.to(tensors[0].dtype)


def premul_sum(factor):
    """PREMUL_SUM by `factor`, a number or a one-element tensor (which PyTorch 1 takes in a
    list, one a tensor of the call)."""
    if isinstance(factor, torch.Tensor):
        try:
            return dist._make_nccl_premul_sum(factor)
        except TypeError:
            return dist._make_nccl_premul_sum([factor])
    return dist._make_nccl_premul_sum(factor)


def run(call, async_op, *args, **kwargs):
    """A dist call, synchronous or waited for through its Work (and its future)."""
    if not async_op:
        return call(*args, **kwargs)
    work = call(*args, async_op=True, **kwargs)
    work.wait()
    expect(work.is_completed(), f"{call.__name__} work completed after wait")
    work.get_future().wait()
    return None


def check_calls(group, gloo, ranks, label):
    rank = dist.get_rank(group)
    world = len(ranks)
    for async_op in (False, True):
        for count in SIZES:
            for dtype in REDUCED:
                for op_name, op in OPS.items():
                    mine = values(ranks[rank], count, dtype)
                    ours, theirs = on_device(mine), mine.clone()
                    run(dist.all_reduce, async_op, ours, op=op, group=group)
                    if dtype in REFERENCE_ONLY:
                        theirs = reduce_reference([values(r, count, dtype) for r in ranks], op_name)
                    else:
                        dist.all_reduce(theirs, op=op, group=gloo)
                    expect(equal(ours, theirs), f"{label} all_reduce {op_name} {dtype} {count} async={async_op}")
                if not dtype.is_floating_point:
                    for op_name, op in BITWISE_OPS.items():
                        mine = values(ranks[rank], count, dtype, salt=7)
                        ours, theirs = on_device(mine), mine.clone()
                        run(dist.all_reduce, async_op, ours, op=op, group=group)
                        if dtype in REFERENCE_ONLY:
                            theirs = reduce_reference([values(r, count, dtype, salt=7) for r in ranks], op_name)
                        else:
                            dist.all_reduce(theirs, op=op, group=gloo)
                        expect(equal(ours, theirs), f"{label} all_reduce {op_name} {dtype} {count} async={async_op}")
                    # A reduce-scatter with one of them: block r of every rank's bits combined.
                    blocks = [on_device(values(ranks[rank], count, dtype, salt=b)) for b in range(world)]
                    expected = reduce_reference([values(r, count, dtype, salt=rank) for r in ranks], "bxor")
                    out = empty(count, dtype)
                    run(dist.reduce_scatter, async_op, out, blocks, op=dist.ReduceOp.BXOR, group=group)
                    expect(equal(out, expected), f"{label} reduce_scatter bxor {dtype} {count}")
                if dtype.is_floating_point:
                    # PREMUL_SUM (no Gloo to compare with): each rank's input times the factor,
                    # summed; a number or a tensor, exact on these values.
                    for factor, scale in ((0.5, 0.5), (torch.tensor(0.25, dtype=torch.float64), 0.25)):
                        premul = premul_sum(factor)
                        expected = reduce_reference(
                            [values(r, count, dtype).double() * scale for r in ranks], "sum").to(dtype)
                        ours = on_device(values(ranks[rank], count, dtype))
                        run(dist.all_reduce, async_op, ours, op=premul, group=group)
                        expect(equal(ours, expected), f"{label} all_reduce premul {scale} {dtype} {count}")
                        # _reduce_scatter_base: its input stays as it was.
                        source = on_device(torch.cat([values(ranks[rank], count, dtype, salt=b)
                                                      for b in range(world)]))
                        before = source.clone()
                        out = empty(count, dtype)
                        run(dist._reduce_scatter_base, async_op, out, source, op=premul, group=group)
                        expected = reduce_reference(
                            [values(r, count, dtype, salt=rank).double() * scale for r in ranks],
                            "sum").to(dtype)
                        expect(equal(out, expected) and equal(source, before),
                               f"{label} _reduce_scatter_base premul {scale} {dtype} {count}")
                    ours = on_device(values(ranks[rank], count, dtype))
                    dist.all_reduce(ours, op=dist.ReduceOp.AVG, group=group)
                    ours = ours.cpu()
                    expected = reduce_reference([values(r, count, dtype) for r in ranks], "avg")
                    # Exact where the world is a power of two; otherwise within rounding.
                    tolerance = 2 * torch.finfo(dtype).eps
                    expect(torch.allclose(ours.double(), expected.double(), rtol=tolerance,
                                          atol=tolerance), f"{label} all_reduce avg {dtype} {count}")
                # reduce: the root's tensor is the sum.
                root = world - 1
                ours = on_device(values(ranks[rank], count, dtype))
                run(dist.reduce, async_op, ours, dst=ranks[root], group=group)
                if rank == root:
                    expected = reduce_reference([values(r, count, dtype) for r in ranks], "sum")
                    expect(equal(ours, expected), f"{label} reduce {dtype} {count}")
                # reduce_scatter (list and _base): block r of the sum.
                blocks = [on_device(values(ranks[rank], count, dtype, salt=b)) for b in range(world)]
                expected = reduce_reference(
                    [values(r, count, dtype, salt=rank) for r in ranks], "sum")
                out = empty(count, dtype)
                run(dist.reduce_scatter, async_op, out, blocks, group=group)
                expect(equal(out, expected), f"{label} reduce_scatter {dtype} {count}")
                whole = torch.cat(blocks)
                out = empty(count, dtype)
                run(dist.reduce_scatter_tensor, async_op, out, whole, group=group)
                expect(equal(out, expected), f"{label} _reduce_scatter_base {dtype} {count}")
                if not async_op:
                    check_strided_output(
                        lambda out: dist.reduce_scatter_tensor(out, torch.cat(blocks), group=group),
                        expected, f"{label} _reduce_scatter_base strided {dtype} {count}")
                # In place: the output is this rank's own block of the input.
                whole = torch.cat(blocks)
                own = whole[rank * count:(rank + 1) * count]
                dist.reduce_scatter_tensor(own, whole, group=group)
                expect(equal(own, expected), f"{label} _reduce_scatter_base in place {dtype} {count}")
            for dtype in MOVED:
                check_movement(group, gloo, ranks, label, count, dtype, async_op)
        run(dist.barrier, async_op, group=group)


def check_movement(group, gloo, ranks, label, count, dtype, async_op):
    rank = dist.get_rank(group)
    world = len(ranks)
    everyone = [values(r, count, dtype) for r in ranks]
    mine = on_device(everyone[rank])
    gloo_moves = dtype not in (torch.bool, torch.complex64, torch.bfloat16, torch.int16)
    # broadcast from each root
    for root in range(world):
        ours = mine.clone()
        run(dist.broadcast, async_op, ours, src=ranks[root], group=group)
        expect(equal(ours, everyone[root]), f"{label} broadcast root {root} {dtype} {count}")
    # all_gather (list), checked against Gloo's where it takes the dtype
    outs = [empty(count, dtype) for _ in range(world)]
    run(dist.all_gather, async_op, outs, mine, group=group)
    expect(all(equal(o, e) for o, e in zip(outs, everyone)), f"{label} all_gather {dtype} {count}")
    if gloo_moves:
        gloo_outs = [torch.empty(count, dtype=dtype) for _ in range(world)]
        dist.all_gather(gloo_outs, everyone[rank], group=gloo)
        expect(all(equal(o, g) for o, g in zip(outs, gloo_outs)), f"{label} all_gather vs Gloo {dtype}")
    # _all_gather_base, out of place and in place (the input is this rank's block)
    out = empty(world * count, dtype)
    run(dist.all_gather_into_tensor, async_op, out, mine, group=group)
    expect(equal(out, torch.cat(everyone)), f"{label} _all_gather_base {dtype} {count}")
    out = torch.zeros(world * count, dtype=dtype, device=DEVICE[0])
    out[rank * count:(rank + 1) * count] = mine
    dist.all_gather_into_tensor(out, out[rank * count:(rank + 1) * count], group=group)
    expect(equal(out, torch.cat(everyone)), f"{label} _all_gather_base in place {dtype} {count}")
    # _all_gather_base into a strided output (every other element of a longer buffer) and into
    # the stacked form (world, count): the elements between stay as they were
    if not async_op:
        check_strided_output(lambda out: dist.all_gather_into_tensor(out, mine, group=group),
                             torch.cat(everyone), f"{label} _all_gather_base strided {dtype} {count}")
        out = empty(world * count, dtype).view(world, count)
        dist.all_gather_into_tensor(out, mine, group=group)
        expect(equal(out, torch.stack(everyone)), f"{label} _all_gather_base stacked {dtype} {count}")
    # all_gather_coalesced
    outs = [[empty(count, dtype) for _ in range(world)] for _ in range(2)]
    dist.all_gather_coalesced(outs, [mine, mine + 0 if dtype != torch.bool else mine.clone()],
                              group=group)
    expect(all(equal(o, e) for lst in outs for o, e in zip(lst, everyone)),
           f"{label} all_gather_coalesced {dtype} {count}")
    # gather and scatter to and from the last rank
    root = world - 1
    gathered = [empty(count, dtype) for _ in range(world)] if rank == root else None
    run(dist.gather, async_op, mine, gather_list=gathered, dst=ranks[root], group=group)
    if rank == root:
        expect(all(equal(o, e) for o, e in zip(gathered, everyone)), f"{label} gather {dtype} {count}")
    pieces = [on_device(values(ranks[root], count, dtype, salt=b)) for b in range(world)]
    out = empty(count, dtype)
    run(dist.scatter, async_op, out, scatter_list=pieces if rank == root else None,
        src=ranks[root], group=group)
    expect(equal(out, pieces[rank]), f"{label} scatter {dtype} {count}")
    # all_to_all_single and all_to_all: block b of rank s's input lands as block s on rank b
    inputs = [values(r, world * count, dtype, salt=7) for r in ranks]
    out = empty(world * count, dtype)
    run(dist.all_to_all_single, async_op, out, on_device(inputs[rank]), group=group)
    expected = torch.cat([inputs[s][rank * count:(rank + 1) * count] for s in range(world)])
    expect(equal(out, expected), f"{label} all_to_all_single {dtype} {count}")
    if gloo_moves:
        gloo_out = torch.empty(world * count, dtype=dtype)
        dist.all_to_all_single(gloo_out, inputs[rank], group=gloo)
        expect(equal(out, gloo_out), f"{label} all_to_all_single vs Gloo {dtype} {count}")
    if not async_op:
        strided_input = torch.stack([on_device(inputs[rank]), empty(world * count, dtype)], 1)[:, 0]
        check_strided_output(
            lambda out: dist.all_to_all_single(out, strided_input, group=group), expected,
            f"{label} all_to_all_single strided {dtype} {count}")
    outs = [empty(count, dtype) for _ in range(world)]
    run(dist.all_to_all, async_op, outs, list(on_device(inputs[rank]).split(count)), group=group)
    expect(equal(torch.cat(outs), expected), f"{label} all_to_all {dtype} {count}")
    # Uneven blocks: rows(s, t) rows of two columns from rank s to rank t (none for some pairs),
    # through all_to_all_single's split sizes and all_to_all's tensors of uneven sizes.
    sends = [[(count + 3 * s + 5 * t) % (count + 2) for t in range(world)] for s in range(world)]
    receives = [sends[s][rank] for s in range(world)]
    inputs = [values(r, 2 * sum(sends[s]), dtype, salt=11).view(-1, 2) for s, r in enumerate(ranks)]
    expected = torch.cat([inputs[s].split(sends[s])[rank] for s in range(world)])
    out = empty(2 * sum(receives), dtype).view(-1, 2)
    run(dist.all_to_all_single, async_op, out, on_device(inputs[rank]), receives, sends[rank],
        group=group)
    expect(equal(out, expected), f"{label} all_to_all_single uneven {dtype} {count}")
    if gloo_moves:
        gloo_out = torch.empty(sum(receives), 2, dtype=dtype)
        dist.all_to_all_single(gloo_out, inputs[rank], receives, sends[rank], group=gloo)
        expect(equal(out, gloo_out), f"{label} all_to_all_single uneven vs Gloo {dtype} {count}")
    outs = [empty(2 * n, dtype) for n in receives]
    run(dist.all_to_all, async_op, outs,
        [on_device(block.flatten()) for block in inputs[rank].split(sends[rank])], group=group)
    expect(equal(torch.cat(outs), expected.flatten()), f"{label} all_to_all uneven {dtype} {count}")
    # Uneven blocks into the input itself: each rank sends and receives as many rows in all.
    square = [[(count + 3 * ((s - t) % world)) % (count + 2) for t in range(world)]
              for s in range(world)]
    both = on_device(values(ranks[rank], 2 * sum(square[rank]), dtype, salt=13).view(-1, 2))
    expected = torch.cat([values(r, 2 * sum(square[s]), dtype, salt=13).view(-1, 2)
                          .split(square[s])[rank] for s, r in enumerate(ranks)])
    run(dist.all_to_all_single, async_op, both, both, [square[s][rank] for s in range(world)],
        square[rank], group=group)
    expect(equal(both, expected), f"{label} all_to_all_single uneven into its input {dtype} {count}")


def check_strided_output(call, expected, what):
    """`call(out)` on an output that is every other element of a buffer twice its length: the
    result in `out`, the elements between untouched."""
    buffer = torch.zeros(2 * expected.numel(), dtype=expected.dtype, device=DEVICE[0])
    between = values(99, expected.numel(), expected.dtype, salt=3)
    buffer[1::2] = on_device(between)
    out = buffer[0::2]
    assert expected.numel() < 2 or not out.is_contiguous()
    call(out)
    expect(equal(out, expected) and equal(buffer[1::2], between), what)


def check_parameters(world):
    """Tensors that require grad are written beneath autograd, as Gloo writes them."""
    rank = dist.get_rank()
    param = torch.nn.Parameter(torch.full((3,), float(rank), device=DEVICE[0]))
    dist.broadcast(param, src=world - 1)
    expect(equal(param.detach(), torch.full((3,), float(world - 1))),
           "broadcast into a parameter that requires grad")
    dist.all_reduce(param)
    expect(equal(param.detach(), torch.full((3,), float(world * (world - 1)))),
           "all_reduce of a parameter that requires grad")


def check_objects(world):
    """The object collectives (pickled into byte tensors, their sizes gathered first), as
    libraries use them for metrics and configuration."""
    rank = dist.get_rank()
    everyone = [{"rank": r, "name": "x" * r, "values": list(range(r))} for r in range(world)]
    gathered = [None] * world
    dist.all_gather_object(gathered, everyone[rank])
    expect(gathered == everyone, "all_gather_object")
    shared = [("root", world - 1), "a longer string " * 50] if rank == world - 1 else [None, None]
    dist.broadcast_object_list(shared, src=world - 1)
    expect(shared == [("root", world - 1), "a longer string " * 50], "broadcast_object_list")
    at_root = [None] * world if rank == 0 else None
    dist.gather_object(everyone[rank], at_root, dst=0)
    expect(rank != 0 or at_root == everyone, "gather_object")
    mine = [None]
    dist.scatter_object_list(mine, everyone if rank == 0 else None, src=0)
    expect(mine == [everyone[rank]], "scatter_object_list")


def check_subgroups(world):
    # Every rank enters new_group; members run inside it, the others go on.
    layouts = [list(range(world)), [0], list(range(0, world, 2)), list(range(world - 1, -1, -1))]
    if world >= 4:
        layouts.append([1, 2])
    for ranks in layouts:
        group = dist.new_group(ranks)
        gloo = dist.new_group(sorted(ranks), backend="gloo")
        if dist.get_rank() in ranks:
            ordered = sorted(ranks)
            label = f"subgroup {ranks}"
            for dtype in (torch.float32, torch.int64):
                mine = values(dist.get_rank(), 1000, dtype)
                ours, theirs = on_device(mine), mine.clone()
                dist.all_reduce(ours, group=group)
                dist.all_reduce(theirs, group=gloo)
                expect(equal(ours, theirs), f"{label} all_reduce {dtype}")
                outs = [empty(1000, dtype) for _ in ordered]
                dist.all_gather(outs, on_device(mine), group=group)
                expect(all(equal(o, values(r, 1000, dtype)) for o, r in zip(outs, ordered)),
                       f"{label} all_gather {dtype}")
                ours = on_device(mine)
                dist.broadcast(ours, src=ordered[-1], group=group)
                expect(equal(ours, values(ordered[-1], 1000, dtype)), f"{label} broadcast {dtype}")
            if len(ranks) == world and ranks == list(range(world)):
                check_calls(group, gloo, ordered, label)
        dist.barrier()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--init-file", required=True)
    parser.add_argument("--check", required=True,
                        choices=["calls", "ddp", "reproducible", "bad-input", "p2p", "dies",
                                 "p2p-dies", "exit"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="where the gradsync side's tensors lie")
    parser.add_argument("--shared-memory", type=int, metavar="BYTES",
                        help="CPU tensors of at least BYTES bytes in gradsync's shared memory")
    parser.add_argument("--no-job-name", action="store_true",
                        help="unset GRADSYNC_JOB: the ranks agree on a name through the store")
    args = parser.parse_args()
    try:
        gradsync.torch._backend.load_extension()
    except ImportError as error:
        print(f"skipped: {error}", flush=True)
        return 77
    if args.no_job_name:
        os.environ.pop("GRADSYNC_JOB", None)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    if args.device == "cuda":
        if not torch.cuda.is_available():
            print("skipped: no CUDA device PyTorch can use", flush=True)
            return 77
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        DEVICE[0] = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(DEVICE[0])
    if args.shared_memory is not None:
        gradsync.torch.use_shared_memory(args.shared_memory)
    timeout = datetime.timedelta(seconds=30 if args.check in ("dies", "p2p-dies", "exit") else 60)
    dist.init_process_group("gradsync", init_method=f"file://{args.init_file}", rank=rank,
                            world_size=world, timeout=timeout)
    expect(dist.get_backend() == "gradsync", "the default group's backend is gradsync")
    if args.check == "calls":
        gloo = dist.new_group(backend="gloo")
        check_calls(dist.group.WORLD, gloo, list(range(world)), "world")
        check_parameters(world)
        check_objects(world)
        check_subgroups(world)
        if args.shared_memory is not None:
            from backend_in_place import check_in_place
            check_in_place(None, list(range(world)), "world", expect)
            if world > 2:
                subgroup = dist.new_group([0, 2])  # every rank creates it; its members use it
                if rank in (0, 2):
                    check_in_place(subgroup, [0, 2], "subgroup", expect)
        status = 0
    elif args.check == "ddp":
        from backend_training import check_training
        status = check_training(args.steps, expect, DEVICE[0], args.shared_memory is not None)
    elif args.check == "reproducible":
        from backend_reproducible import check_reproducible
        status = check_reproducible(expect)
    elif args.check == "p2p":
        from backend_point_to_point import check_point_to_point
        check_point_to_point(expect, DEVICE[0], args.shared_memory is not None)
        status = 0
    elif args.check == "bad-input":
        from backend_faults import check_bad_input
        status = check_bad_input(expect)
    elif args.check == "exit":
        from backend_faults import check_exit_with_a_call_in_flight
        return check_exit_with_a_call_in_flight()
    elif args.check == "dies":
        from backend_faults import check_rank_dies
        return check_rank_dies()
    else:
        from backend_faults import check_point_to_point_rank_dies
        return check_point_to_point_rank_dies()
    if failures:
        print(f"rank {rank}: {len(failures)} checks failed", flush=True)
        return 1
    print(f"rank {rank}: all {checked[0]} checks passed", flush=True)
    dist.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main())
