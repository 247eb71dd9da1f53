#include "transport/mesh.h"

#include "transport/network_transports.h"
#include "transport/reachable_address.h"

#include <arpa/inet.h>
#include <poll.h>

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cstring>
#include <stdexcept>

namespace gradsync::transport {

struct sockaddr_in parse_host_port(const std::string& host_port) {
  const size_t colon = host_port.rfind(':');
  if (colon == std::string::npos)
    throw std::invalid_argument("expected HOST:PORT, got " + host_port);
  const std::string host = host_port.substr(0, colon);
  const std::string port = host_port.substr(colon + 1);
  struct sockaddr_in address {};
  address.sin_family = AF_INET;
  char* end = nullptr;
  const long number = std::strtol(port.c_str(), &end, 10);
  if (port.empty() || *end != '\0' || number < 0 || number > 65535) {
    throw std::invalid_argument("bad port in " + host_port);
  }
  address.sin_port = htons(static_cast<uint16_t>(number));
  if (::inet_pton(AF_INET, host.c_str(), &address.sin_addr) != 1) {
    throw std::invalid_argument("bad IPv4 address in " + host_port);
  }
  return address;
}

namespace {

// A buffer sent as messages of at most `max_bytes` each (0: one message), in order.
struct MessageCut {
  MessageCut(size_t bytes, size_t max_bytes)
      : total(bytes),
        each(max_bytes == 0 || max_bytes >= bytes ? bytes : max_bytes),
        messages(each == 0 ? 1 : (bytes + each - 1) / each) {}
  size_t offset(size_t message) const { return message * each; }
  size_t bytes(size_t message) const { return std::min(each, total - offset(message)); }
  size_t total;
  size_t each;
  size_t messages;
};

std::vector<std::pair<std::string, std::string>> ucx_settings(const MeshOptions& options,
                                                              uint64_t rendezvous_min_bytes) {
  const std::string idle = std::to_string(options.keepalive_idle_seconds) + "s";
  const std::string interval = std::to_string(options.keepalive_interval_seconds) + "s";
  // Transport keys go without their transport's prefix (TCP_): UCX 1.13 matches the names
  // given to ucp_config_modify against each transport's table that way, and calls the prefixed
  // form an invalid configuration.
  // CM_REUSEADDR (UCX_TCP_CM_REUSEADDR, given with the CM prefix only): a daemon restarted on
  // its port binds it again at once, though connections of the one before linger in TIME_WAIT
  // on that port.
  std::vector<std::pair<std::string, std::string>> settings = {{"KEEPALIVE_INTERVAL", idle},
                                                               {"KEEPIDLE", idle},
                                                               {"KEEPINTVL", interval},
                                                               {"KEEPCNT", "3"},
                                                               {"CM_REUSEADDR", "y"}};
  // Over TCP only: see tcp_only() in network_transports.h.
  if (rendezvous_min_bytes == MeshOptions::kEveryMessageEager) {
    settings.emplace_back("RNDV_THRESH", "inf");
  } else if (rendezvous_min_bytes != 0) {
    settings.emplace_back("RNDV_THRESH", std::to_string(rendezvous_min_bytes));
  }
  return settings;
}

// The IPv4 address a connection to us comes from; 0 when UCX cannot say (it then counts as
// coming from any peer).
in_addr_t client_host(ucp_conn_request_h request) {
  ucp_conn_request_attr_t attributes{};
  attributes.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
  if (ucp_conn_request_query(request, &attributes) != UCS_OK ||
      attributes.client_address.ss_family != AF_INET) {
    return 0;
  }
  sockaddr_in address{};
  std::memcpy(&address, &attributes.client_address, sizeof(address));
  return address.sin_addr.s_addr;
}

std::string host_text(in_addr_t host) {
  if (host == 0) return "an unknown host";
  std::array<char, INET_ADDRSTRLEN> text{};
  const in_addr address{host};
  ::inet_ntop(AF_INET, &address, text.data(), text.size());
  return text.data();
}

}  // namespace

Mesh::Mesh(const MeshOptions& options)
    : held_sends_(options.backlog_bytes),
      network_transports_(transport::network_transports()),
      rendezvous_min_bytes_(tcp_only(network_transports_) ? options.tcp_rendezvous_min_bytes : 0),
      context_(create_context(ucx_settings(options, rendezvous_min_bytes_))),
      worker_(create_worker(context_.get())),
      key_(options.cluster_key),
      version_(options.version),
      handshake_timeout_(options.handshake_timeout),
      liveness_timeout_(options.liveness_timeout) {
  struct sockaddr_in address = parse_host_port(options.listen);
  check_listen_address(options.listen);
  ucp_listener_params_t params{};
  params.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  params.sockaddr.addr = reinterpret_cast<const struct sockaddr*>(&address);
  params.sockaddr.addrlen = sizeof(address);
  params.conn_handler.cb = &Mesh::on_connection;
  params.conn_handler.arg = this;
  ucp_listener_h listener = nullptr;
  GRADSYNC_UCX_CHECK(ucp_listener_create(worker_.get(), &params, &listener));
  listener_.reset(listener);
  ucp_listener_attr_t attributes{};
  attributes.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  GRADSYNC_UCX_CHECK(ucp_listener_query(listener, &attributes));
  port_ = ntohs(reinterpret_cast<const struct sockaddr_in*>(&attributes.sockaddr)->sin_port);
  own_address_ = options.listen.substr(0, options.listen.rfind(':')) + ":" + std::to_string(port_);
  ucp_am_handler_param_t handler{};
  handler.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                       UCP_AM_HANDLER_PARAM_FIELD_ARG;
  handler.id = kHandshakeAm;
  handler.cb = &Mesh::on_handshake_message;
  handler.arg = this;
  GRADSYNC_UCX_CHECK(ucp_worker_set_am_recv_handler(worker_.get(), &handler));
  GRADSYNC_UCX_CHECK(ucp_worker_get_efd(worker_.get(), &event_fd_));
  ucp_context_attr_t context_attributes{};
  context_attributes.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  GRADSYNC_UCX_CHECK(ucp_context_query(context_.get(), &context_attributes));
  moves_cuda_memory_ = (context_attributes.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
}

Mesh::~Mesh() {
  say_goodbye();
  // Endpoints before the listener and the worker (members are destroyed after this body).
  // Every one leaves the mesh before any is closed: a close progresses the worker, where a
  // peer that goes at the same moment fails others, and their error callbacks must find
  // nothing left to move (a list changing under its loop, or an endpoint closed twice, which
  // UCX does not survive).
  for (Peer& peer : peers_) close_lanes(peer);
  for (const Inbound& inbound : inbound_) to_close_.push_back(inbound.endpoint);
  for (const Accepted& accepted : inbound_accepted_) to_close_.push_back(accepted.endpoint);
  for (const Closing& closing : closing_) to_close_.push_back(closing.endpoint);
  inbound_.clear();
  inbound_accepted_.clear();
  closing_.clear();
  close_failed();
  // What came for jobs already over (a peer's last cycle, sent as the job ended here) is
  // received and dropped: UCX warns of every message still unmatched when its worker goes.
  discard(0, 0);
}

void Mesh::on_connection(ucp_conn_request_h request, void* arg) {
  auto* mesh = static_cast<Mesh*>(arg);
  auto context = std::make_unique<ErrorContext>(ErrorContext{mesh, kIncoming});
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.conn_request = request;
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &Mesh::on_endpoint_error;
  params.err_handler.arg = context.get();
  // Before the endpoint is made: making it consumes the request.
  const in_addr_t host = client_host(request);
  ucp_ep_h endpoint = nullptr;
  const ucs_status_t status = ucp_ep_create(mesh->worker_.get(), &params, &endpoint);
  if (status != UCS_OK) {
    // The client went as it was accepted. UCX has released the request with the failed
    // endpoint: rejecting it as well would touch freed memory.
    mesh->outcomes_.push_back(
        HandshakeOutcome{"(not named)", true, false,
                         "the connection from " + host_text(host) +
                             " failed as it was accepted: " + ucs_status_string(status)});
    return;
  }
  context->endpoint = endpoint;
  // It says nothing but the handshake until it has proved itself, within the timeout.
  Inbound inbound{endpoint, std::chrono::steady_clock::now() + mesh->handshake_timeout_};
  inbound.host = host;
  mesh->inbound_.push_back(std::move(inbound));
  mesh->error_contexts_.push_back(std::move(context));
}

void Mesh::on_endpoint_error(void* arg, ucp_ep_h endpoint, ucs_status_t status) {
  // Inside a UCX callback: record only. Closing progresses the worker, which must not happen
  // from a callback; close_failed() does it afterwards. An endpoint this mesh no longer holds
  // (closing already) is left alone.
  auto* context = static_cast<ErrorContext*>(arg);
  Mesh& mesh = *context->mesh;
  if (context->peer == kIncoming) {
    // The peer's own connection to us; its failure shows on our endpoint to it as well.
    const auto handshaking = std::find_if(mesh.inbound_.begin(), mesh.inbound_.end(),
                                          [&](const Inbound& i) { return i.endpoint == endpoint; });
    if (handshaking != mesh.inbound_.end()) {
      mesh.outcomes_.push_back(HandshakeOutcome{handshaking->address, true, false,
                                                "the connection closed during the handshake"});
      mesh.inbound_.erase(handshaking);
    } else if (std::erase_if(mesh.inbound_accepted_,
                             [&](const Accepted& a) { return a.endpoint == endpoint; }) == 0 &&
               std::erase_if(mesh.closing_,
                             [&](const Closing& c) { return c.endpoint == endpoint; }) == 0) {
      return;
    }
  } else {
    // Either of our connections to it: the peer fails as a whole, and the other one closes.
    Peer& peer = mesh.peers_[context->peer];
    if (!peer.holds(endpoint)) return;
    if (!peer.failed) ++peer.stats.errors;
    if (peer.failure.empty()) {
      peer.failure = std::string("its connection failed: ") + ucs_status_string(status);
    }
    peer.failed = true;
    peer.waiting.clear();
    mesh.close_lanes(peer);
    mesh.close_connections_from(peer);
    return;
  }
  mesh.to_close_.push_back(endpoint);
}

void Mesh::close_lanes(Peer& peer) {
  // Inside UCX's error callback too: only moves endpoints to to_close_.
  for (Connection& connection : peer.lanes) {
    if (connection.endpoint != nullptr) {
      to_close_.push_back(std::exchange(connection.endpoint, nullptr));
    }
  }
}

void Mesh::close_connections_from(const Peer& peer) {
  // Inside UCX's error callback too: only moves endpoints to to_close_.
  const struct sockaddr_in address = parse_host_port(peer.address);  // valid: connect() parsed it
  std::erase_if(inbound_accepted_, [&](const Accepted& accepted) {
    const bool from_peer = accepted.made_by(address);
    if (from_peer) to_close_.push_back(accepted.endpoint);
    return from_peer;
  });
}

void Mesh::close_failed() {
  while (!to_close_.empty()) {
    const ucp_ep_h endpoint = to_close_.back();
    to_close_.pop_back();
    close_endpoint(endpoint, true);
  }
}

void Mesh::close_endpoint(ucp_ep_h endpoint, bool force) {
  ucp_request_param_t params{};
  params.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  params.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_ptr_t request = ucp_ep_close_nbx(endpoint, &params);
  if (request != nullptr && !UCS_PTR_IS_ERR(request)) {
    // Bounded: a forced close completes without the peer.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (ucp_request_check_status(request) == UCS_INPROGRESS &&
           std::chrono::steady_clock::now() < deadline) {
      ucp_worker_progress(worker_.get());
    }
    ucp_request_free(request);
  }
  // UCX calls its error handler no more: the context may go.
  std::erase_if(error_contexts_,
                [&](const auto& context) { return context->endpoint == endpoint; });
}

PeerId Mesh::connect(const std::string& address) {
  if (auto it = peer_by_address_.find(address); it != peer_by_address_.end()) {
    Peer& peer = peers_[it->second];
    // A failure every job has been told of: the peer daemon may be back (restarted).
    if (peer.failed && peer.reported) open(it->second);
    return it->second;
  }
  // Throws on a malformed address, before the peer exists.
  const in_addr_t host = parse_host_port(address).sin_addr.s_addr;
  const auto id = static_cast<PeerId>(peers_.size());
  peers_.push_back(Peer{address, host});
  peer_by_address_[address] = id;
  open(id);
  return id;
}

void Mesh::open(PeerId id) {
  Peer& peer = peers_[id];
  peer.failed = false;
  peer.left = false;
  peer.reported = false;
  peer.failure.clear();
  const struct sockaddr_in socket_address = parse_host_port(peer.address);
  for (Connection& connection : peer.lanes) {
    // The Hello can fail the peer inside its send (see send_handshake); the other connection
    // is then not made.
    if (peer.failed) return;
    auto context = std::make_unique<ErrorContext>(ErrorContext{this, id});
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    params.sockaddr.addr = reinterpret_cast<const struct sockaddr*>(&socket_address);
    params.sockaddr.addrlen = sizeof(socket_address);
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = &Mesh::on_endpoint_error;
    params.err_handler.arg = context.get();
    ucp_ep_h endpoint = nullptr;
    GRADSYNC_UCX_CHECK(ucp_ep_create(worker_.get(), &params, &endpoint));
    context->endpoint = endpoint;
    error_contexts_.push_back(std::move(context));
    connection = Connection{endpoint, false, false, random_nonce()};
    HandshakeMessage hello;
    hello.type = HandshakeType::kHello;
    hello.has_key = key_.has_value();
    hello.client_nonce = connection.nonce;
    hello.address = own_address_;
    hello.version = version_;
    send_handshake(endpoint, hello);
  }
}

size_t Mesh::largest_eager_message() const {
  if (rendezvous_min_bytes_ < 2 || rendezvous_min_bytes_ == MeshOptions::kEveryMessageEager) {
    return 0;
  }
  // A power of two, so that the messages of a buffer start aligned.
  return std::bit_floor(rendezvous_min_bytes_ - 1);
}

Operation Mesh::send(PeerId peer_id, uint64_t tag, const void* data, size_t bytes,
                     size_t max_message_bytes, Lane lane) {
  auto state = std::make_unique<Operation::State>();
  Peer& peer = peers_.at(peer_id);
  const ucp_ep_h endpoint = peer.lane(lane).endpoint;
  if (peer.failed || endpoint == nullptr || !peer.accepted()) {
    ++peer.stats.errors;
    const ucs_status_t status =
        peer.accepted() || peer.failed ? UCS_ERR_CONNECTION_RESET : UCS_ERR_NOT_CONNECTED;
    return Operation::start(worker_.get(), std::move(state), false, 1,
                            [&](size_t, ucp_request_param_t&) { return UCS_STATUS_PTR(status); });
  }
  peer.stats.bytes_sent += bytes;
  state->held = &held_sends_;
  state->send_bytes = bytes;
  const auto* first = static_cast<const uint8_t*>(data);
  const MessageCut cut(bytes, max_message_bytes);
  return Operation::start(worker_.get(), std::move(state), false, cut.messages,
                          [&](size_t m, ucp_request_param_t& params) {
                            return ucp_tag_send_nbx(endpoint, first + cut.offset(m), cut.bytes(m),
                                                    tag, &params);
                          });
}

void Mesh::post(PeerId peer_id, uint64_t tag, std::shared_ptr<const std::vector<uint8_t>> bytes,
                Lane lane) {
  Peer& peer = peers_.at(peer_id);
  if (peer.failed) {
    ++peer.stats.errors;
    return;
  }
  if (!peer.accepted()) {
    peer.waiting.push_back(Posted{tag, std::move(bytes), lane});
    return;
  }
  std::vector<Operation> operations;
  operations.push_back(send(peer_id, tag, bytes->data(), bytes->size(), 0, lane));
  retire(std::move(operations), {std::move(bytes)});
}

Operation Mesh::receive(uint64_t tag, uint64_t tag_mask, void* data, size_t bytes,
                        std::optional<PeerId> from, size_t max_message_bytes) {
  auto state = std::make_unique<Operation::State>();
  state->source = from.value_or(Operation::kAnySource);
  auto* first = static_cast<uint8_t*>(data);
  const MessageCut cut(bytes, max_message_bytes);
  return Operation::start(worker_.get(), std::move(state), true, cut.messages,
                          [&](size_t m, ucp_request_param_t& params) {
                            return ucp_tag_recv_nbx(worker_.get(), first + cut.offset(m),
                                                    cut.bytes(m), tag, tag_mask, &params);
                          });
}

Operation Mesh::receive_probed(ucp_tag_message_h handle, void* data, size_t bytes) {
  return Operation::start(worker_.get(), std::make_unique<Operation::State>(), true, 1,
                          [&](size_t, ucp_request_param_t& params) {
                            return ucp_tag_msg_recv_nbx(worker_.get(), data, bytes, handle,
                                                        &params);
                          });
}

std::optional<Mesh::Message> Mesh::poll_message(uint64_t tag, uint64_t tag_mask) {
  ucp_tag_recv_info_t info{};
  while (ucp_tag_message_h handle = ucp_tag_probe_nb(worker_.get(), tag, tag_mask, 1, &info)) {
    if (message_buffer_bytes_ < info.length) {
      message_buffer_bytes_ = std::max(info.length, 2 * message_buffer_bytes_);
      message_buffer_ = std::make_unique_for_overwrite<uint8_t[]>(message_buffer_bytes_);
    }
    Operation operation = receive_probed(handle, message_buffer_.get(), info.length);
    // Bounded: an eager message whose connection broke half-way never finishes.
    const auto deadline = std::chrono::steady_clock::now() + liveness_timeout_;
    while (!operation.done() && std::chrono::steady_clock::now() < deadline) {
      ucp_worker_progress(worker_.get());
    }
    if (operation.done() && operation.status() == UCS_OK) {
      return Message{info.sender_tag, std::span(message_buffer_.get(), info.length)};
    }
    // The sender failed while its message was on the way (a rendezvous the dead peer can no
    // longer serve, or the rest of an eager one that will not come): the message is lost.
    // Not this daemon's fault, nor any other peer's: go on with the next message. A receive
    // still pending keeps the buffer, which UCX may yet write; the next message gets another.
    if (!operation.done()) {
      std::vector<Operation> pending;
      pending.push_back(std::move(operation));
      retire(std::move(pending), {std::shared_ptr<const uint8_t[]>(std::move(message_buffer_))});
      message_buffer_bytes_ = 0;
    }
    ++lost_messages_;
    lost_tags_.push_back(info.sender_tag);
  }
  return std::nullopt;
}

std::vector<uint64_t> Mesh::discard(uint64_t tag, uint64_t tag_mask) {
  std::vector<uint64_t> discarded;
  ucp_tag_recv_info_t info{};
  while (ucp_tag_message_h handle = ucp_tag_probe_nb(worker_.get(), tag, tag_mask, 1, &info)) {
    auto sink = std::make_shared<std::vector<uint8_t>>(info.length);
    std::vector<Operation> operations;
    operations.push_back(receive_probed(handle, sink->data(), info.length));
    // Not retire(): a matched receive must not be cancelled, only waited for.
    std::erase_if(operations, [](const Operation& op) { return op.done(); });
    if (!operations.empty()) {
      Retired retired{std::move(operations), {sink}, {}};
      add_feeders(Operation::kAnySource, retired.feeders);
      retired_.push_back(std::move(retired));
    }
    discarded.push_back(info.sender_tag);
  }
  return discarded;
}

bool Mesh::progress() {
  bool any = ucp_worker_progress(worker_.get()) != 0;
  if (handshake_work()) any |= serve_handshakes();
  if (!to_close_.empty()) close_failed();
  if (!retired_.empty()) {
    std::erase_if(retired_, [this](const Retired& r) { return finished(r); });
  }
  return any;
}

void Mesh::retire(std::vector<Operation> operations,
                  std::vector<std::shared_ptr<const void>> memory) {
  for (Operation& operation : operations) {
    if (operation.valid()) operation.cancel();
  }
  std::erase_if(operations, [](const Operation& op) { return !op.valid() || op.done(); });
  if (operations.empty()) return;
  Retired retired{std::move(operations), std::move(memory), {}};
  for (const Operation& operation : retired.operations) {
    if (operation.is_receive()) add_feeders(operation.source(), retired.feeders);
  }
  retired_.push_back(std::move(retired));
}

void Mesh::add_feeders(uint32_t source, std::vector<uint64_t>& feeders) const {
  const bool any = source == Operation::kAnySource || source >= peers_.size();
  std::vector<struct sockaddr_in> daemons;  // every peer's, by PeerId: connect() parsed each
  if (!any) {
    daemons.reserve(peers_.size());
    for (const Peer& peer : peers_) daemons.push_back(parse_host_port(peer.address));
  }
  // Made by another of our peers, by the daemon its handshake named: it carries that peer's
  // data only, even from the source's host (daemons of one machine).
  auto made_by_another_peer = [&](const Accepted& accepted) {
    for (size_t peer = 0; peer < daemons.size(); ++peer) {
      if (peer != source && accepted.made_by(daemons[peer])) return true;
    }
    return false;
  };
  for (const Accepted& accepted : inbound_accepted_) {
    // The source's own connections (by the daemon their handshake named, or by host where
    // that names no other peer: a daemon may be reached by another address than it claims),
    // and any whose origin is unknown. Once none is open, none of the rest of its message can
    // come: its connections closed when we gave up on it (close_connections_from), and a
    // healthy peer's connections carry nothing of the failed one's.
    const bool may_carry =
        any || accepted.host == 0 || !accepted.daemon || accepted.made_by(daemons[source]) ||
        (accepted.host == peers_[source].host && !made_by_another_peer(accepted));
    if (may_carry) feeders.push_back(accepted.serial);
  }
}

bool Mesh::accepted_alive(uint64_t serial) const {
  return std::any_of(inbound_accepted_.begin(), inbound_accepted_.end(),
                     [serial](const Accepted& a) { return a.serial == serial; });
}

bool Mesh::finished(const Retired& retired) const {
  bool pending_receive = false;
  for (const Operation& operation : retired.operations) {
    if (operation.done()) continue;
    if (!operation.is_receive()) return false;  // UCX finishes or fails every send
    pending_receive = true;
  }
  // Rarely here: a receive that outlived its collective. Once no connection that could carry
  // the rest of its message is open, none of it can come (a new connection carries new
  // messages only), so UCX will never write its memory again; its request stays with UCX.
  return !pending_receive || std::none_of(retired.feeders.begin(), retired.feeders.end(),
                                          [this](uint64_t s) { return accepted_alive(s); });
}

bool Mesh::arm() {
  // Arming is only valid once progress has nothing left to do; and whatever progress does
  // now (a message landing in the unexpected queue) the caller must look at before sleeping.
  if (ucp_worker_progress(worker_.get()) != 0 || !handshake_inbox_.empty()) return false;
  const ucs_status_t status = ucp_worker_arm(worker_.get());
  if (status == UCS_ERR_BUSY) return false;
  GRADSYNC_UCX_CHECK(status);
  return true;
}

void Mesh::sleep(std::chrono::milliseconds timeout) {
  if (!arm()) return;
  struct pollfd descriptor {};
  descriptor.fd = event_fd_;
  descriptor.events = POLLIN;
  ::poll(&descriptor, 1, static_cast<int>(timeout.count()));
}

void Mesh::set_link(PeerId peer, double latency_seconds, double bytes_per_second) {
  PeerStats& stats = peers_.at(peer).stats;
  stats.latency_seconds = latency_seconds;
  stats.bytes_per_second = bytes_per_second;
}

std::vector<PeerId> Mesh::take_failed_peers() {
  std::vector<PeerId> failed;
  for (PeerId id = 0; id < peers_.size(); ++id) {
    if (peers_[id].failed && !peers_[id].reported) {
      peers_[id].reported = true;
      failed.push_back(id);
    }
  }
  return failed;
}

}  // namespace gradsync::transport
