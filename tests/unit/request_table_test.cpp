// The client's table of requests: every id keeps its state until taken, whatever the order of
// completions and takes, and the window it keeps stays bounded by what is not taken.
#include "client/request_table.h"

#include <gtest/gtest.h>

namespace gradsync::client {
namespace {

using State = RequestTable::State;

TEST(RequestTable, ARequestIsPendingThenFinishedThenGone) {
  RequestTable table;
  EXPECT_EQ(table.state(1), State::kUnknown);
  table.add(1);
  EXPECT_TRUE(table.pending(1));
  EXPECT_TRUE(table.finish(1, GRADSYNC_ERR_MISMATCH, "tensor 'w': ranks disagree"));
  EXPECT_TRUE(table.finished(1));
  EXPECT_FALSE(table.finish(1, GRADSYNC_OK, "")) << "a second completion changes nothing";
  const RequestTable::Outcome outcome = table.take(1);
  EXPECT_EQ(outcome.status, GRADSYNC_ERR_MISMATCH);
  EXPECT_EQ(outcome.message, "tensor 'w': ranks disagree");
  EXPECT_EQ(table.state(1), State::kUnknown);
}

TEST(RequestTable, CompletionsAndTakesInAnyOrderKeepEveryOutcome) {
  RequestTable table;
  for (uint64_t id = 10; id < 20; ++id) table.add(id);
  for (uint64_t id = 19; id >= 10; --id) {
    ASSERT_TRUE(table.finish(id, GRADSYNC_OK, "message " + std::to_string(id)));
  }
  for (const uint64_t id : {15, 10, 19, 11, 12, 13, 14, 16, 18, 17}) {
    ASSERT_TRUE(table.finished(id)) << id;
    EXPECT_EQ(table.take(id).message, "message " + std::to_string(id));
    EXPECT_EQ(table.state(id), State::kUnknown) << id;
  }
  table.add(20);
  EXPECT_TRUE(table.pending(20));
}

TEST(RequestTable, IdsNeverAddedAndCompletionsNotOursAreUnknown) {
  RequestTable table;
  table.add(3);
  table.add(7);  // 4 to 6 were handed out and never submitted
  for (const uint64_t id : {1, 2, 4, 5, 6, 8}) {
    EXPECT_EQ(table.state(id), State::kUnknown) << id;
    EXPECT_FALSE(table.finish(id, GRADSYNC_OK, "")) << id;
  }
  EXPECT_TRUE(table.pending(3));
  EXPECT_TRUE(table.pending(7));
}

TEST(RequestTable, AnAbandonedRequestIgnoresItsCompletion) {
  RequestTable table;
  table.add(1);
  table.add(2);
  table.abandon(1);
  EXPECT_EQ(table.state(1), State::kUnknown);
  EXPECT_FALSE(table.finish(1, GRADSYNC_ERR_DAEMON_GONE, "late"));
  EXPECT_TRUE(table.finish(2, GRADSYNC_OK, ""));
  EXPECT_EQ(table.take(2).status, GRADSYNC_OK);
}

// One request never taken (a caller that never waits on it) must not keep every later id
// alive, nor lose its own outcome, however many steps go by.
TEST(RequestTable, ARequestNeverTakenKeepsItsOutcomeAndTheRestMoveOn) {
  RequestTable table;
  table.add(1);
  ASSERT_TRUE(table.finish(1, GRADSYNC_OK, "kept"));
  for (uint64_t id = 2; id < 100000; ++id) {
    table.add(id);
    ASSERT_TRUE(table.finish(id, GRADSYNC_OK, ""));
    ASSERT_EQ(table.take(id).status, GRADSYNC_OK);
  }
  EXPECT_EQ(table.take(1).message, "kept");
  table.add(100000);
  EXPECT_TRUE(table.pending(100000));
  EXPECT_EQ(table.window(), 1U);
}

// Pending requests old enough to leave the window still complete and are taken.
TEST(RequestTable, RequestsOutOfTheWindowStillCompleteAndAreTaken) {
  RequestTable table;
  table.add(1);
  table.add(2);
  for (uint64_t id = 3; id < 10000; ++id) {
    table.add(id);
    ASSERT_TRUE(table.finish(id, GRADSYNC_OK, ""));
    ASSERT_EQ(table.take(id).status, GRADSYNC_OK);
  }
  EXPECT_LE(table.window(), 2U);
  EXPECT_TRUE(table.pending(1));
  EXPECT_TRUE(table.finish(1, GRADSYNC_ERR_PEER_FAILED, "node 1 died"));
  EXPECT_EQ(table.take(1).message, "node 1 died");
  table.abandon(2);
  EXPECT_EQ(table.state(2), State::kUnknown);
  EXPECT_FALSE(table.finish(2, GRADSYNC_OK, ""));
}

}  // namespace
}  // namespace gradsync::client
