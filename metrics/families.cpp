#include "metrics/families.h"

#include <sstream>

namespace gradsync::metrics {

const char* type_name(Type type) {
  switch (type) {
    case Type::kCounter:
      return "counter";
    case Type::kGauge:
      return "gauge";
    case Type::kHistogram:
      return "histogram";
  }
  return "?";
}

std::string families_markdown() {
  std::string out = "| metric | type | labels | meaning |\n| --- | --- | --- | --- |\n";
  for (const FamilyDoc& doc : kFamilies) {
    std::string labels;
    std::istringstream names(doc.labels);
    for (std::string name; names >> name;) labels += (labels.empty() ? "`" : ", `") + name + "`";
    out += std::string("| `") + doc.name + "` | " + type_name(doc.type) + " | " + labels + " | " +
           doc.help + " |\n";
  }
  return out;
}

}  // namespace gradsync::metrics
