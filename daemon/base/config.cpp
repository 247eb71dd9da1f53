#include "daemon/base/config.h"

#include "cost_model/cost_model.h"
#include "ipc/protocol.h"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <pwd.h>

#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <type_traits>
#include <variant>
#include <vector>

namespace gradsync::daemon {
namespace {

// When a changed key takes effect on reload (SIGHUP).
enum class Reload {
  kRestart,         // only when the daemon restarts: it binds sockets or sizes threads
  kLive,            // at once
  kLiveNewJobs,     // for jobs that form after the reload
  kLiveNewClients,  // for clients that connect after the reload
};

using Field = std::variant<std::string DaemonConfig::*, bool DaemonConfig::*,
                           uint32_t DaemonConfig::*, uint64_t DaemonConfig::*>;

// Every key in one table: its name, the field it sets, its range, when a change takes effect,
// and its documentation, from which docs/configuration.md's table and systemd/gradsyncd.toml
// are generated (config_docs; a unit test checks both match).
struct Key {
  const char* name;
  Field field;
  Reload reload;
  const char* doc;
  int64_t min = 0;  // integers only
  int64_t max = 0;
  bool octal = false;  // written as 0o..., as permission bits read
};

constexpr int64_t kMaxU32 = std::numeric_limits<uint32_t>::max();
constexpr int64_t kMaxI64 = std::numeric_limits<int64_t>::max();

// Docs: one plain sentence or more each, lower case, without the unit the name already says.
const std::vector<Key>& keys() {
  using C = DaemonConfig;
  static const std::vector<Key> table = {
      {"socket_path", &C::socket_path, Reload::kRestart, "client control socket"},
      {"socket_mode", &C::socket_mode, Reload::kRestart, "permission bits of the socket", 0, 0777,
       true},
      {"socket_group", &C::socket_group, Reload::kRestart,
       "group of the socket (empty: the daemon's)"},
      {"metrics_listen", &C::metrics_listen, Reload::kRestart,
       "Prometheus endpoint, HOST:PORT; `\"\"` disables it, port 0 picks one (`gradsyncctl "
       "status` names it)"},
      {"listen", &C::listen, Reload::kRestart,
       "inter-node transport (UCX) address, HOST:PORT, for multi-node jobs; port 0 picks one "
       "(`gradsyncctl status` names it)"},
      {"cluster_key_file", &C::cluster_key_file, Reload::kRestart,
       "the key node daemons prove to each other (docs/deployment.md, cluster authentication); "
       "must be owned by the daemon's user with no group or other permission bits, or the "
       "daemon does not start; `\"\"`: no key, only daemons without one are accepted"},
      {"log_level", &C::log_level, Reload::kLive, "trace, debug, info, warn, error, critical, off"},
      {"role", &C::role, Reload::kRestart,
       "`node` serves training processes on this machine; `aggregator` serves none and sums "
       "the allreduces of other nodes' jobs that list it (docs/aggregators.md)"},
      {"aggregators", &C::aggregators, Reload::kLiveNewJobs,
       "aggregators, HOST:PORT, comma-separated, that jobs across nodes sum through when they "
       "name none (a job's `GRADSYNC_AGGREGATORS` overrides it); `\"\"`: none"},
      {"aggregation_chunk_bytes", &C::aggregation_chunk_bytes, Reload::kLiveNewJobs,
       "allreduces through aggregators go in chunks of at most this size, each summed as soon "
       "as every node's push of it is in (node 0's is agreed)",
       4 << 10, 64 << 20},
      {"aggregator_link_mbps", &C::aggregator_link_mbps, Reload::kLiveNewJobs,
       "the aggregators' link speed, in Mbit/s, for the cost model's choice between them and "
       "the ring; 0: as fast as the nodes' links as they measure them",
       0, 100'000'000},
      {"fusion_threshold_bytes", &C::fusion_threshold_bytes, Reload::kLive,
       "ready tensors are fused into batches up to this size per rank (across nodes: node 0's "
       "value); a ready tensor never waits for others to fuse with: what is ready together "
       "fuses",
       0, kMaxI64},
      {"pipeline_piece_bytes", &C::pipeline_piece_bytes, Reload::kLiveNewJobs,
       "a batch runs in pieces of about this size: on one node, the most that other jobs' and "
       "higher priorities' work waits behind; across nodes, the ring allreduce's blocks and "
       "what the direct allreduce, reduce-scatter and all-to-all send each node are pipelined "
       "in pieces of it (node 0's value)",
       4 << 10, 1 << 30},
      {"scratch_unused_seconds", &C::scratch_unused_seconds, Reload::kLive,
       "across nodes: what a job's collectives stage through (fusion buffers, pieces in "
       "flight, wire codecs' buffers) that none of them has used this long is freed, and "
       "allocated again when one needs it (`gradsync_job_scratch_bytes`); 0: kept until the job "
       "ends",
       0, 86400},
      {"ring_entries", &C::ring_entries, Reload::kLiveNewClients,
       "entries per client ring, a power of two; also the client's in-flight limit", 2, 1 << 16},
      {"engine_spin_us", &C::engine_spin_us, Reload::kLive,
       "how long the engine polls (yielding) before it sleeps", 0, 1'000'000},
      {"negotiation_hold_us", &C::negotiation_hold_us, Reload::kLiveNewJobs,
       "across nodes: how long a node with nothing to propose holds back its part of a peer's "
       "negotiation cycle, so that its ranks' next collective joins that cycle instead of "
       "needing one of its own; at most `engine_spin_us`, 0 joins at once",
       0, 1'000'000},
      {"negotiation_relay_min_nodes", &C::negotiation_relay_min_nodes, Reload::kLiveNewJobs,
       "across nodes: jobs of at least this many nodes relay their negotiation cycles by "
       "recursive doubling (about log2 N messages per node and cycle, log2 N hops); smaller "
       "jobs send each node's cycle to every other node (N-1 messages, one hop); node 0's value "
       "holds for a job",
       2, kMaxU32},
      {"reduce_threads", &C::reduce_threads, Reload::kRestart,
       "local reduce threads; 0: one per CPU the daemon may run on (its CPU affinity)", 0, 256},
      {"parallel_reduce_min_bytes", &C::parallel_reduce_min_bytes, Reload::kLive,
       "batches below this reduce on the engine thread alone", 4096, kMaxI64},
      {"job_formation_timeout_seconds", &C::job_formation_timeout_seconds, Reload::kLiveNewJobs,
       "a job whose local ranks have not all connected by then fails, naming the missing ones", 1,
       86400},
      {"peer_timeout_seconds", &C::peer_timeout_seconds, Reload::kLiveNewJobs,
       "a peer node daemon that makes no progress this long mid-collective fails the job", 1,
       86400},
      {"stall_warning_seconds", &C::stall_warning_seconds, Reload::kLive,
       "a tensor some ranks or nodes have submitted and others have not, this long: a warning "
       "names it, its job and who is missing",
       1, 86400},
      {"stall_shutdown_seconds", &C::stall_shutdown_seconds, Reload::kLive,
       "a stall this long fails the job with that message to every rank; 0: warn only", 0, 86400},
      {"tcp_keepalive_idle_seconds", &C::tcp_keepalive_idle_seconds, Reload::kRestart,
       "a peer host silent this long is probed by TCP keepalive (a vanished host fails its "
       "jobs after about idle + 3 x interval)",
       1, 86400},
      {"tcp_keepalive_interval_seconds", &C::tcp_keepalive_interval_seconds, Reload::kRestart,
       "time between keepalive probes", 1, 3600},
      {"tcp_bulk_protocol", &C::tcp_bulk_protocol, Reload::kRestart,
       "bulk data to other nodes where UCX has only TCP on this host: `rendezvous` (UCX's "
       "choice: a handshake per message, then the data without UCX's copies), `eager` (every "
       "message at once, through UCX's buffers), or `auto` (per job, from the links it "
       "measures as it forms: `rendezvous` where they are fast next to this host's copies, "
       "eager messages where they are slow); RDMA networks always keep UCX's zero-copy "
       "rendezvous (docs/multi-node.md, TCP networks)"},
      {"tcp_rendezvous_min_bytes", &C::tcp_rendezvous_min_bytes, Reload::kRestart,
       "with `rendezvous` or `auto` over TCP only: smaller messages go eagerly, where the "
       "handshake's round trip costs more than the copies it saves (`auto` cuts a slow link's "
       "bulk data into messages of the largest power of two below it)",
       1, kMaxI64},
      {"response_cache_capacity", &C::response_cache_capacity, Reload::kLiveNewJobs,
       "collectives per multi-node job whose negotiation is cached (a bit each); 0: every one is "
       "reported by name",
       0, 1 << 16},
      {"allreduce_algorithm", &C::allreduce_algorithm, Reload::kLiveNewJobs,
       "inter-node allreduce: `auto` (the cost model), `ring`, `rhd`, `direct` (sums in node "
       "order: the same bits run after run), `aggregate` or `split` (through aggregators: "
       "docs/aggregators.md), and with it the broadcast (`ring`: the chain, the others "
       "direct); a job's `GRADSYNC_ALGO` overrides it"},
      {"allreduce_wire_codec", &C::allreduce_wire_codec, Reload::kLiveNewJobs,
       "what f32 allreduces send between nodes: `none` (the values), `bf16` (rounded to "
       "bfloat16 on the ring: half the bytes) or `topk:PERCENT` (sums and averages send that "
       "percent of each tensor's 32 KiB chunks, the rest later; `topk` alone is `topk:1`); a "
       "job's `GRADSYNC_WIRE_CODEC` overrides it (docs/multi-node.md)"},
      {"autotune", &C::autotune, Reload::kLiveNewJobs,
       "tune each job's fusion threshold, pipeline piece, negotiation hold and ring crossover "
       "over its first steps (docs/autotune.md); a job's `GRADSYNC_AUTOTUNE` overrides it, and "
       "across nodes node 0's ranks decide"},
      {"autotune_max_steps", &C::autotune_max_steps, Reload::kLiveNewJobs,
       "steps an autotuned job's search may take; fewer steps try fewer candidates", 5, 1'000'000},
      {"autotune_max_seconds", &C::autotune_max_seconds, Reload::kLiveNewJobs,
       "time an autotuned job's search may take; past it the best measured so far is kept", 1,
       86'400},
      {"autotune_log", &C::autotune_log, Reload::kLive,
       "CSV file the daemon appends each autotune trial and choice to, with the job's name "
       "(`\"\"`: none)"},
      {"max_clients", &C::max_clients, Reload::kLive, "connected clients", 1, 1 << 20},
      {"max_buffers_per_client", &C::max_buffers_per_client, Reload::kLiveNewClients,
       "registered buffers per client", 1, kMaxU32},
      {"host_mapping_cache_entries", &C::host_mapping_cache_entries, Reload::kRestart,
       "clients' shared-memory ranges kept mapped; past it the least recently used one no "
       "collective uses is unmapped, and mapped again when next used",
       1, 1 << 24},
      {"device_mapping_cache_entries", &C::device_mapping_cache_entries, Reload::kRestart,
       "client device allocations kept open through CUDA IPC; past it the least recently used "
       "one no collective uses is closed, and opened again when next used",
       1, 1 << 20},
  };
  return table;
}

ConfigError key_error(const std::string& key, const std::string& what) {
  return ConfigError("config key '" + key + "': " + what);
}

void set_key(const Key& key, DaemonConfig& config, const toml::node& node) {
  std::visit(
      [&](auto field) {
        using Value = std::remove_cvref_t<decltype(config.*field)>;
        if constexpr (std::is_same_v<Value, std::string>) {
          const auto value = node.value<std::string>();
          if (!value) throw key_error(key.name, "expected a string");
          config.*field = *value;
        } else if constexpr (std::is_same_v<Value, bool>) {
          if (!node.is_boolean()) throw key_error(key.name, "expected true or false");
          config.*field = *node.value<bool>();
        } else {
          if (!node.is_integer()) throw key_error(key.name, "expected an integer");
          const int64_t value = *node.value<int64_t>();
          if (value < key.min || value > key.max) {
            throw key_error(key.name, "value " + std::to_string(value) + " outside [" +
                                          std::to_string(key.min) + ", " + std::to_string(key.max) +
                                          "]");
          }
          config.*field = static_cast<Value>(value);
        }
      },
      key.field);
}

// A TOML basic string: quoted, with quotes, backslashes and control characters escaped.
std::string toml_string(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned char>(c));
      out += escaped;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// The key's value in `config` as TOML writes it.
std::string value_text(const Key& key, const DaemonConfig& config) {
  return std::visit(
      [&](auto field) -> std::string {
        using Value = std::remove_cvref_t<decltype(config.*field)>;
        std::ostringstream out;
        if constexpr (std::is_same_v<Value, std::string>) {
          out << toml_string(config.*field);
        } else if constexpr (std::is_same_v<Value, bool>) {
          out << (config.*field ? "true" : "false");
        } else if (key.octal) {
          out << "0o" << std::oct << config.*field;
        } else {
          out << config.*field;
        }
        return out.str();
      },
      key.field);
}

const Key* find_key(const std::string& name) {
  for (const Key& key : keys()) {
    if (name == key.name) return &key;
  }
  return nullptr;
}

const char* reload_note(Reload reload) {
  switch (reload) {
    case Reload::kRestart:
      return "";
    case Reload::kLive:
      return " (*live*)";
    case Reload::kLiveNewJobs:
      return " (*live*: jobs that form after)";
    case Reload::kLiveNewClients:
      return " (*live*: clients that connect after)";
  }
  return "";
}

// `text` as comment lines of at most `width` columns.
std::string comment(const std::string& text, size_t width) {
  std::string out, line = "#";
  std::istringstream words(text);
  std::string word;
  while (words >> word) {
    if (line.size() + 1 + word.size() > width && line != "#") {
      out += line + "\n";
      line = "#";
    }
    line += " " + word;
  }
  return out + line + "\n";
}

// The keys of a `[[qos.rule]]` table, documented as the flat keys are.
struct RuleKey {
  const char* name;
  const char* doc;
};
constexpr RuleKey kRuleKeys[] = {
    {"job",
     "glob over the job's name (`*`, `?`, `[...]`, as fnmatch(3)); default `\"*\"`: every job"},
    {"user", "the job's owner (the user of its ranks), as a user name or a uid; default: anyone"},
    {"weight",
     "the job's relative share of the engine and of the inter-node links, above 0; "
     "default 1"},
    {"max_gbit_per_s", "cap on the job's inter-node send rate, in Gbit/s; default 0: no cap"},
    {"latency_class",
     "`true`: the job's small collectives (up to 256 KiB per rank) go ahead of "
     "other jobs' bulk pieces, and while it is active the other jobs together send to other "
     "nodes at 70% of the link; default `false`"},
};
constexpr double kMaxWeight = 1e6;
constexpr double kMaxGbitPerSecond = 1e5;

// Why fnmatch(3) would not read `pattern` as the operator meant, if it would not: a bracket
// expression left open, or a trailing escape.
std::optional<std::string> glob_problem(const std::string& pattern) {
  if (pattern.empty()) return "an empty glob matches no job";
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '\\') {
      if (++i == pattern.size()) return "ends in an escape (\\\\) with nothing to escape";
    } else if (pattern[i] == '[') {
      size_t j = i + 1;
      if (j < pattern.size() && (pattern[j] == '!' || pattern[j] == '^')) ++j;
      if (j < pattern.size() && pattern[j] == ']') ++j;  // a leading ] is a member
      while (j < pattern.size() && pattern[j] != ']') ++j;
      if (j == pattern.size()) {
        return "the bracket expression at column " + std::to_string(i + 1) + " is not closed";
      }
      i = j;
    }
  }
  return std::nullopt;
}

std::optional<uid_t> uid_of_user(const std::string& name) {
  std::vector<char> buffer(16384);
  struct passwd entry {};
  struct passwd* found = nullptr;
  if (::getpwnam_r(name.c_str(), &entry, buffer.data(), buffer.size(), &found) != 0 ||
      found == nullptr) {
    return std::nullopt;
  }
  return found->pw_uid;
}

double rule_number(const toml::node& node, const std::string& key, double min, double max,
                   bool min_open) {
  const auto value = node.value<double>();
  if (!node.is_number() || !value) throw key_error(key, "expected a number");
  if (*value < min || (min_open && *value == min) || *value > max) {
    throw key_error(
        key, fmt::format("value {} outside {}{}, {}]", *value, min_open ? "(" : "[", min, max));
  }
  return *value;
}

QosRule parse_rule(const toml::table& table, const std::string& where) {
  QosRule rule;
  for (const auto& [name, node] : table) {
    const std::string key = where + "." + std::string(name.str());
    if (name.str() == "job") {
      const auto value = node.value<std::string>();
      if (!node.is_string()) throw key_error(key, "expected a string");
      if (auto problem = glob_problem(*value)) {
        throw key_error(key, "invalid glob '" + *value + "': " + *problem);
      }
      rule.job = *value;
    } else if (name.str() == "user") {
      if (node.is_integer()) {
        const int64_t uid = *node.value<int64_t>();
        if (uid < 0 || uid >= kMaxU32) {
          throw key_error(key, "uid " + std::to_string(uid) + " out of range");
        }
        rule.user = std::to_string(uid);
        rule.uid = static_cast<uid_t>(uid);
      } else if (node.is_string()) {
        rule.user = *node.value<std::string>();
        rule.uid = uid_of_user(rule.user);
        if (!rule.uid) throw key_error(key, "no user '" + rule.user + "' on this host");
      } else {
        throw key_error(key, "expected a user name or a uid");
      }
    } else if (name.str() == "weight") {
      rule.weight = rule_number(node, key, 0, kMaxWeight, true);
    } else if (name.str() == "max_gbit_per_s") {
      rule.max_gbit_per_s = rule_number(node, key, 0, kMaxGbitPerSecond, false);
    } else if (name.str() == "latency_class") {
      if (!node.is_boolean()) throw key_error(key, "expected true or false");
      rule.latency_class = *node.value<bool>();
    } else {
      throw key_error(key,
                      "unknown key (a rule has job, user, weight, max_gbit_per_s and "
                      "latency_class)");
    }
  }
  return rule;
}

// `qos` holds only `[[qos.rule]]` tables.
void parse_qos(const toml::node& node, DaemonConfig& config) {
  const toml::table* qos = node.as_table();
  if (qos == nullptr) throw key_error("qos", "expected tables: write each rule as [[qos.rule]]");
  for (const auto& [name, value] : *qos) {
    if (name.str() != "rule") {
      throw key_error("qos." + std::string(name.str()),
                      "unknown key (qos holds [[qos.rule]] tables)");
    }
    const toml::array* rules = value.as_array();
    if (rules == nullptr)
      throw key_error("qos.rule", "expected tables: write each rule as [[qos.rule]]");
    for (size_t i = 0; i < rules->size(); ++i) {
      const std::string where = "qos.rule[" + std::to_string(i + 1) + "]";
      const toml::table* table = (*rules)[i].as_table();
      if (table == nullptr) throw key_error(where, "expected a table");
      config.qos_rules.push_back(parse_rule(*table, where));
    }
  }
}

// The rules as one line of TOML (an inline table), so that a reload's comparison sees them as
// one key.
std::string qos_value(const std::vector<QosRule>& rules) {
  std::string out = "{ rule = [";
  for (size_t i = 0; i < rules.size(); ++i) {
    const QosRule& rule = rules[i];
    out += i == 0 ? " " : ", ";
    out += "{ job = " + toml_string(rule.job);
    if (!rule.user.empty()) {
      const bool numeric = rule.user.find_first_not_of("0123456789") == std::string::npos;
      out += ", user = " + (numeric ? rule.user : toml_string(rule.user));
    }
    out += fmt::format(", weight = {}, max_gbit_per_s = {}, latency_class = {} }}", rule.weight,
                       rule.max_gbit_per_s, rule.latency_class);
  }
  return out + (rules.empty() ? "] }" : " ] }");
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
    if (name == "qos") {
      parse_qos(node, config);
      continue;
    }
    const Key* spec = find_key(name);
    if (spec == nullptr) throw ConfigError(origin + ": unknown config key '" + name + "'");
    set_key(*spec, config, node);
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
  if (config.allreduce_algorithm != "auto" &&
      !cost_model::parse_algorithm(config.allreduce_algorithm)) {
    throw key_error("allreduce_algorithm",
                    "must be auto, ring, rhd, direct, aggregate or split, not '" +
                        config.allreduce_algorithm + "'");
  }
  if (config.role != "node" && config.role != "aggregator") {
    throw key_error("role", "must be node or aggregator, not '" + config.role + "'");
  }
  if (config.role == "aggregator" && config.listen.empty()) {
    throw key_error("listen", "an aggregator needs an inter-node listener");
  }
  for (const std::string& aggregator : ipc::split_addresses(config.aggregators)) {
    if (aggregator.find(':') == std::string::npos) {
      throw key_error("aggregators", "'" + aggregator + "' is not HOST:PORT");
    }
  }
  if (!cost_model::parse_wire_codec(config.allreduce_wire_codec)) {
    throw key_error("allreduce_wire_codec", "must be none, bf16, topk or topk:PERCENT, not '" +
                                                config.allreduce_wire_codec + "'");
  }
  if ((config.ring_entries & (config.ring_entries - 1)) != 0) {
    throw key_error("ring_entries", "must be a power of two");
  }
}

std::string to_toml(const DaemonConfig& config) {
  // One `key = value` line each, in the order of the key names (as TOML tables print).
  std::map<std::string, std::string> lines;
  for (const Key& key : keys()) lines[key.name] = value_text(key, config);
  lines["qos"] = qos_value(config.qos_rules);
  std::string out;
  for (const auto& [name, value] : lines) out += name + " = " + value + "\n";
  if (!out.empty()) out.pop_back();
  return out;
}

std::vector<std::string> keep_restart_only_keys(DaemonConfig& fresh, const DaemonConfig& running) {
  std::vector<std::string> kept;
  for (const Key& key : keys()) {
    if (key.reload != Reload::kRestart) continue;
    std::visit(
        [&](auto field) {
          if (fresh.*field == running.*field) return;
          fresh.*field = running.*field;
          kept.emplace_back(key.name);
        },
        key.field);
  }
  return kept;
}

std::string config_docs(ConfigDocs format) {
  const DaemonConfig defaults = default_config();
  std::string out;
  if (format == ConfigDocs::kMarkdown) {
    out = "| key | default | meaning |\n| --- | --- | --- |\n";
    for (const Key& key : keys()) {
      out += std::string("| `") + key.name + "` | `" + value_text(key, defaults) + "` | " +
             key.doc + reload_note(key.reload) + " |\n";
    }
    out += std::string(
               "| `[[qos.rule]]` | none | shares between jobs (docs/qos.md): tables with the "
               "keys below; the first that matches a job applies, and a job none matches "
               "has weight 1, no cap and no latency class") +
           reload_note(Reload::kLive) + " |\n\n| `[[qos.rule]]` key | meaning |\n| --- | --- |\n";
    for (const RuleKey& key : kRuleKeys)
      out += std::string("| `") + key.name + "` | " + key.doc + " |\n";
    return out;
  }
  out =
      "# gradsyncd configuration. Every key is optional; the values below are the built-in "
      "defaults.\n"
      "# Units are in the key names. Command-line flags override: --socket, --metrics-listen, "
      "--listen,\n"
      "# --cluster-key-file, --log-level. Generated by `gradsyncd --print-config-docs toml` "
      "from the\n"
      "# table in daemon/base/config.cpp; docs/configuration.md says which keys reload live.\n";
  for (const Key& key : keys()) {
    out += "\n" + comment(key.doc, 98) + key.name + " = " + value_text(key, defaults) + "\n";
  }
  out += "\n" +
         comment(
             "shares between jobs (docs/qos.md), reloaded live: the first rule that matches a "
             "job applies; a job none matches has weight 1, no cap and no latency class. Each "
             "rule is a table with these keys, all optional:",
             98) +
         "# [[qos.rule]]\n";
  for (const RuleKey& key : kRuleKeys) out += comment(std::string(key.name) + ": " + key.doc, 98);
  return out;
}

}  // namespace gradsync::daemon
