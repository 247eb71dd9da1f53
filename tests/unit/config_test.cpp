#include "daemon/base/config.h"
#include "ipc/protocol.h"

#include <gtest/gtest.h>
#include <toml++/toml.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace gradsync::daemon {
namespace {

std::string read_source_file(const std::string& relative) {
  std::ifstream in(std::string(GRADSYNC_SOURCE_DIR) + "/" + relative);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Every key the daemon knows, as its effective configuration names them.
std::vector<std::string> every_key(const DaemonConfig& config) {
  std::vector<std::string> keys;
  const toml::table table = toml::parse(to_toml(config));
  for (const auto& [key, value] : table) keys.emplace_back(key.str());
  return keys;
}

TEST(Config, DefaultsAreValidAndDocumented) {
  const DaemonConfig config = default_config();
  EXPECT_NO_THROW(validate(config));
  EXPECT_EQ(config.socket_path, "/run/gradsync/gradsyncd.sock");
  EXPECT_EQ(config.metrics_listen, "0.0.0.0:9477");
  EXPECT_EQ(config.fusion_threshold_bytes, 64ull << 20);

  // The docs come from the key table: every key has a row and a line, at its default.
  const std::string table = config_docs(ConfigDocs::kMarkdown);
  const std::string file = config_docs(ConfigDocs::kToml);
  EXPECT_EQ(to_toml(parse_config(file, "generated")), to_toml(config));
  for (const std::string& key : every_key(config)) {
    if (key == "qos") {  // tables of their own: documented, and shipped commented out
      EXPECT_NE(table.find("\n| `[[qos.rule]]` |"), std::string::npos);
      EXPECT_NE(file.find("\n# [[qos.rule]]\n"), std::string::npos);
      continue;
    }
    EXPECT_NE(table.find("\n| `" + key + "` |"), std::string::npos) << key;
    EXPECT_NE(file.find("\n" + key + " = "), std::string::npos) << key;
  }
}

// systemd/gradsyncd.toml and docs/configuration.md's table are what the code generates: a key
// added, removed or redocumented in daemon/base/config.cpp fails here until they are regenerated.
TEST(Config, ShippedFileAndDocsAreGenerated) {
  EXPECT_EQ(read_source_file("systemd/gradsyncd.toml"), config_docs(ConfigDocs::kToml))
      << "regenerate: gradsyncd --print-config-docs toml > systemd/gradsyncd.toml";
  const std::string docs = read_source_file("docs/configuration.md");
  const std::string begin = "from the table in daemon/base/config.cpp: edit it there -->\n";
  const size_t from = docs.find(begin);
  const size_t to = docs.find("<!-- end of generated table -->");
  ASSERT_NE(from, std::string::npos) << "docs/configuration.md has no generated table";
  ASSERT_NE(to, std::string::npos);
  EXPECT_EQ(docs.substr(from + begin.size(), to - from - begin.size()),
            config_docs(ConfigDocs::kMarkdown))
      << "regenerate the table: gradsyncd --print-config-docs markdown";
}

TEST(Config, ParsesEveryKey) {
  const DaemonConfig c = parse_config(R"(
socket_path = "/tmp/x.sock"
socket_mode = 0o600
socket_group = ""
metrics_listen = "127.0.0.1:0"
listen = "198.18.0.1:7000"
log_level = "debug"
fusion_threshold_bytes = 1048576
ring_entries = 64
engine_spin_us = 5
reduce_threads = 3
parallel_reduce_min_bytes = 65536
job_formation_timeout_seconds = 9
max_clients = 10
max_buffers_per_client = 7
tcp_bulk_protocol = "eager"
tcp_rendezvous_min_bytes = 1048576
allreduce_wire_codec = "bf16"
)",
                                      "test");
  EXPECT_EQ(c.socket_path, "/tmp/x.sock");
  EXPECT_EQ(c.socket_mode, 0600u);
  EXPECT_EQ(c.metrics_listen, "127.0.0.1:0");
  EXPECT_EQ(c.listen, "198.18.0.1:7000");
  EXPECT_EQ(c.log_level, "debug");
  EXPECT_EQ(c.fusion_threshold_bytes, 1048576u);
  EXPECT_EQ(c.ring_entries, 64u);
  EXPECT_EQ(c.engine_spin_us, 5u);
  EXPECT_EQ(c.reduce_threads, 3u);
  EXPECT_EQ(c.parallel_reduce_min_bytes, 65536u);
  EXPECT_EQ(c.job_formation_timeout_seconds, 9u);
  EXPECT_EQ(c.max_clients, 10u);
  EXPECT_EQ(c.max_buffers_per_client, 7u);
  EXPECT_EQ(c.tcp_bulk_protocol, "eager");
  EXPECT_EQ(c.tcp_rendezvous_min_bytes, 1048576u);
  EXPECT_EQ(c.allreduce_wire_codec, "bf16");
}

TEST(Config, ShippedConfigFileIsTheDefaults) {
  // systemd/gradsyncd.toml documents the defaults: it must not drift from the code.
  const DaemonConfig shipped = load_config_file(GRADSYNC_SOURCE_DIR "/systemd/gradsyncd.toml");
  EXPECT_EQ(to_toml(shipped), to_toml(default_config()));
}

TEST(Config, RoundTripsThroughToml) {
  DaemonConfig c = default_config();
  c.engine_spin_us = 42;
  c.socket_path = "/tmp/round.sock";
  const DaemonConfig again = parse_config(to_toml(c), "round trip");
  EXPECT_EQ(again.engine_spin_us, 42u);
  EXPECT_EQ(again.socket_path, "/tmp/round.sock");
}

void expect_error(const std::string& toml, const std::string& fragment) {
  try {
    parse_config(toml, "bad.toml");
    FAIL() << "accepted: " << toml;
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos)
        << "message '" << e.what() << "' lacks '" << fragment << "'";
  }
}

