#include "client/slurm.h"

#include <arpa/inet.h>
#include <netdb.h>

#include <array>
#include <charconv>
#include <cstdlib>
#include <memory>
#include <stdexcept>

namespace gradsync::client::slurm {
namespace {

uint64_t number(std::string_view text, std::string_view whole) {
  uint64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) {
    throw std::invalid_argument("'" + std::string(text) + "' in '" + std::string(whole) +
                                "' is not a number");
  }
  return value;
}

// Splits at the commas outside brackets.
std::vector<std::string_view> top_level_items(std::string_view list) {
  std::vector<std::string_view> items;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= list.size(); ++i) {
    if (i < list.size() && list[i] == '[') ++depth;
    if (i < list.size() && list[i] == ']') --depth;
    if (depth < 0 || depth > 1) {
      throw std::invalid_argument("unbalanced brackets in the host list '" + std::string(list) +
                                  "'");
    }
    if (i == list.size() || (list[i] == ',' && depth == 0)) {
      if (i > start) items.push_back(list.substr(start, i - start));
      start = i + 1;
    }
  }
  if (depth != 0) {
    throw std::invalid_argument("unbalanced brackets in the host list '" + std::string(list) + "'");
  }
  return items;
}

// The values of a bracket group's body ("01-03,7"), as text with the range's padding.
std::vector<std::string> range_values(std::string_view body, std::string_view whole) {
  std::vector<std::string> values;
  for (size_t start = 0; start <= body.size();) {
    const size_t comma = std::min(body.find(',', start), body.size());
    const std::string_view part = body.substr(start, comma - start);
    const size_t dash = part.find('-');
    const std::string_view first = part.substr(0, dash);
    const std::string_view last = dash == std::string_view::npos ? first : part.substr(dash + 1);
    const uint64_t low = number(first, whole);
    const uint64_t high = number(last, whole);
    if (high < low || high - low > 100'000) {
      throw std::invalid_argument("bad range '" + std::string(part) + "' in '" +
                                  std::string(whole) + "'");
    }
    for (uint64_t value = low; value <= high; ++value) {
      std::string text = std::to_string(value);
      if (text.size() < first.size()) text.insert(0, first.size() - text.size(), '0');
      values.push_back(std::move(text));
    }
    start = comma + 1;
  }
  return values;
}

void expand_item(std::string_view item, std::string_view whole, std::vector<std::string>& out) {
  const size_t open = item.find('[');
  if (open == std::string_view::npos) {
    out.emplace_back(item);
    return;
  }
  const size_t close = item.find(']', open);
  const std::string prefix(item.substr(0, open));
  const std::string_view rest = item.substr(close + 1);
  for (const std::string& value : range_values(item.substr(open + 1, close - open - 1), whole)) {
    expand_item(prefix + value + std::string(rest), whole, out);
  }
}

}  // namespace

std::vector<std::string> expand_hostlist(std::string_view list) {
  std::vector<std::string> hosts;
  for (const std::string_view item : top_level_items(list)) expand_item(item, list, hosts);
  return hosts;
}

std::vector<int32_t> tasks_per_node(std::string_view counts) {
  std::vector<int32_t> tasks;
  for (size_t start = 0; start < counts.size();) {
    const size_t comma = std::min(counts.find(',', start), counts.size());
    const std::string_view part = counts.substr(start, comma - start);
    const size_t repeat = part.find("(x");
    const uint64_t each = number(part.substr(0, repeat), counts);
    uint64_t times = 1;
    if (repeat != std::string_view::npos) {
      if (part.back() != ')') {
        throw std::invalid_argument("bad repeat '" + std::string(part) + "' in '" +
                                    std::string(counts) + "'");
      }
      times = number(part.substr(repeat + 2, part.size() - repeat - 3), counts);
    }
    if (each > INT32_MAX || times > 100'000) {
      throw std::invalid_argument("'" + std::string(part) + "' in '" + std::string(counts) +
                                  "' is out of range");
    }
    tasks.insert(tasks.end(), times, static_cast<int32_t>(each));
    start = comma + 1;
  }
  return tasks;
}

namespace {

int32_t variable(const char* name, bool required, int32_t fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') {
    if (required) throw std::invalid_argument(std::string("srun did not set ") + name);
    return fallback;
  }
  const uint64_t value = number(text, text);
  if (value > INT32_MAX) throw std::invalid_argument(std::string(name) + " is out of range");
  return static_cast<int32_t>(value);
}

}  // namespace

std::optional<TaskLayout> layout_from_env() {
  const char* nodelist = std::getenv("SLURM_JOB_NODELIST");
  if (std::getenv("SLURM_PROCID") == nullptr || nodelist == nullptr) return std::nullopt;
  TaskLayout task;
  task.rank = variable("SLURM_PROCID", true, 0);
  task.world_size = variable("SLURM_NTASKS", true, 1);
  task.local_rank = variable("SLURM_LOCALID", true, 0);
  task.node = variable("SLURM_NODEID", true, 0);
  task.hosts = expand_hostlist(nodelist);
  const char* counts = std::getenv("SLURM_TASKS_PER_NODE");
  if (counts == nullptr) throw std::invalid_argument("srun did not set SLURM_TASKS_PER_NODE");
  const std::vector<int32_t> tasks = tasks_per_node(counts);
  if (static_cast<size_t>(task.node) >= tasks.size()) {
    throw std::invalid_argument("SLURM_NODEID " + std::to_string(task.node) +
                                " has no entry in "
                                "SLURM_TASKS_PER_NODE '" +
                                counts + "'");
  }
  task.local_world_size = tasks[static_cast<size_t>(task.node)];
  task.job = "slurm." + std::to_string(variable("SLURM_JOB_ID", false, 0)) + "." +
             std::to_string(variable("SLURM_STEP_ID", false, 0));
  return task;
}

std::string node_list(const std::vector<std::string>& hosts, uint16_t port) {
  std::string list;
  for (const std::string& host : hosts) {
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const int status = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
    if (status != 0 || found == nullptr) {
      throw std::runtime_error("node '" + host + "' of SLURM_JOB_NODELIST has no IPv4 address: " +
                               ::gai_strerror(status));
    }
    const std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> owned(found, &::freeaddrinfo);
    std::array<char, INET_ADDRSTRLEN> text{};
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(found->ai_addr)->sin_addr,
                text.data(), text.size());
    if (!list.empty()) list += ",";
    list += std::string(text.data()) + ":" + std::to_string(port);
  }
  return list;
}

}  // namespace gradsync::client::slurm
