// The mesh's side of the cluster handshake (handshake.h): the server half for connections
// made to us, the client half for ours. UCX delivers the messages into an inbox from its
// callback; everything else happens here, outside UCX's callbacks.
#include "transport/mesh.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace gradsync::transport {
namespace {

// Far above any handshake message, far below what a flood could pile up.
constexpr size_t kMaxHandshakeBytes = 1024;
constexpr size_t kMaxInbox = 1024;
// Time a refused connection's Result has to go out before the connection is closed.
constexpr std::chrono::milliseconds kRefusalLinger{200};
// Time a daemon that shuts down gives its goodbyes to go out.
constexpr std::chrono::milliseconds kGoodbyeLinger{500};

}  // namespace

ucs_status_t Mesh::on_handshake_message(void* arg, const void* /*header*/, size_t /*header_bytes*/,
                                        void* data, size_t bytes,
                                        const ucp_am_recv_param_t* param) {
  auto* mesh = static_cast<Mesh*>(arg);
  // A handshake message is small and sent eagerly: anything else is dropped unread.
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0 || bytes > kMaxHandshakeBytes ||
      mesh->handshake_inbox_.size() >= kMaxInbox) {
    return UCS_OK;
  }
  const ucp_ep_h endpoint =
      (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) != 0 ? param->reply_ep : nullptr;
  const auto* begin = static_cast<const uint8_t*>(data);
  mesh->handshake_inbox_.push_back(Delivery{endpoint, std::vector<uint8_t>(begin, begin + bytes)});
  return UCS_OK;
}

bool Mesh::serve_handshakes() {
  bool did = false;
  std::vector<Delivery> inbox;
  inbox.swap(handshake_inbox_);
  for (const Delivery& delivery : inbox) {
    did = true;
    const std::optional<HandshakeMessage> message = decode_handshake(delivery.bytes);
    const auto inbound = std::find_if(inbound_.begin(), inbound_.end(), [&](const Inbound& i) {
      return i.endpoint == delivery.endpoint;
    });
    if (delivery.endpoint != nullptr && inbound != inbound_.end()) {
      const Inbound copy = *inbound;
      if (!message) {
        refuse_inbound(copy, "it sent a malformed handshake message");
      } else if (message->type == HandshakeType::kHello && copy.stage == Inbound::Stage::kHello) {
        on_hello(*inbound, *message);
      } else if (message->type == HandshakeType::kProof && copy.stage == Inbound::Stage::kProof) {
        on_proof(*inbound, *message);
      } else {
        refuse_inbound(copy, "it broke the handshake's order");
      }
      continue;
    }
    if (message &&
        (message->type == HandshakeType::kPing || message->type == HandshakeType::kPong)) {
      on_liveness(delivery, *message);
      continue;
    }
    if (message && message->type == HandshakeType::kGoodbye) {
      on_goodbye(delivery);
      continue;
    }
    // On our own connections: answers name the handshake by our nonce. Anything else (a
    // connection that finished its handshake, or is gone) is dropped.
    if (!message ||
        (message->type != HandshakeType::kChallenge && message->type != HandshakeType::kResult)) {
      continue;
    }
    if (const auto handshake = find_handshake(message->client_nonce)) {
      const auto [id, lane] = *handshake;
      if (message->type == HandshakeType::kChallenge) {
        on_challenge(id, lane, *message);
      } else {
        on_result(id, lane, *message);
      }
    }
  }
  const auto now = std::chrono::steady_clock::now();
  std::vector<Inbound> expired;
  for (const Inbound& inbound : inbound_) {
    if (inbound.deadline <= now) expired.push_back(inbound);
  }
  for (const Inbound& inbound : expired) {
    refuse_inbound(inbound, fmt::format("it did not complete the handshake within {} ms",
                                        handshake_timeout_.count()));
    did = true;
  }
  std::vector<Check> unanswered;
  std::erase_if(checks_, [&](const Check& check) {
    if (check.deadline > now) return false;
    unanswered.push_back(check);
    return true;
  });
  for (const Check& check : unanswered) {
    Peer& peer = peers_[check.peer];
    const bool current = std::any_of(peer.lanes.begin(), peer.lanes.end(),
                                     [&](const Connection& c) { return c.nonce == check.nonce; });
    if (peer.failed || !current) continue;  // failed meanwhile, or reconnected
    ++peer.stats.errors;
    peer.failed = true;
    peer.failure =
        fmt::format("it did not answer a liveness check within {} ms", liveness_timeout_.count());
    close_lanes(peer);
    close_connections_from(peer);
    did = true;
  }
  for (size_t i = 0; i < closing_.size();) {
    if (closing_[i].at <= now) {
      const ucp_ep_h endpoint = closing_[i].endpoint;
      closing_.erase(closing_.begin() + static_cast<ptrdiff_t>(i));
      close_endpoint(endpoint, true);
      did = true;
    } else {
      ++i;
    }
  }
  return did;
}

