// gradsyncctl's human-readable output: the daemon's JSON status as aligned tables.
#pragma once

#include <nlohmann/json.hpp>

#include <ostream>
#include <string>
#include <vector>

namespace gradsync::ctl {

// Columns padded to their widest cell; numbers right-aligned.
class Table {
 public:
  explicit Table(std::vector<std::string> headers) : headers_(std::move(headers)) {}
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void print(std::ostream& out) const;

 private:
  std::vector<std::string> headers_;
  std::vector<std::vector<std::string>> rows_;
};

std::string human_bytes(double bytes);
std::string human_duration(double seconds);

void print_status(const nlohmann::json& status, std::ostream& out);
void print_jobs(const nlohmann::json& status, std::ostream& out);
void print_clients(const nlohmann::json& status, std::ostream& out);
void print_peers(const nlohmann::json& status, std::ostream& out);
// An aggregator's jobs (docs/aggregators.md).
void print_aggregated_jobs(const nlohmann::json& status, std::ostream& out);
void print_config(const nlohmann::json& status, std::ostream& out);

}  // namespace gradsync::ctl
