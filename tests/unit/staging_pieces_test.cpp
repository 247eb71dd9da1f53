// How a device allreduce across nodes is cut into pieces (device_staging.h): every node must
// cut alike from the agreed count and dtype, every piece but the last whole 16-byte packs, the
// pieces covering the elements exactly, and no more of them than kMaxStagingPieces.
#include "daemon/collectives/internode/device_staging.h"

#include <gtest/gtest.h>

namespace gradsync::daemon {
namespace {

ReadyCollective collective(ipc::Collective kind, gradsync_dtype dtype, uint64_t count, int device) {
  ReadyCollective c;
  Submission& s = c.ranks.emplace_back();
  s.collective = kind;
  s.dtype = dtype;
  s.count = count;
  s.device = device;
  return c;
}

TEST(StagingPieces, HostMemoryAndCollectivesOtherThanAllreduceRunWhole) {
  for (const uint64_t count : {uint64_t{0}, uint64_t{1} << 30}) {
    EXPECT_EQ(staging_pieces(
                  collective(ipc::Collective::kAllreduce, GRADSYNC_FLOAT32, count, kHostMemory))
                  .count,
              1u);
    EXPECT_EQ(
        staging_pieces(collective(ipc::Collective::kBroadcast, GRADSYNC_FLOAT32, count, 0)).count,
        1u);
    EXPECT_EQ(
        staging_pieces(collective(ipc::Collective::kAllgather, GRADSYNC_FLOAT32, count, 0)).count,
        1u);
  }
}

TEST(StagingPieces, PiecesCoverTheElementsInWholePacks) {
  for (const gradsync_dtype dtype : {GRADSYNC_FLOAT16, GRADSYNC_FLOAT32, GRADSYNC_FLOAT64}) {
    const uint64_t element = ipc::dtype_bytes(dtype);
    const uint64_t pack = 16 / element;
    for (const uint64_t count :
         {uint64_t{0}, uint64_t{1}, uint64_t{7}, kStagingPieceBytes / element,
          kStagingPieceBytes / element + 1, (uint64_t{5} << 20) + 3, uint64_t{100} << 20,
          (uint64_t{1} << 31) + 5}) {
      SCOPED_TRACE(testing::Message() << ipc::dtype_name(dtype) << " count " << count);
      const StagingPieces pieces =
          staging_pieces(collective(ipc::Collective::kAllreduce, dtype, count, 0));
      ASSERT_GE(pieces.count, 1u);
      EXPECT_LE(pieces.count, kMaxStagingPieces);
      if (count == 0) continue;
      EXPECT_EQ(pieces.elements % pack, 0u);
      // The last piece holds at least one element, and the pieces all of them.
      EXPECT_LT((pieces.count - 1) * pieces.elements, count);
      EXPECT_GE(pieces.count * pieces.elements, count);
      // Small enough to overlap: a piece is about kStagingPieceBytes unless the cap on their
      // number makes it larger.
      if (count * element > kStagingPieceBytes * kMaxStagingPieces) {
        EXPECT_EQ(pieces.count, kMaxStagingPieces);
      } else {
        EXPECT_LE(pieces.elements * element, kStagingPieceBytes + 32);
      }
    }
  }
}

TEST(StagingPieces, ALargeTensorIsCutSoThatCopiesOverlapTheNetwork) {
  // 20 MiB and 12 bytes of f32: six pieces, the last one short.
  const StagingPieces pieces = staging_pieces(
      collective(ipc::Collective::kAllreduce, GRADSYNC_FLOAT32, (uint64_t{5} << 20) + 3, 0));
  EXPECT_EQ(pieces.count, 6u);
  EXPECT_EQ(pieces.elements, 873816u);
}

}  // namespace
}  // namespace gradsync::daemon
