#include "tests/integration/harness.h"

#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <array>
#include <cstdio>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <thread>

namespace gradsync::testing {

BoundAddresses bound_addresses(const std::string& socket_path) {
  const CommandResult status = run_command(tools::executable_dir() + "/gradsyncctl --socket " +
                                           socket_path + " --json status");
  const auto json = nlohmann::json::parse(status.out, nullptr, false);
  if (status.status != 0 || !json.is_object()) {
    throw std::runtime_error("gradsyncctl status at " + socket_path + " failed: " + status.out);
  }
  return {json.value("listen", ""), json.value("metrics_listen", "")};
}

uint16_t port_of(const std::string& address) {
  return static_cast<uint16_t>(std::stoul(address.substr(address.rfind(':') + 1)));
}

// HTTP/1.0: the server closes when done.
std::string scrape(uint16_t port) {
  ipc::UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  struct sockaddr_in address {};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(port);
  if (::connect(fd.get(), reinterpret_cast<struct sockaddr*>(&address), sizeof(address)) != 0) {
    return {};
  }
  const std::string request = "GET /metrics HTTP/1.0\r\n\r\n";
  if (::send(fd.get(), request.data(), request.size(), MSG_NOSIGNAL) < 0) return {};
  std::string response;
  char buffer[4096];
  while (true) {
    const ssize_t n = ::recv(fd.get(), buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    response.append(buffer, static_cast<size_t>(n));
  }
  return response;
}

double sample(const std::string& text, const std::string& series) {
  for (size_t at = text.find(series); at != std::string::npos; at = text.find(series, at + 1)) {
    if (at != 0 && text[at - 1] != '\n') continue;
    const size_t value = at + series.size();
    if (value < text.size() && text[value] == ' ') return std::stod(text.substr(value + 1));
  }
  return -1;
}

DaemonResources resources_of(pid_t pid) {
  DaemonResources r;
  const std::string proc = "/proc/" + std::to_string(pid);
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator(proc + "/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++r.open_fds;
  }
  std::ifstream maps(proc + "/maps");
  for (std::string line; std::getline(maps, line);) {
    if (line.find("memfd:gradsync") != std::string::npos) ++r.memfd_mappings;
  }
  return r;
}

DaemonResources settled_resources_of(pid_t pid, const std::string& socket_path) {
  const std::string command = tools::executable_dir() + "/gradsyncctl --socket " + socket_path +
                              " --json clients 2>/dev/null";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    const CommandResult clients = run_command(command);
    if (clients.status == 0 && nlohmann::json::parse(clients.out, nullptr, false).empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // gradsyncctl's own connection closes asynchronously too: two equal readings apart.
  DaemonResources settled = resources_of(pid);
  while (std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const DaemonResources again = resources_of(pid);
    if (again == settled) break;
    settled = again;
  }
  return settled;
}

namespace {

// Until gradsyncctl lists job `job` as `matches` wants it (up to `timeout`).
bool wait_for_job(const std::string& socket_path, const std::string& job,
                  const std::function<bool(const nlohmann::json&)>& matches,
                  std::chrono::seconds timeout) {
  const std::string command =
      tools::executable_dir() + "/gradsyncctl --socket " + socket_path + " --json jobs 2>/dev/null";
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    const CommandResult listed = run_command(command);
    const auto json = nlohmann::json::parse(listed.out, nullptr, false);
    const auto& jobs = json.is_object() ? json.value("jobs", nlohmann::json::array()) : json;
    for (const auto& j : jobs.is_array() ? jobs : nlohmann::json::array()) {
      if (j.value("name", "") == job && matches(j)) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

}  // namespace

bool wait_for_local_ranks(const std::string& socket_path, const std::string& job, int ranks,
                          std::chrono::seconds timeout) {
  return wait_for_job(
      socket_path, job,
      [ranks](const nlohmann::json& j) { return j.value("local_ranks", 0) == ranks; }, timeout);
}

bool wait_for_job_state(const std::string& socket_path, const std::string& job,
                        const std::string& state, std::chrono::seconds timeout) {
  return wait_for_job(
      socket_path, job, [&state](const nlohmann::json& j) { return j.value("state", "") == state; },
      timeout);
}

void DaemonTest::SetUp() {}

void DaemonTest::kill_daemon() {
  daemon_killed_ = true;
  daemon_->process().signal(SIGKILL);
}

void DaemonTest::TearDown() {
  if (daemon_ && daemon_killed_) daemon_.reset();
  if (daemon_) {
    EXPECT_EQ(daemon_->stop(), 0) << "gradsyncd did not exit cleanly on SIGTERM";
    const std::string socket = daemon_->socket_path();
    EXPECT_FALSE(std::filesystem::exists(socket)) << "socket file left behind";
    daemon_.reset();
  }
  if (!config_path_.empty()) std::filesystem::remove(config_path_);
  if (!log_path_.empty()) std::filesystem::remove(log_path_);
}

void DaemonTest::start_daemon(const std::string& extra_toml,
                              const std::vector<std::string>& extra_args,
                              const std::vector<std::string>& launcher) {
  config_path_ = std::filesystem::temp_directory_path() /
                 ("gradsync-test-" + std::to_string(::getpid()) + ".toml");
  rewrite_config(extra_toml);
  std::vector<std::string> args{"--config", config_path_};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  daemon_ = std::make_unique<tools::PrivateDaemon>(build_dir() + "/gradsyncd", args, launcher);
}

void DaemonTest::start_logged_daemon(const std::string& extra_toml,
                                     const std::vector<std::string>& extra_args) {
  log_path_ = std::filesystem::temp_directory_path() /
              ("gradsync-test-" + std::to_string(::getpid()) + ".log");
  std::filesystem::remove(log_path_);
  start_daemon(extra_toml, extra_args, {"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>>" + log_path_});
}

std::string DaemonTest::daemon_log() const {
  std::ifstream in(log_path_);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void DaemonTest::rewrite_config(const std::string& extra_toml) {
  std::ofstream config(config_path_, std::ios::trunc);
  // Open to every uid so the isolation tests can try; the job, not the socket, is the boundary.
  config << "socket_mode = 0o666\n" << extra_toml << "\n";
}

CommandResult run_command(const std::string& command) {
  CommandResult result;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  std::array<char, 4096> chunk{};
  size_t n = 0;
  while ((n = std::fread(chunk.data(), 1, chunk.size(), pipe)) > 0)
    result.out.append(chunk.data(), n);
  const int status = ::pclose(pipe);
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

tools::ChildProcess DaemonTest::spawn_rank(const std::string& job, int rank, int ranks,
                                           const std::vector<std::string>& args,
                                           const std::vector<std::string>& prefix,
                                           const std::map<std::string, std::string>& env) {
  std::vector<std::string> argv = {build_dir() + "/gradsync-test-rank"};
  argv.insert(argv.end(), prefix.begin(), prefix.end());
  argv.insert(argv.end(), args.begin(), args.end());
  std::map<std::string, std::string> rank_env{
      {"GRADSYNC_SOCKET", socket()},         {"GRADSYNC_JOB", job},
      {"RANK", std::to_string(rank)},        {"LOCAL_RANK", std::to_string(rank)},
      {"WORLD_SIZE", std::to_string(ranks)}, {"LOCAL_WORLD_SIZE", std::to_string(ranks)}};
  rank_env.insert(env.begin(), env.end());
  return tools::ChildProcess(argv, rank_env);
}

std::vector<tools::ChildProcess> DaemonTest::spawn_ranks(
    const std::string& job, int ranks, const std::vector<std::string>& args,
    const std::vector<std::string>& prefix, const std::map<std::string, std::string>& env) {
  std::vector<tools::ChildProcess> children;
  children.reserve(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) children.push_back(spawn_rank(job, r, ranks, args, prefix, env));
  return children;
}

void DaemonTest::expect_all_succeed(std::vector<tools::ChildProcess>& children,
                                    std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (size_t r = 0; r < children.size(); ++r) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    const auto status = children[r].wait_for(std::max(left, std::chrono::milliseconds(1)));
    ASSERT_TRUE(status.has_value())
        << "rank " << r << " did not finish within " << timeout.count() << " s";
    EXPECT_EQ(*status, 0) << "rank " << r << " failed";
  }
}

void DaemonTest::expect_resources_return_to(const DaemonResources& baseline,
                                            std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  DaemonResources now = resources_of(daemon_->process().pid());
  while (!(now == baseline) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    now = resources_of(daemon_->process().pid());
  }
  EXPECT_EQ(now.open_fds, baseline.open_fds) << "daemon fds did not return to baseline";
  EXPECT_EQ(now.memfd_mappings, baseline.memfd_mappings)
      << "daemon shared-memory mappings did not return to baseline";
}

RawClient::RawClient(const std::string& socket_path) {
  socket_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  struct sockaddr_un address {};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, socket_path.c_str(), sizeof(address.sun_path) - 1);
  if (::connect(socket_.get(), reinterpret_cast<struct sockaddr*>(&address), sizeof(address)) !=
      0) {
    throw ipc::SystemError("connect", errno);
  }
}

void RawClient::send_bytes(const void* data, size_t bytes) {
  ASSERT_EQ(::send(socket_.get(), data, bytes, MSG_NOSIGNAL), static_cast<ssize_t>(bytes));
}

void RawClient::send(capnp::MessageBuilder& message, std::span<const int> fds) {
  ipc::send_frame(socket_.get(), ipc::encode(message), fds);
}

ipc::Frame RawClient::receive(int timeout_ms) {
  return ipc::receive_frame(socket_.get(), reader_, timeout_ms);
}

std::pair<uint32_t, std::string> RawClient::receive_status(int timeout_ms) {
  ipc::Frame frame = receive(timeout_ms);
  ipc::DecodedMessage message(frame.payload);
  const auto reply = message.root<ipc::wire::Reply>();
  if (reply.isError()) return {reply.getError().getCode(), reply.getError().getMessage().cStr()};
  return {0, ""};
}

bool RawClient::closed_by_daemon(int timeout_ms) {
  struct pollfd pfd {
    socket_.get(), POLLIN, 0
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    if (::poll(&pfd, 1, 50) > 0) {
      char byte = 0;
      const ssize_t n = ::recv(socket_.get(), &byte, 1, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN)) return true;
    }
  }
  return false;
}

std::pair<uint32_t, std::string> RawClient::hello(const std::string& job, int local_rank, int ranks,
                                                  uint32_t version, const std::string& parent,
                                                  const std::vector<int32_t>& parent_ranks) {
  capnp::MallocMessageBuilder message;
  auto hello = message.initRoot<ipc::wire::Request>().initHello();
  hello.setProtocolVersion(version);
  hello.setJob(job);
  hello.setRank(local_rank);
  hello.setWorldSize(ranks);
  hello.setLocalRank(local_rank);
  hello.setLocalWorldSize(ranks);
  hello.setParentJob(parent);
  auto list = hello.initParentRanks(static_cast<unsigned>(parent_ranks.size()));
  for (size_t i = 0; i < parent_ranks.size(); ++i) {
    list.set(static_cast<unsigned>(i), parent_ranks[i]);
  }
  send(message);
  ipc::Frame frame = receive();
  ipc::DecodedMessage decoded(frame.payload);
  const auto reply = decoded.root<ipc::wire::Reply>();
  if (reply.isError()) return {reply.getError().getCode(), reply.getError().getMessage().cStr()};
  const uint32_t entries = reply.getWelcome().getRingEntries();
  segment_ = ipc::Mapping(frame.fds.at(0).get(), 0, reply.getWelcome().getSegmentBytes());
  view_ = ipc::SegmentView::over(segment_.data(), entries);
  doorbell_ = std::move(frame.fds.at(1));
  submissions_ = ipc::RingProducer<ipc::SubmissionEntry>(view_.submissions, entries);
  completions_ = ipc::RingConsumer<ipc::CompletionEntry>(view_.completions, entries);
  return {0, ""};
}

namespace {

// A RegisterBuffer request for [offset, offset + bytes) as buffer `id`; the kind of memory is
// the caller's to fill in.
ipc::wire::RegisterBuffer::Builder start_registration(capnp::MessageBuilder& message, uint32_t id,
                                                      uint64_t offset, uint64_t bytes) {
  auto request = message.initRoot<ipc::wire::Request>().initRegisterBuffer();
  request.setBufferId(id);
  request.setOffset(offset);
  request.setBytes(bytes);
  return request;
}

}  // namespace

std::pair<uint32_t, std::string> RawClient::register_buffer(uint32_t id, int fd, uint64_t offset,
                                                            uint64_t bytes) {
  capnp::MallocMessageBuilder message;
  start_registration(message, id, offset, bytes).getMemory().setHost();
  send(message, fd >= 0 ? std::span<const int>(&fd, 1) : std::span<const int>());
  return receive_status();
}

std::pair<uint32_t, std::string> RawClient::register_vmm(uint32_t id, uint64_t offset,
                                                         uint64_t bytes,
                                                         const std::vector<uint64_t>& segment_bytes,
                                                         const std::vector<int>& fds,
                                                         const std::vector<uint8_t>& uuid) {
  capnp::MallocMessageBuilder message;
  auto request = start_registration(message, id, offset, bytes);
  auto memory = request.getMemory().initCudaVmm();
  auto sizes = memory.initSegmentBytes(static_cast<unsigned>(segment_bytes.size()));
  for (unsigned i = 0; i < sizes.size(); ++i) sizes.set(i, segment_bytes[i]);
  memory.setDeviceUuid(kj::arrayPtr(uuid.data(), uuid.size()));
  send(message, fds);
  return receive_status();
}

std::pair<uint32_t, std::string> RawClient::register_device(uint32_t id, uint64_t offset,
                                                            uint64_t bytes,
                                                            const std::vector<uint8_t>& handle,
                                                            const std::vector<uint8_t>& uuid,
                                                            int fd) {
  capnp::MallocMessageBuilder message;
  auto request = start_registration(message, id, offset, bytes);
  auto memory = request.getMemory().initCudaIpc();
  memory.setHandle(kj::arrayPtr(handle.data(), handle.size()));
  memory.setDeviceUuid(kj::arrayPtr(uuid.data(), uuid.size()));
  send(message, fd >= 0 ? std::span<const int>(&fd, 1) : std::span<const int>());
  return receive_status();
}

void RawClient::submit(const ipc::SubmissionEntry& entry) {
  ASSERT_TRUE(submissions_.try_push(entry));
  ipc::eventfd_signal(doorbell_.get());
}

ipc::CompletionEntry RawClient::next_completion(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  ipc::CompletionEntry entry{};
  while (!completions_.try_pop(entry)) {
    if (std::chrono::steady_clock::now() > deadline) {
      ADD_FAILURE() << "no completion within " << timeout.count() << " ms";
      return {};
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return entry;
}

ipc::SubmissionEntry allreduce_entry(const std::string& name, uint32_t buffer, uint64_t offset,
                                     uint64_t count) {
  ipc::SubmissionEntry entry{};
  entry.request = 1;
  entry.collective = static_cast<uint8_t>(ipc::Collective::kAllreduce);
  entry.dtype = GRADSYNC_FLOAT32;
  entry.op = GRADSYNC_SUM;
  entry.send_buffer = entry.recv_buffer = buffer;
  entry.send_offset = entry.recv_offset = offset;
  entry.count = count;
  std::memcpy(entry.name, name.data(), name.size());
  entry.name_length = static_cast<uint32_t>(name.size());
  return entry;
}

std::string poor_autotune_config(const std::string& csv, uint32_t max_steps) {
  return "fusion_threshold_bytes = 65536\npipeline_piece_bytes = 65536\nnegotiation_hold_us = 0\n"
         "autotune_max_steps = " +
         std::to_string(max_steps) + "\nautotune_log = \"" + csv + "\"\n";
}

std::string expect_autotune_trials(const std::string& csv, uint32_t max_steps) {
  std::ifstream in(csv);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line.rfind("unix_seconds,job,outcome,stage,round,fusion_threshold_bytes", 0), 0u)
      << line;
  uint64_t steps = 0;
  std::set<std::string> tried;
  std::string chosen;
  std::string all;  // for the failure messages
  while (std::getline(in, line)) {
    all += line + "\n";
    std::vector<std::string> fields;
    std::stringstream row(line);
    for (std::string field; std::getline(row, field, ',');) fields.push_back(field);
    if (fields.size() != 11) {
      ADD_FAILURE() << "autotune_log line: " << line;
      return "";
    }
    const std::string settings = "fusion_threshold_bytes=" + fields[5] +
                                 " piece_bytes=" + fields[6] + " negotiation_hold_us=" + fields[7] +
                                 " ring_min_bytes=" + fields[8];
    if (fields[2] == "chosen") {
      EXPECT_EQ(chosen, "") << "a second choice: " << line;
      chosen = settings;
    } else {
      tried.insert(settings);
      steps += 1 + std::stoull(fields[9]);  // its warm-up step and those measured
    }
  }
  EXPECT_GE(tried.size(), 2u) << all;
  EXPECT_LE(steps, max_steps) << all;
  EXPECT_NE(chosen, "") << "the search did not end within its bound:\n" << all;
  EXPECT_TRUE(tried.contains(chosen)) << chosen;
  return chosen;
}

}  // namespace gradsync::testing
