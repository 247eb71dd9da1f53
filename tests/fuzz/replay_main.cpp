// main() for a fuzz target outside libFuzzer: runs it over every file of the directories it is
// given (the seed corpus), or writes its seeds (--write-seeds DIR).
#include "tests/fuzz/fuzz_target.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  if (argc == 3 && std::string(argv[1]) == "--write-seeds") {
    fs::create_directories(argv[2]);
    int n = 0;
    for (const auto& seed : gradsync::fuzz::seeds()) {
      std::ofstream out(fs::path(argv[2]) / ("seed-" + std::to_string(n++)), std::ios::binary);
      out.write(reinterpret_cast<const char*>(seed.data()),
                static_cast<std::streamsize>(seed.size()));
    }
    std::printf("%d seeds written to %s\n", n, argv[2]);
    return 0;
  }
  int inputs = 0;
  for (int i = 1; i < argc; ++i) {
    for (const auto& entry : fs::directory_iterator(argv[i])) {
      std::ifstream in(entry.path(), std::ios::binary);
      const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                                       std::istreambuf_iterator<char>());
      LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
      ++inputs;
    }
  }
  if (inputs == 0) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR... | --write-seeds DIR (no inputs found)\n",
                 argv[0]);
    return 2;
  }
  std::printf("%d inputs replayed\n", inputs);
  return 0;
}
