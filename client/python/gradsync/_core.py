"""The Python client: a Communicator over libgradsync, asynchronous handles, errors.

Data the daemon reads and writes must live in gradsync's shared memory. Tensors made with
`Communicator.empty` live there already (zero copy). Any other tensor or array is copied into a
registered staging buffer, reduced there, and copied back; staging buffers are pooled by size,
so a training loop with stable shapes (DDP buckets) registers them once, not every step.

CUDA tensors are not copied: their memory is registered with the daemon (which opens it through
CUDA IPC, on a daemon with a GPU) and the collective is ordered on the current stream of their
device; wait() returns once the daemon's work is done, the stream waiting for the result.
"""
import contextlib
import ctypes
import threading
import weakref

from . import _library

# gradsync_result, gradsync_dtype and gradsync_op values (include/gradsync/gradsync.h; a test
# checks that they match).
OK, IN_PROGRESS = 0, 1
ERR_INVALID_ARGUMENT, ERR_CONNECT, ERR_PROTOCOL, ERR_PERMISSION = 2, 3, 4, 5
ERR_MISMATCH, ERR_PEER_FAILED, ERR_DAEMON_GONE, ERR_OUT_OF_MEMORY = 6, 7, 8, 9
ERR_INTERNAL, ERR_TIMEOUT, ERR_UNSUPPORTED = 10, 11, 12
FLOAT32, FLOAT64, FLOAT16, BFLOAT16, INT32, INT64 = 0, 1, 2, 3, 4, 5
OPS = {"sum": 0, "avg": 1, "average": 1, "mean": 1, "min": 2, "max": 3, "prod": 4, "product": 4,
       "band": 5, "bor": 6, "bxor": 7}  # the bitwise ops: integer dtypes only

_ELEMENT_BYTES = {FLOAT32: 4, FLOAT64: 8, FLOAT16: 2, BFLOAT16: 2, INT32: 4, INT64: 8}
_DTYPE_BY_NAME = {
    "float32": FLOAT32, "float": FLOAT32, "float64": FLOAT64, "double": FLOAT64,
    "float16": FLOAT16, "half": FLOAT16, "bfloat16": BFLOAT16, "int32": INT32, "int64": INT64,
}
_PAGE = 4096
AUTOTUNE_DEFAULT, AUTOTUNE_ON, AUTOTUNE_OFF = 0, 1, 2


class GradsyncError(RuntimeError):
    """A failed gradsync call: `code` is the gradsync_result, the message the daemon's."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


class InvalidArgumentError(GradsyncError, ValueError):
    pass


class MismatchError(GradsyncError):
    """Ranks disagree on a tensor's count, dtype, op or root."""


class PeerFailedError(GradsyncError):
    """Another rank of the job died or left."""


class DaemonGoneError(GradsyncError):
    """gradsyncd shut down or closed the connection."""


class TimeoutError_(GradsyncError):
    pass


class UnsupportedError(GradsyncError):
    """This build or machine cannot serve the request (device memory without a GPU)."""


_ERRORS = {ERR_INVALID_ARGUMENT: InvalidArgumentError, ERR_MISMATCH: MismatchError,
           ERR_PEER_FAILED: PeerFailedError, ERR_DAEMON_GONE: DaemonGoneError,
           ERR_TIMEOUT: TimeoutError_, ERR_UNSUPPORTED: UnsupportedError}

_lib = None
_lib_lock = threading.Lock()

# Heaps every communicator of the process uses in place (gradsync.torch's shared memory
# allocator's): attached to those open now and to each one that connects later.
_process_heaps = []
_open_communicators = weakref.WeakSet()


def use_heap_everywhere(heap):
    """Every communicator of the process, open or to come, uses the memory of the heap at
    address `heap` (a gradsync_heap*) in place."""
    if heap not in _process_heaps:
        _process_heaps.append(heap)
    for comm in list(_open_communicators):
        comm.attach_heap(heap)


def library():
    global _lib
    with _lib_lock:
        if _lib is None:
            _lib = _library.load()
        return _lib


def _error(code, message):
    return _ERRORS.get(code, GradsyncError)(code, message)


def _check_connect(lib, code):
    """Raises the error of a call made before a communicator exists (its message is the
    library's last connect error)."""
    if code != OK:
        raise _error(code, lib.gradsync_last_error(None).decode())


def node_address(socket_path=None):
    """The inter-node address (HOST:PORT) of the daemon at `socket_path` (default: the one
    GRADSYNC_SOCKET names): where the other nodes of a job reach it."""
    lib = library()
    address = ctypes.create_string_buffer(256)
    encoded = socket_path.encode() if socket_path else None
    _check_connect(lib, lib.gradsync_node_address(encoded, address, len(address)))
    return address.value.decode()


