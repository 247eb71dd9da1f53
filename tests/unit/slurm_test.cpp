// Slurm's host lists and task counts, as srun writes them, and a task's layout from srun's
// environment.
#include "client/slurm.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace gradsync::client::slurm {
namespace {

using Hosts = std::vector<std::string>;

TEST(SlurmHostList, ExpandsRangesListsAndPadding) {
  EXPECT_EQ(expand_hostlist("gpu5"), Hosts{"gpu5"});
  EXPECT_EQ(expand_hostlist("node[01-03,7],gpu5"),
            (Hosts{"node01", "node02", "node03", "node7", "gpu5"}));
  EXPECT_EQ(expand_hostlist("rack[1-2]-n[8-9]"),
            (Hosts{"rack1-n8", "rack1-n9", "rack2-n8", "rack2-n9"}));
  EXPECT_EQ(expand_hostlist("127.0.0.[2-3]"), (Hosts{"127.0.0.2", "127.0.0.3"}));
  EXPECT_EQ(expand_hostlist("n[098-101]"), (Hosts{"n098", "n099", "n100", "n101"}));
}

TEST(SlurmHostList, RejectsWhatIsMalformed) {
  EXPECT_THROW(expand_hostlist("node[1-3"), std::invalid_argument);
  EXPECT_THROW(expand_hostlist("node1-3]"), std::invalid_argument);
  EXPECT_THROW(expand_hostlist("node[3-1]"), std::invalid_argument);
  EXPECT_THROW(expand_hostlist("node[a-b]"), std::invalid_argument);
  EXPECT_THROW(expand_hostlist("node[[1]]"), std::invalid_argument);
}

TEST(SlurmTasksPerNode, ExpandsRepeats) {
  EXPECT_EQ(tasks_per_node("4"), std::vector<int32_t>{4});
  EXPECT_EQ(tasks_per_node("2(x3),1"), (std::vector<int32_t>{2, 2, 2, 1}));
  EXPECT_THROW(tasks_per_node("2(x3"), std::invalid_argument);
  EXPECT_THROW(tasks_per_node("two"), std::invalid_argument);
}

// srun's variables for task 3 of 4, the second of two on the second node.
class SlurmEnvironment : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const auto& [name, value] : kVariables) ::setenv(name, value, 1);
  }
  void TearDown() override {
    for (const auto& [name, value] : kVariables) ::unsetenv(name);
  }
  static constexpr std::pair<const char*, const char*> kVariables[] = {
      {"SLURM_PROCID", "3"},
      {"SLURM_NTASKS", "4"},
      {"SLURM_LOCALID", "1"},
      {"SLURM_NODEID", "1"},
      {"SLURM_JOB_NODELIST", "127.0.0.[2-3]"},
      {"SLURM_TASKS_PER_NODE", "2(x2)"},
      {"SLURM_JOB_ID", "77"},
      {"SLURM_STEP_ID", "0"}};
};

TEST_F(SlurmEnvironment, GivesTheTasksPlaceAndTheNodes) {
  const std::optional<TaskLayout> task = layout_from_env();
  ASSERT_TRUE(task.has_value());
  EXPECT_EQ(task->rank, 3);
  EXPECT_EQ(task->world_size, 4);
  EXPECT_EQ(task->local_rank, 1);
  EXPECT_EQ(task->local_world_size, 2);
  EXPECT_EQ(task->node, 1);
  EXPECT_EQ(task->job, "slurm.77.0");
  EXPECT_EQ(node_list(task->hosts, 9478), "127.0.0.2:9478,127.0.0.3:9478");
}

TEST_F(SlurmEnvironment, NamesAMalformedVariable) {
  ::setenv("SLURM_TASKS_PER_NODE", "2", 1);  // one node's count for two nodes
  try {
    layout_from_env();
    FAIL() << "a node without a task count was taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("SLURM_TASKS_PER_NODE"), std::string::npos) << e.what();
  }
}

TEST(SlurmEnvironmentAbsent, IsNoLayout) {
  ::unsetenv("SLURM_PROCID");
  EXPECT_FALSE(layout_from_env().has_value());
}

}  // namespace
}  // namespace gradsync::client::slurm
