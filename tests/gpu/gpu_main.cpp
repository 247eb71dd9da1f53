// The GPU tests' entry point: where no CUDA device is usable they skip, saying why (exit 77,
// which ctest reports as skipped); the same binary is the second process of the IPC tests.
#include "tests/gpu/gpu_testing.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], gradsync::gpu_testing::kIpcChildFlag) == 0) {
    return gradsync::gpu_testing::ipc_child(argc, argv);
  }
  if (argc >= 2 && std::strcmp(argv[1], gradsync::gpu_testing::kRankChildFlag) == 0) {
    return gradsync::gpu_testing::rank_child();
  }
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess || devices == 0) {
    std::printf("gpu tests skipped: no usable CUDA device (cudaGetDeviceCount: %s)\n",
                status != cudaSuccess ? cudaGetErrorString(status) : "none");
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
