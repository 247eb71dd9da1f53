#include "daemon/control/admin.h"

#include <fmt/format.h>
#include <toml++/toml.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cerrno>
#include <sstream>

namespace gradsync::daemon {
namespace {

using Json = nlohmann::ordered_json;

}  // namespace

std::string config_json(const DaemonConfig& config) {
  // One source of truth for the keys and their order: the TOML the daemon prints.
  std::ostringstream out;
  out << toml::json_formatter{toml::parse(to_toml(config))};
  return out.str();
}

void restrict_to_viewer(EngineSnapshot& snapshot, uid_t viewer, uid_t daemon_uid,
                        const std::function<std::optional<uid_t>(const std::string&)>& owner_of) {
  if (viewer == 0 || viewer == daemon_uid) return;
  std::erase_if(snapshot.clients, [&](const ClientView& c) { return c.uid != viewer; });
  const size_t before = snapshot.jobs.size();
  std::erase_if(snapshot.jobs, [&](const JobView& j) { return owner_of(j.name) != viewer; });
  snapshot.hidden_jobs = before - snapshot.jobs.size();
}

std::string status_json(const DaemonInfo& daemon, const DaemonConfig& config,
                        const EngineSnapshot& snapshot) {
  Json status;
  status["version"] = daemon.version;
  status["pid"] = daemon.pid;
  status["uptime_seconds"] =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - daemon.started).count();
  status["socket"] = config.socket_path;
  status["listen"] = daemon.listen_address;
  status["metrics_listen"] = daemon.metrics_address;
  status["role"] = config.role;
  status["reduce_isa"] = daemon.reduce_isa;
  status["devices"] = daemon.devices;
  status["config"] = Json::parse(config_json(config));
  Json& clients = status["clients"] = Json::array();
  for (const ClientView& c : snapshot.clients) {
    clients.push_back({{"id", c.id},
                       {"pid", c.pid},
                       {"uid", c.uid},
                       {"job", c.job},
                       {"rank", c.rank},
                       {"local_rank", c.local_rank},
                       {"buffers", c.buffers},
                       {"submitted", c.submitted},
                       {"completed", c.completed},
                       {"in_flight", c.in_flight}});
  }
  status["hidden_jobs"] = snapshot.hidden_jobs;
  Json& jobs = status["jobs"] = Json::array();
  for (const JobView& j : snapshot.jobs) {
    jobs.push_back(
        {{"name", j.name},
         {"state", j.state},
         {"failure", j.failure},
         {"local_ranks", j.local_ranks},
         {"local_world_size", j.local_world_size},
         {"world_size", j.world_size},
         {"nodes", j.nodes},
         {"node_rank", j.node_rank},
         {"algorithm", j.algorithm},
         {"wire_codec", j.wire_codec},
         {"stall_seconds", j.stall_seconds},
         {"stall", j.stall},
         {"traced", j.traced},
         {"parent",
          j.parent.empty() ? Json(nullptr) : Json{{"job", j.parent}, {"ranks", j.parent_ranks}}},
         {"lost_ranks", j.lost_ranks},
         {"qos",
          {{"rule", j.share.rule},
           {"weight", j.share.weight},
           {"max_gbit_per_s", j.share.cap_bytes_per_second * 8 / 1e9},
           {"latency_class", j.share.latency_class},
           {"engine_bytes", j.engine_bytes},
           {"wire_bytes", j.wire_bytes},
           {"wire_share", j.wire_share},
           {"share_wait_seconds", j.share_wait_seconds}}}});
    if (!j.autotune.empty()) {
      jobs.back()["autotune"] = {
          {"state", j.autotune},
          {"trials", j.autotune_trials},
          {"best_bus_bytes_per_second", j.autotune_best_bus_bytes_per_second},
          {"fusion_threshold_bytes", j.tuned.fusion_threshold_bytes},
          {"piece_bytes", j.tuned.piece_bytes},
          {"negotiation_hold_us", j.tuned.negotiation_hold_us},
          {"ring_min_bytes", j.tuned.ring_min_bytes}};
    }
  }
  Json& peers = status["peers"] = Json::array();
  for (const PeerView& p : snapshot.peers) {
    peers.push_back({{"address", p.address},
                     {"state", p.failed ? "failed" : "connected"},
                     {"bytes_sent", p.bytes_sent},
                     {"bytes_received", p.bytes_received},
                     {"errors", p.errors},
                     {"latency_seconds", p.latency_seconds},
                     {"bytes_per_second", p.bytes_per_second}});
  }
  status["link_bytes_per_second"] = snapshot.link_bytes_per_second;
  Json& aggregated = status["aggregated_jobs"] = Json::array();
  for (const AggregatorJobView& j : snapshot.aggregated_jobs) {
    aggregated.push_back({{"name", j.name},
                          {"nodes", j.nodes},
                          {"index", j.index},
                          {"aggregators", j.aggregators},
                          {"chunk_bytes", j.chunk_bytes},
                          {"collectives_in_flight", j.collectives_in_flight},
                          {"bytes_received", j.bytes_received},
                          {"bytes_sent", j.bytes_sent},
                          {"chunks_summed", j.chunks_summed}});
  }
  return status.dump(2);
}

std::string trace_json(const TraceData& trace, uint32_t node_rank) {
  // Written out directly: a trace holds up to a million events, and a tree of them would cost
  // far more than the text.
  std::string out;
  out.reserve(256 + trace.events.size() * 120);
  const auto microseconds = [&trace](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double, std::micro>(t - trace.started).count();
  };
  const std::string job = Json(fmt::format("job {} on node {}", trace.job, node_rank)).dump();
  out += "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  out += fmt::format(R"({{"name":"process_name","ph":"M","pid":1,"args":{{"name":{}}}}})", job);
  // One row per tensor, in the order they first appear.
  for (size_t i = 0; i < trace.tensors.size(); ++i) {
    out += fmt::format(
        ",\n{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":{},\"args\":{{\"name\":{}}}}"
        "}",
        i + 1, Json(trace.tensors[i]).dump());
    out += fmt::format(
        ",\n{{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":1,\"tid\":{},\"args\":{{"
        "\"sort_index\":{}}}}}",
        i + 1, i + 1);
  }
  for (const TraceEvent& e : trace.events) {
    out += fmt::format(
        ",\n{{\"name\":\"{}\",\"cat\":\"gradsync\",\"ph\":\"X\",\"pid\":1,\"tid\":{},\"ts\":{:.3f},"
        "\"dur\":{:.3f},\"args\":{{\"bytes\":{},\"fused\":{}}}}}",
        phase_name(e.phase), e.tensor + 1, microseconds(e.begin),
        std::chrono::duration<double, std::micro>(e.end - e.begin).count(), e.bytes, e.fused);
  }
  out += "\n],\"otherData\":";
  out += Json({{"job", trace.job},
               {"node_rank", node_rank},
               {"steps", trace.steps},
               {"events", trace.events.size()},
               {"tensors", trace.tensors.size()},
               {"ended", trace.ended}})
             .dump();
  out += "}\n";
  return out;
}

ipc::UniqueFd report_memfd(std::string_view text) {
  ipc::UniqueFd fd = ipc::create_sealed_memfd("gradsync-report", text.size());
  size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = ::pwrite(fd.get(), text.data() + written, text.size() - written,
                               static_cast<off_t>(written));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw ipc::SystemError("pwrite(report)", errno);
    }
    written += static_cast<size_t>(n);
  }
  return fd;
}

}  // namespace gradsync::daemon
