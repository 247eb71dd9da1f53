// A job's part across nodes: the node daemons agree on one order of collectives (node 0
// coordinates), and each collective runs as local reduce -> inter-node ring allreduce over UCX
// -> local broadcast. Engine-thread only.
//
// Ordering: when a collective is ready on this node (all local ranks submitted it), the node
// sends Ready(key) to node 0. When node 0 has Ready(key) from every node, it assigns the next
// sequence number and sends Go(key, sequence) to all; every node runs collectives in sequence
// order, so the ring steps of one collective never meet another's.
#pragma once

#include "daemon/internode.capnp.h"
#include "daemon/job.h"
#include "transport/mesh.h"

#include <spdlog/logger.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace gradsync::daemon {

// Tag layout between node daemons: kind (8 bits) | sender node (8) | job (16) | low 32 bits.
namespace tags {
inline constexpr uint64_t kControl = 1;
inline constexpr uint64_t kData = 2;
inline constexpr uint64_t kKindMask = uint64_t{0xff} << 56;
inline constexpr uint64_t kNodeMask = uint64_t{0xff} << 48;
inline uint64_t make(uint64_t kind, uint32_t node, uint16_t job, uint32_t low) {
  return (kind << 56) | (uint64_t{node & 0xffu} << 48) | (uint64_t{job} << 32) | low;
}
inline uint64_t sender_mask() {
  return kKindMask | (uint64_t{0xff} << 48) | (uint64_t{0xffff} << 32) | 0xffffffffu;
}
}  // namespace tags

inline constexpr uint32_t kMaxNodes = 255;

struct NodeLayout {
  std::vector<std::string> nodes;  // inter-node addresses, in node order
  uint32_t node_rank = 0;
  int32_t world_size = 1;  // ranks of the job on all nodes
};

class NodeJob {
 public:
  NodeJob(const std::string& job_name, NodeLayout layout, transport::Mesh& mesh,
          std::chrono::seconds peer_timeout);

  const NodeLayout& layout() const { return layout_; }
  bool has_peer(transport::PeerId peer) const;

  // A unit ready on this node: announce it to the coordinator. Units that cannot run across
  // nodes yet fail at once.
  void on_locally_ready(ReadyUnit unit);
  // A control message for this job from another node.
  void on_message(wire::NodeMessage::Reader message);
  // The next unit whose turn has come (Go received, ready here), if any.
  std::optional<ReadyUnit> next_runnable();
  // Runs it across the nodes and completes it on every local rank. Returns an error message
  // when the job cannot go on (a peer failed or timed out); the unit's ranks got it already.
  std::optional<std::string> execute(ReadyUnit& unit);

  // Tells every other node that the job failed here.
  void broadcast_abort(const std::string& reason);
  // Fails everything waiting here (the Job fails its own queues).
  void fail_waiting(gradsync_result status, const std::string& message);

 private:
  struct CoordinatorEntry {
    std::vector<bool> nodes_ready;
    size_t count_ready = 0;
    std::string description;  // of the first Ready, to compare the others with
    uint32_t first_node = 0;
    std::string mismatch;
  };

  void send(uint32_t node, capnp::MessageBuilder& message);
  void coordinate_ready(uint32_t node, wire::Ready::Reader ready);
  void on_go(const std::string& key, uint64_t sequence, const std::string& error);
  uint64_t data_tag(uint32_t sender, uint32_t sequence, uint32_t part) const;
  std::optional<std::string> broadcast(const ReadyCollective& collective, uint32_t sequence);
  std::optional<std::string> allgather(const ReadyCollective& collective, uint32_t sequence);
  std::optional<std::string> ring_allreduce(uint8_t* data, uint64_t count, gradsync_dtype dtype,
                                            gradsync_op op, uint32_t sequence);
  // Progresses until every operation is done. On failure (a peer died, or silence past the
  // timeout) the pending ones are retired to the mesh with the job's buffers and `memory`, so
  // that nothing UCX may still touch is freed, and the error is returned.
  std::optional<std::string> wait_for(const std::vector<transport::Operation*>& operations,
                                      const char* what,
                                      std::vector<std::shared_ptr<const void>> memory = {});

  std::string job_name_;
  NodeLayout layout_;
  transport::Mesh& mesh_;
  std::chrono::seconds peer_timeout_;
  std::shared_ptr<spdlog::logger> log_;
  uint16_t job_tag_;
  std::vector<transport::PeerId> peers_;  // by node; own entry unused
  std::map<std::string, std::deque<ReadyUnit>> awaiting_go_;
  std::map<uint64_t, std::pair<std::string, std::string>> go_by_sequence_;  // key, error
  uint64_t next_to_run_ = 0;
  // Node 0 only.
  std::map<std::string, std::deque<CoordinatorEntry>> coordinator_;
  uint64_t next_to_assign_ = 0;
  std::vector<uint8_t> staging_;
  std::vector<uint8_t> incoming_;
};

}  // namespace gradsync::daemon
