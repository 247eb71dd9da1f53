// The daemon's view of its peers over UCX: one worker, a listener for peers that connect to
// us, and an endpoint to each peer we connect to. Messages are tagged; receives are posted
// against a tag and mask and land directly in the caller's buffer.
//
// A daemon makes two connections to each peer, one per Lane (transport.h): bulk data, and
// control messages, which would otherwise wait behind every byte of bulk data handed to TCP
// before them. A daemon sends only on the endpoints it created, and tags carry the sender's
// node index, so the listener side learns who connected only for its logs (from the
// handshake). Endpoints use peer-failure error handling: a peer that dies shows up in
// take_failed_peers() rather than as a hang; a connection that stops carrying messages without
// an error is found by check_alive(). A peer fails as a whole: when either of our connections
// to it fails, the other closes with it, and so do the connections it made to us.
//
// Each connection runs the cluster handshake (handshake.h) over UCX active messages before it
// carries anything else; a peer is accepted once both of ours to it are. Until then, control
// messages to it wait in the mesh (post()), and send() to it fails; a peer that refuses us, or
// fails to prove the key, is failed with the reason. A connection to us that does not complete
// the handshake in time is closed.
#pragma once

#include "transport/handshake.h"
#include "transport/transport.h"
#include "transport/ucx.h"

#include <netinet/in.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace gradsync::transport {

// HOST:PORT (IPv4) to a socket address; throws std::invalid_argument.
struct sockaddr_in parse_host_port(const std::string& host_port);

struct MeshOptions {
  std::string listen;  // HOST:PORT; port 0 picks one
  // A peer host that vanishes without closing its connections (power loss, a cut link) is
  // noticed after about idle + 3 * interval seconds of silence, by TCP keepalive.
  uint32_t keepalive_idle_seconds = 10;
  uint32_t keepalive_interval_seconds = 2;
  std::optional<ClusterKey> cluster_key;  // none: only daemons without a key are accepted
  // This daemon's gradsync version: a peer of another version is refused at the handshake, as
  // no two versions promise to speak the same protocol.
  std::string version = GRADSYNC_VERSION;
  std::chrono::milliseconds handshake_timeout{10000};  // for a connection to us
  std::chrono::milliseconds liveness_timeout{3000};    // for an answer to check_alive
  // Where UCX reaches other hosts over TCP only (network_transports.h): messages of this many
  // bytes and more go after a rendezvous handshake, smaller ones eagerly. kEveryMessageEager
  // sends all of them eagerly; 0 leaves it to UCX.
  uint64_t tcp_rendezvous_min_bytes = 0;
  static constexpr uint64_t kEveryMessageEager = UINT64_MAX;
  // Sends held unfinished to this many bytes or more: the network takes less than it is
  // given (SendLoad::backlogged_seconds).
  uint64_t backlog_bytes = 4 << 20;
};

// A handshake that ended, for the logs and the metrics.
struct HandshakeOutcome {
  std::string address;   // the peer's (for a connection to us, as it claimed in its Hello)
  bool inbound = false;  // a connection the peer made to us
  bool accepted = false;
  std::string reason;  // why it was refused
};

// What went over a peer's connections, for the metrics and gradsyncctl. Bytes received are
// counted by whoever knows the sender (tags name it within a job, not in the mesh).
struct PeerStats {
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t errors = 0;  // connection failures and sends refused on a failed connection
  // The link as the last job that measured it found it (zero: not measured).
  double latency_seconds = 0;
  double bytes_per_second = 0;
};

class Mesh final : public Transport {
 public:
  explicit Mesh(const MeshOptions& options);
  ~Mesh() override;
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  uint16_t port() const { return port_; }
  // Sends UCX holds and has not finished. Over TCP nothing wakes a sleeping worker when a
  // socket it could not write to drains: such a send moves only when progress() is called, so
  // the caller should poll rather than sleep while this is not zero.
  size_t unfinished_sends() const { return held_sends_.count(); }
  SendLoad send_load(std::chrono::steady_clock::time_point now) const override {
    return {held_sends_.bytes(), held_sends_.delivered_bytes(),
            std::chrono::duration<double>(held_sends_.backlogged(now)).count()};
  }
  // UCX's network transports on this host, and the rendezvous threshold set for them (0:
  // UCX's own, as on any network with more than TCP).
  const std::vector<std::string>& network_transports() const { return network_transports_; }
  uint64_t rendezvous_min_bytes() const { return rendezvous_min_bytes_; }
  // Whether this UCX moves CUDA memory itself (a build with its CUDA transports). Device
  // memory crosses nodes staged through pinned host memory either way (device_staging.h); the
  // daemon says at start which UCX it found.
  bool moves_cuda_memory() const { return moves_cuda_memory_; }

