#include "tests/gpu/gpu_testing.h"

#include <cuda.h>
#include <fmt/format.h>

#include <stdexcept>

namespace gradsync::gpu_testing {
namespace {

template <typename Function>
Function entry_point(const char* symbol) {
  Function function = nullptr;
  if (!daemon::driver_entry_point(symbol, function)) {
    throw std::runtime_error(fmt::format("the driver has no {}", symbol));
  }
  return function;
}

void check(CUresult status, const char* call) {
  if (status != CUDA_SUCCESS) {
    throw std::runtime_error(
        fmt::format("{} failed (CUresult {})", call, static_cast<int>(status)));
  }
}

}  // namespace

VmmMemory::VmmMemory(size_t min_bytes, int segments) {
  int device = 0;
  GRADSYNC_CUDA_CHECK(cudaGetDevice(&device));
  GRADSYNC_CUDA_CHECK(cudaFree(nullptr));  // the context the driver calls below use
  CUmemAllocationProp properties{};
  properties.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  properties.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  properties.location.id = device;
  properties.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t granularity = 0;
  check(entry_point<decltype(&cuMemGetAllocationGranularity)>("cuMemGetAllocationGranularity")(
            &granularity, &properties, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
        "cuMemGetAllocationGranularity");
  const size_t per_segment = (min_bytes / static_cast<size_t>(segments) + 1);
  segment_bytes_ = (per_segment + granularity - 1) / granularity * granularity;
  bytes_ = segment_bytes_ * static_cast<size_t>(segments);
  check(entry_point<decltype(&cuMemAddressReserve)>("cuMemAddressReserve")(&base_, bytes_, 0, 0, 0),
        "cuMemAddressReserve");
  const auto create = entry_point<decltype(&cuMemCreate)>("cuMemCreate");
  const auto map = entry_point<decltype(&cuMemMap)>("cuMemMap");
  for (int s = 0; s < segments; ++s) {
    CUmemGenericAllocationHandle handle = 0;
    check(create(&handle, segment_bytes_, &properties, 0), "cuMemCreate");
    handles_.push_back(handle);
    // Each segment mapped by a call of its own, as PyTorch grows a segment.
    check(map(base_ + static_cast<size_t>(s) * segment_bytes_, segment_bytes_, 0, handle, 0),
          "cuMemMap");
  }
  CUmemAccessDesc access{};
  access.location = properties.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  check(entry_point<decltype(&cuMemSetAccess)>("cuMemSetAccess")(base_, bytes_, &access, 1),
        "cuMemSetAccess");
}

VmmMemory::~VmmMemory() {
  try {
    const auto unmap = entry_point<decltype(&cuMemUnmap)>("cuMemUnmap");
    const auto release = entry_point<decltype(&cuMemRelease)>("cuMemRelease");
    for (size_t s = 0; s < handles_.size(); ++s) {
      (void)unmap(base_ + s * segment_bytes_, segment_bytes_);
      (void)release(handles_[s]);
    }
    (void)entry_point<decltype(&cuMemAddressFree)>("cuMemAddressFree")(base_, bytes_);
  } catch (const std::exception&) {  // the driver went away: so did the memory
  }
}

}  // namespace gradsync::gpu_testing
