// A kernel that keeps a stream busy for a while: the event-ordering tests put it before the
// writes a collective must wait for, so that a daemon that did not wait would read stale data.
#include "tests/gpu/spin_kernel.h"

namespace gradsync::gpu_testing {
namespace {

__global__ void spin(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

}  // namespace

cudaError_t launch_spin(cudaStream_t stream, long long cycles) {
  spin<<<1, 1, 0, stream>>>(cycles);
  return cudaGetLastError();
}

}  // namespace gradsync::gpu_testing