std::optional<std::pair<PeerId, Lane>> Mesh::find_handshake(const Nonce& nonce) const {
  for (PeerId id = 0; id < peers_.size(); ++id) {
    const Peer& peer = peers_[id];
    if (peer.failed) continue;
    for (const Lane lane : {Lane::kBulk, Lane::kControl}) {
      const Connection& connection = peer.lane(lane);
      if (!connection.accepted && connection.nonce == nonce) return std::pair{id, lane};
    }
  }
  return std::nullopt;
}

// Liveness: a Ping goes on each of our connections to the peer, named by a fresh nonce; the
// peer answers on the same connection (its endpoint for it), and only on one it has accepted.
// Both must answer: control messages stuck on a cut connection would stall a job as surely
// as its data.

void Mesh::check_alive(PeerId id) {
  Peer& peer = peers_.at(id);
  if (peer.failed || !peer.accepted() ||
      std::any_of(checks_.begin(), checks_.end(), [&](const Check& c) { return c.peer == id; })) {
    return;
  }
  const auto deadline = std::chrono::steady_clock::now() + liveness_timeout_;
  for (Connection& connection : peer.lanes) {
    // A Ping on a connection already reset fails the peer inside the send (see
    // send_handshake): the other connection is then closing, and the check moot.
    if (peer.failed) break;
    // The handshake's nonce is spent: the check reuses the field, and a reconnection (which
    // draws a new one) makes a late answer to the old connection's check moot.
    connection.nonce = random_nonce();
    HandshakeMessage ping;
    ping.type = HandshakeType::kPing;
    ping.client_nonce = connection.nonce;
    send_handshake(connection.endpoint, ping);
    checks_.push_back(Check{id, connection.nonce, deadline});
  }
  if (peer.failed) std::erase_if(checks_, [&](const Check& check) { return check.peer == id; });
}

void Mesh::on_liveness(const Delivery& delivery, const HandshakeMessage& message) {
  if (message.type == HandshakeType::kPing) {
    const bool accepted =
        delivery.endpoint != nullptr &&
        std::any_of(inbound_accepted_.begin(), inbound_accepted_.end(),
                    [&](const Accepted& a) { return a.endpoint == delivery.endpoint; });
    if (!accepted) return;
    HandshakeMessage pong;
    pong.type = HandshakeType::kPong;
    pong.client_nonce = message.client_nonce;
    send_handshake(delivery.endpoint, pong);
    return;
  }
  std::erase_if(checks_, [&](const Check& check) { return check.nonce == message.client_nonce; });
}

// Goodbye: on each connection a peer made to us, with REPLY, so that it arrives naming one of
// the peer's own endpoints, those its jobs send on. Only those connections can say it.

void Mesh::say_goodbye() {
  HandshakeMessage goodbye;
  goodbye.type = HandshakeType::kGoodbye;
  auto bytes = std::make_shared<const std::vector<uint8_t>>(encode(goodbye));
  std::vector<Operation> sends;
  std::vector<uint64_t> told;
  sends.reserve(inbound_accepted_.size());
  told.reserve(inbound_accepted_.size());
  // Over a copy: a send on a connection already reset drops it from inbound_accepted_ on the
  // spot (see send_handshake). Its endpoint stays valid until close_failed().
  const std::vector<Accepted> accepted_now = inbound_accepted_;
  for (const Accepted& accepted : accepted_now) {
    sends.push_back(start_handshake_send(accepted.endpoint, *bytes, true));
    told.push_back(accepted.serial);
  }
  // Then until each of those peers has hung up, which it does once it has read the goodbye.
  // Closing first would lose the goodbye wherever the peer was still sending to us (eager bulk
  // data): a socket closed with unread data resets the connection, and the reset discards
  // what the peer had not read yet. Bounded: a peer that does not hang up in time learns from
  // the broken connection instead.
  const auto deadline = std::chrono::steady_clock::now() + kGoodbyeLinger;
  auto all_done = [&] {
    return std::all_of(sends.begin(), sends.end(), [](const Operation& op) { return op.done(); }) &&
           std::none_of(told.begin(), told.end(), [this](uint64_t s) { return accepted_alive(s); });
  };
  while (!all_done() && std::chrono::steady_clock::now() < deadline) {
    ucp_worker_progress(worker_.get());
  }
  std::erase_if(sends, [](const Operation& op) { return op.done(); });
  if (!sends.empty()) retire(std::move(sends), {std::move(bytes)});
}

