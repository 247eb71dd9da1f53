#include "tools/bench/resnet50.h"

namespace gradsync::bench {

std::vector<ParameterTensor> resnet50_parameters() {
  std::vector<ParameterTensor> params;
  auto conv = [&](const std::string& name, size_t out, size_t in, size_t k) {
    params.push_back({name + ".weight", out * in * k * k});
  };
  auto batch_norm = [&](const std::string& name, size_t channels) {
    params.push_back({name + ".weight", channels});
    params.push_back({name + ".bias", channels});
  };
  conv("conv1", 64, 3, 7);
  batch_norm("bn1", 64);
  constexpr size_t kExpansion = 4;
  const size_t widths[] = {64, 128, 256, 512};
  const size_t blocks[] = {3, 4, 6, 3};
  size_t in = 64;
  for (size_t layer = 0; layer < 4; ++layer) {
    const size_t width = widths[layer];
    for (size_t block = 0; block < blocks[layer]; ++block) {
      const std::string prefix = "layer" + std::to_string(layer + 1) + "." + std::to_string(block);
      conv(prefix + ".conv1", width, in, 1);
      batch_norm(prefix + ".bn1", width);
      conv(prefix + ".conv2", width, width, 3);
      batch_norm(prefix + ".bn2", width);
      conv(prefix + ".conv3", width * kExpansion, width, 1);
      batch_norm(prefix + ".bn3", width * kExpansion);
      if (block == 0) {
        conv(prefix + ".downsample.0", width * kExpansion, in, 1);
        batch_norm(prefix + ".downsample.1", width * kExpansion);
      }
      in = width * kExpansion;
    }
  }
  params.push_back({"fc.weight", size_t{1000} * 2048});
  params.push_back({"fc.bias", 1000});
  return params;
}

}  // namespace gradsync::bench
