#include "daemon/qos/policy.h"

#include <fnmatch.h>

namespace gradsync::daemon {

JobShare share_for(const std::vector<QosRule>& rules, const std::string& job, uid_t owner) {
  for (size_t i = 0; i < rules.size(); ++i) {
    const QosRule& rule = rules[i];
    if (rule.uid && *rule.uid != owner) continue;
    if (::fnmatch(rule.job.c_str(), job.c_str(), 0) != 0) continue;
    // Gbit/s (10^9 bits) to bytes per second.
    return JobShare{rule.weight, rule.max_gbit_per_s * 1e9 / 8, rule.latency_class,
                    static_cast<int>(i + 1)};
  }
  return JobShare{};
}

}  // namespace gradsync::daemon