  // The peer at `address` (HOST:PORT), connecting on first use, and again after a failure
  // that take_failed_peers() has reported (the peer daemon may have restarted).
  PeerId connect(const std::string& address) override;
  // The peer has accepted our handshake: sends may go to it.
  bool authenticated(PeerId peer) const override { return peers_.at(peer).accepted(); }
  // Why the peer failed (empty: it has not, or its connection broke without a reason).
  const std::string& failure(PeerId peer) const override { return peers_.at(peer).failure; }
  const std::string& address_of(PeerId peer) const { return peers_.at(peer).address; }
  size_t peer_count() const { return peers_.size(); }
  const PeerStats& stats(PeerId peer) const { return peers_.at(peer).stats; }
  void count_received(PeerId peer, uint64_t bytes) override {
    peers_.at(peer).stats.bytes_received += bytes;
  }
  void set_link(PeerId peer, double latency_seconds, double bytes_per_second) override;

  // The largest message that goes without a rendezvous where the rendezvous threshold is
  // set (TCP only, rendezvous_min_bytes() not 0 and not kEveryMessageEager); else 0.
  size_t largest_eager_message() const;

  // Fails at once (UCS_ERR_NOT_CONNECTED) before the peer accepted the handshake. With
  // `max_message_bytes` (0: no limit), a larger buffer goes as several messages of that size
  // and the rest, in order, with the same tag: the receive must be posted with the same limit.
  // Operation is done when all of them are. Cutting a buffer into messages below the
  // rendezvous threshold sends it without a rendezvous (see largest_eager_message()).
  Operation send(PeerId peer, uint64_t tag, const void* data, size_t bytes,
                 size_t max_message_bytes = 0, Lane lane = Lane::kBulk) override;
  // Sends without waiting: held until the handshake is done, then until UCX is done with it.
  // A failure shows as a failed peer.
  void post(PeerId peer, uint64_t tag, std::shared_ptr<const std::vector<uint8_t>> bytes,
            Lane lane = Lane::kBulk) override;
  // A whole message of unknown size matching tag/mask, if one has arrived (for control
  // messages: small, so it completes without waiting on the sender). Its payload lies in the
  // mesh's receive buffer, valid until the next call: one buffer serves every control message,
  // with no allocation per message once it has grown to the largest.
  struct Message {
    uint64_t tag;
    std::span<const uint8_t> payload;
  };
  // A message that cannot arrive whole is dropped, counted, and its tag kept for
  // take_lost_messages(): its sender failed before it could be received, or the rest of it
  // did not come within the liveness timeout (an eager message of several fragments whose
  // connection broke half-way, which UCX never finishes).
  std::optional<Message> poll_message(uint64_t tag, uint64_t tag_mask);
  uint64_t lost_messages() const { return lost_messages_; }
  // The tags of messages dropped since the last call: the jobs they were for cannot go on.
  std::vector<uint64_t> take_lost_messages() { return std::move(lost_tags_); }
  // `from`: the peer whose data it waits for (nullopt: any). retire() needs it to know when a
  // receive cut off half-way can no longer be written.
  // `max_message_bytes`: as the sender's (send()); the messages then come from one sender.
  Operation receive(uint64_t tag, uint64_t tag_mask, void* data, size_t bytes,
                    std::optional<PeerId> from = std::nullopt,
                    size_t max_message_bytes = 0) override;

  // Operations nobody waits for (sends left to finish on their own, or operations of a
  // collective that failed), with whatever memory they read or write: kept until UCX is done
  // with them, however long a live peer takes. Receives not matched yet are cancelled. A
  // receive matched to a message whose connection broke half-way is never finished by UCX
  // (an eager message of several fragments): its memory goes once every connection to us
  // that could have carried that message has closed, since no more of it can arrive then.
  void retire(std::vector<Operation> operations,
              std::vector<std::shared_ptr<const void>> memory) override;
  // Receives and drops every message that has arrived matching tag/mask: for what peers still
  // send to a job that has ended here. Left in UCX, such messages would pile up, and a large
  // one would hold its sender's buffer until it is received. Returns their tags. Does not
  // progress UCX: what it finds had arrived before the call.
  std::vector<uint64_t> discard(uint64_t tag, uint64_t tag_mask);

  size_t retired_count() const { return retired_.size(); }
  // Drives UCX; true when it made progress.
  bool progress() override;
  // For sleeping: the fd to poll, and arm() before polling (false: something happened or is
  // pending; poll for messages again instead of sleeping).
  int event_fd() const { return event_fd_; }
  bool arm();
  // Arms and waits up to `timeout` for UCX's fd (returns at once if events are pending).
  void sleep(std::chrono::milliseconds timeout);

