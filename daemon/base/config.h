// gradsyncd's configuration: one struct, read in one place (load_config), documented in the
// table of docs/configuration.md. Every key names its unit.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace gradsync::daemon {

// One `[[qos.rule]]` table: which jobs it matches, and the share of the node it gives them
// (docs/qos.md). The first rule that matches a job applies; a job no rule matches has weight 1,
// no cap and no latency class.
struct QosRule {
  std::string job = "*";       // glob over the job's name (fnmatch(3))
  std::string user;            // the job's owner: a user name or uid as written; empty: anyone
  std::optional<uid_t> uid;    // `user` resolved when the configuration was read
  double weight = 1;           // relative share of the engine and of the inter-node links
  double max_gbit_per_s = 0;   // cap on the job's inter-node send rate; 0: none
  bool latency_class = false;  // its small collectives go ahead of other jobs' bulk pieces
  bool operator==(const QosRule&) const = default;
};

struct DaemonConfig {
  std::string socket_path = "/run/gradsync/gradsyncd.sock";
  uint32_t socket_mode = 0660;
  std::string socket_group;                     // empty: keep the daemon's group
  std::string metrics_listen = "0.0.0.0:9477";  // empty: no metrics endpoint
  std::string listen = "0.0.0.0:9478";          // inter-node (UCX), used by multi-node jobs
  std::string cluster_key_file;                 // empty: accept only daemons without a key
  std::string log_level = "info";
  // "node": serves training processes; "aggregator": sums for other nodes' jobs only
  // (docs/aggregators.md).
  std::string role = "node";
  // HOST:PORT of aggregators, comma-separated: a job's default (GRADSYNC_AGGREGATORS overrides).
  std::string aggregators;
  // Below tcp_rendezvous_min_bytes: pushes and sums go eagerly (decision 0019).
  uint64_t aggregation_chunk_bytes = 64ull << 10;
  // The aggregators' links for the cost model (0: as fast as the nodes' own, as they measure).
  uint32_t aggregator_link_mbps = 0;

  uint64_t fusion_threshold_bytes = 64ull << 20;
  uint64_t pipeline_piece_bytes = 4ull << 20;  // a batch runs in pieces of this size
  uint32_t scratch_unused_seconds = 30;        // a job's staging memory unused this long is freed
  uint32_t ring_entries = 1024;                // per client, each ring
  uint32_t engine_spin_us = 100;               // spin (yielding) before the engine blocks
  uint32_t negotiation_hold_us = 50;  // hold an empty part of a peer's cycle (<= engine_spin_us)
  uint32_t negotiation_relay_min_nodes = 8;         // jobs this large relay negotiation cycles
  uint32_t reduce_threads = 0;                      // 0: one per CPU it may run on
  uint64_t parallel_reduce_min_bytes = 1ull << 20;  // smaller batches reduce on the engine thread
  uint32_t job_formation_timeout_seconds = 300;     // all local ranks must connect within this
  uint32_t peer_timeout_seconds = 60;   // a node daemon silent this long mid-collective fails it
  uint32_t stall_warning_seconds = 60;  // a tensor some ranks or nodes wait on this long: warn
  uint32_t stall_shutdown_seconds = 0;  // and this long: fail its job (0: never)
  uint32_t tcp_keepalive_idle_seconds = 10;     // a silent peer host is probed after this
  uint32_t tcp_keepalive_interval_seconds = 2;  // then every this; 3 unanswered: it failed
  // Bulk data to other nodes over a TCP-only network: eager (no handshake per message),
  // rendezvous (UCX's choice, as on RDMA networks, where it is always kept), or auto (per job:
  // eager where the measured link is slow next to this host's copies, else rendezvous). See
  // docs/multi-node.md, "TCP networks".
  std::string tcp_bulk_protocol = "auto";
  uint64_t tcp_rendezvous_min_bytes = 256 << 10;  // rendezvous, auto: smaller messages go eager
  uint32_t response_cache_capacity = 1024;        // collectives per multi-node job; 0: no cache
  std::string allreduce_algorithm = "auto";       // across nodes: auto, ring, rhd, direct, ...
  // What f32 allreduces send between nodes: none (the values) or bf16 (rounded, half the
  // bytes); a job's GRADSYNC_WIRE_CODEC overrides it.
  std::string allreduce_wire_codec = "none";
  bool autotune = false;  // per job: GRADSYNC_AUTOTUNE overrides it
  uint32_t autotune_max_steps = 200;
  uint32_t autotune_max_seconds = 120;
  std::string autotune_log;  // CSV of the trials; empty: none
  uint32_t max_clients = 1024;
  uint32_t max_buffers_per_client = 65536;
  // Clients' shared-memory ranges kept mapped; past it the least recently used one no
  // collective uses is unmapped (its registration stays, and it maps again on use).
  uint32_t host_mapping_cache_entries = 65536;
  // Client device allocations kept open through CUDA IPC; past it the least recently used
  // one no collective uses is closed (its registration stays, and it opens again on use).
  uint32_t device_mapping_cache_entries = 1024;
  // Shares between jobs (`[[qos.rule]]`, reloaded live): the first rule matching a job applies.
  std::vector<QosRule> qos_rules;
};

class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The configuration the daemon runs with when given no file (and the content of
// systemd/gradsyncd.toml).
DaemonConfig default_config();

// Parses TOML text over the defaults. Unknown keys, wrong types and out-of-range values are
// errors that name the key. `origin` names the source in messages.
DaemonConfig parse_config(const std::string& toml_text, const std::string& origin);
DaemonConfig load_config_file(const std::string& path);

// Checks cross-key rules; throws ConfigError.
void validate(const DaemonConfig& config);

// Effective configuration as TOML, one `key = value` line per key in name order (for logs,
// `gradsyncd --print-config` and the reload's comparison).
std::string to_toml(const DaemonConfig& config);

// Puts back into `fresh` the values of `running` for the keys that take effect only at a
// restart; returns the names of those that differed.
std::vector<std::string> keep_restart_only_keys(DaemonConfig& fresh, const DaemonConfig& running);

// The keys' documentation from the configuration table: docs/configuration.md's table
// (markdown) or systemd/gradsyncd.toml (toml, every key at its default with its doc as a
// comment). `gradsyncd --print-config-docs FORMAT` prints it.
enum class ConfigDocs { kMarkdown, kToml };
std::string config_docs(ConfigDocs format);

}  // namespace gradsync::daemon
