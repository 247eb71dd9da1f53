// The gradient set of a ResNet-50 training step: torchvision's 161 parameter tensors,
// 25,557,032 fp32 parameters, in registration order (backprop produces them in reverse).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace gradsync::bench {

struct ParameterTensor {
  std::string name;
  size_t elements;
};

std::vector<ParameterTensor> resnet50_parameters();

}  // namespace gradsync::bench
