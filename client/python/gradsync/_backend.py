"""torch.distributed's backend "gradsync": finds the C++ process group (gradsync._torch_backend,
built against libtorch) and registers it with torch.distributed.

Each process group, the default one and every dist.new_group, is a job of its own in the
daemon. Its ranks agree through the group's store on what the daemon needs to know: the job's
name (GRADSYNC_JOB, or one rank 0 makes up, so that two jobs on one node never collide), which
ranks share a node (each rank's local rank and the node's count), and which nodes the group
spans (a group on one node is a one-node job: it never touches the network). Where no
GRADSYNC_NODES lists the nodes' daemons, each node's first rank asks its daemon for its
inter-node address and publishes it in the store, and every rank reads the list from there.
"""
import atexit
import ctypes
import functools
import glob
import importlib.machinery
import importlib.util
import inspect
import os
import secrets
import socket
import weakref
from pathlib import Path

from . import _core, _library

BACKEND = "gradsync"
_JOB_NAME_BYTES = 63
# The groups this process created, each stopped as the interpreter exits (_shut_down).
_groups = weakref.WeakSet()
# The job of this process's default group, where it is a gradsync group: every later group's job
# is a part of it (a rank that dies fails each group holding it, even one it never joined).
_default_group_job = {"name": ""}


def _extension_candidates():
    """Beside the library GRADSYNC_LIBRARY names, beside this package (installed), then the
    build tree of the repository this package sits in."""
    directories = []
    explicit = os.environ.get("GRADSYNC_LIBRARY")
    if explicit:
        directories.append(Path(explicit).resolve().parent)
    here = Path(__file__).resolve().parent
    directories += [here, here.parents[2] / "build"]
    for directory in directories:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            yield from sorted(glob.glob(str(directory / f"_torch_backend{suffix}")))


