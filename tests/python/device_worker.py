"""One rank checking how device memory registrations are answered. Where this process has no
CUDA device (every CI machine), both ways of registering device memory fail with a reason,
and the communicator goes on serving host memory; with a device, a real CUDA tensor registers,
and a range past its allocation is refused. Exit status 0 when all pass."""
import ctypes
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "client", "python"))
import gradsync  # noqa: E402
from gradsync import _core, _library  # noqa: E402


def expect(condition, what):
    if not condition:
        raise AssertionError(what)


def main():
    comm = gradsync.init()
    lib = _core.library()
    handle = comm._handle

    # A description the daemon must check: a handle no driver issued, on a device no node has.
    memory = _library.CudaIpcMemory()
    for i in range(64):
        memory.handle[i] = (i * 37) & 0xFF
    memory.offset = 0
    for i in range(16):
        memory.device_uuid[i] = 0xA0 + i
    fake_address = 0x7F0000000000
    code = lib.gradsync_register_cuda_ipc(handle, fake_address, 4096, ctypes.byref(memory))
    message = refusal = comm._last_error()
    if torch.cuda.is_available():
        # A daemon with GPUs opens the handle: the made-up device is not one of them.
        expect(code == _core.ERR_INVALID_ARGUMENT, f"made-up handle: code {code}: {message}")
        expect("not one of this node's" in message, f"made-up device: {message}")
    else:
        expect(code == _core.ERR_UNSUPPORTED, f"device memory without a GPU: code {code}: {message}")
        expect("device memory is not served here" in message and "host memory only" in message,
               f"refusal gives the reason: {message}")
    # A null description is the caller's mistake, caught before the daemon.
    code = lib.gradsync_register_cuda_ipc(handle, fake_address, 4096, None)
    expect(code == _core.ERR_INVALID_ARGUMENT, f"null description: code {code}")

    # The driver path: host memory is not device memory, and without a driver there is none.
    host = comm.empty((1024,))
    code = lib.gradsync_register_device(handle, host.data_ptr(), 4096)
    message = comm._last_error()
    expect(code in (_core.ERR_UNSUPPORTED, _core.ERR_INVALID_ARGUMENT),
           f"host memory as device memory: code {code}: {message}")
    expect("register device memory" in message, f"message names the call: {message}")
    print("refusals:", refusal, "|", message, flush=True)

    if torch.cuda.is_available():
        tensor = torch.empty(1 << 20, dtype=torch.float32, device="cuda")
        nbytes = tensor.numel() * tensor.element_size()
        comm._check(lib.gradsync_register_device(handle, tensor.data_ptr(), nbytes))
        comm._check(lib.gradsync_unregister(handle, tensor.data_ptr()))
        code = lib.gradsync_register_device(handle, tensor.data_ptr(), 1 << 40)
        expect(code == _core.ERR_INVALID_ARGUMENT, f"range past the allocation: code {code}")

    if torch.cuda.is_available():
        # The Python API on CUDA tensors: registered, ordered on the current stream, no copies.
        size, rank = gradsync.size(), gradsync.rank()
        for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int64):
            t = (torch.arange(4099, device="cuda") % 13 + rank).to(dtype)
            gradsync.allreduce(t, name=f"cuda.{dtype}")
            expected = sum((torch.arange(4099) % 13 + r) for r in range(size)).to(dtype)
            expect(torch.equal(t.cpu(), expected), f"allreduce of a CUDA {dtype} tensor")
        gathered = gradsync.allgather(torch.full((5,), rank, device="cuda"), name="cuda.gather")
        expect(gathered.device.type == "cuda" and
               gathered.cpu().tolist() == [[float(r)] * 5 for r in range(size)], "allgather")

    # Nothing of that cost the communicator anything: host memory still works.
    host.fill_(gradsync.rank() + 1.0)
    gradsync.allreduce(host, name="after.refusals")
    size = gradsync.size()
    expect(bool((host == size * (size + 1) / 2).all()), "allreduce after the refusals")
    gradsync.shutdown()
    print("device registration checks passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
