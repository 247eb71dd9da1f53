// gradsync-transport-bench: what the daemons' transport (transport/mesh.h: UCX, with the
// daemon's settings) carries between two hosts, bulk data cut and paced as the ring allreduce
// sends it. One way; both ways from one thread, as a daemon's engine thread makes every send
// and receive of its node; or both ways from two threads, one mesh sending and one receiving.
// Set beside the daemons' own figures, it tells what the transport allows a node and what a
// thread of its own for each direction would add. Run one on each host, each naming the other:
//
//   host A: gradsync-transport-bench --listen A:13500 --peer B:13500 [--threads 2]
//   host B: gradsync-transport-bench --listen B:13500 --peer A:13500 [--threads 2]
//
// One way: --direction out on one host, --direction in on the other.
#include "tools/common/sizes.h"
#include "tools/transport_bench/transfers.h"
#include "transport/mesh.h"

#include <fmt/core.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace {

using gradsync::tools::Clock;
using gradsync::tools::Leaving;
using gradsync::tools::SideResult;
using gradsync::tools::TransferSettings;
using gradsync::transport::Mesh;
using gradsync::transport::MeshOptions;
using gradsync::transport::PeerId;

struct Options {
  std::string listen;
  std::string peer;
  std::string direction = "both";
  int threads = 1;
  std::string bytes = "64M";
  std::string piece = "4M";
  size_t pieces_ahead = 2;
  uint32_t transfers = 10;
  uint32_t warmup = 2;
  std::string bulk_protocol = "rendezvous";
  std::string rendezvous_min = "256K";
  std::string send_memory = "written";
  double timeout_seconds = 60;
  bool json = false;
};

// Which side leaves first where both send and receive: the one at the lower address.
Leaving leaving_of(const Options& o) {
  if (o.direction == "in") return Leaving::kFirst;
  if (o.direction == "out") return Leaving::kLast;
  const auto own = gradsync::transport::parse_host_port(o.listen);
  const auto peer = gradsync::transport::parse_host_port(o.peer);
  const auto key = [](const sockaddr_in& a) {
    return std::make_tuple(ntohl(a.sin_addr.s_addr), ntohs(a.sin_port));
  };
  if (key(own) == key(peer)) throw std::invalid_argument("--listen and --peer are one address");
  return key(own) < key(peer) ? Leaving::kFirst : Leaving::kLast;
}

MeshOptions mesh_options(const Options& o, const std::string& listen) {
  MeshOptions options{listen};
  options.tcp_rendezvous_min_bytes = o.bulk_protocol == "eager"
                                         ? MeshOptions::kEveryMessageEager
                                         : gradsync::tools::parse_size(o.rendezvous_min);
  return options;
}

double gbytes_per_second(const std::optional<SideResult>& side) {
  return side->seconds > 0 ? static_cast<double>(side->bytes) / side->seconds / 1e9 : 0;
}

