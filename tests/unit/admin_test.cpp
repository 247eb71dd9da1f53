// What gradsyncctl's status shows to whom: the operator sees everything, anyone else only
// their own clients and jobs.
#include "daemon/control/admin.h"

#include <gtest/gtest.h>

#include <map>

namespace gradsync::daemon {
namespace {

constexpr uid_t kDaemonUid = 999;

EngineSnapshot two_users() {
  EngineSnapshot snapshot;
  snapshot.clients = {ClientView{1, 100, 1000, "alice-job"}, ClientView{2, 101, 1001, "bob-job"},
                      ClientView{3, 102, 1000, "alice-job"}};
  snapshot.jobs = {JobView{"alice-job"}, JobView{"bob-job"}, JobView{"orphan"}};
  snapshot.peers = {PeerView{"198.18.0.2:9478"}};
  return snapshot;
}

std::optional<uid_t> owner_of(const std::string& job) {
  static const std::map<std::string, uid_t> owners = {{"alice-job", 1000}, {"bob-job", 1001}};
  const auto it = owners.find(job);
  return it == owners.end() ? std::nullopt : std::optional<uid_t>(it->second);
}

TEST(RestrictToViewer, TheOperatorSeesEverything) {
  for (const uid_t operator_uid : {uid_t{0}, kDaemonUid}) {
    EngineSnapshot snapshot = two_users();
    restrict_to_viewer(snapshot, operator_uid, kDaemonUid, owner_of);
    EXPECT_EQ(snapshot.clients.size(), 3u);
    EXPECT_EQ(snapshot.jobs.size(), 3u);
    EXPECT_EQ(snapshot.hidden_jobs, 0u);
  }
}

TEST(RestrictToViewer, AUserSeesOnlyTheirOwnClientsAndJobs) {
  EngineSnapshot snapshot = two_users();
  restrict_to_viewer(snapshot, 1000, kDaemonUid, owner_of);
  ASSERT_EQ(snapshot.clients.size(), 2u);
  for (const ClientView& c : snapshot.clients) EXPECT_EQ(c.uid, 1000u);
  ASSERT_EQ(snapshot.jobs.size(), 1u);
  EXPECT_EQ(snapshot.jobs[0].name, "alice-job");
  EXPECT_EQ(snapshot.hidden_jobs, 2u) << "bob's job, and a job whose owner is unknown";
  EXPECT_EQ(snapshot.peers.size(), 1u) << "the node's peers are not a job's";
}

TEST(RestrictToViewer, AUserWithoutJobsSeesNone) {
  EngineSnapshot snapshot = two_users();
  restrict_to_viewer(snapshot, 65534, kDaemonUid, owner_of);
  EXPECT_TRUE(snapshot.clients.empty());
  EXPECT_TRUE(snapshot.jobs.empty());
  EXPECT_EQ(snapshot.hidden_jobs, 3u);
}

}  // namespace
}  // namespace gradsync::daemon
