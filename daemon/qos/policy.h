// Which share of the node a job gets: the first `[[qos.rule]]` of the configuration that
// matches its name and owner (docs/qos.md).
#pragma once

#include "daemon/base/config.h"

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace gradsync::daemon {

struct JobShare {
  double weight = 1;
  double cap_bytes_per_second = 0;  // on the job's inter-node sends; 0: none
  bool latency_class = false;
  int rule = 0;  // the rule that matched, counting from 1; 0: none did (the default share)
  bool operator==(const JobShare&) const = default;
};

JobShare share_for(const std::vector<QosRule>& rules, const std::string& job, uid_t owner);

// Collectives up to this many bytes per rank are a latency-class job's small ones, which go
// ahead of other jobs' bulk work.
inline constexpr uint64_t kLatencyClassMaxBytes = 256 << 10;

}  // namespace gradsync::daemon
