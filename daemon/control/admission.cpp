#include "daemon/control/admission.h"

#include "cost_model/cost_model.h"
#include "daemon/links/aggregation_plan.h"
#include "daemon/links/links.h"
#include "ipc/protocol.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <vector>

namespace gradsync::daemon {
namespace {

bool valid_job_name(const std::string& name) {
  if (name.empty() || name.size() > ipc::kMaxJobNameBytes) return false;
  for (char c : name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ||
          c == ':')) {
      return false;
    }
  }
  return true;
}

void resolve_nodes(ClientIdentity& who, ipc::wire::Hello::Reader hello, const HelloRules& rules) {
  for (auto node : hello.getNodes()) who.nodes.emplace_back(node.cStr());
  if (who.nodes.size() <= 1) {
    if (who.world_size != who.local_world_size) {
      throw Refusal{GRADSYNC_ERR_INVALID_ARGUMENT,
                    fmt::format("job '{}' spans {} ranks but {} are local: a multi-node job "
                                "needs GRADSYNC_NODES",
                                who.job, who.world_size, who.local_world_size)};
    }
    who.nodes.clear();
    return;
  }
  if (rules.listen_address.empty()) {
    throw Refusal{GRADSYNC_ERR_INVALID_ARGUMENT,
                  "this gradsyncd has no inter-node listener (listen is empty)"};
  }
  if (who.nodes.size() > kMaxNodes) {
    throw Refusal{GRADSYNC_ERR_INVALID_ARGUMENT,
                  fmt::format("at most {} nodes per job", kMaxNodes)};
  }
  const int32_t rank = hello.getNodeRank();
  if (rank >= 0) {
    if (static_cast<size_t>(rank) >= who.nodes.size()) {
      throw Refusal{GRADSYNC_ERR_INVALID_ARGUMENT,
                    fmt::format("node rank {} outside the {} nodes of GRADSYNC_NODES", rank,
                                who.nodes.size())};
    }
    who.node_rank = static_cast<uint32_t>(rank);
  } else {
    const auto self = std::find(who.nodes.begin(), who.nodes.end(), rules.listen_address);
    if (self == who.nodes.end()) {
      throw Refusal{GRADSYNC_ERR_INVALID_ARGUMENT,
                    fmt::format("this gradsyncd ({}) is not in GRADSYNC_NODES: set "
                                "GRADSYNC_NODE_RANK",
                                rules.listen_address)};
    }
    who.node_rank = static_cast<uint32_t>(self - who.nodes.begin());
  }
  if (who.world_size < who.local_world_size) {
    throw Refusal{GRADSYNC_ERR_INVALID_ARGUMENT,
                  fmt::format("WORLD_SIZE {} is smaller than LOCAL_WORLD_SIZE {}", who.world_size,
                              who.local_world_size)};
  }
}

// The job's settings across nodes. Checked on a single-node job too: a setting that means
// nothing is a mistake the rank should hear of, not one that waits for a second node.
void resolve_settings(ClientIdentity& who, ipc::wire::Hello::Reader hello,
                      const HelloRules& rules) {
  who.algorithm = hello.getAlgorithm().cStr();
  if (who.algorithm.empty()) who.algorithm = rules.default_algorithm;
  if (who.algorithm != "auto" && !cost_model::parse_algorithm(who.algorithm)) {
    throw Refusal{
        GRADSYNC_ERR_INVALID_ARGUMENT,
        fmt::format("GRADSYNC_ALGO must be auto, ring, rhd, direct, aggregate or split, not '{}'",
                    who.algorithm)};
  }
  for (auto aggregator : hello.getAggregators()) who.aggregators.emplace_back(aggregator.cStr());
  if (who.aggregators.empty()) who.aggregators = rules.default_aggregators;
  if (who.aggregators.size() > aggregation::kMaxAggregators) {
    throw Refusal{GRADSYNC_ERR_INVALID_ARGUMENT,
                  fmt::format("GRADSYNC_AGGREGATORS names {} aggregators; at most {}",
                              who.aggregators.size(), aggregation::kMaxAggregators)};
  }
  for (size_t i = 0; i < who.aggregators.size(); ++i) {
    const std::string& aggregator = who.aggregators[i];
    if (std::find(who.aggregators.begin(), who.aggregators.begin() + static_cast<ptrdiff_t>(i),
                  aggregator) != who.aggregators.begin() + static_cast<ptrdiff_t>(i) ||
        std::find(who.nodes.begin(), who.nodes.end(), aggregator) != who.nodes.end()) {
      throw Refusal{GRADSYNC_ERR_INVALID_ARGUMENT,
                    fmt::format("aggregator {} is named twice, or is one of the job's nodes "
                                "(GRADSYNC_AGGREGATORS, GRADSYNC_NODES)",
                                aggregator)};
    }
  }
  const bool through_aggregators = who.algorithm == "aggregate" || who.algorithm == "split";
  if (through_aggregators && who.aggregators.empty() && !who.nodes.empty()) {
    throw Refusal{GRADSYNC_ERR_INVALID_ARGUMENT,
                  fmt::format("GRADSYNC_ALGO={} needs aggregators (GRADSYNC_AGGREGATORS, or the "
                              "daemon's aggregators key)",
                              who.algorithm)};
  }
  who.wire_codec = hello.getWireCodec().cStr();
  if (who.wire_codec.empty()) who.wire_codec = rules.default_wire_codec;
  if (!cost_model::parse_wire_codec(who.wire_codec)) {
    throw Refusal{
        GRADSYNC_ERR_INVALID_ARGUMENT,
        fmt::format("GRADSYNC_WIRE_CODEC must be none, bf16, topk or topk:PERCENT, not '{}'",
                    who.wire_codec)};
  }
  switch (hello.getAutotune()) {
    case ipc::wire::Autotune::ON:
      who.autotune = true;
      break;
    case ipc::wire::Autotune::OFF:
      who.autotune = false;
      break;
    default:
      who.autotune = rules.default_autotune;
  }
}

