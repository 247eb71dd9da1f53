#include "daemon/config.h"

#include "daemon/node/cost_model.h"

#include <toml++/toml.h>

#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <sstream>

namespace gradsync::daemon {
namespace {

// One setter per key: the single place a key's name, type and range live.
using Setter = std::function<void(DaemonConfig&, const toml::node&, const std::string& key)>;

ConfigError key_error(const std::string& key, const std::string& what) {
  return ConfigError("config key '" + key + "': " + what);
}

Setter string_key(std::string DaemonConfig::*field) {
  return [field](DaemonConfig& config, const toml::node& node, const std::string& key) {
    const auto value = node.value<std::string>();
    if (!value) throw key_error(key, "expected a string");
    config.*field = *value;
  };
}

template <typename Int>
Setter integer_key(Int DaemonConfig::*field, int64_t min, int64_t max) {
  return [field, min, max](DaemonConfig& config, const toml::node& node, const std::string& key) {
    if (!node.is_integer()) throw key_error(key, "expected an integer");
    const int64_t value = *node.value<int64_t>();
    if (value < min || value > max) {
      throw key_error(key, "value " + std::to_string(value) + " outside [" + std::to_string(min) +
                               ", " + std::to_string(max) + "]");
    }
    config.*field = static_cast<Int>(value);
  };
}

const std::map<std::string, Setter>& setters() {
  constexpr int64_t kMaxU32 = std::numeric_limits<uint32_t>::max();
  constexpr int64_t kMaxI64 = std::numeric_limits<int64_t>::max();
  static const std::map<std::string, Setter> table = {
      {"socket_path", string_key(&DaemonConfig::socket_path)},
      {"socket_mode", integer_key(&DaemonConfig::socket_mode, 0, 0777)},
      {"socket_group", string_key(&DaemonConfig::socket_group)},
      {"metrics_listen", string_key(&DaemonConfig::metrics_listen)},
      {"listen", string_key(&DaemonConfig::listen)},
      {"cluster_key_file", string_key(&DaemonConfig::cluster_key_file)},
      {"log_level", string_key(&DaemonConfig::log_level)},
      {"fusion_threshold_bytes", integer_key(&DaemonConfig::fusion_threshold_bytes, 0, kMaxI64)},
      {"ring_entries", integer_key(&DaemonConfig::ring_entries, 2, 1 << 16)},
      {"engine_spin_us", integer_key(&DaemonConfig::engine_spin_us, 0, 1'000'000)},
      {"negotiation_hold_us", integer_key(&DaemonConfig::negotiation_hold_us, 0, 1'000'000)},
      {"negotiation_relay_min_nodes",
       integer_key(&DaemonConfig::negotiation_relay_min_nodes, 2, kMaxU32)},
      {"reduce_threads", integer_key(&DaemonConfig::reduce_threads, 0, 256)},
      {"parallel_reduce_min_bytes",
       integer_key(&DaemonConfig::parallel_reduce_min_bytes, 4096, kMaxI64)},
      {"job_formation_timeout_seconds",
       integer_key(&DaemonConfig::job_formation_timeout_seconds, 1, 86400)},
      {"peer_timeout_seconds", integer_key(&DaemonConfig::peer_timeout_seconds, 1, 86400)},
      {"stall_warning_seconds", integer_key(&DaemonConfig::stall_warning_seconds, 1, 86400)},
      {"stall_shutdown_seconds", integer_key(&DaemonConfig::stall_shutdown_seconds, 0, 86400)},
      {"tcp_keepalive_idle_seconds",
       integer_key(&DaemonConfig::tcp_keepalive_idle_seconds, 1, 86400)},
      {"tcp_keepalive_interval_seconds",
       integer_key(&DaemonConfig::tcp_keepalive_interval_seconds, 1, 3600)},
      {"tcp_bulk_protocol", string_key(&DaemonConfig::tcp_bulk_protocol)},
      {"tcp_rendezvous_min_bytes",
       integer_key(&DaemonConfig::tcp_rendezvous_min_bytes, 1, kMaxI64)},
      {"response_cache_capacity", integer_key(&DaemonConfig::response_cache_capacity, 0, 1 << 16)},
      {"allreduce_algorithm", string_key(&DaemonConfig::allreduce_algorithm)},
      {"allreduce_wire_codec", string_key(&DaemonConfig::allreduce_wire_codec)},
      {"max_clients", integer_key(&DaemonConfig::max_clients, 1, 1 << 20)},
      {"max_buffers_per_client", integer_key(&DaemonConfig::max_buffers_per_client, 1, kMaxU32)},
      {"host_mapping_cache_entries",
       integer_key(&DaemonConfig::host_mapping_cache_entries, 1, 1 << 24)},
      {"device_mapping_cache_entries",
       integer_key(&DaemonConfig::device_mapping_cache_entries, 1, 1 << 20)},
  };
  return table;
}

}  // namespace

DaemonConfig default_config() {
  return DaemonConfig{};
}

DaemonConfig parse_config(const std::string& toml_text, const std::string& origin) {
  toml::table table;
  try {
    table = toml::parse(toml_text, origin);
  } catch (const toml::parse_error& e) {
    std::ostringstream message;
    message << origin << ":" << e.source().begin.line << ":" << e.source().begin.column << ": "
            << e.description();
    throw ConfigError(message.str());
  }
  DaemonConfig config = default_config();
  for (const auto& [key, node] : table) {
    const std::string name(key.str());
    const auto setter = setters().find(name);
    if (setter == setters().end())
      throw ConfigError(origin + ": unknown config key '" + name + "'");
    setter->second(config, node, name);
  }
  validate(config);
  return config;
}

DaemonConfig load_config_file(const std::string& path) {
  std::ifstream file(path);
  if (!file) throw ConfigError("cannot read config file " + path);
  std::stringstream text;
  text << file.rdbuf();
  return parse_config(text.str(), path);
}

void validate(const DaemonConfig& config) {
  if (config.socket_path.empty()) throw key_error("socket_path", "must not be empty");
  if (config.socket_path.size() >= 108) throw key_error("socket_path", "longer than 107 bytes");
  static const char* const kLevels[] = {"trace", "debug",    "info", "warn",
                                        "error", "critical", "off"};
  bool level_known = false;
  for (const char* level : kLevels) level_known = level_known || config.log_level == level;
  if (!level_known) throw key_error("log_level", "unknown level '" + config.log_level + "'");
  if (config.tcp_bulk_protocol != "auto" && config.tcp_bulk_protocol != "eager" &&
      config.tcp_bulk_protocol != "rendezvous") {
    throw key_error("tcp_bulk_protocol",
                    "must be auto, eager or rendezvous, not '" + config.tcp_bulk_protocol + "'");
  }
  if (config.allreduce_algorithm != "auto" && config.allreduce_algorithm != "ring" &&
      config.allreduce_algorithm != "rhd") {
    throw key_error("allreduce_algorithm",
                    "must be auto, ring or rhd, not '" + config.allreduce_algorithm + "'");
  }
  if (!parse_wire_codec(config.allreduce_wire_codec)) {
    throw key_error("allreduce_wire_codec", "must be none, bf16, topk or topk:PERCENT, not '" +
                                                config.allreduce_wire_codec + "'");
  }
  if ((config.ring_entries & (config.ring_entries - 1)) != 0) {
    throw key_error("ring_entries", "must be a power of two");
  }
}

std::string to_toml(const DaemonConfig& c) {
  toml::table table{
      {"socket_path", c.socket_path},
      {"socket_mode", static_cast<int64_t>(c.socket_mode)},
      {"socket_group", c.socket_group},
      {"metrics_listen", c.metrics_listen},
      {"listen", c.listen},
      {"cluster_key_file", c.cluster_key_file},
      {"log_level", c.log_level},
      {"fusion_threshold_bytes", static_cast<int64_t>(c.fusion_threshold_bytes)},
      {"ring_entries", static_cast<int64_t>(c.ring_entries)},
      {"engine_spin_us", static_cast<int64_t>(c.engine_spin_us)},
      {"negotiation_hold_us", static_cast<int64_t>(c.negotiation_hold_us)},
      {"negotiation_relay_min_nodes", static_cast<int64_t>(c.negotiation_relay_min_nodes)},
      {"reduce_threads", static_cast<int64_t>(c.reduce_threads)},
      {"parallel_reduce_min_bytes", static_cast<int64_t>(c.parallel_reduce_min_bytes)},
      {"job_formation_timeout_seconds", static_cast<int64_t>(c.job_formation_timeout_seconds)},
      {"peer_timeout_seconds", static_cast<int64_t>(c.peer_timeout_seconds)},
      {"stall_warning_seconds", static_cast<int64_t>(c.stall_warning_seconds)},
      {"stall_shutdown_seconds", static_cast<int64_t>(c.stall_shutdown_seconds)},
      {"tcp_keepalive_idle_seconds", static_cast<int64_t>(c.tcp_keepalive_idle_seconds)},
      {"tcp_keepalive_interval_seconds", static_cast<int64_t>(c.tcp_keepalive_interval_seconds)},
      {"tcp_bulk_protocol", c.tcp_bulk_protocol},
      {"tcp_rendezvous_min_bytes", static_cast<int64_t>(c.tcp_rendezvous_min_bytes)},
      {"response_cache_capacity", static_cast<int64_t>(c.response_cache_capacity)},
      {"allreduce_algorithm", c.allreduce_algorithm},
      {"allreduce_wire_codec", c.allreduce_wire_codec},
      {"max_clients", static_cast<int64_t>(c.max_clients)},
      {"max_buffers_per_client", static_cast<int64_t>(c.max_buffers_per_client)},
      {"host_mapping_cache_entries", static_cast<int64_t>(c.host_mapping_cache_entries)},
      {"device_mapping_cache_entries", static_cast<int64_t>(c.device_mapping_cache_entries)},
  };
  std::ostringstream out;
  out << table;
  return out.str();
}

}  // namespace gradsync::daemon