int measure(const Options& o) {
  if (o.threads == 2 && o.direction != "both") {
    throw std::invalid_argument(
        "--threads 2 sends and receives on a thread each: --direction both");
  }
  TransferSettings settings;
  settings.bytes = gradsync::tools::parse_size(o.bytes);
  settings.piece_bytes = gradsync::tools::parse_size(o.piece);
  settings.pieces_ahead = o.pieces_ahead;
  settings.transfers = o.transfers;
  settings.warmup = o.warmup;
  settings.send_memory = o.send_memory == "untouched" ? gradsync::tools::SendMemory::kUntouched
                                                      : gradsync::tools::SendMemory::kWritten;
  settings.deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                         std::chrono::duration<double>(o.timeout_seconds));
  const bool sends = o.direction != "in";
  const bool receives = o.direction != "out";
  const Leaving leaving = leaving_of(o);

  // The mesh at --listen receives, and ends the run with the peer. With two threads, another
  // mesh (on any port) sends from a thread of its own; it is kept until the run has ended, as
  // its bytes are safe only once the peer says it has them all.
  Mesh mesh(mesh_options(o, o.listen));
  std::optional<Mesh> sender;
  std::vector<Mesh*> meshes{&mesh};
  if (o.threads == 2) {
    sender.emplace(mesh_options(o, o.listen.substr(0, o.listen.rfind(':')) + ":0"));
    meshes.push_back(&*sender);
  }
  const std::vector<PeerId> peers = gradsync::tools::connect_all(meshes, o.peer, settings.deadline);
  const PeerId peer = peers.front();
  std::optional<SideResult> sent;
  std::optional<SideResult> received;
  if (o.threads == 1) {
    const SideResult side = gradsync::tools::run_side(
        mesh, sends ? std::optional<PeerId>(peer) : std::nullopt, receives, settings);
    if (sends) sent = side;
    if (receives) received = side;
  } else {
    const PeerId sender_peer = peers.back();
    std::exception_ptr failure;
    std::thread sending([&] {
      try {
        sent = gradsync::tools::run_side(*sender, sender_peer, false, settings);
      } catch (...) {
        failure = std::current_exception();
      }
    });
    try {
      received = gradsync::tools::run_side(mesh, std::nullopt, true, settings);
    } catch (...) {
      sending.join();
      throw;
    }
    sending.join();
    if (failure) std::rethrow_exception(failure);
  }
  gradsync::tools::finish(mesh, peer, leaving, sends, settings.deadline);

  const std::string protocol =
      o.bulk_protocol == "eager" ? "eager" : "rendezvous from " + o.rendezvous_min;
  if (o.json) {
    nlohmann::json out = {{"direction", o.direction},        {"threads", o.threads},
                          {"bytes", settings.bytes},         {"piece_bytes", settings.piece_bytes},
                          {"transfers", o.transfers},        {"bulk_protocol", protocol},
                          {"send_memory", o.send_memory},    {"sent_gbytes_per_s", nullptr},
                          {"received_gbytes_per_s", nullptr}};
    if (sent) out["sent_gbytes_per_s"] = gbytes_per_second(sent);
    if (received) out["received_gbytes_per_s"] = gbytes_per_second(received);
    std::puts(out.dump().c_str());
    return 0;
  }
  fmt::print(
      "gradsync-transport-bench: {} {}, {} thread{}: {} transfers of {} in pieces of {}, {}, "
      "from {} memory\n",
      o.direction == "both"  ? "both ways with"
      : o.direction == "out" ? "sending to"
                             : "receiving from",
      o.peer, o.threads, o.threads == 1 ? "" : "s", o.transfers, o.bytes, o.piece, protocol,
      o.send_memory);
  if (sent) fmt::print("  sent      {:.3f} GB/s\n", gbytes_per_second(sent));
  if (received) fmt::print("  received  {:.3f} GB/s\n", gbytes_per_second(received));
  return 0;
}

int run(int argc, char** argv) {
  Options o;
  CLI::App app{
      "gradsync-transport-bench: the daemons' transport between two hosts, one way or both "
      "ways from one or two threads"};
  app.set_version_flag("--version", GRADSYNC_VERSION);
  app.add_option("--listen", o.listen, "HOST:PORT this side listens on")->required();
  app.add_option("--peer", o.peer, "HOST:PORT the other side listens on")->required();
  app.add_option("--direction", o.direction,
                 "both (default), or out and in: one side sends, the other receives")
      ->check(CLI::IsMember({"both", "out", "in"}));
  app.add_option("--threads", o.threads,
                 "1 (default): one thread sends and receives, as a daemon's engine; 2: a "
                 "thread and a connection each way")
      ->check(CLI::Range(1, 2));
  app.add_option("--bytes", o.bytes, "bytes per transfer and direction, K/M/G suffixes (64M)");
  app.add_option("--piece", o.piece, "bytes per message, as the ring's pieces (4M)");
  app.add_option("--pieces-ahead", o.pieces_ahead,
                 "sends unfinished at most (2, as the ring's own pieces)")
      ->check(CLI::PositiveNumber);
  app.add_option("--transfers", o.transfers, "timed transfers (10)")->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup, "transfers before them, not timed (2)");
  app.add_option("--bulk-protocol", o.bulk_protocol,
                 "rendezvous (default, the daemon's choice on fast TCP links) or eager")
      ->check(CLI::IsMember({"rendezvous", "eager"}));
  app.add_option("--rendezvous-min-bytes", o.rendezvous_min,
                 "with rendezvous: smaller messages go eagerly (256K, the daemon's default)");
  app.add_option("--send-memory", o.send_memory,
                 "written (default): data, as a daemon sends; untouched: memory never written, "
                 "which the kernel reads from one page of zeros, as ucx_perftest sends (both "
                 "sides alike)")
      ->check(CLI::IsMember({"written", "untouched"}));
  app.add_option("--timeout-s", o.timeout_seconds, "every wait ends in an error after this (60)")
      ->check(CLI::PositiveNumber);
  app.add_flag("--json", o.json, "one line of JSON");
  CLI11_PARSE(app, argc, argv);
  return measure(o);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "gradsync-transport-bench: %s\n", error.what());
    return 1;
  } catch (...) {
    std::fprintf(stderr, "gradsync-transport-bench: unknown error\n");
    return 1;
  }
}
