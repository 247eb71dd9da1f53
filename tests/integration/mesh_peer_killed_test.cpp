// The transport beside a real daemon killed outright (SIGKILL: no goodbye, its sockets reset
// by the kernel). UCX runs an endpoint's error callback inside a send on a connection already
// reset, so the mesh must expect a peer to fail in the middle of its own sends.
#include "tests/integration/harness.h"
#include "tests/integration/loopback_cluster.h"
#include "transport/mesh.h"

#include <gmock/gmock.h>
#include <signal.h>

#include <thread>

namespace gradsync::testing {
namespace {

using Clock = std::chrono::steady_clock;

template <typename Done>
void progress_until(transport::Mesh& mesh, Done done, const char* what) {
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (!done()) {
    mesh.progress();
    ASSERT_LT(Clock::now(), deadline) << what << " within 10 s";
  }
}

// A liveness check (both connections pinged, one after the other) of a daemon killed after
// traffic reached its reset sockets: the first Ping fails the peer on the spot. The check
// fails it once, and the mesh connects again to the daemon restarted. (This crashed a daemon
// whose job failed as a peer died: it checked its other peers' liveness.)
TEST(MeshBesideADaemon, ALivenessCheckOfAPeerKilledOutrightFailsItAndItsRestartIsReached) {
  LoopbackCluster cluster(1, "", false, {""});
  transport::Mesh mesh(transport::MeshOptions{"127.0.0.1:0"});
  for (int round = 0; round < 3; ++round) {
    const transport::PeerId peer = mesh.connect(cluster.address(0));
    progress_until(
        mesh, [&] { return mesh.authenticated(peer); }, "the handshake ended");
    cluster.daemon(0).process().signal(SIGKILL);
    cluster.daemon(0).stop();  // reaps it: its sockets are closed
    // Unprogressed sends on both connections draw the resets the check's Pings then meet.
    auto bytes = std::make_shared<const std::vector<uint8_t>>(64, uint8_t{1});
    mesh.post(peer, 1, bytes, transport::Lane::kBulk);
    mesh.post(peer, 1, bytes, transport::Lane::kControl);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    mesh.check_alive(peer);
    progress_until(
        mesh, [&] { return mesh.failed(peer); }, "the killed daemon failed");
    EXPECT_THAT(mesh.failure(peer), ::testing::HasSubstr("its connection failed"));
    EXPECT_EQ(mesh.take_failed_peers(), std::vector<transport::PeerId>{peer});
    EXPECT_TRUE(mesh.take_failed_peers().empty()) << "a failure is reported once";
    cluster.restart(0);
  }
}

}  // namespace
}  // namespace gradsync::testing