void Mesh::on_goodbye(const Delivery& delivery) {
  // The connection's close may have come in the same progress call, and failed the peer
  // already: its endpoint is then on its way to being closed, and still has its context.
  const auto context =
      std::find_if(error_contexts_.begin(), error_contexts_.end(), [&](const auto& c) {
        return delivery.endpoint != nullptr && c->endpoint == delivery.endpoint &&
               c->peer != kIncoming;
      });
  if (context == error_contexts_.end()) return;
  Peer& peer = peers_[(*context)->peer];
  if (peer.reported) return;  // every job has heard of its failure already
  // Both of ours: the peer waits for us to hang up (say_goodbye).
  close_lanes(peer);
  if (!peer.failed) peer.waiting.clear();
  peer.failed = true;
  peer.left = true;
  peer.failure = "it shut down";
}

Operation Mesh::start_handshake_send(ucp_ep_h endpoint, const std::vector<uint8_t>& bytes,
                                     bool reply) {
  return Operation::start(worker_.get(), std::make_unique<Operation::State>(), false, 1,
                          [&](size_t, ucp_request_param_t& params) {
                            params.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
                            params.flags =
                                UCP_AM_SEND_FLAG_EAGER | (reply ? UCP_AM_SEND_FLAG_REPLY : 0);
                            return ucp_am_send_nbx(endpoint, kHandshakeAm, nullptr, 0, bytes.data(),
                                                   bytes.size(), &params);
                          });
}

void Mesh::send_handshake(ucp_ep_h endpoint, const HandshakeMessage& message) {
  // The client's messages say which connection they came on (REPLY): the server knows a
  // connection only by its endpoint. The server's answers name the handshake by the client's
  // nonce instead, so they need no reply endpoint.
  //
  // UCX runs the endpoint's error callback inside the send when the connection is already
  // reset (a peer killed outright): on return, on_endpoint_error may have failed the peer and
  // moved its endpoints, both connections, to to_close_. Callers look again before going on.
  const bool from_client = message.type == HandshakeType::kHello ||
                           message.type == HandshakeType::kProof ||
                           message.type == HandshakeType::kPing;
  auto bytes = std::make_shared<const std::vector<uint8_t>>(encode(message));
  std::vector<Operation> operations;
  operations.push_back(start_handshake_send(endpoint, *bytes, from_client));
  retire(std::move(operations), {bytes});
}

// Server side.

void Mesh::on_hello(Inbound& inbound, const HandshakeMessage& hello) {
  inbound.address = hello.address;
  inbound.client_nonce = hello.client_nonce;
  if (hello.version != version_) {
    refuse_inbound(Inbound(inbound),
                   fmt::format("the connecting daemon runs gradsync {}, this one {}: every "
                               "daemon of a cluster must run the same version",
                               hello.version.empty() ? "(unnamed)" : hello.version, version_));
  } else if (key_ && hello.has_key) {
    inbound.server_nonce = random_nonce();
    inbound.stage = Inbound::Stage::kProof;
    HandshakeMessage challenge;
    challenge.type = HandshakeType::kChallenge;
    challenge.client_nonce = inbound.client_nonce;
    challenge.server_nonce = inbound.server_nonce;
    challenge.proof = key_->prove(ClusterKey::Role::kServer, inbound.client_nonce,
                                  inbound.server_nonce, inbound.address);
    send_handshake(inbound.endpoint, challenge);
  } else if (!key_ && !hello.has_key) {
    accept_inbound(Inbound(inbound));
  } else if (key_) {
    refuse_inbound(Inbound(inbound),
                   "the connecting daemon has no cluster key, and this one requires it");
  } else {
    refuse_inbound(Inbound(inbound),
                   "the connecting daemon has a cluster key, and this one has "
                   "none");
  }
}

