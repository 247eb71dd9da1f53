// The daemon's view of its peers over UCX: one worker, a listener for peers that connect to
// us, and an endpoint to each peer we connect to. Messages are tagged; receives are posted
// against a tag and mask and land directly in the caller's buffer.
//
// Every pair of daemons holds two connections, one each way: a daemon sends only on the
// endpoint it created, and tags carry the sender's node index, so the listener side never has
// to learn who connected. Endpoints use peer-failure error handling: a peer that dies shows up
// in failed_peers() rather than as a hang.
#pragma once

#include "transport/ucx.h"

#include <netinet/in.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace gradsync::transport {

using PeerId = uint32_t;

// HOST:PORT (IPv4) to a socket address; throws std::invalid_argument.
struct sockaddr_in parse_host_port(const std::string& host_port);

struct MeshOptions {
  std::string listen;  // HOST:PORT; port 0 picks one
  // A peer host that vanishes without closing its connections (power loss, a cut link) is
  // noticed after about idle + 3 * interval seconds of silence, by TCP keepalive.
  uint32_t keepalive_idle_seconds = 10;
  uint32_t keepalive_interval_seconds = 2;
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

class Mesh {
 public:
  explicit Mesh(const MeshOptions& options);
  ~Mesh();
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  uint16_t port() const { return port_; }

  // The peer at `address` (HOST:PORT), connecting on first use.
  PeerId connect(const std::string& address);
  const std::string& address_of(PeerId peer) const { return peers_.at(peer).address; }
  size_t peer_count() const { return peers_.size(); }
  const PeerStats& stats(PeerId peer) const { return peers_.at(peer).stats; }
  void count_received(PeerId peer, uint64_t bytes) {
    peers_.at(peer).stats.bytes_received += bytes;
  }
  void set_link(PeerId peer, double latency_seconds, double bytes_per_second);

  Operation send(PeerId peer, uint64_t tag, const void* data, size_t bytes);
  // A whole message of unknown size matching tag/mask, if one has arrived (for control
  // messages: small, so it completes without waiting on the sender).
  struct Message {
    uint64_t tag;
    std::vector<uint8_t> payload;
  };
  std::optional<Message> poll_message(uint64_t tag, uint64_t tag_mask);
  Operation receive(uint64_t tag, uint64_t tag_mask, void* data, size_t bytes);

  // Operations nobody waits for (sends left to finish on their own, or operations of a
  // collective that failed), with whatever memory they read or write: kept until UCX is done
  // with them, however long a live peer takes.
  void retire(std::vector<Operation> operations, std::vector<std::shared_ptr<const void>> memory);

  size_t retired_count() const { return retired_.size(); }
  // Drives UCX; true when it made progress.
  bool progress();
  // For sleeping: the fd to poll, and arm() before polling (false: something happened or is
  // pending; poll for messages again instead of sleeping).
  int event_fd() const { return event_fd_; }
  bool arm();
  // Arms and waits up to `timeout` for UCX's fd (returns at once if events are pending).
  void sleep(std::chrono::milliseconds timeout);

  // Peers whose endpoint failed since the last call (each reported once).
  std::vector<PeerId> take_failed_peers();
  bool failed(PeerId peer) const { return peers_.at(peer).failed; }

 private:
  struct Peer {
    std::string address;
    ucp_ep_h endpoint = nullptr;
    bool failed = false;
    bool reported = false;
    PeerStats stats;
  };
  struct ErrorContext {
    Mesh* mesh;
    PeerId peer;  // kIncoming for listener-side endpoints
  };
  static constexpr PeerId kIncoming = UINT32_MAX;

  static void on_connection(ucp_conn_request_h request, void* arg);
  static void on_endpoint_error(void* arg, ucp_ep_h endpoint, ucs_status_t status);
  void close_endpoint(ucp_ep_h endpoint, bool force);
  void close_failed();

  Context context_;
  Worker worker_;
  Listener listener_;
  uint16_t port_ = 0;
  int event_fd_ = -1;
  std::vector<Peer> peers_;
  std::map<std::string, PeerId> peer_by_address_;
  std::vector<ucp_ep_h> incoming_;
  std::vector<ucp_ep_h> to_close_;  // failed endpoints, closed outside UCX's callbacks
  std::vector<std::unique_ptr<ErrorContext>> error_contexts_;
  struct Retired {
    std::vector<Operation> operations;
    std::vector<std::shared_ptr<const void>> memory;
  };
  std::vector<Retired> retired_;  // after worker_: released while the worker still exists
};

}  // namespace gradsync::transport