  // Peers whose endpoint failed since the last call (each reported once).
  std::vector<PeerId> take_failed_peers();
  bool failed(PeerId peer) const override { return peers_.at(peer).failed; }
  // The peer failed because it said goodbye (it shut down), not because its connection broke.
  bool left(PeerId peer) const { return peers_.at(peer).left; }

  // Asks the peer to answer over our connection to it; no answer within the liveness timeout
  // fails the peer and closes the connection, so that the next job reconnects. For after a
  // collective made no progress: a link that was cut with data in flight leaves TCP
  // retransmitting for many minutes without an error, and keepalive only probes idle
  // connections. A peer that answers keeps its connection. Nothing happens for a peer that
  // has failed, or has not accepted us yet, or is being checked already.
  void check_alive(PeerId peer) override;

  // Handshakes that ended since the last call, both ways.
  std::vector<HandshakeOutcome> take_handshake_outcomes() { return std::move(outcomes_); }
  // Handshake or liveness work waits (messages to answer, deadlines to watch): progress()
  // soon, even when no job uses the mesh.
  bool needs_service() const { return handshake_work() || !outcomes_.empty(); }

 private:
  struct Posted {
    uint64_t tag;
    std::shared_ptr<const std::vector<uint8_t>> bytes;
    Lane lane;
  };
  // One of our connections to a peer.
  struct Connection {
    ucp_ep_h endpoint = nullptr;
    bool accepted = false;       // its handshake succeeded
    bool server_proved = false;  // the peer proved the key on it (when we hold one)
    Nonce nonce{};               // ours, naming its handshake, then its liveness check
  };
  struct Peer {
    std::string address;
    in_addr_t host = 0;               // its IPv4 address, as connections from it come
    std::array<Connection, 2> lanes;  // by Lane
    bool failed = false;
    bool left = false;  // it said goodbye
    bool reported = false;
    std::string failure;
    std::vector<Posted> waiting;  // posted before both handshakes ended, in order
    PeerStats stats;

    Connection& lane(Lane lane) { return lanes[static_cast<size_t>(lane)]; }
    const Connection& lane(Lane lane) const { return lanes[static_cast<size_t>(lane)]; }
    bool accepted() const { return lanes[0].accepted && lanes[1].accepted; }
    bool holds(ucp_ep_h endpoint) const {
      return endpoint != nullptr &&
             (lanes[0].endpoint == endpoint || lanes[1].endpoint == endpoint);
    }
  };
  // A connection a peer made to us, while its handshake runs.
  struct Inbound {
    ucp_ep_h endpoint = nullptr;
    std::chrono::steady_clock::time_point deadline;
    enum class Stage { kHello, kProof } stage = Stage::kHello;
    Nonce client_nonce{};
    Nonce server_nonce{};
    std::string address;  // as claimed
    in_addr_t host = 0;   // where the connection came from (0: unknown)
  };
  // A connection a peer made to us that passed the handshake: it carries that peer's data.
  struct Accepted {
    ucp_ep_h endpoint = nullptr;
    in_addr_t host = 0;
    uint64_t serial = 0;  // names it in Retired::feeders
    // The daemon that made it, by the listening address its Hello claimed (an unspecified
    // host taken from where the connection came): what connect() would be given for it.
    std::optional<struct sockaddr_in> daemon;

    // Whether the daemon listening at `address` made it.
    bool made_by(const struct sockaddr_in& address) const {
      return daemon && daemon->sin_addr.s_addr == address.sin_addr.s_addr &&
             daemon->sin_port == address.sin_port;
    }
  };
  // Closes the connections `peer` made to us. When we give up on a peer, its connections to
  // us go too: over a cut link, one with data in flight (a Pong we sent back) is not probed by
  // TCP keepalive and could stay open for the kernel's retransmission timeout (many minutes),
  // holding what its receives would have written into.
  void close_connections_from(const Peer& peer);
  struct ErrorContext {
    Mesh* mesh;
    PeerId peer;  // kIncoming for listener-side endpoints
    ucp_ep_h endpoint = nullptr;
  };
  static constexpr PeerId kIncoming = UINT32_MAX;
  static constexpr uint16_t kHandshakeAm = 1;  // the active-message id of the handshake
  // A refused connection to us, closed once its Result has had time to go out.
  struct Closing {
    ucp_ep_h endpoint;
    std::chrono::steady_clock::time_point at;
  };
  struct Delivery {
    ucp_ep_h endpoint;  // the one it came on (null if the sender did not say)
    std::vector<uint8_t> bytes;
  };

