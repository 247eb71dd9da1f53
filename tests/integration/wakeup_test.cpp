// How a client and the engine wake each other: a client rings the doorbell only while the
// engine says it sleeps, so a busy engine costs its clients no system call per submission.
#include "tests/integration/harness.h"

#include "ipc/system.h"

namespace gradsync::testing {
namespace {

class WakeupTest : public DaemonTest {};

// The control thread makes a new client ring until the engine has attached it; an engine that
// then stays busy (here: spins a second after each piece of work) must take that request back
// itself, since it would otherwise fall only when the engine next sleeps.
TEST_F(WakeupTest, AnAttachedClientOfABusyEngineIsNotAskedToRing) {
  start_daemon("engine_spin_us = 1000000");
  RawClient client(socket());
  ASSERT_EQ(client.hello("wakeup", 0, 1).first, 0u);
  ipc::UniqueFd memfd = ipc::create_sealed_memfd("wakeup", 4096);
  ASSERT_EQ(client.register_buffer(1, memfd.get(), 0, 4096).first, 0u);
  const ipc::Mapping mapping(memfd.get(), 0, 4096);
  auto* data = static_cast<float*>(mapping.data());
  for (int i = 0; i < 1024; ++i) data[i] = static_cast<float>(i);
  client.submit(allreduce_entry("first", 1, 0, 1024));
  const ipc::CompletionEntry done = client.next_completion();
  EXPECT_EQ(done.status, GRADSYNC_OK) << std::string(done.message, done.message_length);
  EXPECT_EQ(data[1023], 1023.0f);  // one rank: the sum is its own input
  // The completion came from the engine's round, well inside its second of spinning.
  EXPECT_FALSE(client.daemon_asks_for_doorbell());
}

}  // namespace
}  // namespace gradsync::testing
