#include "client/torch/point_to_point.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace gradsync::torch_backend {
namespace {

template <size_t N>
std::string field(const char (&value)[N]) {
  return {value, strnlen(value, N)};
}

template <size_t N>
void set_field(char (&target)[N], const std::string& value) {
  std::memset(target, 0, N);
  std::memcpy(target, value.data(), std::min(value.size(), N - 1));
}

// FNV-1a: stable across processes and builds, as every rank of the pair must agree on it.
uint32_t name_hash(const std::string& text) {
  uint32_t hash = 2166136261U;
  for (const char c : text) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 16777619U;
  }
  return hash;
}

}  // namespace

std::string pair_job_name(const std::string& group_job, int low, int high) {
  constexpr size_t kCapacity = sizeof(gradsync_options::job) - 1;
  const std::string suffix = ".p2p." + std::to_string(low) + "." + std::to_string(high);
  if (group_job.size() + suffix.size() <= kCapacity) return group_job + suffix;
  char hash[10];
  std::snprintf(hash, sizeof(hash), "~%08x", name_hash(group_job));
  const size_t kept = kCapacity - suffix.size() - std::strlen(hash);
  return group_job.substr(0, kept) + hash + suffix;
}

std::string message_name(int source, int target, int tag) {
  return "p2p." + std::to_string(source) + ">" + std::to_string(target) + ".tag" +
         std::to_string(tag);
}

std::string alltoall_block_name(int source, int target) {
  return "alltoall." + std::to_string(source) + ">" + std::to_string(target);
}

static_assert(sizeof(gradsync_job_settings::parent_job) == sizeof(gradsync_options::job));

PairRanks pair_ranks(int self, int peer) {
  return {std::min(self, peer), std::max(self, peer)};
}

gradsync_job_settings pair_settings(const gradsync_job_settings& group,
                                    const gradsync_options& group_options, const PairRanks& ranks) {
  gradsync_job_settings pair = group;
  pair.struct_bytes = sizeof(pair);
  std::memcpy(pair.parent_job, group_options.job, sizeof(pair.parent_job));
  pair.parent_ranks = ranks.data();
  return pair;
}

gradsync_options pair_options(const gradsync_options& group, const GroupLayout& layout, int peer) {
  const int self = group.rank;
  const auto members = static_cast<int>(layout.member_addresses.size());
  if (members != group.world_size) {
    throw std::invalid_argument("the group's layout names " + std::to_string(members) +
                                " ranks' nodes for a group of " + std::to_string(group.world_size));
  }
  if (peer < 0 || peer >= members || peer == self) {
    throw std::invalid_argument("rank " + std::to_string(peer) +
                                " is not another rank of this group of " + std::to_string(members));
  }
  const int low = std::min(self, peer);
  const int high = std::max(self, peer);
  gradsync_options pair = group;
  set_field(pair.job, pair_job_name(field(group.job), low, high));
  pair.rank = self == low ? 0 : 1;
  pair.world_size = 2;
  const std::string& low_node = layout.member_addresses[static_cast<size_t>(low)];
  const std::string& high_node = layout.member_addresses[static_cast<size_t>(high)];
  if (low_node == high_node) {
    pair.local_rank = pair.rank;
    pair.local_world_size = 2;
    set_field(pair.nodes, "");
    pair.node_rank = 0;
    return pair;
  }
  if (low_node.empty() || high_node.empty()) {
    throw std::invalid_argument("the group's layout gives rank " +
                                std::to_string(low_node.empty() ? low : high) +
                                " no node address beside ranks on other nodes");
  }
  pair.local_rank = 0;
  pair.local_world_size = 1;
  set_field(pair.nodes, low_node + "," + high_node);
  pair.node_rank = pair.rank;
  return pair;
}

}  // namespace gradsync::torch_backend
