"""gradsync: gradient communication through the node's gradsyncd.

    import gradsync
    gradsync.init()                      # identity from torchrun's environment
    gradsync.allreduce(tensor, name="w", op="avg")
    h = gradsync.allreduce(tensor, async_op=True); h.wait()

The module-level functions use one default Communicator made by init(); create Communicator
objects directly to hold several. PyTorch DDP: see gradsync.torch.
"""
from ._core import (Communicator, DaemonGoneError, GradsyncError, Handle, InvalidArgumentError,
                    MismatchError, PeerFailedError, SharedBuffer, UnsupportedError, node_address)

__all__ = ["Communicator", "DaemonGoneError", "GradsyncError", "Handle", "InvalidArgumentError",
           "MismatchError", "PeerFailedError", "SharedBuffer", "UnsupportedError", "init",
           "node_address",
           "shutdown",
           "communicator", "rank", "size", "local_rank", "local_size", "allreduce", "broadcast",
           "allgather", "reduce_scatter", "alltoall", "barrier", "empty"]

_default = None


def init(**options):
    """Connects the default communicator (keyword arguments as for Communicator)."""
    global _default
    if _default is None:
        _default = Communicator(**options)
    return _default


def shutdown():
    global _default
    if _default is not None:
        _default.close()
        _default = None


def communicator():
    if _default is None:
        raise GradsyncError(2, "gradsync.init() has not been called")
    return _default


def rank():
    return communicator().rank


def size():
    return communicator().size


def local_rank():
    return communicator().local_rank


def local_size():
    return communicator().local_size


def allreduce(tensor, name=None, op="sum", out=None, async_op=False, priority=0):
    return communicator().allreduce(tensor, name=name, op=op, out=out, async_op=async_op,
                                    priority=priority)


def broadcast(tensor, root=0, name=None, async_op=False, priority=0):
    return communicator().broadcast(tensor, root=root, name=name, async_op=async_op,
                                    priority=priority)


def allgather(tensor, name=None, async_op=False, priority=0):
    return communicator().allgather(tensor, name=name, async_op=async_op, priority=priority)


def reduce_scatter(tensor, name=None, op="sum", out=None, async_op=False, priority=0):
    return communicator().reduce_scatter(tensor, name=name, op=op, out=out, async_op=async_op,
                                         priority=priority)


def alltoall(tensor, name=None, out=None, async_op=False, priority=0):
    return communicator().alltoall(tensor, name=name, out=out, async_op=async_op,
                                   priority=priority)


def barrier():
    communicator().barrier()


def empty(shape, dtype=None):
    return communicator().empty(shape, dtype)