def _dtype_of(array):
    name = str(array.dtype).replace("torch.", "")
    if name not in _DTYPE_BY_NAME:
        raise InvalidArgumentError(ERR_INVALID_ARGUMENT, f"unsupported dtype {array.dtype}")
    return _DTYPE_BY_NAME[name]


def _is_torch(array):
    return type(array).__module__.startswith("torch")


def _is_cuda(array):
    return _is_torch(array) and array.device.type == "cuda"


def _address_and_bytes(array):
    """Data address and size of a contiguous torch tensor or NumPy array."""
    if _is_torch(array):
        if array.device.type not in ("cpu", "cuda"):
            raise InvalidArgumentError(ERR_INVALID_ARGUMENT,
                                       f"tensors on {array.device.type} are not supported")
        if not array.is_contiguous():
            raise InvalidArgumentError(ERR_INVALID_ARGUMENT, "tensor must be contiguous")
        return array.data_ptr(), array.numel() * array.element_size()
    if not array.flags["C_CONTIGUOUS"]:
        raise InvalidArgumentError(ERR_INVALID_ARGUMENT, "array must be C-contiguous")
    return array.ctypes.data, array.nbytes


class SharedBuffer:
    """Registered shared memory. Views made from it keep it alive; it must not outlive its
    communicator (closing the communicator unmaps it)."""

    def __init__(self, comm, nbytes):
        self._comm = comm
        self.nbytes = nbytes
        pointer = ctypes.c_void_p()
        comm._check(library().gradsync_alloc(comm._handle, nbytes, ctypes.byref(pointer)))
        self.address = pointer.value
        try:
            comm._check(library().gradsync_register(comm._handle, self.address, nbytes))
        except GradsyncError:
            library().gradsync_free(comm._handle, self.address)
            raise
        # Buffer-protocol object over the memory; it holds us, so views hold us.
        self._memory = (ctypes.c_char * nbytes).from_address(self.address)
        self._memory._owner = self

    def contains(self, address, nbytes):
        return self.address <= address and address + nbytes <= self.address + self.nbytes

    def tensor(self, dtype, count, offset=0):
        import torch
        return torch.frombuffer(self._memory, dtype=dtype, count=count, offset=offset)

    def numpy(self, dtype, count, offset=0):
        import numpy
        return numpy.frombuffer(self._memory, dtype=dtype, count=count, offset=offset)

    def free(self):
        if self.address is not None and self._comm._handle is not None:
            library().gradsync_free(self._comm._handle, self.address)
        self.address = None


class Handle:
    """An asynchronous collective. wait() returns its output (the input tensor for in-place
    collectives) or raises the daemon's error."""

    def __init__(self, comm, request, output, staging=None, copy_back=None):
        self._comm = comm
        self._request = request
        self._output = output
        self._staging = staging
        self._copy_back = copy_back
        self._done = False

    def wait(self):
        if not self._done:
            code = library().gradsync_wait(self._comm._handle, self._request)
            self._finish(code)
        return self._output

    def test(self):
        """True once complete (raising if it failed)."""
        if self._done:
            return True
        code = library().gradsync_test(self._comm._handle, self._request)
        if code == IN_PROGRESS:
            return False
        self._finish(code)
        return True

    def _finish(self, code):
        self._done = True
        try:
            if code != OK:
                raise _error(code, self._comm._last_error())
            if self._copy_back is not None:
                self._copy_back()
        finally:
            if self._staging is not None:
                self._comm._release_staging(self._staging)
                self._staging = None


