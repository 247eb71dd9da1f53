#include "daemon/links/links.h"

#include "ipc/messages.h"

#include <fmt/format.h>

#include <sched.h>

#include <algorithm>
#include <functional>

namespace gradsync::daemon {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

uint8_t* Scratch::get(size_t slot, size_t bytes) {
  if (slots_.size() <= slot) slots_.resize(slot + 1);
  Slot& s = slots_[slot];
  s.asked = Clock::now();
  if (!s.buffer) s.buffer = std::make_shared<std::vector<uint8_t>>();
  if (s.buffer->size() < bytes) {
    // Exactly what is asked, without the old contents: growing in place may take up to twice
    // the old size, and the slot keeps what it took until it goes unused.
    std::vector<uint8_t>(bytes).swap(*s.buffer);
  }
  return s.buffer->data();
}

size_t Scratch::bytes() const {
  size_t held = 0;
  for (const Slot& s : slots_) held += s.buffer ? s.buffer->capacity() : 0;
  return held;
}

size_t Scratch::release_unused(Clock::time_point unused_since) {
  size_t freed = 0;
  for (Slot& s : slots_) {
    if (s.buffer && s.asked < unused_since) {
      freed += s.buffer->capacity();
      s.buffer.reset();
    }
  }
  return freed;
}

std::vector<std::shared_ptr<const void>> Scratch::abandon() {
  std::vector<std::shared_ptr<const void>> memory;
  for (Slot& s : slots_) {
    if (s.buffer) memory.push_back(std::move(s.buffer));
  }
  slots_.clear();
  return memory;
}

NodeLinks::NodeLinks(const std::string& job_name, NodeLayout layout,
                     transport::Transport& transport, std::chrono::seconds peer_timeout)
    : job_name_(job_name),
      layout_(std::move(layout)),
      transport_(transport),
      peer_timeout_(peer_timeout),
      job_tag_(tags::job_of_name(job_name)) {
  // Connect to every other node now: each endpoint also watches that peer for failure.
  for (uint32_t node = 0; node < layout_.nodes.size(); ++node) {
    peers_.push_back(node == layout_.node_rank ? transport::PeerId{}
                                               : transport_.connect(layout_.nodes[node]));
  }
  for (const std::string& address : layout_.aggregators) {
    aggregator_peers_.push_back(transport_.connect(address));
  }
  aggregator_traffic_.resize(aggregator_peers_.size());
}

bool NodeLinks::authenticated() const {
  for (uint32_t node = 0; node < peers_.size(); ++node) {
    if (node != me() && !transport_.authenticated(peers_[node])) return false;
  }
  return std::all_of(aggregator_peers_.begin(), aggregator_peers_.end(),
                     [this](transport::PeerId peer) { return transport_.authenticated(peer); });
}

void NodeLinks::check_alive() {
  for (uint32_t node = 0; node < peers_.size(); ++node) {
    if (node != me()) transport_.check_alive(peers_[node]);
  }
  for (const transport::PeerId peer : aggregator_peers_) transport_.check_alive(peer);
}

bool NodeLinks::has_peer(transport::PeerId peer) const {
  for (uint32_t node = 0; node < peers_.size(); ++node) {
    if (node != me() && peers_[node] == peer) return true;
  }
  return aggregator_index(peer).has_value();
}

std::optional<uint32_t> NodeLinks::aggregator_index(transport::PeerId peer) const {
  for (uint32_t a = 0; a < aggregator_peers_.size(); ++a) {
    if (aggregator_peers_[a] == peer) return a;
  }
  return std::nullopt;
}

transport::Operation NodeLinks::push(uint32_t a, uint32_t sequence, uint64_t local,
                                     const void* data, size_t bytes) {
  aggregator_traffic_[a].bytes_sent += bytes;
  return transport_.send(aggregator_peers_[a],
                         tag(tags::kPush, me(), sequence, static_cast<uint32_t>(local)), data,
                         bytes, 0);
}

transport::Operation NodeLinks::receive_sum(uint32_t a, uint32_t sequence, uint64_t local,
                                            void* data, size_t bytes) {
  aggregator_traffic_[a].bytes_received += bytes;
  return transport_.receive(tag(tags::kSum, a, sequence, static_cast<uint32_t>(local)), tags::kAll,
                            data, bytes, aggregator_peers_[a], 0);
}

void NodeLinks::send_to_aggregator(uint32_t a, capnp::MessageBuilder& message) {
  transport_.post(aggregator_peers_[a], tags::make(tags::kAggregation, me(), job_tag_, 0),
                  std::make_shared<const std::vector<uint8_t>>(ipc::encode(message)));
}

PaceWait::~PaceWait() {
  if (ticket_ != 0) links_->pacer()->cancel(ticket_);
}

bool PaceWait::ready() {
  if (links_->top() && ranked_.held_back_by(*links_->top())) return false;
  WirePacer* pacer = links_->pacer();
  if (pacer == nullptr || bytes_ == 0) return true;
  const auto now = Clock::now();
  if (ticket_ == 0) ticket_ = pacer->request(links_->flow(), bytes_, now);
  pacer->dispatch(now, links_->transport().send_load(now));
  if (!pacer->take_grant(ticket_)) return false;
  ticket_ = 0;
  return true;
}

uint64_t NodeLinks::tag(uint64_t kind, uint32_t sender, uint32_t sequence, uint32_t part) const {
  return tags::make(kind, sender, job_tag_, tags::low(sequence, part));
}

transport::Operation NodeLinks::send(uint32_t node, uint64_t tag, const void* data, size_t bytes,
                                     size_t max_message_bytes) {
  return transport_.send(peers_[node], tag, data, bytes, max_message_bytes);
}

transport::Operation NodeLinks::receive(uint64_t tag, std::optional<uint32_t> sender, void* data,
                                        size_t bytes, size_t max_message_bytes) {
  const uint64_t mask = sender ? tags::kAll : tags::kAll & ~tags::kNodeMask;
  return transport_.receive(tag, mask, data, bytes,
                            sender ? std::optional(peers_[*sender]) : std::nullopt,
                            max_message_bytes);
}

void NodeLinks::count_received(uint64_t sender_tag, uint64_t bytes) {
  const auto node = tags::node_of(sender_tag);
  if (node < peers_.size() && node != me()) transport_.count_received(peers_[node], bytes);
}

void NodeLinks::set_link(uint32_t node, double latency_seconds, double bytes_per_second) {
  if (node < peers_.size() && node != me()) {
    transport_.set_link(peers_[node], latency_seconds, bytes_per_second);
  }
}

std::optional<std::string> NodeLinks::failed_peer(const char* what) const {
  for (uint32_t node = 0; node < peers_.size(); ++node) {
    if (node != me() && transport_.failed(peers_[node])) {
      const std::string& reason = transport_.failure(peers_[node]);
      return fmt::format("node {} ({}) of job '{}' failed while {}{}{}", node, layout_.nodes[node],
                         job_name_, what, reason.empty() ? "" : ": ", reason);
    }
  }
  for (uint32_t a = 0; a < aggregator_peers_.size(); ++a) {
    if (transport_.failed(aggregator_peers_[a])) {
      const std::string& reason = transport_.failure(aggregator_peers_[a]);
      return fmt::format("aggregator {} of job '{}' failed while {}{}{}", layout_.aggregators[a],
                         job_name_, what, reason.empty() ? "" : ": ", reason);
    }
  }
  return std::nullopt;
}

void NodeLinks::send_control(uint32_t node, capnp::MessageBuilder& message) {
  // Never wait for it: a large message goes by rendezvous, which completes only once the peer
  // receives it, and the peer may be sending to us at the same moment. The transport keeps the
  // bytes until the peer has accepted our handshake and UCX is done; a failure shows up as a
  // failed peer, which fails the job. On the control lane, so that a negotiation (and the
  // small collectives a cycle carries) never waits behind the job's bulk data.
  transport_.post(peers_[node], tags::make(tags::kControl, me(), job_tag_, 0),
                  std::make_shared<const std::vector<uint8_t>>(ipc::encode(message)),
                  transport::Lane::kControl);
}

void NodeLinks::send_control_to_all_live(capnp::MessageBuilder& message,
                                         const std::function<void(uint32_t node)>& address) {
  std::vector<std::shared_ptr<const void>> copies;
  std::vector<transport::Operation> sends;
  for (uint32_t node = 0; node < peers_.size(); ++node) {
    if (node == me() || transport_.failed(peers_[node])) continue;
    address(node);
    auto bytes = std::make_shared<const std::vector<uint8_t>>(ipc::encode(message));
    copies.push_back(bytes);
    const uint64_t tag = tags::make(tags::kControl, me(), job_tag_, 0);
    // On the control lane, behind the job's earlier control messages (an abort after them).
    if (transport_.authenticated(peers_[node])) {
      sends.push_back(transport_.send(peers_[node], tag, bytes->data(), bytes->size(), 0,
                                      transport::Lane::kControl));
    } else {
      transport_.post(peers_[node], tag, bytes, transport::Lane::kControl);  // after the handshake
    }
  }
  // Bounded: a peer that is gone does not hold us up. What is still in flight then is
  // retired with its bytes.
  const auto deadline = Clock::now() + std::chrono::seconds(1);
  auto all_done = [&] {
    return std::all_of(sends.begin(), sends.end(), [](const auto& op) { return op.done(); });
  };
  while (!all_done() && Clock::now() < deadline) {
    if (!transport_.progress()) sched_yield();
  }
  transport_.retire(std::move(sends), std::move(copies));
}

Flight::Flight(NodeLinks& links, Scratch* scratch, std::vector<std::shared_ptr<const void>> memory,
               const char* what)
    : links_(links), scratch_(scratch), memory_(std::move(memory)), what_(what) {}

Flight::~Flight() {
  std::vector<transport::Operation> pending;
  for (auto& operation : operations_) {
    if (!operation.valid()) continue;
    if (!operation.done()) {
      pending.push_back(std::move(operation));
    } else if (operation.is_receive() && operation.status() == UCS_OK) {
      links_.count_received(operation.sender_tag(), operation.received_bytes());
    }
  }
  if (pending.empty()) return;
  if (scratch_ != nullptr) {
    for (auto& buffer : scratch_->abandon()) memory_.push_back(std::move(buffer));
  }
  links_.transport().retire(std::move(pending), std::move(memory_));
}

size_t Flight::add(transport::Operation operation) {
  operations_.push_back(std::move(operation));
  return operations_.size() - 1;
}

std::optional<std::string> Flight::failure_of(const transport::Operation& operation) const {
  if (operation.status() == UCS_OK) return std::nullopt;
  // An operation fails with its connection: name the peer where the transport knows it.
  if (auto named = links_.failed_peer(what_)) return named;
  return fmt::format("job '{}': {} failed: {}", links_.job_name(), what_,
                     ucs_status_string(operation.status()));
}

size_t Flight::count_done() const {
  return static_cast<size_t>(std::count_if(operations_.begin(), operations_.end(),
                                           [](const auto& op) { return op.done(); }));
}

FlightWait::FlightWait(Flight& flight, std::optional<size_t> index)
    : flight_(&flight), index_(index), deadline_(Clock::now() + flight.links_.peer_timeout()) {}

bool FlightWait::ready() {
  Flight& f = *flight_;
  if (index_) {
    if (f.operations_[*index_].done()) {
      result_ = f.failure_of(f.operations_[*index_]);
      return true;
    }
  } else {
    while (f.waited_ < f.operations_.size() && f.operations_[f.waited_].done()) ++f.waited_;
    if (f.waited_ == f.operations_.size()) {
      for (const auto& operation : f.operations_) {
        if (!result_) result_ = f.failure_of(operation);
      }
      return true;
    }
  }
  if ((result_ = f.links_.failed_peer(f.what_))) return true;
  if (Clock::now() > deadline_) {
    // Silent for the peer timeout? Not if any of the Flight's operations finished meanwhile.
    const size_t done = f.count_done();
    if (done == done_at_deadline_) {
      result_ = fmt::format("job '{}': no progress for {} s while {}", f.links_.job_name(),
                            f.links_.peer_timeout().count(), f.what_);
      return true;
    }
    done_at_deadline_ = done;
    deadline_ = Clock::now() + f.links_.peer_timeout();
  }
  return false;
}

}  // namespace gradsync::daemon
