"""PyTorch integration: torch.distributed's backend "gradsync", DDP communication hooks and
parameter broadcast.

    import gradsync.torch                      # registers the backend
    dist.init_process_group("gradsync")        # under torchrun: nothing else to set
    model = DDP(model)                         # DDP's own allreduce runs in gradsyncd

or, with gradsync's own communicator and no backend:

    model = DDP(model)
    model.register_comm_hook(gradsync.torch.GradsyncState(), gradsync.torch.allreduce_hook)

or DASO's hierarchical, partly asynchronous synchronisation instead of DDP (daso.py):

    opt = gradsync.torch.DASO(model, optimizer, total_epochs=30)

or each gradient averaged while the next forward runs, the first layers' first (overlap.py):

    opt = gradsync.torch.overlap_forward(model, optimizer)

The hooks average each gradient bucket through gradsyncd while backward goes on (the daemon
reduces bucket i while autograd computes bucket i+1) and complete every bucket's future before
the last bucket's hook returns, which is before DDP waits for them. Bucket buffers are staged in
shared memory registered once and reused every step. Each bucket runs at the priority of its
index: DDP fills bucket 0 with the last layers, so the first layers' bucket goes first when
several are waiting (docs/priority.md).
"""
import contextlib
import itertools

import torch

from . import _backend, _core
from .daso import DASO, node_groups  # noqa: F401  (gradsync.torch.DASO)
from .overlap import OverlapForward, overlap_forward  # noqa: F401

_backend.register()

_state_ids = itertools.count()


class GradsyncState:
    """Hook state: the communicator and the collectives in flight for this step."""

    def __init__(self, comm=None, name=None):
        if comm is None:
            from . import init
            comm = init()
        self.comm = comm
        self.prefix = name or f"ddp{next(_state_ids)}"
        self._in_flight = []  # (handle, future, finish)

    def _track(self, handle, finish):
        future = torch.futures.Future()
        self._in_flight.append((handle, future, finish))
        return future

    def _complete_all(self):
        """Waits for every bucket of the step; a failure fails every future and raises."""
        in_flight, self._in_flight = self._in_flight, []
        error = None
        for handle, future, finish in in_flight:
            if error is None:
                try:
                    handle.wait()
                    future.set_result(finish())
                    continue
                except _core.GradsyncError as failure:
                    error = failure
            future.set_exception(error)
        if error is not None:
            raise error


@contextlib.contextmanager
def priority(value, group=None):
    """Collectives called through the gradsync process group `group` (default: the default
    group) inside run at priority `value` (higher first; docs/priority.md)."""
    import torch.distributed as dist
    process_group = group if group is not None else dist.distributed_c10d._get_default_group()
    if not hasattr(process_group, "priority"):
        raise RuntimeError(f"gradsync.torch.priority: {type(process_group).__name__} is not "
                           "a gradsync process group")
    before = process_group.priority
    process_group.priority = value
    try:
        yield
    finally:
        process_group.priority = before


def use_shared_memory(min_bytes=1 << 20):
    """CPU tensors of at least `min_bytes` bytes allocated from now on live in shared memory
    gradsyncd maps, so that the gradsync backend's collectives run on them where they lie
    instead of copying them into memory of its own and back (docs/python.md). Call it before
    the model and DDP are built, so that DDP's buckets are among them; 0 stops (tensors already
    allocated stay where they are). Children the process forks (DataLoader workers) share
    these tensors' memory rather than copying it, as with Tensor.share_memory_()."""
    if min_bytes < 0:
        raise ValueError(f"gradsync.torch.use_shared_memory: min_bytes {min_bytes} is negative")
    extension = _backend.load_extension()
    extension.use_shared_memory(int(min_bytes))
    # The package's communicators too (gradsync.init(), the hooks' GradsyncState): their calls
    # on these tensors run in place as well.
    _core.use_heap_everywhere(extension.shared_memory_heap())


def in_shared_memory(tensor):
    """Whether `tensor` lies in gradsync's shared memory (use_shared_memory)."""
    return _backend.load_extension().in_shared_memory(tensor)


def _default_group_is_gradsync():
    import torch.distributed as dist
    return (dist.is_available() and dist.is_initialized() and
            dist.get_backend() == _backend.BACKEND)


def _reduce_on_default_group(bucket, wire_dtype):
    """A hook called with state None (PyTorch's hooks mean the default group by it), where the
    default group is gradsync's: the bucket's average through the backend."""
    import torch.distributed as dist
    buffer = bucket.buffer()
    sent = buffer if wire_dtype is None else buffer.to(wire_dtype)
    sent.div_(dist.get_world_size())
    with priority(bucket.index()):
        future = dist.all_reduce(sent, async_op=True).get_future()
    return future.then(lambda done: buffer.copy_(done.value()[0]) if sent is not buffer
                       else done.value()[0])


_default_state = None


def _reduce_bucket(state, bucket, wire_dtype):
    global _default_state
    if state is None:
        if _default_group_is_gradsync():
            return _reduce_on_default_group(bucket, wire_dtype)
        # No gradsync process group: the default communicator, gradsync.init()'s.
        if _default_state is None:
            _default_state = GradsyncState()
        state = _default_state
    buffer = bucket.buffer()
    name = f"{state.prefix}.bucket{bucket.index()}"
    if wire_dtype is None or wire_dtype == buffer.dtype:
        handle = state.comm.allreduce(buffer, name=name, op="avg", async_op=True,
                                      priority=bucket.index())
        future = state._track(handle, lambda: buffer)
    else:
        # Compressed on the wire: the daemon accumulates 16-bit floats in float32.
        compressed = buffer.to(wire_dtype)
        handle = state.comm.allreduce(compressed, name=name, op="avg", async_op=True,
                                      priority=bucket.index())
        future = state._track(handle, lambda: buffer.copy_(compressed))
    if bucket.is_last():
        state._complete_all()
    return future


def allreduce_hook(state, bucket):
    """Averages the bucket's gradients over all ranks (DDP's default semantics)."""
    return _reduce_bucket(state, bucket, None)


def fp16_compress_hook(state, bucket):
    """As allreduce_hook, with float16 gradients in the collective."""
    return _reduce_bucket(state, bucket, torch.float16)


def bfloat16_compress_hook(state, bucket):
    """As allreduce_hook, with bfloat16 gradients in the collective. (Not named
    bf16_compress_hook: DDP refuses a hook of that name without CUDA and NCCL.)"""
    return _reduce_bucket(state, bucket, torch.bfloat16)


def broadcast_parameters(module_or_state, root=0, comm=None, prefix="params"):
    """Makes every rank's parameters and buffers equal root's, in one grouped collective."""
    if comm is None:
        from . import init
        comm = init()
    state = (module_or_state.state_dict() if isinstance(module_or_state, torch.nn.Module)
             else module_or_state)
    handles = []
    with torch.no_grad(), comm.group():
        for key, value in state.items():
            if torch.is_tensor(value) and value.numel() > 0:
                handles.append(comm.broadcast(value.data, root=root, name=f"{prefix}.{key}",
                                              async_op=True))
    for handle in handles:
        handle.wait()