class Communicator:
    """A connection to the node's gradsyncd as one rank of a job. Arguments default to the
    environment (GRADSYNC_SOCKET, GRADSYNC_JOB, RANK, WORLD_SIZE, LOCAL_RANK,
    LOCAL_WORLD_SIZE: torchrun's variables; GRADSYNC_ALGO, GRADSYNC_WIRE_CODEC,
    GRADSYNC_AUTOTUNE, GRADSYNC_AGGREGATORS).
    `algorithm`: the job's allreduce across nodes, "auto", "ring", "rhd", "direct" (float sums
    the same bits run after run: docs/multi-node.md), "aggregate" or "split";
    `wire_codec`: what the job's f32 allreduces send between nodes, "bf16" or "none";
    `autotune`: whether the daemons tune the job's settings over its first steps
    (docs/autotune.md); None leaves each to the environment or the daemon. Node 0's ranks
    decide these for the job. `aggregators`: "HOST:PORT,..." of the aggregators the job's
    allreduces across nodes may go through (docs/aggregators.md), the same on every node. Used
    by one thread at a time."""

    def __init__(self, socket=None, job=None, rank=None, world_size=None, local_rank=None,
                 local_world_size=None, timeout_ms=0, algorithm=None, wire_codec=None,
                 autotune=None, aggregators=None):
        lib = library()
        options = _library.Options()
        _check_connect(lib, lib.gradsync_options_from_env(ctypes.byref(options)))
        if socket is not None:
            options.socket_path = socket.encode()
        if job is not None:
            options.job = job.encode()
        for field, value in (("rank", rank), ("world_size", world_size),
                             ("local_rank", local_rank), ("local_world_size", local_world_size)):
            if value is not None:
                setattr(options, field, value)
        options.timeout_ms = timeout_ms
        if algorithm is not None:
            options.algorithm = algorithm.encode()
        self.rank, self.size = options.rank, options.world_size
        self.local_rank, self.local_size = options.local_rank, options.local_world_size
        self.job = options.job.decode()
        settings = _library.JobSettings()
        _check_connect(lib, lib.gradsync_job_settings_from_env(ctypes.byref(settings)))
        if wire_codec is not None:
            settings.wire_codec = wire_codec.encode()
        if autotune is not None:
            settings.autotune = AUTOTUNE_ON if autotune else AUTOTUNE_OFF
        if aggregators is not None:
            settings.aggregators = aggregators.encode()
        handle = ctypes.c_void_p()
        _check_connect(lib, lib.gradsync_connect_with(ctypes.byref(options), ctypes.byref(settings),
                                                      ctypes.byref(handle)))
        self._handle = handle
        self._buffers = []       # from empty(): zero-copy candidates
        self._staging_free = {}  # nbytes -> [SharedBuffer]
        self._staging_all = []
        self._device_ranges = {}  # registered CUDA memory: address -> nbytes
        self._heaps = []          # attached heaps (gradsync_heap* addresses): used in place
        self._stream = None       # the CUDA stream device collectives are ordered on
        self._priority = 0        # of the collectives submitted from now on (set_priority)
        for heap in _process_heaps:
            self.attach_heap(heap)
        _open_communicators.add(self)

    # -- lifetime -----------------------------------------------------------------------------
    def close(self):
        if self._handle is not None:
            for buffer in self._staging_all + self._buffers:
                buffer.free()
            library().gradsync_disconnect(self._handle)
            self._handle = None
            _open_communicators.discard(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the process exit closes the connection
            pass

    # -- memory -------------------------------------------------------------------------------
    def empty(self, shape, dtype=None):
        """A torch tensor in registered shared memory: collectives on it copy nothing."""
        import torch
        dtype = dtype or torch.float32
        count = 1
        for dim in (shape if isinstance(shape, (tuple, list)) else (shape,)):
            count *= dim
        nbytes = max(1, count) * torch.tensor([], dtype=dtype).element_size()
        buffer = SharedBuffer(self, nbytes)
        self._buffers.append(buffer)
        return buffer.tensor(dtype, count).view(shape)

    def _staging_for(self, nbytes):
        size = max(_PAGE, (nbytes + _PAGE - 1) // _PAGE * _PAGE)
        free = self._staging_free.setdefault(size, [])
        if free:
            return free.pop()
        buffer = SharedBuffer(self, size)
        self._staging_all.append(buffer)
        return buffer

    def _release_staging(self, buffer):
        self._staging_free.setdefault(buffer.nbytes, []).append(buffer)

    def attach_heap(self, heap):
        """Collectives use memory of the heap at address `heap` (a gradsync_heap*, such as the
        torch backend's shared memory allocator's) in place, without staging it."""
        if heap not in self._heaps:
            self._check(library().gradsync_attach_heap(self._handle, heap))
            self._heaps.append(heap)

    def _registered(self, address, nbytes):
        return (any(b.contains(address, nbytes) for b in self._buffers) or
                any(library().gradsync_heap_contains(heap, address, nbytes)
                    for heap in self._heaps))

    # -- collectives --------------------------------------------------------------------------
    def _check(self, code):
        if code != OK:
            raise _error(code, self._last_error())

    def _last_error(self):
        return library().gradsync_last_error(self._handle).decode(errors="replace")

    def waiting_for(self):
        """What this communicator's job waits for, as its daemon says: its oldest collective that
        some ranks (or nodes) submitted a second or more ago and others have not, naming those;
        "" when nothing waits. For a call that takes too long."""
        text = ctypes.create_string_buffer(4096)
        self._check(library().gradsync_waiting_for(self._handle, text, len(text)))
        return text.value.decode(errors="replace")

    def _submit(self, function, name, send_array, out_array, out_bytes, *args, send_blocks=1,
                priority=0):
        """Runs one collective from send_array into out_array, staging whichever is not in
        registered memory. The collective's count is send_array's elements over send_blocks (a
        reduce-scatter sends a block to each rank); it runs at `priority` (higher first)."""
        if priority != self._priority:
            if not -2**31 <= priority < 2**31:
                raise InvalidArgumentError(ERR_INVALID_ARGUMENT,
                                           f"priority {priority} is not a 32-bit integer")
            self._check(library().gradsync_set_priority(self._handle, int(priority)))
            self._priority = priority
        if _is_cuda(send_array) or _is_cuda(out_array):
            return self._submit_device(function, name, send_array, out_array, *args,
                                       send_blocks=send_blocks)
        dtype = _dtype_of(send_array)
        send_address, send_bytes = _address_and_bytes(send_array)
        out_address, _ = _address_and_bytes(out_array)
        count = send_bytes // _ELEMENT_BYTES[dtype] // send_blocks
        in_place = send_address == out_address
        staging = None
        copy_back = None
        if not (self._registered(send_address, send_bytes) and
                self._registered(out_address, out_bytes)):
            # Receive region first, send region after it (in place: the same region).
            total = out_bytes if in_place else out_bytes + send_bytes
            staging = self._staging_for(total)
            recv_staged = staging.address
            send_staged = recv_staged if in_place else recv_staged + out_bytes
            ctypes.memmove(send_staged, send_address, send_bytes)
            send_address, out_target, out_address = send_staged, out_address, recv_staged

            def copy_back(source=recv_staged, target=out_target, nbytes=out_bytes):
                ctypes.memmove(target, source, nbytes)
        request = ctypes.c_uint64()
        encoded = name.encode() if name is not None else None
        code = function(self._handle, encoded, send_address, out_address, count, dtype, *args,
                        ctypes.byref(request))
        if code != OK:
            if staging is not None:
                self._release_staging(staging)
            raise _error(code, self._last_error())
        return Handle(self, request.value, out_array, staging, copy_back)

    # -- CUDA tensors ---------------------------------------------------------------------------
    def _submit_device(self, function, name, send, out, *args, send_blocks=1):
        """A collective on CUDA tensors: their memory registered with the daemon (which opens it
        through CUDA IPC), ordered on the current stream of their device. The handle's wait()
        returns once the daemon's work is done, the stream waiting for it."""
        import torch
        if not (_is_cuda(send) and _is_cuda(out)) or send.device != out.device:
            raise InvalidArgumentError(ERR_INVALID_ARGUMENT,
                                       "send and output must be on the same CUDA device "
                                       "(or both in host memory)")
        dtype = _dtype_of(send)
        send_address, send_bytes = _address_and_bytes(send)
        out_address, out_bytes = _address_and_bytes(out)
        count = send_bytes // _ELEMENT_BYTES[dtype] // send_blocks
        encoded = name.encode() if name is not None else None
        with torch.cuda.device(send.device):
            stream = torch.cuda.current_stream(send.device).cuda_stream
            if stream != self._stream:
                self._check(library().gradsync_set_cuda_stream(self._handle, stream))
                self._stream = stream
            for attempt in range(2):
                if attempt > 0:
                    self._forget_device_range(send_address, send_bytes)
                    self._forget_device_range(out_address, out_bytes)
                self._register_device_range(send_address, send_bytes)
                self._register_device_range(out_address, out_bytes)
                request = ctypes.c_uint64()
                code = function(self._handle, encoded, send_address, out_address, count, dtype,
                                *args, ctypes.byref(request))
                if code == OK:
                    return Handle(self, request.value, out)
                message = self._last_error()
                # The caching allocator freed a block and allocated it again at the same address:
                # register the new memory once more, then try again.
                if code != ERR_INVALID_ARGUMENT or "freed" not in message or attempt > 0:
                    raise _error(code, message)
        raise AssertionError("unreachable")

    def _register_device_range(self, address, nbytes):
        """Registers [address, address + nbytes) of device memory unless a registration holds it
        already; registrations it overlaps are of memory since freed, and go first."""
        for start, size in self._device_ranges.items():
            if start <= address and address + nbytes <= start + size:
                return
        self._forget_device_range(address, nbytes)
        self._check(library().gradsync_register_device(self._handle, address, nbytes))
        self._device_ranges[address] = nbytes

    def _forget_device_range(self, address, nbytes):
        """Unregisters every device registration overlapping [address, address + nbytes)."""
        for start in [a for a, n in self._device_ranges.items()
                      if a < address + nbytes and address < a + n]:
            del self._device_ranges[start]
            library().gradsync_unregister(self._handle, start)

    def allreduce(self, tensor, name=None, op="sum", out=None, async_op=False, priority=0):
        """Reduces `tensor` across the job's ranks into `out` (default: in place)."""
        if op not in OPS:
            raise InvalidArgumentError(ERR_INVALID_ARGUMENT, f"unknown op {op!r}")
        out = tensor if out is None else out
        _, nbytes = _address_and_bytes(tensor)
        handle = self._submit(library().gradsync_allreduce, name, tensor, out, nbytes, OPS[op],
                              priority=priority)
        return handle if async_op else handle.wait()

    def broadcast(self, tensor, root=0, name=None, async_op=False, priority=0):
        """Replaces `tensor` on every rank with root's."""
        _, nbytes = _address_and_bytes(tensor)
        handle = self._submit(library().gradsync_broadcast, name, tensor, tensor, nbytes, root,
                              priority=priority)
        return handle if async_op else handle.wait()

    def allgather(self, tensor, name=None, async_op=False, priority=0):
        """Every rank's `tensor`, concatenated along a new first dimension of size()."""
        out = self._new_like(tensor, (self.size,) + tuple(tensor.shape))
        _, nbytes = _address_and_bytes(out)
        handle = self._submit(library().gradsync_allgather, name, tensor, out, nbytes,
                              priority=priority)
        return handle if async_op else handle.wait()

    def _blocks_per_rank(self, call, tensor):
        """Checks that `tensor` holds one block per rank along its first dimension."""
        shape = tuple(tensor.shape)
        if not shape or shape[0] != self.size:
            raise InvalidArgumentError(
                ERR_INVALID_ARGUMENT,
                f"{call} takes one block per rank along the first dimension: "
                f"{self.size} ranks, a tensor of shape {shape}")
        return shape

    def _check_out_bytes(self, call, out, expected):
        _, nbytes = _address_and_bytes(out)
        if nbytes != expected:
            raise InvalidArgumentError(ERR_INVALID_ARGUMENT,
                                       f"{call}'s out holds {nbytes} bytes, where {expected} "
                                       "are due")
        return nbytes

    def reduce_scatter(self, tensor, name=None, op="sum", out=None, async_op=False, priority=0):
        """Reduces `tensor` across the job's ranks and keeps this rank's block: `tensor` holds
        one block per rank along its first dimension (of size()), and the result is block
        rank(), shaped as tensor[0], in `out` (default: a new array)."""
        if op not in OPS:
            raise InvalidArgumentError(ERR_INVALID_ARGUMENT, f"unknown op {op!r}")
        shape = self._blocks_per_rank("reduce_scatter", tensor)
        out = self._new_like(tensor, shape[1:]) if out is None else out
        _, send_bytes = _address_and_bytes(tensor)
        nbytes = self._check_out_bytes("reduce_scatter", out, send_bytes // self.size)
        handle = self._submit(library().gradsync_reduce_scatter, name, tensor, out, nbytes,
                              OPS[op], send_blocks=self.size, priority=priority)
        return handle if async_op else handle.wait()

    def alltoall(self, tensor, name=None, out=None, async_op=False, priority=0):
        """Exchanges blocks: `tensor` holds one block per rank along its first dimension, block
        r going to rank r; the result, of the same shape, holds block r from rank r, in `out`
        (default: a new array; never `tensor` itself)."""
        shape = self._blocks_per_rank("alltoall", tensor)
        out = self._new_like(tensor, shape) if out is None else out
        _, send_bytes = _address_and_bytes(tensor)
        nbytes = self._check_out_bytes("alltoall", out, send_bytes)
        handle = self._submit(library().gradsync_alltoall, name, tensor, out, nbytes,
                              send_blocks=self.size, priority=priority)
        return handle if async_op else handle.wait()

    def barrier(self):
        request = ctypes.c_uint64()
        self._check(library().gradsync_barrier(self._handle, ctypes.byref(request)))
        Handle(self, request.value, None).wait()

    @contextlib.contextmanager
    def group(self):
        """Collectives submitted inside run as one unit (fused whole)."""
        self._check(library().gradsync_group_start(self._handle))
        try:
            yield
        finally:
            self._check(library().gradsync_group_end(self._handle))

    @staticmethod
    def _new_like(array, shape):
        if _is_torch(array):
            import torch
            return torch.empty(shape, dtype=array.dtype, device=array.device)
        import numpy
        return numpy.empty(shape, dtype=array.dtype)
