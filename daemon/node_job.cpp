#include "daemon/node_job.h"

#include "daemon/log.h"
#include "ipc/messages.h"
#include "kernels/reduce.h"

#include <fmt/format.h>

#include <sched.h>

#include <algorithm>
#include <functional>

namespace gradsync::daemon {
namespace {

using Clock = std::chrono::steady_clock;

std::string describe(ipc::Collective collective, gradsync_dtype dtype, gradsync_op op,
                     uint64_t count, uint32_t members, int32_t root) {
  return fmt::format("{}, count {}, {}, {}{}{}", ipc::collective_name(collective), count,
                     ipc::dtype_name(dtype), ipc::op_name(op),
                     root >= 0 ? fmt::format(", root {}", root) : "",
                     members > 1 ? fmt::format(", a group of {}", members) : "");
}

std::string describe(wire::Ready::Reader ready) {
  return describe(static_cast<ipc::Collective>(ready.getCollective()),
                  static_cast<gradsync_dtype>(ready.getDtype()),
                  static_cast<gradsync_op>(ready.getOp()), ready.getCount(), ready.getMembers(),
                  ready.getRoot());
}

// Chunk c of a ring over n nodes: elements [begin, end) of count.
std::pair<uint64_t, uint64_t> chunk(uint64_t count, uint32_t nodes, uint32_t c) {
  return {count * c / nodes, count * (c + 1) / nodes};
}

}  // namespace

NodeJob::NodeJob(const std::string& job_name, NodeLayout layout, transport::Mesh& mesh,
                 std::chrono::seconds peer_timeout)
    : job_name_(job_name),
      layout_(std::move(layout)),
      mesh_(mesh),
      peer_timeout_(peer_timeout),
      log_(logger("nodes")),
      job_tag_(static_cast<uint16_t>(std::hash<std::string>{}(job_name))) {
  // Connect to every other node now: each endpoint also watches that peer for failure.
  for (uint32_t node = 0; node < layout_.nodes.size(); ++node) {
    peers_.push_back(node == layout_.node_rank ? transport::PeerId{}
                                               : mesh_.connect(layout_.nodes[node]));
  }
}

bool NodeJob::has_peer(transport::PeerId peer) const {
  for (uint32_t node = 0; node < peers_.size(); ++node) {
    if (node != layout_.node_rank && peers_[node] == peer) return true;
  }
  return false;
}

void NodeJob::send(uint32_t node, capnp::MessageBuilder& message) {
  // Control messages are small; UCX copies them (eager), so the buffer may go at once, but
  // the Operation must complete before it is dropped.
  auto bytes = std::make_shared<const std::vector<uint8_t>>(ipc::encode(message));
  transport::Operation operation =
      mesh_.send(peers_[node], tags::make(tags::kControl, layout_.node_rank, job_tag_, 0),
                 bytes->data(), bytes->size());
  wait_for({&operation}, "sending a control message", {bytes});
}

void NodeJob::on_locally_ready(ReadyUnit unit) {
  // Nodes may assemble a group in different orders: run its members in name order, and name
  // the group by its first member, so that every node agrees on both.
  std::sort(unit.collectives.begin(), unit.collectives.end(),
            [](const ReadyCollective& a, const ReadyCollective& b) {
              return a.first().name < b.first().name;
            });
  const Submission& lead = unit.collectives.front().first();
  const std::string key = lead.name;
  capnp::MallocMessageBuilder message;
  auto root = message.initRoot<wire::NodeMessage>();
  root.setJob(job_name_);
  root.setNode(layout_.node_rank);
  auto ready = root.initReady();
  ready.setKey(key);
  ready.setCollective(static_cast<uint8_t>(lead.collective));
  ready.setDtype(static_cast<uint8_t>(lead.dtype));
  ready.setOp(static_cast<uint8_t>(lead.op));
  ready.setCount(lead.count);
  ready.setMembers(static_cast<uint32_t>(unit.collectives.size()));
  ready.setRoot(lead.collective == ipc::Collective::kBroadcast ? lead.root : -1);
  awaiting_go_[key].push_back(std::move(unit));
  log_->debug("job '{}': '{}' ready on node {}", job_name_, key, layout_.node_rank);
  if (layout_.node_rank == 0) {
    coordinate_ready(0, ready.asReader());
  } else {
    send(0, message);
  }
}

void NodeJob::coordinate_ready(uint32_t node, wire::Ready::Reader ready) {
  const std::string key = ready.getKey();
  log_->debug("job '{}': node {} reports '{}' ready", job_name_, node, key);
  auto& entries = coordinator_[key];
  auto entry = std::find_if(entries.begin(), entries.end(),
                            [node](const CoordinatorEntry& e) { return !e.nodes_ready[node]; });
  if (entry == entries.end()) {
    entries.push_back(CoordinatorEntry{std::vector<bool>(layout_.nodes.size()), 0, {}, 0, {}});
    entry = std::prev(entries.end());
  }
  const std::string description = describe(ready);
  if (entry->count_ready == 0) {
    entry->description = description;
    entry->first_node = node;
  } else if (entry->description != description && entry->mismatch.empty()) {
    entry->mismatch = fmt::format("tensor '{}': nodes disagree: node {} has {}; node {} has {}",
                                  key, entry->first_node, entry->description, node, description);
  }
  entry->nodes_ready[node] = true;
  ++entry->count_ready;
  // Entries of one key complete in order: every node reports its collectives in order.
  while (!entries.empty() && entries.front().count_ready == layout_.nodes.size()) {
    const uint64_t sequence = next_to_assign_++;
    const std::string error = entries.front().mismatch;
    entries.pop_front();
    capnp::MallocMessageBuilder message;
    auto root = message.initRoot<wire::NodeMessage>();
    root.setJob(job_name_);
    root.setNode(0);
    auto go = root.initGo();
    go.setKey(key);
    go.setSequence(sequence);
    go.setError(error);
    for (uint32_t other = 1; other < layout_.nodes.size(); ++other) send(other, message);
    on_go(key, sequence, error);
  }
  if (entries.empty()) coordinator_.erase(key);
}

void NodeJob::on_message(wire::NodeMessage::Reader message) {
  switch (message.which()) {
    case wire::NodeMessage::READY:
      if (layout_.node_rank == 0 && message.getNode() < layout_.nodes.size()) {
        coordinate_ready(message.getNode(), message.getReady());
      }
      break;
    case wire::NodeMessage::GO:
      on_go(message.getGo().getKey(), message.getGo().getSequence(), message.getGo().getError());
      break;
    case wire::NodeMessage::ABORT:
      break;  // handled by the engine, which fails the whole job
  }
}

void NodeJob::on_go(const std::string& key, uint64_t sequence, const std::string& error) {
  log_->debug("job '{}': go '{}' as {} on node {}", job_name_, key, sequence, layout_.node_rank);
  go_by_sequence_[sequence] = {key, error};
}

std::optional<ReadyUnit> NodeJob::next_runnable() {
  while (true) {
    const auto go = go_by_sequence_.find(next_to_run_);
    if (go == go_by_sequence_.end()) return std::nullopt;
    auto waiting = awaiting_go_.find(go->second.first);
    if (waiting == awaiting_go_.end() || waiting->second.empty()) return std::nullopt;
    ReadyUnit unit = std::move(waiting->second.front());
    waiting->second.pop_front();
    if (waiting->second.empty()) awaiting_go_.erase(waiting);
    const std::string error = go->second.second;
    go_by_sequence_.erase(go);
    ++next_to_run_;
    if (error.empty()) return unit;
    for (auto& c : unit.collectives) {
      for (auto& s : c.ranks) complete(s, GRADSYNC_ERR_MISMATCH, error);
    }
  }
}

std::optional<std::string> NodeJob::wait_for(const std::vector<transport::Operation*>& ops,
                                             const char* what,
                                             std::vector<std::shared_ptr<const void>> memory) {
  const auto deadline = Clock::now() + peer_timeout_;
  std::optional<std::string> error;
  while (!error) {
    if (std::all_of(ops.begin(), ops.end(), [](auto* op) { return op->done(); })) break;
    // Yield when UCX has nothing: the peers we wait for may share our cores.
    if (!mesh_.progress()) sched_yield();
    for (uint32_t node = 0; node < peers_.size() && !error; ++node) {
      if (node != layout_.node_rank && mesh_.failed(peers_[node])) {
        error = fmt::format("node {} ({}) of job '{}' failed while {}", node, layout_.nodes[node],
                            job_name_, what);
      }
    }
    if (!error && Clock::now() > deadline) {
      error = fmt::format("job '{}': no progress for {} s while {}", job_name_,
                          peer_timeout_.count(), what);
    }
  }
  for (auto* op : ops) {
    if (!error && op->status() != UCS_OK) {
      error =
          fmt::format("job '{}': {} failed: {}", job_name_, what, ucs_status_string(op->status()));
    }
  }
  if (error) {
    std::vector<transport::Operation> pending;
    pending.reserve(ops.size());
    for (auto* op : ops) pending.push_back(std::move(*op));
    memory.push_back(std::make_shared<const std::vector<uint8_t>>(std::move(staging_)));
    memory.push_back(std::make_shared<const std::vector<uint8_t>>(std::move(incoming_)));
    staging_ = {};
    incoming_ = {};
    mesh_.retire(std::move(pending), std::move(memory));
  }
  return error;
}

std::optional<std::string> NodeJob::ring_allreduce(uint8_t* data, uint64_t count,
                                                   gradsync_dtype dtype, gradsync_op op,
                                                   uint32_t sequence) {
  const auto nodes = static_cast<uint32_t>(layout_.nodes.size());
  const uint32_t me = layout_.node_rank;
  const uint32_t right = (me + 1) % nodes;
  const uint32_t left = (me + nodes - 1) % nodes;
  const size_t element = ipc::dtype_bytes(dtype);
  incoming_.resize(static_cast<size_t>((count / nodes + 1) * element));
  uint32_t step = 0;
  auto tag = [&](uint32_t sender) { return data_tag(sender, sequence, step); };
  // Reduce-scatter: after N-1 steps this node holds the full reduction of chunk me+1.
  for (uint32_t s = 0; s + 1 < nodes; ++s, ++step) {
    const auto [send_begin, send_end] = chunk(count, nodes, (me + nodes - s) % nodes);
    const auto [recv_begin, recv_end] = chunk(count, nodes, (me + nodes - s - 1) % nodes);
    transport::Operation receive = mesh_.receive(tag(left), tags::sender_mask(), incoming_.data(),
                                                 (recv_end - recv_begin) * element);
    transport::Operation send = mesh_.send(peers_[right], tag(me), data + send_begin * element,
                                           (send_end - send_begin) * element);
    if (auto error = wait_for({&send, &receive}, "reducing across nodes")) return error;
    const void* inputs[] = {data + recv_begin * element, incoming_.data()};
    void* outputs[] = {data + recv_begin * element};
    kernels::reduce_to_all(dtype, op, inputs, 2, outputs, 1, recv_end - recv_begin, false);
  }
  // Allgather: pass the reduced chunks around the ring, straight into place.
  for (uint32_t s = 0; s + 1 < nodes; ++s, ++step) {
    const auto [send_begin, send_end] = chunk(count, nodes, (me + 1 + nodes - s) % nodes);
    const auto [recv_begin, recv_end] = chunk(count, nodes, (me + nodes - s) % nodes);
    transport::Operation receive =
        mesh_.receive(tag(left), tags::sender_mask(), data + recv_begin * element,
                      (recv_end - recv_begin) * element);
    transport::Operation send = mesh_.send(peers_[right], tag(me), data + send_begin * element,
                                           (send_end - send_begin) * element);
    if (auto error = wait_for({&send, &receive}, "gathering across nodes")) return error;
  }
  return std::nullopt;
}

uint64_t NodeJob::data_tag(uint32_t sender, uint32_t sequence, uint32_t part) const {
  // Collectives run one at a time in sequence order, so 16 bits of sequence are plenty to
  // keep a late message of one apart from the next.
  return tags::make(tags::kData, sender, job_tag_, ((sequence & 0xffffu) << 16) | (part & 0xffffu));
}

std::optional<std::string> NodeJob::broadcast(const ReadyCollective& collective,
                                              uint32_t sequence) {
  const Submission& lead = collective.first();
  const uint64_t bytes = lead.send_bytes();
  const Submission* root = nullptr;
  for (const auto& s : collective.ranks) {
    if (s.session->identity().rank == lead.root) root = &s;
  }
  const uint8_t* source = nullptr;
  if (root != nullptr) {
    // The root's node sends its data straight from the root's buffer to every other node.
    std::vector<transport::Operation> sends;
    for (uint32_t node = 0; node < peers_.size(); ++node) {
      if (node == layout_.node_rank) continue;
      sends.push_back(
          mesh_.send(peers_[node], data_tag(layout_.node_rank, sequence, 0), root->send, bytes));
    }
    std::vector<transport::Operation*> all;
    all.reserve(sends.size());
    for (auto& send : sends) all.push_back(&send);
    if (auto error = wait_for(all, "broadcasting to other nodes", {root->send_buffer})) {
      return error;
    }
    source = root->send;
  } else {
    staging_.resize(std::max<uint64_t>(bytes, 1));
    // From whichever node holds the root: match any sender.
    transport::Operation receive = mesh_.receive(
        data_tag(0, sequence, 0), tags::sender_mask() & ~tags::kNodeMask, staging_.data(), bytes);
    if (auto error = wait_for({&receive}, "receiving a broadcast")) return error;
    source = staging_.data();
  }
  const bool streaming = bytes >= kernels::kStreamingMinBytes;
  for (const auto& s : collective.ranks) {
    if (s.recv != source) kernels::copy(s.recv, source, bytes, streaming);
  }
  return std::nullopt;
}

std::optional<std::string> NodeJob::allgather(const ReadyCollective& collective,
                                              uint32_t sequence) {
  const Submission& lead = collective.first();
  const uint64_t block = lead.send_bytes();
  const auto world = static_cast<uint32_t>(layout_.world_size);
  std::vector<bool> local(world, false);
  for (const auto& s : collective.ranks)
    local[static_cast<uint32_t>(s.session->identity().rank)] = true;
  // Remote blocks land in staging at their slot; local blocks go out from the ranks' buffers.
  staging_.resize(std::max<uint64_t>(block * world, 1));
  std::vector<transport::Operation> operations;
  for (uint32_t slot = 0; slot < world; ++slot) {
    if (!local[slot]) {
      operations.push_back(mesh_.receive(data_tag(0, sequence, slot),
                                         tags::sender_mask() & ~tags::kNodeMask,
                                         staging_.data() + slot * block, block));
    }
  }
  for (const auto& s : collective.ranks) {
    const auto slot = static_cast<uint32_t>(s.session->identity().rank);
    for (uint32_t node = 0; node < peers_.size(); ++node) {
      if (node == layout_.node_rank) continue;
      operations.push_back(
          mesh_.send(peers_[node], data_tag(layout_.node_rank, sequence, slot), s.send, block));
    }
  }
  std::vector<transport::Operation*> all;
  all.reserve(operations.size());
  for (auto& operation : operations) all.push_back(&operation);
  std::vector<std::shared_ptr<const void>> sources;
  sources.reserve(collective.ranks.size());
  for (const auto& s : collective.ranks) sources.push_back(s.send_buffer);
  if (auto error = wait_for(all, "gathering from other nodes", std::move(sources))) return error;
  const bool streaming = block * world >= kernels::kStreamingMinBytes;
  for (const auto& target : collective.ranks) {
    for (uint32_t slot = 0; slot < world; ++slot) {
      uint8_t* destination = target.recv + slot * block;
      if (!local[slot]) {
        kernels::copy(destination, staging_.data() + slot * block, block, streaming);
        continue;
      }
      for (const auto& source : collective.ranks) {
        // In place, a rank's own slot is already there.
        if (static_cast<uint32_t>(source.session->identity().rank) == slot &&
            destination != source.send) {
          kernels::copy(destination, source.send, block, streaming);
        }
      }
    }
  }
  return std::nullopt;
}

std::optional<std::string> NodeJob::execute(ReadyUnit& unit) {
  const auto sequence = static_cast<uint32_t>(next_to_run_ - 1);
  auto fail_unit = [&unit](const std::string& error) {
    for (auto& c : unit.collectives) {
      for (auto& s : c.ranks) complete(s, GRADSYNC_ERR_PEER_FAILED, error);
    }
  };
  for (auto& collective : unit.collectives) {
    const Submission& lead = collective.first();
    std::optional<std::string> error;
    if (lead.collective == ipc::Collective::kBroadcast) error = broadcast(collective, sequence);
    if (lead.collective == ipc::Collective::kAllgather) error = allgather(collective, sequence);
    if (error) {
      fail_unit(*error);
      return error;
    }
    if (lead.collective == ipc::Collective::kAllreduce) {
      const uint64_t bytes = lead.send_bytes();
      staging_.resize(std::max<uint64_t>(bytes, 1));
      // Average = sum everywhere, divided once by the job's world size at the end.
      const gradsync_op op = lead.op == GRADSYNC_AVG ? GRADSYNC_SUM : lead.op;
      std::vector<const void*> inputs;
      for (const auto& s : collective.ranks) inputs.push_back(s.send);
      void* staging = staging_.data();
      kernels::reduce_to_all(lead.dtype, op, inputs.data(), inputs.size(), &staging, 1, lead.count,
                             false);
      if (auto error = ring_allreduce(staging_.data(), lead.count, lead.dtype, op, sequence)) {
        fail_unit(*error);
        return error;
      }
      if (lead.op == GRADSYNC_AVG) {
        kernels::divide(lead.dtype, staging_.data(), lead.count,
                        static_cast<uint64_t>(layout_.world_size));
      }
      const bool streaming = bytes >= kernels::kStreamingMinBytes;
      for (const auto& s : collective.ranks)
        kernels::copy(s.recv, staging_.data(), bytes, streaming);
    }
    // A barrier moves no data: its Go from the coordinator is the barrier.
  }
  for (auto& c : unit.collectives) {
    for (auto& s : c.ranks) complete(s, GRADSYNC_OK);
  }
  return std::nullopt;
}

void NodeJob::broadcast_abort(const std::string& reason) {
  capnp::MallocMessageBuilder message;
  auto root = message.initRoot<wire::NodeMessage>();
  root.setJob(job_name_);
  root.setNode(layout_.node_rank);
  root.setAbort(reason);
  auto bytes = std::make_shared<const std::vector<uint8_t>>(ipc::encode(message));
  std::vector<transport::Operation> sends;
  for (uint32_t node = 0; node < peers_.size(); ++node) {
    if (node == layout_.node_rank || mesh_.failed(peers_[node])) continue;
    sends.push_back(mesh_.send(peers_[node],
                               tags::make(tags::kControl, layout_.node_rank, job_tag_, 0),
                               bytes->data(), bytes->size()));
  }
  // Best effort, bounded: a peer that is gone does not hold us up. What is still in flight
  // then is retired with its bytes.
  const auto deadline = Clock::now() + std::chrono::seconds(1);
  auto all_done = [&] {
    return std::all_of(sends.begin(), sends.end(), [](const auto& op) { return op.done(); });
  };
  while (!all_done() && Clock::now() < deadline) {
    if (!mesh_.progress()) sched_yield();
  }
  mesh_.retire(std::move(sends), {bytes});
}

void NodeJob::fail_waiting(gradsync_result status, const std::string& message) {
  for (auto& [key, units] : awaiting_go_) {
    for (auto& unit : units) {
      for (auto& c : unit.collectives) {
        for (auto& s : c.ranks) complete(s, status, message);
      }
    }
  }
  awaiting_go_.clear();
  go_by_sequence_.clear();
}

}  // namespace gradsync::daemon
