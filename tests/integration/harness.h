// Integration harness: a real gradsyncd process per test, real rank processes, and a raw
// protocol client for input no well-behaved library would send.
#pragma once

#include "ipc/frame_socket.h"
#include "ipc/messages.h"
#include "ipc/segment.h"
#include "tools/common/process.h"

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace gradsync::testing {

// Where the daemon at `socket_path` listens, as gradsyncctl status reports it: port 0 in its
// configuration resolved to the port it bound. Tests start daemons on port 0 and ask, so
// that no port is ever probed free and then taken by another test before the daemon binds it.
struct BoundAddresses {
  std::string listen;   // inter-node HOST:PORT; empty: none
  std::string metrics;  // /metrics HOST:PORT; empty: none
};
BoundAddresses bound_addresses(const std::string& socket_path);
// The port of a HOST:PORT address.
uint16_t port_of(const std::string& address);
// GET /metrics from 127.0.0.1:port; empty when nothing answers.
std::string scrape(uint16_t port);
// The value of `series` (name and labels, exactly as exported) in a scrape; -1 when absent.
double sample(const std::string& text, const std::string& series);

// Runs a shell command; its exit status and standard output.
struct CommandResult {
  int status = -1;
  std::string out;
};
CommandResult run_command(const std::string& command);

// The daemon's own resources, to check that clients leave nothing behind.
struct DaemonResources {
  size_t open_fds = 0;
  size_t memfd_mappings = 0;
  bool operator==(const DaemonResources&) const = default;
};
DaemonResources resources_of(pid_t pid);
// The daemon's resources once the clients that left have been let go: clients leave
// asynchronously (the engine frees a session after the control thread saw its socket close),
// so a baseline taken right after ranks exit may still hold one. Waits (up to 10 s) until
// gradsyncctl, answered by the engine after every earlier departure, lists no client.
DaemonResources settled_resources_of(pid_t pid, const std::string& socket_path);
// Waits (up to `timeout`) until the daemon at `socket_path` lists job `job` with `ranks` local
// ranks connected, as gradsyncctl reports it; false when it never did.
bool wait_for_local_ranks(const std::string& socket_path, const std::string& job, int ranks,
                          std::chrono::seconds timeout);
// The same, until it lists the job in `state` (forming, measuring, running, failed).
bool wait_for_job_state(const std::string& socket_path, const std::string& job,
                        const std::string& state, std::chrono::seconds timeout);

// Autotune (docs/autotune.md): a daemon configuration to tune from (poor fusion and pieces, no
// hold), its search bounded by `max_steps`, its trials written to `csv`.
std::string poor_autotune_config(const std::string& csv, uint32_t max_steps);
// Checks the trials a search wrote to `csv`: several settings tried, one chosen, within
// `max_steps` steps. Returns the choice as the daemon logs it ("fusion_threshold_bytes=...
// piece_bytes=... negotiation_hold_us=... ring_min_bytes=..."); empty where the checks failed.
std::string expect_autotune_trials(const std::string& csv, uint32_t max_steps);

class DaemonTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

  // Extra daemon config (TOML lines) for a test, extra flags, and a launcher to run it under
  // (see PrivateDaemon).
  void start_daemon(const std::string& extra_toml = "",
                    const std::vector<std::string>& extra_args = {},
                    const std::vector<std::string>& launcher = {});

  // start_daemon with the daemon's log (its stderr) kept for daemon_log().
  void start_logged_daemon(const std::string& extra_toml = "",
                           const std::vector<std::string>& extra_args = {});
  std::string daemon_log() const;

  std::string build_dir() const { return tools::executable_dir(); }
  // The daemon's configuration file; rewrite_config replaces what start_daemon wrote.
  const std::string& config_path() const { return config_path_; }
  void rewrite_config(const std::string& extra_toml);
  const std::string& socket() const { return daemon_->socket_path(); }
  tools::PrivateDaemon& daemon() { return *daemon_; }
  // SIGKILL: the daemon gets no chance to clean up, and the teardown checks expect none.
  void kill_daemon();

  // Spawns `ranks` local ranks of `job` running gradsync-test-rank with `args`, and `env`
  // added to their environment.
  std::vector<tools::ChildProcess> spawn_ranks(const std::string& job, int ranks,
                                               const std::vector<std::string>& args,
                                               const std::vector<std::string>& prefix = {},
                                               const std::map<std::string, std::string>& env = {});
  tools::ChildProcess spawn_rank(const std::string& job, int rank, int ranks,
                                 const std::vector<std::string>& args,
                                 const std::vector<std::string>& prefix = {},
                                 const std::map<std::string, std::string>& env = {});

  // Waits for every child; fails the test naming the rank on a non-zero status or a timeout.
  void expect_all_succeed(std::vector<tools::ChildProcess>& children,
                          std::chrono::seconds timeout = std::chrono::seconds(120));

  // Polls until the daemon's resources equal `baseline` (they settle asynchronously).
  void expect_resources_return_to(const DaemonResources& baseline,
                                  std::chrono::seconds timeout = std::chrono::seconds(10));

 private:
  std::string config_path_;
  std::string log_path_;
  std::unique_ptr<tools::PrivateDaemon> daemon_;
  bool daemon_killed_ = false;
};

