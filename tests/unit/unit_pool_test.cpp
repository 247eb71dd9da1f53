// The storage a job keeps of finished collectives: handed out again empty, with its capacity,
// and never holding on to what the collectives held (their buffers' mappings).
#include "daemon/job/unit_pool.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

namespace gradsync::daemon {
namespace {

ReadyUnit unit_of(UnitPool& pool, const std::string& name,
                  const std::shared_ptr<const void>& buffer) {
  std::vector<Submission> ranks = pool.ranks();
  for (int r = 0; r < 2; ++r) {
    Submission s;
    s.name = pool.name();
    s.name.assign(name);
    s.send_buffer = buffer;
    s.recv_buffer = buffer;
    ranks.push_back(std::move(s));
  }
  ReadyUnit unit{pool.collectives()};
  unit.collectives.push_back(ReadyCollective{std::move(ranks), {}});
  return unit;
}

TEST(UnitPool, HandsStorageBackEmptyWithItsCapacity) {
  UnitPool pool;
  const std::string name = "layer4.2.conv3.weight.grad";  // longer than a short string's buffer
  auto buffer = std::make_shared<int>(0);
  pool.recycle(unit_of(pool, name, buffer));
  const std::string reused = pool.name();
  EXPECT_TRUE(reused.empty());
  EXPECT_GE(reused.capacity(), name.size());
  const std::vector<Submission> ranks = pool.ranks();
  EXPECT_TRUE(ranks.empty());
  EXPECT_GE(ranks.capacity(), 2u);
  const std::vector<ReadyCollective> collectives = pool.collectives();
  EXPECT_TRUE(collectives.empty());
  EXPECT_GE(collectives.capacity(), 1u);
  EXPECT_EQ(pool.collectives().capacity(), 0u) << "one unit's storage was handed out twice";
}

TEST(UnitPool, ReleasesTheMappingsAUnitHeldWhenItTakesItBack) {
  UnitPool pool;
  auto buffer = std::make_shared<int>(0);
  pool.recycle(unit_of(pool, "w", buffer));
  EXPECT_EQ(buffer.use_count(), 1) << "the pool keeps a finished collective's buffer mapped";
}

TEST(UnitPool, KeepsABoundedAmount) {
  UnitPool pool;
  std::vector<ReadyUnit> units;
  units.reserve(5000);
  for (int i = 0; i < 5000; ++i) units.push_back(unit_of(pool, "tensor." + std::to_string(i), {}));
  for (auto& unit : units) pool.recycle(std::move(unit));
  size_t kept = 0;
  while (pool.collectives().capacity() > 0) ++kept;
  EXPECT_EQ(kept, UnitPool::kMaxSpare);
}

}  // namespace
}  // namespace gradsync::daemon