void Mesh::on_proof(Inbound& inbound, const HandshakeMessage& proof) {
  if (key_->verify(proof.proof, ClusterKey::Role::kClient, inbound.client_nonce,
                   inbound.server_nonce, inbound.address)) {
    accept_inbound(Inbound(inbound));
  } else {
    refuse_inbound(Inbound(inbound),
                   "the connecting daemon's proof does not match the cluster key (it holds "
                   "another key)");
  }
}

bool Mesh::answer_inbound(const Inbound& inbound, const std::string& refusal) {
  HandshakeMessage result;
  result.type = HandshakeType::kResult;
  result.client_nonce = inbound.client_nonce;
  result.accepted = refusal.empty();
  result.reason = refusal;
  send_handshake(inbound.endpoint, result);
  // Gone already when the send found the connection reset: on_endpoint_error ended the
  // handshake (its outcome counted, the endpoint to close).
  return std::erase_if(inbound_, [&](const Inbound& i) { return i.endpoint == inbound.endpoint; }) >
         0;
}

void Mesh::accept_inbound(const Inbound& inbound) {
  if (!answer_inbound(inbound, {})) return;
  std::optional<struct sockaddr_in> daemon;
  try {
    daemon = parse_host_port(inbound.address);
    if (daemon->sin_addr.s_addr == htonl(INADDR_ANY)) daemon->sin_addr.s_addr = inbound.host;
  } catch (const std::invalid_argument&) {
    // Not an address we could connect to: no peer of ours can be this daemon.
  }
  inbound_accepted_.push_back(
      Accepted{inbound.endpoint, inbound.host, next_accepted_serial_++, daemon});
  outcomes_.push_back(HandshakeOutcome{inbound.address, true, true, {}});
}

void Mesh::refuse_inbound(const Inbound& inbound, const std::string& reason) {
  if (!answer_inbound(inbound, reason)) return;
  closing_.push_back(Closing{inbound.endpoint, std::chrono::steady_clock::now() + kRefusalLinger});
  outcomes_.push_back(HandshakeOutcome{
      inbound.address.empty() ? std::string("(not named)") : inbound.address, true, false, reason});
}

// Client side.

void Mesh::on_challenge(PeerId id, Lane lane, const HandshakeMessage& challenge) {
  Connection& connection = peers_[id].lane(lane);
  if (!key_) {
    refuse_peer(id, "it asked for a cluster key, and this daemon has none");
    return;
  }
  if (!key_->verify(challenge.proof, ClusterKey::Role::kServer, connection.nonce,
                    challenge.server_nonce, own_address_)) {
    refuse_peer(id, "it did not prove the cluster key (it holds another key)");
    return;
  }
  connection.server_proved = true;
  HandshakeMessage proof;
  proof.type = HandshakeType::kProof;
  proof.client_nonce = connection.nonce;
  proof.proof = key_->prove(ClusterKey::Role::kClient, connection.nonce, challenge.server_nonce,
                            own_address_);
  send_handshake(connection.endpoint, proof);
}

void Mesh::on_result(PeerId id, Lane lane, const HandshakeMessage& result) {
  Peer& peer = peers_[id];
  Connection& connection = peer.lane(lane);
  if (!result.accepted) {
    refuse_peer(id, "it refused this daemon: " + result.reason);
  } else if (key_ && !connection.server_proved) {
    refuse_peer(id, "it accepted this daemon without proving the cluster key");
  } else {
    connection.accepted = true;
    if (!peer.accepted()) return;  // the other connection's handshake goes on
    outcomes_.push_back(HandshakeOutcome{peer.address, false, true, {}});
    for (Posted& posted : std::exchange(peer.waiting, {})) {
      post(id, posted.tag, std::move(posted.bytes), posted.lane);
    }
  }
}

void Mesh::refuse_peer(PeerId id, const std::string& reason) {
  Peer& peer = peers_[id];
  if (peer.failed) return;  // its other connection's refusal said it
  ++peer.stats.errors;
  peer.failed = true;
  peer.failure = reason;
  peer.waiting.clear();
  close_lanes(peer);
  outcomes_.push_back(HandshakeOutcome{peer.address, false, false, reason});
}

}  // namespace gradsync::transport
