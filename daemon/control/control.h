// The control thread: accepts clients on the unix socket, reads their credentials, validates
// every control message (hello, buffer registration) and hands the results to the engine;
// answers gradsyncctl (status, traces). Also owns the signals (SIGTERM/SIGINT shut down,
// SIGHUP reloads the configuration) and the systemd notifications.
#pragma once

#include "daemon/base/config.h"
#include "daemon/base/watchdog.h"
#include "daemon/control/admin.h"
#include "daemon/control/admission.h"
#include "daemon/engine/engine.h"
#include "ipc/frame_socket.h"
#include "ipc/messages.h"
#include "metrics/metrics.h"

#include <sys/socket.h>

#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace gradsync::daemon {

class ControlServer {
 public:
  // Reads the configuration afresh (for SIGHUP); throws ConfigError.
  using ConfigSource = std::function<DaemonConfig()>;

  // Binds the socket (creating its directory) and sets up the epoll set. Throws on failure.
  ControlServer(DaemonConfig config, Engine& engine, metrics::Metrics& metrics, DaemonInfo info,
                Devices devices, ConfigSource reload);
  ~ControlServer();  // closes every client and removes the socket file
  ControlServer(const ControlServer&) = delete;
  ControlServer& operator=(const ControlServer&) = delete;

  // Serves until SIGTERM or SIGINT, then asks the engine to shut down and returns.
  void run();

 private:
  struct Client {
    uint64_t id = 0;
    ipc::UniqueFd socket;
    ipc::FrameReader reader;
    struct ucred credentials {};
    bool joined = false;
    std::string job;
    int32_t local_rank = -1;
    std::set<uint32_t> buffers;
    bool events_registered = false;
    bool mps_mismatch_told = false;  // check_mps warned about it once
    // The memfds its registrations brought, by identity: held by the engine's mapping cache,
    // shared by every range of one memfd.
    std::map<std::pair<dev_t, ino_t>, std::weak_ptr<const ipc::UniqueFd>> memfds;
  };
  // The control thread's view of a job: who owns it and which local ranks are taken.
  struct JobRecord {
    uid_t owner = 0;
    int32_t local_world_size = 0;
    std::vector<std::string> nodes;
    uint32_t node_rank = 0;
    std::string parent_job;
    std::vector<int32_t> parent_ranks;
    std::vector<uint64_t> client_by_rank;  // 0: free
    std::string failure;                   // non-empty once a rank left
  };

  void accept_clients();
  void serve(Client& client);
  void handle_frame(Client& client, ipc::Frame& frame);
  void handle_hello(Client& client, ipc::wire::Hello::Reader hello);
  HelloRules hello_rules() const;
  void handle_register(Client& client, ipc::wire::RegisterBuffer::Reader request,
                       std::vector<ipc::UniqueFd>& fds);
  // The engine command for a registration, or a Refusal for the client.
  AddBuffer host_registration(Client& client, uint32_t id,
                              ipc::wire::RegisterBuffer::Reader request, ipc::UniqueFd memfd);
  // CUDA IPC (no fds) or VMM memory (an fd per segment).
  // Warns, once per client, where the rank's context on device `ordinal` (as the daemon
  // numbers them) is shared through MPS and the daemon's is not, or the reverse.
  void check_mps(Client& client, ipc::wire::MpsState rank_mps, int ordinal);
  AddBuffer device_registration(uint32_t id, ipc::wire::RegisterBuffer::Reader request,
                                std::vector<ipc::UniqueFd> fds) const;
  void handle_unregister(Client& client, uint32_t buffer_id);
  void handle_register_events(Client& client, ipc::wire::RegisterEvents::Reader request,
                              const std::vector<ipc::UniqueFd>& fds);
  void handle_inspect(Client& client, ipc::wire::Inspect::Reader inspect);
  void start_trace(Client& client, ipc::wire::TraceRequest::Reader request);
  // Replies to the traces that have finished; the epoll timeout while any is pending.
  void deliver_traces();
  int poll_timeout_ms() const;
  void reply_report(Client& client, std::string_view text);
  void reload();
  void reply_ok(Client& client);
  // Where other nodes reach this daemon (transport::reachable_address), or why it cannot say.
  void reply_node_address(Client& client);
  // What the asker's job waits for (Inspect.waitingFor), from an engine snapshot.
  void reply_waiting_for(Client& client, const std::string& job);
  // The engine's snapshot; none (the client told why) where the engine does not answer.
  std::optional<EngineSnapshot> engine_snapshot(Client& client);
  void reply_error(Client& client, gradsync_result code, const std::string& message);
  // `how`: whether the rank left the job (a goodbye) or its connection ended.
  void disconnect(uint64_t client_id, const std::string& reason, Departure how);
  void feed_watchdog();

  DaemonConfig config_;  // as of the last reload
  Engine& engine_;
  Devices devices_;
  metrics::Metrics& metrics_;
  std::shared_ptr<spdlog::logger> log_;
  DaemonInfo info_;
  ConfigSource reload_;
  ipc::UniqueFd listener_;
  ipc::UniqueFd epoll_;
  ipc::UniqueFd signals_;
  bool socket_bound_ = false;
  uint64_t next_client_id_ = 1;
  std::unordered_map<uint64_t, std::unique_ptr<Client>> clients_;
  std::map<std::string, JobRecord> jobs_;
  struct PendingTrace {
    uint64_t client;
    uint32_t node_rank;
    std::future<TraceData> result;
  };
  std::vector<PendingTrace> traces_;
  EngineWatchdog watchdog_;
  bool engine_silent_ = false;  // logged once per silence
};

}  // namespace gradsync::daemon
