#pragma once

#include <cuda_runtime_api.h>

namespace gradsync::gpu_testing {

// One thread spinning for `cycles` GPU clock cycles on `stream` (about 2e9 per second).
cudaError_t launch_spin(cudaStream_t stream, long long cycles);

}  // namespace gradsync::gpu_testing