// The job this one is a part of: a name like any job's, other than this one's, and a distinct
// rank in it for each of this job's ranks.
void resolve_parent(ClientIdentity& who, ipc::wire::Hello::Reader hello) {
  who.parent_job = hello.getParentJob().cStr();
  const auto ranks = hello.getParentRanks();
  if (who.parent_job.empty()) {
    if (ranks.size() != 0) {
      throw Refusal{GRADSYNC_ERR_INVALID_ARGUMENT, "parent ranks given without a parent job"};
    }
    return;
  }
  if (!valid_job_name(who.parent_job) || who.parent_job == who.job) {
    throw Refusal{GRADSYNC_ERR_INVALID_ARGUMENT,
                  fmt::format("parent job '{}' of job '{}' must be another job's name, 1-{} "
                              "characters of [A-Za-z0-9._:-]",
                              who.parent_job, who.job, ipc::kMaxJobNameBytes)};
  }
  if (ranks.size() != static_cast<size_t>(who.world_size)) {
    throw Refusal{GRADSYNC_ERR_INVALID_ARGUMENT,
                  fmt::format("job '{}' of {} ranks names {} ranks in its parent job '{}'", who.job,
                              who.world_size, ranks.size(), who.parent_job)};
  }
  for (const int32_t rank : ranks) who.parent_ranks.push_back(rank);
  std::vector<int32_t> sorted = who.parent_ranks;
  std::sort(sorted.begin(), sorted.end());
  if (sorted.front() < 0 || std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    throw Refusal{GRADSYNC_ERR_INVALID_ARGUMENT,
                  fmt::format("job '{}': its ranks in parent job '{}' must be distinct and not "
                              "negative",
                              who.job, who.parent_job)};
  }
}

}  // namespace

ClientIdentity validate_hello(ipc::wire::Hello::Reader hello, pid_t pid, uid_t uid,
                              const HelloRules& rules) {
  if (!rules.serves_ranks) {
    throw Refusal{GRADSYNC_ERR_INVALID_ARGUMENT,
                  "this gradsyncd is an aggregator (role = \"aggregator\"): it sums for other "
                  "nodes' jobs and serves no training processes; connect to a node's daemon"};
  }
  if (hello.getProtocolVersion() != ipc::kProtocolVersion) {
    throw Refusal{GRADSYNC_ERR_PROTOCOL,
                  fmt::format("protocol version {} is not supported (gradsyncd speaks {})",
                              hello.getProtocolVersion(), ipc::kProtocolVersion)};
  }
  ClientIdentity who;
  who.job = hello.getJob().cStr();
  who.rank = hello.getRank();
  who.world_size = hello.getWorldSize();
  who.local_rank = hello.getLocalRank();
  who.local_world_size = hello.getLocalWorldSize();
  who.pid = pid;
  who.uid = uid;
  if (!valid_job_name(who.job)) {
    throw Refusal{GRADSYNC_ERR_INVALID_ARGUMENT,
                  fmt::format("job name '{}' must be 1-{} characters of [A-Za-z0-9._:-]", who.job,
                              ipc::kMaxJobNameBytes)};
  }
  if (who.local_world_size < 1 || who.local_world_size > ipc::kMaxLocalRanks ||
      who.local_rank < 0 || who.local_rank >= who.local_world_size || who.world_size < 1 ||
      who.rank < 0 || who.rank >= who.world_size || who.local_world_size > who.world_size) {
    throw Refusal{GRADSYNC_ERR_INVALID_ARGUMENT,
                  fmt::format("inconsistent identity: rank {} of {}, local rank {} of {} (at most "
                              "{} local ranks)",
                              who.rank, who.world_size, who.local_rank, who.local_world_size,
                              ipc::kMaxLocalRanks)};
  }
  resolve_nodes(who, hello, rules);
  resolve_settings(who, hello, rules);
  resolve_parent(who, hello);
  return who;
}

void validate_range(uint32_t buffer_id, uint64_t offset, uint64_t bytes, uint64_t size) {
  uint64_t end = 0;
  if (bytes == 0 || __builtin_add_overflow(offset, bytes, &end) || end > size) {
    throw Refusal{GRADSYNC_ERR_INVALID_ARGUMENT,
                  fmt::format("register buffer {}: range [{}, +{}) outside the {}-byte segment",
                              buffer_id, offset, bytes, size)};
  }
}

}  // namespace gradsync::daemon