// Speaks the control protocol and the rings directly.
class RawClient {
 public:
  explicit RawClient(const std::string& socket_path);

  int socket() const { return socket_.get(); }
  void send_bytes(const void* data, size_t bytes);
  void send(capnp::MessageBuilder& message, std::span<const int> fds = {});
  ipc::Frame receive(int timeout_ms = 10'000);
  // The reply's error (code, message), or code 0 for ok/welcome.
  std::pair<uint32_t, std::string> receive_status(int timeout_ms = 10'000);
  bool closed_by_daemon(int timeout_ms = 5'000);

  // hello + welcome; maps the segment. A job of `ranks` on this node, `local_rank` its rank;
  // a part of `parent` (none where empty) whose ranks are `parent_ranks` there.
  std::pair<uint32_t, std::string> hello(const std::string& job, int local_rank, int ranks,
                                         uint32_t version = ipc::kProtocolVersion,
                                         const std::string& parent = "",
                                         const std::vector<int32_t>& parent_ranks = {});
  std::pair<uint32_t, std::string> register_buffer(uint32_t id, int fd, uint64_t offset,
                                                   uint64_t bytes);
  // Device memory as a CUDA IPC handle and device UUID (any sizes, to test the checks).
  std::pair<uint32_t, std::string> register_device(uint32_t id, uint64_t offset, uint64_t bytes,
                                                   const std::vector<uint8_t>& handle,
                                                   const std::vector<uint8_t>& uuid, int fd = -1);
  // VMM device memory: each segment's size, and the fds sent with it (as many or not).
  std::pair<uint32_t, std::string> register_vmm(uint32_t id, uint64_t offset, uint64_t bytes,
                                                const std::vector<uint64_t>& segment_bytes,
                                                const std::vector<int>& fds,
                                                const std::vector<uint8_t>& uuid);
  void submit(const ipc::SubmissionEntry& entry);
  uint64_t submission_ring_free() const { return submissions_.free_slots(); }
  // Whether the daemon asks this client to ring the doorbell after a submission.
  bool daemon_asks_for_doorbell() const {
    return view_.header->daemon_sleeping.load(std::memory_order_seq_cst) != 0;
  }
  ipc::CompletionEntry next_completion(
      std::chrono::milliseconds timeout = std::chrono::seconds(10));

 private:
  ipc::UniqueFd socket_;
  ipc::FrameReader reader_;
  ipc::Mapping segment_;
  ipc::SegmentView view_{};
  ipc::UniqueFd doorbell_;
  ipc::RingProducer<ipc::SubmissionEntry> submissions_;
  ipc::RingConsumer<ipc::CompletionEntry> completions_;
};

ipc::SubmissionEntry allreduce_entry(const std::string& name, uint32_t buffer, uint64_t offset,
                                     uint64_t count);

}  // namespace gradsync::testing
