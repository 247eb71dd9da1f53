// The configuration parser: any text is a configuration or a ConfigError naming what is wrong,
// and what parses prints back (to_toml) to text that parses to the same.
#include "daemon/base/config.h"
#include "tests/fuzz/fuzz_target.h"

#include <fstream>
#include <iterator>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gradsync::daemon;
  const std::string text(reinterpret_cast<const char*>(data), size);
  DaemonConfig config;
  try {
    config = parse_config(text, "fuzz");
    validate(config);
  } catch (const ConfigError&) {
    return 0;
  }
  const std::string printed = to_toml(config);
  try {
    if (to_toml(parse_config(printed, "fuzz (printed)")) != printed) {
      gradsync::fuzz::violated("a printed configuration reads back differently");
    }
  } catch (const ConfigError&) {
    gradsync::fuzz::violated("a printed configuration does not parse");
  }
  return 0;
}

namespace gradsync::fuzz {

std::vector<std::vector<uint8_t>> seeds() {
  auto bytes = [](const std::string& text) {
    return std::vector<uint8_t>(text.begin(), text.end());
  };
  return {
      bytes(daemon::to_toml(daemon::default_config())),
      bytes("socket_mode = 0o600\nlog_level = \"debug\"\nstall_shutdown_seconds = 30\n"),
      bytes("listen = \"198.18.0.1:9478\"\nallreduce_algorithm = \"ring\"\n"),
      bytes("ring_entries = 3\n"),  // not a power of two: an error
  };
}

}  // namespace gradsync::fuzz
