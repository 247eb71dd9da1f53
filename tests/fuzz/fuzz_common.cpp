// Shared by every fuzz target, under libFuzzer or replayed: a violated property aborts, which
// libFuzzer reports with the input that did it.
#include "tests/fuzz/fuzz_target.h"

#include <cstdio>
#include <cstdlib>

namespace gradsync::fuzz {

void violated(const char* what) {
  std::fprintf(stderr, "fuzz: property violated: %s\n", what);
  std::abort();
}

}  // namespace gradsync::fuzz
