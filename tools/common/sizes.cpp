#include "tools/common/sizes.h"

#include <cstdlib>
#include <stdexcept>

namespace gradsync::tools {

uint64_t parse_size(const std::string& text) {
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text.c_str(), &end, 10);
  if (text.empty() || end == text.c_str()) throw std::invalid_argument("bad size '" + text + "'");
  const std::string suffix(end);
  uint64_t scale = 1;
  if (suffix == "K" || suffix == "k")
    scale = 1ull << 10;
  else if (suffix == "M" || suffix == "m")
    scale = 1ull << 20;
  else if (suffix == "G" || suffix == "g")
    scale = 1ull << 30;
  else if (!suffix.empty())
    throw std::invalid_argument("bad size suffix in '" + text + "'");
  return value * scale;
}

}  // namespace gradsync::tools
