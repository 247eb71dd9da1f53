#include "tools/ctl/render.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>

namespace gradsync::ctl {
namespace {

// A count or a quantity with its unit ("12", "1.5 GiB"), not an address ("127.0.0.1:9478").
bool numeric(const std::string& cell) {
  return !cell.empty() && std::isdigit(static_cast<unsigned char>(cell.front())) != 0 &&
         cell.find(':') == std::string::npos;
}

std::string text(const nlohmann::json& value) {
  if (value.is_string()) return value.get<std::string>();
  return value.dump();
}

}  // namespace

void Table::print(std::ostream& out) const {
  std::vector<size_t> widths(headers_.size());
  // A column of numbers only is right-aligned.
  std::vector<bool> right(headers_.size(), !rows_.empty());
  for (size_t c = 0; c < headers_.size(); ++c) widths[c] = headers_[c].size();
  for (const auto& row : rows_) {
    for (size_t c = 0; c < row.size() && c < widths.size(); ++c) {
      widths[c] = std::max(widths[c], row[c].size());
      right[c] = right[c] && (numeric(row[c]) || row[c] == "-");
    }
  }
  auto line = [&](const std::vector<std::string>& cells) {
    std::string text;
    for (size_t c = 0; c < widths.size(); ++c) {
      const std::string& cell = c < cells.size() ? cells[c] : std::string();
      const bool last = c + 1 == widths.size();
      if (right[c]) {
        text += fmt::format("{:>{}}", cell, widths[c]);
      } else {
        text += last ? cell : fmt::format("{:<{}}", cell, widths[c]);
      }
      if (!last) text += "  ";
    }
    while (!text.empty() && text.back() == ' ') text.pop_back();
    out << text << "\n";
  };
  line(headers_);
  for (const auto& row : rows_) line(row);
}

std::string human_bytes(double bytes) {
  static constexpr std::array<const char*, 5> kUnits = {"B", "KiB", "MiB", "GiB", "TiB"};
  size_t unit = 0;
  while (bytes >= 1024 && unit + 1 < kUnits.size()) {
    bytes /= 1024;
    ++unit;
  }
  return unit == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.1f} {}", bytes, kUnits[unit]);
}

std::string human_duration(double seconds) {
  const auto s = static_cast<int64_t>(seconds);
  if (s < 60) return fmt::format("{:.1f}s", seconds);
  if (s < 3600) return fmt::format("{}m {:02}s", s / 60, s % 60);
  if (s < 86400) return fmt::format("{}h {:02}m", s / 3600, s % 3600 / 60);
  return fmt::format("{}d {:02}h", s / 86400, s % 86400 / 3600);
}

void print_status(const nlohmann::json& status, std::ostream& out) {
  out << fmt::format("gradsyncd {}  pid {}  up {}  reduce {}\n", text(status["version"]),
                     text(status["pid"]), human_duration(status["uptime_seconds"].get<double>()),
                     text(status["reduce_isa"]));
  const std::string listen = text(status["listen"]);
  out << fmt::format(
      "socket {}  inter-node {}  metrics {}\n", text(status["socket"]),
      listen.empty() ? "(none)" : listen,
      text(status["metrics_listen"]).empty() ? "(none)" : text(status["metrics_listen"]));
  if (status.contains("devices")) out << fmt::format("devices: {}\n", text(status["devices"]));
  if (text(status["role"]) == "aggregator") {
    out << fmt::format("role aggregator: sums allreduces for {} jobs of other nodes\n",
                       status["aggregated_jobs"].size());
  }
  out << fmt::format("{} clients, {} jobs, {} peers\n", status["clients"].size(),
                     status["jobs"].size(), status["peers"].size());
  if (const size_t hidden = status.value("hidden_jobs", size_t{0}); hidden > 0) {
    out << fmt::format("({} jobs of other users not shown)\n", hidden);
  }
  if (!status["jobs"].empty()) {
    out << "\n";
    print_jobs(status, out);
  }
  if (!status["aggregated_jobs"].empty()) {
    out << "\n";
    print_aggregated_jobs(status, out);
  }
  if (!status["peers"].empty()) {
    out << "\n";
    print_peers(status, out);
  }
}

namespace {
// "auto", or "auto+bf16" when the job's allreduces travel encoded.
std::string algorithm_and_codec(const nlohmann::json& job) {
  const std::string codec = job.value("wire_codec", "none");
  return text(job["algorithm"]) + (codec == "none" ? "" : "+" + codec);
}
}  // namespace

// "w3 cap 0.5G 74% waited 2.1s": its weight, cap, part of the node's bytes to other nodes
// over the last second (jobs across nodes) and time it waited for its share.
std::string share(const nlohmann::json& qos) {
  std::string text = fmt::format("w{}", qos["weight"].get<double>());
  if (const double cap = qos["max_gbit_per_s"].get<double>(); cap > 0) {
    text += fmt::format(" cap {}G", cap);
  }
  if (qos["latency_class"].get<bool>()) text += " latency";
  if (qos["wire_bytes"].get<double>() > 0) {
    text += fmt::format(" {:.0f}%", qos["wire_share"].get<double>() * 100);
  }
  if (const double waited = qos["share_wait_seconds"].get<double>(); waited >= 0.05) {
    text += " waited " + human_duration(waited);
  }
  return text;
}

