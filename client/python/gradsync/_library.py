"""Finds and declares libgradsync (ctypes): GRADSYNC_LIBRARY, then the installed library, then
the build tree of the repository this package sits in."""
import ctypes
import ctypes.util
import os
from pathlib import Path


class Options(ctypes.Structure):
    """gradsync_options (include/gradsync/gradsync.h)."""
    _fields_ = [
        ("socket_path", ctypes.c_char * 108),
        ("job", ctypes.c_char * 64),
        ("rank", ctypes.c_int32),
        ("world_size", ctypes.c_int32),
        ("local_rank", ctypes.c_int32),
        ("local_world_size", ctypes.c_int32),
        ("timeout_ms", ctypes.c_int32),
        ("nodes", ctypes.c_char * 1024),
        ("node_rank", ctypes.c_int32),
        ("algorithm", ctypes.c_char * 16),
    ]


class JobSettings(ctypes.Structure):
    """gradsync_job_settings (include/gradsync/gradsync.h, API version 9): struct_bytes says
    how much of the library's struct this one holds."""
    _fields_ = [
        ("struct_bytes", ctypes.c_uint32),
        ("wire_codec", ctypes.c_char * 16),
        ("autotune", ctypes.c_int),  # gradsync_autotune: 0 the daemon decides, 1 on, 2 off
        ("aggregators", ctypes.c_char * 1024),  # HOST:PORT,...; b"": the daemon's default
    ]

    def __init__(self):
        super().__init__()
        self.struct_bytes = ctypes.sizeof(self)


class CudaIpcMemory(ctypes.Structure):
    """gradsync_cuda_ipc_memory (include/gradsync/gradsync.h)."""
    _fields_ = [
        ("handle", ctypes.c_uint8 * 64),
        ("offset", ctypes.c_uint64),
        ("device_uuid", ctypes.c_uint8 * 16),
    ]


def _candidates():
    explicit = os.environ.get("GRADSYNC_LIBRARY")
    if explicit:
        yield explicit
        return
    installed = ctypes.util.find_library("gradsync")
    if installed:
        yield installed
    for prefix in ("/usr/local/lib", "/usr/lib", "/usr/lib/x86_64-linux-gnu"):
        yield os.path.join(prefix, "libgradsync.so")
    repository = Path(__file__).resolve().parents[3]
    yield str(repository / "build" / "libgradsync.so")


def load():
    errors = []
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError as error:
            errors.append(f"{path}: {error}")
            continue
        _declare(lib)
        return lib
    raise OSError("libgradsync.so not found (set GRADSYNC_LIBRARY); tried:\n  " + "\n  ".join(errors))


def _declare(lib):
    c_int, c_size, c_void, c_char = ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_char_p
    comm = ctypes.c_void_p
    request = ctypes.c_uint64
    signatures = {
        "gradsync_options_from_env": ([ctypes.POINTER(Options)], c_int),
        "gradsync_connect": ([ctypes.POINTER(Options), ctypes.POINTER(comm)], c_int),
        "gradsync_job_settings_from_env": ([ctypes.POINTER(JobSettings)], c_int),
        "gradsync_connect_with": ([ctypes.POINTER(Options), ctypes.POINTER(JobSettings),
                                   ctypes.POINTER(comm)], c_int),
        "gradsync_disconnect": ([comm], None),
        "gradsync_alloc": ([comm, c_size, ctypes.POINTER(c_void)], c_int),
        "gradsync_free": ([comm, c_void], c_int),
        "gradsync_register": ([comm, c_void, c_size], c_int),
        "gradsync_unregister": ([comm, c_void], c_int),
        "gradsync_attach_heap": ([comm, c_void], c_int),
        "gradsync_heap_contains": ([c_void, c_void, c_size], c_int),
        "gradsync_register_cuda_ipc": ([comm, c_void, c_size, ctypes.POINTER(CudaIpcMemory)],
                                       c_int),
        "gradsync_register_device": ([comm, c_void, c_size], c_int),
        "gradsync_set_cuda_stream": ([comm, c_void], c_int),
        "gradsync_unset_cuda_stream": ([comm], c_int),
        "gradsync_set_priority": ([comm, ctypes.c_int32], c_int),
        "gradsync_allreduce": ([comm, c_char, c_void, c_void, c_size, c_int, c_int,
                                ctypes.POINTER(request)], c_int),
        "gradsync_broadcast": ([comm, c_char, c_void, c_void, c_size, c_int, ctypes.c_int32,
                                ctypes.POINTER(request)], c_int),
        "gradsync_allgather": ([comm, c_char, c_void, c_void, c_size, c_int,
                                ctypes.POINTER(request)], c_int),
        "gradsync_reduce_scatter": ([comm, c_char, c_void, c_void, c_size, c_int, c_int,
                                     ctypes.POINTER(request)], c_int),
        "gradsync_alltoall": ([comm, c_char, c_void, c_void, c_size, c_int,
                               ctypes.POINTER(request)], c_int),
        "gradsync_barrier": ([comm, ctypes.POINTER(request)], c_int),
        "gradsync_node_address": ([c_char, ctypes.c_char_p, c_size], c_int),
        "gradsync_group_start": ([comm], c_int),
        "gradsync_group_end": ([comm], c_int),
        "gradsync_wait": ([comm, request], c_int),
        "gradsync_test": ([comm, request], c_int),
        "gradsync_wait_timeout": ([comm, request, ctypes.c_int32], c_int),
        "gradsync_waiting_for": ([comm, ctypes.c_char_p, c_size], c_int),
        "gradsync_last_error": ([comm], c_char),
        "gradsync_result_string": ([c_int], c_char),
    }
    for name, (arguments, result) in signatures.items():
        function = getattr(lib, name)
        function.argtypes = arguments
        function.restype = result