TEST(Config, ParsesTheAggregatorKeys) {
  const DaemonConfig c = parse_config(R"(
role = "aggregator"
listen = "198.18.0.9:7000"
aggregators = "198.18.0.7:7000, 198.18.0.8:7000"
aggregation_chunk_bytes = 262144
aggregator_link_mbps = 25000
allreduce_algorithm = "split"
)",
                                      "test");
  EXPECT_EQ(c.role, "aggregator");
  EXPECT_EQ(c.aggregators, "198.18.0.7:7000, 198.18.0.8:7000");
  EXPECT_EQ(gradsync::ipc::split_addresses(c.aggregators),
            (std::vector<std::string>{"198.18.0.7:7000", "198.18.0.8:7000"}));
  EXPECT_EQ(c.aggregation_chunk_bytes, 262144u);
  EXPECT_EQ(c.aggregator_link_mbps, 25000u);
  EXPECT_EQ(c.allreduce_algorithm, "split");
}
TEST(Config, RejectsBadAggregatorSettings) {
  expect_error("role = \"server\"", "role");
  expect_error("role = \"aggregator\"\nlisten = \"\"", "listen");
  expect_error("aggregators = \"198.18.0.7\"", "198.18.0.7");
  expect_error("aggregation_chunk_bytes = 1024", "aggregation_chunk_bytes");
  expect_error("allreduce_algorithm = \"tree\"", "allreduce_algorithm");
}

TEST(Config, RejectsUnknownKeysByName) {
  expect_error("fusion_threshold = 5", "fusion_threshold");
}
TEST(Config, RejectsWrongTypes) {
  expect_error("engine_spin_us = \"fast\"", "engine_spin_us");
}
TEST(Config, RejectsOutOfRange) {
  expect_error("ring_entries = 1", "ring_entries");
}
TEST(Config, RejectsNegativeSizes) {
  expect_error("fusion_threshold_bytes = -1", "fusion_threshold_bytes");
}
TEST(Config, RejectsNonPowerOfTwoRings) {
  expect_error("ring_entries = 100", "power of two");
}
TEST(Config, RejectsUnknownTcpBulkProtocol) {
  expect_error("tcp_bulk_protocol = \"fast\"", "auto, eager or rendezvous");
}
TEST(Config, RejectsUnknownWireCodec) {
  expect_error("allreduce_wire_codec = \"fp8\"", "none, bf16, topk or topk:PERCENT");
  expect_error("allreduce_wire_codec = \"topk:0\"", "not 'topk:0'");
}
TEST(Config, RejectsUnknownLogLevel) {
  expect_error("log_level = \"loud\"", "log_level");
}
TEST(Config, ReportsSyntaxErrorsWithLine) {
  expect_error("\n\nsocket_path = ", "bad.toml:3");
}
TEST(Config, RejectsOverlongSocketPath) {
  expect_error("socket_path = \"/" + std::string(120, 'a') + "\"", "socket_path");
}

}  // namespace
}  // namespace gradsync::daemon