namespace {
// "autotune done: fusion 16.0 MiB, piece 1.0 MiB, hold 25 us, ring from 4.0 MiB": the
// settings in effect, where the job autotunes (docs/autotune.md).
std::string autotune_note(const nlohmann::json& tune) {
  std::string note = fmt::format("autotune {}: fusion {}, piece {}", text(tune["state"]),
                                 human_bytes(tune["fusion_threshold_bytes"].get<double>()),
                                 human_bytes(tune["piece_bytes"].get<double>()));
  if (const auto hold = tune["negotiation_hold_us"].get<uint32_t>(); hold > 0) {
    note += fmt::format(", hold {} us", hold);
  }
  if (const double ring_min = tune["ring_min_bytes"].get<double>(); ring_min > 0) {
    note += ", ring from " + human_bytes(ring_min);
  }
  return note;
}
}  // namespace

void print_jobs(const nlohmann::json& status, std::ostream& out) {
  Table table(
      {"JOB", "STATE", "LOCAL RANKS", "WORLD", "NODE", "ALGORITHM", "SHARE", "STALL", "NOTE"});
  for (const auto& job : status["jobs"]) {
    const auto& nodes = job["nodes"];
    std::string note = text(job["failure"]);
    // Each later clause goes first: the failure, the longest, last.
    auto put_first = [&note](const std::string& clause) {
      note = note.empty() ? clause : clause + "; " + note;
    };
    // What a stalled job waits for: the tensor, and the ranks or nodes that hold it back.
    if (std::string stall = job.value("stall", ""); !stall.empty()) {
      const std::string own_name = "job '" + text(job["name"]) + "': ";
      if (stall.starts_with(own_name)) stall.erase(0, own_name.size());
      put_first(stall);
    }
    if (job["traced"].get<bool>()) put_first("tracing");
    if (!job["parent"].is_null()) put_first("part of " + text(job["parent"]["job"]));
    if (!job["lost_ranks"].empty()) put_first("lost ranks " + job["lost_ranks"].dump());
    if (job.contains("autotune")) put_first(autotune_note(job["autotune"]));
    table.add({text(job["name"]), text(job["state"]),
               fmt::format("{}/{}", text(job["local_ranks"]), text(job["local_world_size"])),
               text(job["world_size"]),
               nodes.empty() ? "-" : fmt::format("{} of {}", text(job["node_rank"]), nodes.size()),
               nodes.empty() ? "-" : algorithm_and_codec(job), share(job["qos"]),
               job["stall_seconds"].get<double>() > 0
                   ? human_duration(job["stall_seconds"].get<double>())
                   : "-",
               note});
  }
  table.print(out);
}

void print_clients(const nlohmann::json& status, std::ostream& out) {
  Table table({"ID", "PID", "UID", "JOB", "RANK", "LOCAL RANK", "BUFFERS", "SUBMITTED", "COMPLETED",
               "IN FLIGHT"});
  for (const auto& c : status["clients"]) {
    table.add({text(c["id"]), text(c["pid"]), text(c["uid"]), text(c["job"]), text(c["rank"]),
               text(c["local_rank"]), text(c["buffers"]), text(c["submitted"]),
               text(c["completed"]), text(c["in_flight"])});
  }
  table.print(out);
}

void print_peers(const nlohmann::json& status, std::ostream& out) {
  Table table({"PEER", "STATE", "SENT", "RECEIVED", "ERRORS", "LATENCY", "BANDWIDTH"});
  for (const auto& p : status["peers"]) {
    const double latency = p["latency_seconds"].get<double>();
    const double bandwidth = p["bytes_per_second"].get<double>();
    table.add({text(p["address"]), text(p["state"]), human_bytes(p["bytes_sent"].get<double>()),
               human_bytes(p["bytes_received"].get<double>()), text(p["errors"]),
               latency > 0 ? fmt::format("{:.1f} us", latency * 1e6) : "-",
               bandwidth > 0 ? fmt::format("{:.2f} GB/s", bandwidth / 1e9) : "-"});
  }
  table.print(out);
  // The pacer's measure of what the links carry, by which it shares them (docs/qos.md).
  const double link = status.value("link_bytes_per_second", 0.0);
  out << "links to other nodes carry "
      << (link > 0 ? fmt::format("{:.1f} MB/s", link / 1e6) : "(not measured yet)") << "\n";
}

void print_aggregated_jobs(const nlohmann::json& status, std::ostream& out) {
  Table table({"AGGREGATED JOB", "NODES", "PLACE", "CHUNK", "IN FLIGHT", "RECEIVED", "SENT",
               "CHUNKS SUMMED"});
  for (const auto& j : status["aggregated_jobs"]) {
    table.add({text(j["name"]), std::to_string(j["nodes"].size()),
               fmt::format("{} of {}", text(j["index"]), text(j["aggregators"])),
               human_bytes(j["chunk_bytes"].get<double>()), text(j["collectives_in_flight"]),
               human_bytes(j["bytes_received"].get<double>()),
               human_bytes(j["bytes_sent"].get<double>()), text(j["chunks_summed"])});
  }
  table.print(out);
}

void print_config(const nlohmann::json& status, std::ostream& out) {
  Table table({"KEY", "VALUE"});
  for (const auto& [key, value] : status["config"].items()) table.add({key, text(value)});
  table.print(out);
}

}  // namespace gradsync::ctl