@functools.cache
def load_extension():
    """The extension module, loaded once; libgradsync is loaded first, so that the extension
    links against the library the package chose."""
    _core.library()
    for path in _extension_candidates():
        spec = importlib.util.spec_from_file_location("gradsync._torch_backend", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    raise ImportError("gradsync: the torch.distributed backend (_torch_backend) is not built "
                      "here: it needs libtorch-dev and pybind11-dev when gradsync is built")


def register():
    """Registers the backend with torch.distributed (once per process)."""
    import torch.distributed as dist
    if BACKEND.upper() in dist.Backend._plugins:
        return
    options = {"extended_api": True}
    if "devices" in inspect.signature(dist.Backend.register_backend).parameters:
        options["devices"] = ["cpu", "cuda"]  # PyTorch 2 asks which devices a backend serves
    dist.Backend.register_backend(BACKEND, _create_process_group, **options)
    atexit.register(_shut_down)


def _shut_down():
    """Runs every group's queued calls to their end before the interpreter finalizes: a group
    left to be destroyed during finalization would have its worker thread, which takes the GIL
    to complete a call's future, stopped by the interpreter in the middle of it."""
    for group in list(_groups):
        group.shutdown()


def _environment():
    options = _library.Options()
    lib = _core.library()
    _core._check_connect(lib, lib.gradsync_options_from_env(ctypes.byref(options)))
    nodes = [node for node in options.nodes.decode().split(",") if node]
    node_rank = options.node_rank
    if nodes and node_rank < 0 and os.environ.get("GROUP_RANK", "").isdigit():
        node_rank = int(os.environ["GROUP_RANK"])  # torchrun's node rank
    return options.socket_path.decode(), nodes, node_rank


def _job_name(store, rank, is_default_group, group_id):
    configured = os.environ.get("GRADSYNC_JOB")
    if configured:
        name = configured if is_default_group else f"{configured}.{group_id}"
    elif rank == 0:
        host = socket.gethostname().split(".")[0][:20]
        name = f"torch.{host}.{os.getpid()}.{secrets.token_hex(4)}"
        store.set("gradsync/job", name)
    else:
        name = store.get("gradsync/job").decode()
    if len(name.encode()) > _JOB_NAME_BYTES:
        raise ValueError(f"gradsync: job name '{name}' is longer than {_JOB_NAME_BYTES} bytes "
                         "(shorten GRADSYNC_JOB)")
    return name


def _group_layout(store, rank, size, socket_path, nodes, node_rank, is_default_group):
    """This rank's local rank and its node's rank count, the inter-node addresses of the nodes
    the group spans (none for a group on one node), and each member's node as an index into
    them, from every member's node as the store tells it."""
    if nodes and node_rank >= 0:
        node = str(node_rank)
    else:
        node = f"{socket.gethostname()}:{socket_path}"
    store.set(f"gradsync/node/{rank}", node)
    members = [store.get(f"gradsync/node/{r}").decode() for r in range(size)]
    local = [r for r in range(size) if members[r] == node]
    distinct = sorted(set(members), key=members.index)
    if len(distinct) == 1:
        return local.index(rank), len(local), [], [0] * size
    if not nodes:
        addresses = _node_addresses(store, rank, members, distinct, node, socket_path)
        return local.index(rank), len(local), addresses, [distinct.index(m) for m in members]
    if is_default_group:
        return local.index(rank), len(local), nodes, [int(m) for m in members]
    if node_rank < 0:
        raise RuntimeError("gradsync: a process group across some of the nodes needs each "
                           "rank's node: set GRADSYNC_NODE_RANK (torchrun's GROUP_RANK serves "
                           "as well)")
    spanned = sorted(int(member) for member in distinct)
    return (local.index(rank), len(local), [nodes[n] for n in spanned],
            [spanned.index(int(member)) for member in members])


def _node_addresses(store, rank, members, distinct, node, socket_path):
    """The inter-node addresses of the daemons of the `distinct` nodes of `members` (each rank's
    node, in rank order; `distinct` in order of each node's first rank): each node's first rank
    publishes its own daemon's, every rank reads them all."""
    index = distinct.index(node)
    if members.index(node) == rank:
        store.set(f"gradsync/address/{index}", _core.node_address(socket_path))
    addresses = [store.get(f"gradsync/address/{i}").decode() for i in range(len(distinct))]
    for i, address in enumerate(addresses):
        if addresses.index(address) != i:
            raise RuntimeError(
                f"gradsync: the daemons of two nodes (ranks {members.index(distinct[i])} and "
                f"{members.index(distinct[addresses.index(address)])}) both say their "
                f"inter-node address is {address}: give each daemon an address the other "
                "nodes reach it at (`listen` in its configuration)")
    return addresses


def _create_process_group(options, pg_options):
    """torch.distributed's creator (extended API): one call per process group member."""
    if pg_options is not None:
        raise RuntimeError("gradsync: the backend takes no pg_options")
    extension = load_extension()
    store, rank, size = options.store, options.group_rank, options.group_size
    is_default_group = len(options.global_ranks_in_group) == 0
    socket_path, nodes, node_rank = _environment()
    job = _job_name(store, rank, is_default_group, options.group_id)
    local_rank, local_size, addresses, member_nodes = _group_layout(
        store, rank, size, socket_path, nodes, node_rank, is_default_group)
    if is_default_group:
        _default_group_job["name"] = job
    parent_job = "" if is_default_group else _default_group_job["name"]
    parent_ranks = list(options.global_ranks_in_group) if parent_job else []
    group = extension.ProcessGroupGradsync(
        rank=rank, size=size, local_rank=local_rank, local_size=local_size, job=job,
        socket=socket_path, nodes=",".join(addresses), node_rank=member_nodes[rank],
        member_addresses=[addresses[n] if addresses else "" for n in member_nodes],
        parent_job=parent_job, parent_ranks=parent_ranks, timeout=options.timeout)
    _groups.add(group)
    return group
