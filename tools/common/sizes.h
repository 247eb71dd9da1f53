// Sizes on the tools' command lines: bytes with an optional K, M or G (binary) suffix.
#pragma once

#include <cstdint>
#include <string>

namespace gradsync::tools {

// 8, 64K, 1M, 2G. Throws std::invalid_argument naming the text.
uint64_t parse_size(const std::string& text);

}  // namespace gradsync::tools