  static void on_connection(ucp_conn_request_h request, void* arg);
  static void on_endpoint_error(void* arg, ucp_ep_h endpoint, ucs_status_t status);
  static ucs_status_t on_handshake_message(void* arg, const void* header, size_t header_bytes,
                                           void* data, size_t bytes,
                                           const ucp_am_recv_param_t* param);
  void open(PeerId peer);
  // Receives a message found by ucp_tag_probe_nb (removed from UCX's queue) into `data`.
  Operation receive_probed(ucp_tag_message_h handle, void* data, size_t bytes);
  // Messages to answer, handshakes or checks with deadlines, refused connections to close.
  bool handshake_work() const {
    return !handshake_inbox_.empty() || !inbound_.empty() || !closing_.empty() || !checks_.empty();
  }
  void close_endpoint(ucp_ep_h endpoint, bool force);
  void close_failed();
  // Both our connections to the peer, to be closed outside UCX's callbacks (to_close_).
  void close_lanes(Peer& peer);

  // The handshake (mesh_handshake.cpp), outside UCX's callbacks.
  bool serve_handshakes();  // true when it did something
  void send_handshake(ucp_ep_h endpoint, const HandshakeMessage& message);
  void on_hello(Inbound& inbound, const HandshakeMessage& hello);
  void on_proof(Inbound& inbound, const HandshakeMessage& proof);
  // Our connection whose handshake `nonce` names, while it runs.
  std::optional<std::pair<PeerId, Lane>> find_handshake(const Nonce& nonce) const;
  void on_challenge(PeerId peer, Lane lane, const HandshakeMessage& challenge);
  void on_result(PeerId peer, Lane lane, const HandshakeMessage& result);
  // Sends the Result (accepted when `refusal` is empty); `inbound` leaves inbound_. False when
  // the send found the connection gone, which ended the handshake already.
  bool answer_inbound(const Inbound& inbound, const std::string& refusal);
  // Both end the handshake: `inbound` leaves inbound_ (pass a copy).
  void accept_inbound(const Inbound& inbound);
  void refuse_inbound(const Inbound& inbound, const std::string& reason);
  void refuse_peer(PeerId peer, const std::string& reason);
  void on_liveness(const Delivery& delivery, const HandshakeMessage& message);
  // Tells every peer connected to us that we are going (bounded: a peer that does not take it
  // in time finds out when the connection breaks).
  void say_goodbye();
  void on_goodbye(const Delivery& delivery);
  Operation start_handshake_send(ucp_ep_h endpoint, const std::vector<uint8_t>& bytes, bool reply);

  HeldSends held_sends_;                         // see unfinished_sends()
  std::vector<std::string> network_transports_;  // before context_: its settings depend on them
  uint64_t rendezvous_min_bytes_ = 0;
  Context context_;
  bool moves_cuda_memory_ = false;
  Worker worker_;
  Listener listener_;
  uint16_t port_ = 0;
  std::string own_address_;  // HOST:PORT as given, with the port chosen
  std::optional<ClusterKey> key_;
  std::string version_;
  std::chrono::milliseconds handshake_timeout_;
  int event_fd_ = -1;
  std::vector<Peer> peers_;
  std::map<std::string, PeerId> peer_by_address_;
  std::vector<Inbound> inbound_;            // handshaking
  std::vector<Accepted> inbound_accepted_;  // done: they carry data, and hear our goodbye
  uint64_t next_accepted_serial_ = 0;
  std::vector<Closing> closing_;
  std::vector<Delivery> handshake_inbox_;
  struct Check {
    PeerId peer;
    Nonce nonce;
    std::chrono::steady_clock::time_point deadline;
  };
  std::vector<Check> checks_;  // liveness checks awaiting their Pong
  std::chrono::milliseconds liveness_timeout_;
  std::vector<HandshakeOutcome> outcomes_;
  std::vector<ucp_ep_h> to_close_;  // failed endpoints, closed outside UCX's callbacks
  std::vector<std::unique_ptr<ErrorContext>> error_contexts_;
  struct Retired {
    std::vector<Operation> operations;
    std::vector<std::shared_ptr<const void>> memory;
    // The connections to us (Accepted::serial) that could still bring data for its pending
    // receives, as of when it was retired.
    std::vector<uint64_t> feeders;
  };
  // Adds to `feeders` the accepted connections that may carry data from `source`: those its
  // daemon made (by the address their handshake named, or from its host unless their
  // handshake names another of our peers) and those of unknown origin, or every one when the
  // source is any peer.
  void add_feeders(uint32_t source, std::vector<uint64_t>& feeders) const;
  bool accepted_alive(uint64_t serial) const;
  // UCX is done with it, or will never be: what is pending is receives whose feeders closed.
  bool finished(const Retired& retired) const;
  std::vector<Retired> retired_;  // after worker_: released while the worker still exists
  uint64_t lost_messages_ = 0;
  std::vector<uint64_t> lost_tags_;
  std::unique_ptr<uint8_t[]> message_buffer_;  // poll_message's; word-aligned, as capnp reads it
  size_t message_buffer_bytes_ = 0;
};

}  // namespace gradsync::transport
