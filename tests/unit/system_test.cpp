#include "ipc/system.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <utility>

namespace gradsync::ipc {
namespace {

// Whether the page at `address` is mapped in this process: msync fails with ENOMEM where not.
bool mapped(void* address) {
  return ::msync(address, 1, MS_ASYNC) == 0 || errno != ENOMEM;
}

TEST(Mapping, AnonymousMemoryReadsAsZerosAndIsUnmappedWithItsLastOwner) {
  constexpr size_t kBytes = size_t{3} << 20;
  Mapping memory = Mapping::anonymous(kBytes);
  ASSERT_NE(memory.data(), nullptr);
  ASSERT_EQ(memory.size(), kBytes);
  auto* bytes = static_cast<uint8_t*>(memory.data());
  for (size_t offset = 0; offset < kBytes; offset += 4096) ASSERT_EQ(bytes[offset], 0) << offset;
  bytes[kBytes - 1] = 7;
  EXPECT_EQ(bytes[kBytes - 1], 7);

  void* base = memory.data();
  Mapping moved = std::move(memory);
  EXPECT_EQ(memory.data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_EQ(moved.data(), base);
  EXPECT_TRUE(mapped(base));
  moved = Mapping();
  EXPECT_FALSE(mapped(base));
}

}  // namespace
}  // namespace gradsync::ipc
