"""PyTorch integration: DDP communication hooks and parameter broadcast.

    model = DDP(model)
    model.register_comm_hook(gradsync.torch.GradsyncState(), gradsync.torch.allreduce_hook)

The hooks average each gradient bucket through gradsyncd while backward goes on (the daemon
reduces bucket i while autograd computes bucket i+1) and complete every bucket's future before
the last bucket's hook returns, which is before DDP waits for them. Bucket buffers are staged in
shared memory registered once and reused every step.
"""
import itertools

import torch

from . import _core

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


def _reduce_bucket(state, bucket, wire_dtype):
    buffer = bucket.buffer()
    name = f"{state.prefix}.bucket{bucket.index()}"
    if wire_dtype is None or wire_dtype == buffer.dtype:
        handle = state.comm.allreduce(buffer, name=name, op="avg", async_op=True)
        future = state._track(handle, lambda: buffer)
    else:
        # Compressed on the wire: the daemon accumulates 16-bit floats in float32.
        compressed = buffer.to(wire_dtype)
        handle = state.comm.allreduce(compressed, name=name, op="avg", async_op=True)
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
