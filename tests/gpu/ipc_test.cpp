// CUDA IPC as the daemon uses it: a second process (the daemon's part, played by this binary
// with --ipc-child) opens a rank's allocation through Devices, maps two pieces of it (one
// open allocation between them), reduces in it, is refused a range past its end, and lets go;
// and the mapping cache evicts and opens again what no work holds.
#include "daemon/device/devices.h"
#include "daemon/memory/mapping_cache.h"
#include "kernels/cuda/reduce.h"
#include "tests/gpu/gpu_testing.h"
#include "tools/common/process.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <iostream>
#include <string>

namespace gradsync::gpu_testing {
namespace {

constexpr size_t kAllocationBytes = 3 << 20;
constexpr size_t kPieceOffset = 1 << 20;  // the piece the child doubles: [1 MiB, 2 MiB)
constexpr size_t kPieceBytes = 1 << 20;

std::string to_hex(const uint8_t* data, size_t bytes) {
  std::string text;
  for (size_t i = 0; i < bytes; ++i) text += fmt::format("{:02x}", data[i]);
  return text;
}

template <size_t N>
std::array<uint8_t, N> from_hex(const std::string& text) {
  std::array<uint8_t, N> bytes{};
  for (size_t i = 0; i < N && 2 * i + 1 < text.size(); ++i) {
    bytes[i] = static_cast<uint8_t>(std::stoi(text.substr(2 * i, 2), nullptr, 16));
  }
  return bytes;
}

daemon::DeviceHandle export_handle(const DeviceMemory& memory, size_t offset, size_t bytes) {
  cudaIpcMemHandle_t ipc{};
  GRADSYNC_CUDA_CHECK(cudaIpcGetMemHandle(&ipc, memory.data()));
  int device = 0;
  GRADSYNC_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp properties{};
  GRADSYNC_CUDA_CHECK(cudaGetDeviceProperties(&properties, device));
  daemon::DeviceHandle handle;
  std::memcpy(handle.ipc.data(), ipc.reserved, handle.ipc.size());
  std::memcpy(handle.device.data(), properties.uuid.bytes, handle.device.size());
  handle.offset = offset;
  handle.bytes = bytes;
  return handle;
}

TEST(DeviceIpc, ASecondProcessOpensReducesInAndReleasesARanksMemory) {
  DeviceMemory memory(kAllocationBytes);
  const std::vector<float> ones(kAllocationBytes / sizeof(float), 1.0f);
  GRADSYNC_CUDA_CHECK(
      cudaMemcpy(memory.data(), ones.data(), kAllocationBytes, cudaMemcpyHostToDevice));
  const daemon::DeviceHandle handle = export_handle(memory, kPieceOffset, kPieceBytes);

  tools::ChildProcess child(
      {"/proc/self/exe", kIpcChildFlag, to_hex(handle.ipc.data(), handle.ipc.size()),
       to_hex(handle.device.data(), handle.device.size())},
      {});
  const auto status = child.wait_for(std::chrono::seconds(60));
  ASSERT_TRUE(status.has_value()) << "the IPC child hung";
  ASSERT_EQ(*status, 0) << "the IPC child failed (its reason is on stderr)";

  std::vector<float> after(kAllocationBytes / sizeof(float));
  GRADSYNC_CUDA_CHECK(
      cudaMemcpy(after.data(), memory.data(), kAllocationBytes, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < after.size(); ++i) {
    const size_t byte = i * sizeof(float);
    const bool in_piece = byte >= kPieceOffset && byte < kPieceOffset + kPieceBytes;
    ASSERT_EQ(after[i], in_piece ? 2.0f : 1.0f) << "element " << i;
  }
}

}  // namespace

int ipc_child(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: " << argv[0] << " " << kIpcChildFlag << " HANDLE_HEX UUID_HEX\n";
    return 2;
  }
  try {
    const daemon::Devices devices = daemon::Devices::probe();
    if (!devices.available()) throw std::runtime_error(devices.summary());
    daemon::DeviceHandle handle;
    handle.ipc = from_hex<daemon::kIpcHandleBytes>(argv[2]);
    handle.device = from_hex<16>(argv[3]);

    // Two pieces of one allocation: one open mapping between them (CUDA opens a handle once).
    handle.offset = kPieceOffset;
    handle.bytes = kPieceBytes;
    auto piece = devices.map(handle);
    handle.offset = 0;
    handle.bytes = kAllocationBytes;
    auto whole = devices.map(handle);
    if (piece->allocation != whole->allocation || whole->data + kPieceOffset != piece->data) {
      throw std::runtime_error("two pieces of one allocation were opened twice");
    }
    // A range past the allocation's end is refused, naming the allocation's size.
    handle.offset = kAllocationBytes - 4;
    handle.bytes = 8;
    try {
      (void)devices.map(handle);
      throw std::runtime_error("a range past the allocation was accepted");
    } catch (const daemon::DeviceError& e) {
      if (std::string(e.what()).find("outside its allocation") == std::string::npos) throw;
    }
    // A device this node does not have.
    handle.device[0] ^= 0xff;
    try {
      (void)devices.map(handle);
      throw std::runtime_error("an unknown device was accepted");
    } catch (const daemon::DeviceError& e) {
      if (std::string(e.what()).find("not one of this node's") == std::string::npos) throw;
    }

    // piece += piece, in place, on the daemon's side of the mapping.
    const daemon::DeviceScope scope(piece->device);
    const void* inputs[] = {piece->data, piece->data};
    void* outputs[] = {piece->data};
    GRADSYNC_CUDA_CHECK(kernels::cuda::reduce_to_all(GRADSYNC_FLOAT32, GRADSYNC_SUM, inputs, 2,
                                                     outputs, 1, kPieceBytes / sizeof(float),
                                                     nullptr));
    GRADSYNC_CUDA_CHECK(cudaDeviceSynchronize());

    // Released when its last piece goes, and opened again on the next use.
    piece.reset();
    whole.reset();
    handle.device = from_hex<16>(argv[3]);
    handle.offset = kPieceOffset;
    handle.bytes = kPieceBytes;
    if (devices.map(handle)->allocation.get() == nullptr) {
      throw std::runtime_error("an allocation closed could not be opened again");
    }

    // The mapping cache over device memory: with room for one mapping, two registrations
    // alternate, each use evicting the other's mapping (the allocation closes with the last).
    daemon::MappingCache<daemon::DeviceMapper> cache(daemon::DeviceMapper(devices), 1);
    handle.device = from_hex<16>(argv[3]);
    handle.offset = 0;
    handle.bytes = kPieceOffset;
    cache.add({1, 1}, handle);
    handle.offset = kPieceOffset;
    handle.bytes = kPieceBytes;
    cache.add({1, 2}, handle);
    // One acquire per statement: a mapping held (a temporary alive to the end of its
    // expression) is never evicted.
    for (int round = 0; round < 3; ++round) {
      for (const daemon::MappingKey key : {daemon::MappingKey{1, 1}, daemon::MappingKey{1, 2}}) {
        if (!cache.acquire(key)) throw std::runtime_error("a registered buffer did not map");
      }
    }
    if (cache.counters().evictions < 5) throw std::runtime_error("the cache did not evict");
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "ipc child: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace gradsync::gpu_testing
