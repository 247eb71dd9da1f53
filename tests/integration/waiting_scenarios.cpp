// gradsync-test-rank's scenarios of waiting: tensors some ranks withhold (the stall inspector,
// gradsync_waiting_for), gradsync_wait_timeout, and a loop that runs until something fails.
#include "tests/integration/rank_scenarios.h"
#include "tools/common/reference.h"

#include <gradsync/gradsync.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

namespace gradsync::testing {

// The first `submitters` ranks submit a tensor the other ranks withhold (they sleep until
// killed): the daemon's stall inspector must name it and them, and with stall_shutdown_seconds
// fail the job with that message (a submitter then exits 0 if it got a timeout naming the
// tensor and `missing`).
int scenario_withhold(Communicator& comm, const RankIdentity& me, const std::string& missing,
                      int submitters) {
  SharedBuffer buf = comm.allocate(4096);
  if (me.rank >= submitters) {
    std::this_thread::sleep_for(std::chrono::seconds(120));
    return 0;
  }
  const gradsync_request r =
      comm.allreduce("withheld.tensor", buf.data(), buf.data(), 16, GRADSYNC_FLOAT32, GRADSYNC_SUM);
  const gradsync_result result = gradsync_wait(comm.get(), r);
  const std::string message = gradsync_last_error(comm.get());
  std::printf("%d %s\n", result, message.c_str());
  // With several nodes submitting, the first to give up fails the job on the others too.
  EXPECT_OR_FAIL(
      me, result == GRADSYNC_ERR_TIMEOUT || (submitters > 1 && result == GRADSYNC_ERR_PEER_FAILED),
      "expected a timeout, got %d (%s)", result, message.c_str());
  EXPECT_OR_FAIL(me,
                 message.find("withheld.tensor") != std::string::npos &&
                     message.find(missing) != std::string::npos,
                 "the message does not name the tensor and '%s': %s", missing.c_str(),
                 message.c_str());
  return 0;
}

// Rank 0 submits a tensor the other ranks withhold (they sleep until killed) and asks the daemon
// what its job waits for: nothing at first, nor just after (ranks submit a moment apart: a
// stall has waited a second), then the tensor and `missing`, within 10 s.
int scenario_waiting_for(Communicator& comm, const RankIdentity& me, const std::string& missing) {
  SharedBuffer buf = comm.allocate(4096);
  if (me.rank != 0) {
    std::this_thread::sleep_for(std::chrono::seconds(120));
    return 0;
  }
  const std::string before = comm.waiting_for();
  EXPECT_OR_FAIL(me, before.empty(), "the job waits for something before any submission: %s",
                 before.c_str());
  const auto submitted = std::chrono::steady_clock::now();
  comm.allreduce("withheld.tensor", buf.data(), buf.data(), 16, GRADSYNC_FLOAT32, GRADSYNC_SUM);
  const std::string just_after = comm.waiting_for();
  // Only where the answer came well within the second can it be held to that.
  if (std::chrono::steady_clock::now() - submitted < std::chrono::milliseconds(500)) {
    EXPECT_OR_FAIL(me, just_after.empty(), "a collective submitted a moment ago is a stall: %s",
                   just_after.c_str());
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::string waiting;
  // Until the other nodes' reports of the cycle arrive, the daemon knows only that it waits
  // for "the other nodes"; then it names those that have not submitted.
  while (std::chrono::steady_clock::now() < deadline) {
    waiting = comm.waiting_for();
    if (waiting.find("withheld.tensor") != std::string::npos &&
        waiting.find(missing) != std::string::npos) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::printf("waiting for: %s\n", waiting.c_str());
  EXPECT_OR_FAIL(me,
                 waiting.find("withheld.tensor") != std::string::npos &&
                     waiting.find(missing) != std::string::npos,
                 "the daemon's answer does not name the tensor and '%s': %s", missing.c_str(),
                 waiting.c_str());
  EXPECT_OR_FAIL(me, waiting.find("has waited 0 s") == std::string::npos,
                 "a stall younger than a second was reported: %s", waiting.c_str());
  // A buffer too small for the answer gets as much of it as fits.
  char small[8];
  EXPECT_OR_FAIL(me,
                 gradsync_waiting_for(comm.get(), small, sizeof(small)) == GRADSYNC_OK &&
                     std::strlen(small) == sizeof(small) - 1,
                 "a short buffer did not get the answer cut short: '%s'", small);
  return 0;  // with the request in flight: the rank leaves, as a rank that gives up would
}

// gradsync_wait_timeout: rank 0's allreduce is still in flight after a short wait while the
// other ranks hold theirs back (IN_PROGRESS, the request still valid), then completes.
int scenario_wait_timeout(Communicator& comm, const RankIdentity& me) {
  constexpr size_t kCount = 1000;
  SharedBuffer buf = comm.allocate(kCount * sizeof(float));
  auto* data = buf.as<float>();
  reference::fill_input(data, kCount, GRADSYNC_FLOAT32, me.rank, GRADSYNC_SUM, 0);
  if (me.rank != 0) std::this_thread::sleep_for(std::chrono::seconds(2));
  const gradsync_request r =
      comm.allreduce("held", data, data, kCount, GRADSYNC_FLOAT32, GRADSYNC_SUM);
  if (me.rank == 0) {
    const gradsync_result negative = gradsync_wait_timeout(comm.get(), r, -1);
    EXPECT_OR_FAIL(me, negative == GRADSYNC_ERR_INVALID_ARGUMENT, "a negative timeout gave %s",
                   gradsync_result_string(negative));
    if (me.ranks > 1) {
      const gradsync_result early = gradsync_wait_timeout(comm.get(), r, 50);
      EXPECT_OR_FAIL(me, early == GRADSYNC_IN_PROGRESS,
                     "a wait before the others submitted gave %s", gradsync_result_string(early));
    }
  }
  const gradsync_result done = gradsync_wait_timeout(comm.get(), r, 60'000);
  EXPECT_OR_FAIL(me, done == GRADSYNC_OK, "the wait gave %s: %s", gradsync_result_string(done),
                 gradsync_last_error(comm.get()));
  const size_t wrong = reference::count_wrong(reference::Kind::kAllreduce, data, kCount,
                                              GRADSYNC_FLOAT32, GRADSYNC_SUM, me.ranks, 0, 0);
  EXPECT_OR_FAIL(me, wrong == 0, "%zu wrong", wrong);
  return 0;
}

// Allreduce in a loop until something fails; the exit status is the failure's result code.
// `polling` waits with gradsync_test instead of gradsync_wait.
int scenario_loop(Communicator& comm, const RankIdentity& me, size_t bytes, bool polling,
                  bool broadcast) {
  SharedBuffer buf = comm.allocate(bytes);
  std::printf("ready\n");
  std::fflush(stdout);
  while (true) {
    gradsync_request r = 0;
    gradsync_result result =
        broadcast ? gradsync_broadcast(comm.get(), "loop", buf.data(), buf.data(), bytes / 4,
                                       GRADSYNC_FLOAT32, 0, &r)
                  : gradsync_allreduce(comm.get(), "loop", buf.data(), buf.data(), bytes / 4,
                                       GRADSYNC_FLOAT32, GRADSYNC_SUM, &r);
    if (result == GRADSYNC_OK && polling) {
      do {
        result = gradsync_test(comm.get(), r);
      } while (result == GRADSYNC_IN_PROGRESS);
    } else if (result == GRADSYNC_OK) {
      result = gradsync_wait(comm.get(), r);
    }
    if (result != GRADSYNC_OK) {
      std::printf("rank %d: loop ended: %s: %s\n", me.rank, gradsync_result_string(result),
                  gradsync_last_error(comm.get()));
      return static_cast<int>(result);
    }
  }
}

}  // namespace gradsync::testing
