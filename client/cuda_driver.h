// The CUDA driver calls libgradsync makes to describe device memory for the daemon, loaded
// from libcuda.so.1 on first use: the library links no CUDA, and a process without a driver
// gets a clear error instead of a failure to load.
#pragma once

#include <gradsync/gradsync.h>

#include <cstddef>

namespace gradsync::client {

// The allocation holding [ptr, ptr + bytes) of device memory, its IPC handle, the range's
// offset in it and the device's UUID. Throws Error: no driver (GRADSYNC_ERR_UNSUPPORTED), not
// device memory, past the allocation's end, or memory CUDA IPC cannot share
// (GRADSYNC_ERR_INVALID_ARGUMENT).
gradsync_cuda_ipc_memory describe_device_memory(const void* ptr, size_t bytes);

}  // namespace gradsync::client
