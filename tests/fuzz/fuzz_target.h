// What every fuzz target provides. Built with clang's libFuzzer (scripts/fuzz) the target runs
// under the fuzzer; built otherwise (the normal build), replay_main.cpp runs it over the seed
// corpus in tests/fuzz/corpus/, a regression test in every CI run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

// libFuzzer's entry point: must not crash, leak, hang or trip a sanitizer for any input.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace gradsync::fuzz {

// Valid inputs to start from: written to the corpus by `replay --write-seeds DIR`.
std::vector<std::vector<uint8_t>> seeds();

// Ends the process when a property the target checks does not hold (a finding).
[[noreturn]] void violated(const char* what);

}  // namespace gradsync::fuzz
