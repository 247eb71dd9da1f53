// The metric families the daemon exports are the ones families.h lists, with its types, labels
// and help, and docs/metrics.md's table is generated from that list.
#include "metrics/metrics.h"
#include "metrics/families.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

namespace gradsync::metrics {
namespace {

std::string read_source_file(const std::string& relative) {
  std::ifstream in(std::string(GRADSYNC_SOURCE_DIR) + "/" + relative);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::set<std::string> words(const std::string& text) {
  std::istringstream in(text);
  std::set<std::string> out;
  for (std::string word; in >> word;) out.insert(word);
  return out;
}

// A daemon's metrics with a series in every family: per-job and per-peer families have none
// until a job or a peer has been seen.
std::string exposition_with_every_family() {
  Metrics metrics("", BuildInfo{"test", false, 0, 0, "generic"}, "log_level = \"info\"");
  metrics.collective_completed(CollectiveKind::kAllreduce, 4096, "ring", 1e-3);
  metrics.flush_completions();
  metrics.peer_link_measured("198.18.0.2:9478", 1e-5, 1e9);
  metrics.set_peer_traffic("198.18.0.2:9478", 10, 20, 0);
  Metrics::JobProgress progress;
  progress.stall_seconds = 1;
  progress.rank_submitted = {3, 4};
  progress.rank_completed = {3, 3};
  progress.node_cycles = {7, 8};
  progress.autotune = Metrics::JobProgress::Autotune{12, true, 5e9, 16 << 20, 1 << 20, 25e-6, 0};
  metrics.set_job_progress("train", progress);
  metrics.set_aggregator_job("summed", {1 << 20, 1 << 20, 1, 2});
  metrics.aggregator_chunk_waited("summed", 1e-3);
  metrics.aggregation_traffic("198.18.0.20:9478", 1 << 20, 1 << 20);
  return metrics.exposition();
}

struct Exported {
  std::string help;
  std::string type;
  std::set<std::string> labels;  // of every sample, but a histogram's `le`
  bool sampled = false;
};

// Prometheus' text format, by family name.
std::map<std::string, Exported> parse(const std::string& text) {
  std::map<std::string, Exported> families;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0) {
      const size_t name_end = line.find(' ', 7);
      Exported& family = families[line.substr(7, name_end - 7)];
      (line[2] == 'H' ? family.help : family.type) = line.substr(name_end + 1);
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    std::string name = line.substr(0, line.find_first_of("{ "));
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string base = name.substr(0, name.size() - std::string(suffix).size());
      if (name.ends_with(suffix) && families.count(base) && families[base].type == "histogram") {
        name = base;
      }
    }
    Exported& family = families[name];
    family.sampled = true;
    const size_t open = line.find('{');
    if (open == std::string::npos || open > line.find(' ')) continue;
    // label="value",...: values are quoted, so split on the quotes.
    for (size_t at = open + 1; at < line.size() && line[at] != '}';) {
      const size_t equals = line.find('=', at);
      const std::string label = line.substr(at, equals - at);
      size_t close = equals + 2;
      while (line[close] != '"' || line[close - 1] == '\\') ++close;
      if (label != "le") family.labels.insert(label);
      at = close + 1 + (line[close + 1] == ',' ? 1 : 0);
    }
  }
  return families;
}

TEST(MetricFamilies, EveryFamilyIsExportedAsTheTableSays) {
  const auto exported = parse(exposition_with_every_family());
  for (const FamilyDoc& doc : kFamilies) {
    SCOPED_TRACE(doc.name);
    const auto found = exported.find(doc.name);
    ASSERT_NE(found, exported.end());
    EXPECT_EQ(found->second.help, doc.help);
    EXPECT_EQ(found->second.type, type_name(doc.type));
    EXPECT_TRUE(found->second.sampled);
    EXPECT_EQ(found->second.labels, words(doc.labels));
  }
  EXPECT_EQ(exported.size(), kFamilies.size()) << "a family exported that families.h lacks";
}

// A family added, removed or redocumented in families.h fails here until docs/metrics.md's
// table is regenerated.
TEST(MetricFamilies, DocsTableIsGenerated) {
  const std::string docs = read_source_file("docs/metrics.md");
  const std::string begin = "from the table in metrics/families.h: edit it there -->\n";
  const size_t from = docs.find(begin);
  const size_t to = docs.find("<!-- end of generated table -->");
  ASSERT_NE(from, std::string::npos) << "docs/metrics.md has no generated table";
  ASSERT_NE(to, std::string::npos);
  EXPECT_EQ(docs.substr(from + begin.size(), to - from - begin.size()), families_markdown())
      << "regenerate the table: gradsyncd --print-metrics-docs";
}

}  // namespace
}  // namespace gradsync::metrics
