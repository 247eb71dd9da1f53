// Picks the widest build of the reduction loops this CPU runs, once.
#include "kernels/reduce.h"

#include "kernels/codec.h"

#include "kernels/convert.h"
#include "kernels/cpu/reduce_variants.h"
#include "kernels/dtype.h"

#include <cpuid.h>

namespace gradsync::kernels {
bool cpu_has_avx2() {
  __builtin_cpu_init();
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
  return f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

namespace {
struct Kernels {
  ReduceFn reduce;
  CopyFn copy;
  EncodeBf16Fn encode_bf16;
  DecodeBf16Fn decode_bf16;
  RoundBf16Fn round_bf16;
  const char* isa;
};

// Immutable after the first call (a function-local static, initialised thread-safely).
const Kernels& selected() {
  static const Kernels kernels =
      cpu_has_avx2() ? Kernels{&avx2::reduce_to_all, &avx2::copy,       &avx2::encode_bf16,
                               &avx2::decode_bf16,   &avx2::round_bf16, "avx2"}
                     : Kernels{&generic::reduce_to_all, &generic::copy,       &generic::encode_bf16,
                               &generic::decode_bf16,   &generic::round_bf16, "generic"};
  return kernels;
}
}  // namespace

void reduce_to_all(gradsync_dtype dtype, gradsync_op op, const void* const* inputs,
                   size_t num_inputs, void* const* outputs, size_t num_outputs, size_t count,
                   bool streaming) {
  // One input comes out of every op unchanged (avg divides by 1). A node with one rank asks
  // this for each of a step's tensors, mostly small ones, where the kernels' set-up costs more
  // than the copy.
  if (num_inputs == 1) {
    const size_t bytes = count * dtype_bytes(dtype);
    for (size_t o = 0; o < num_outputs; ++o) {
      if (outputs[o] != inputs[0]) copy(outputs[o], inputs[0], bytes, streaming);
    }
    return;
  }
  selected().reduce(dtype, op, inputs, num_inputs, outputs, num_outputs, count, streaming);
}

void copy(void* dst, const void* src, size_t bytes, bool streaming) {
  selected().copy(dst, src, bytes, streaming);
}

void encode_bf16(uint16_t* dst, const float* src, size_t count) {
  selected().encode_bf16(dst, src, count);
}

void decode_bf16(float* dst, const uint16_t* src, size_t count) {
  selected().decode_bf16(dst, src, count);
}

void round_bf16(uint16_t* wire, float* data, size_t count) {
  selected().round_bf16(wire, data, count);
}

namespace {
template <typename T, typename Load, typename Store>
void divide_each(void* data, size_t count, Load load, Store store) {
  auto* values = static_cast<T*>(data);
  for (size_t i = 0; i < count; ++i) values[i] = store(load(values[i]));
}
}  // namespace

void divide(gradsync_dtype dtype, void* data, size_t count, uint64_t divisor) {
  const float scale_f = 1.0f / static_cast<float>(divisor);
  const double scale_d = 1.0 / static_cast<double>(divisor);
  const auto d = static_cast<int64_t>(divisor);
  auto same = [](auto v) { return v; };
  switch (dtype) {
    case GRADSYNC_FLOAT32:
      return divide_each<float>(
          data, count, [&](float v) { return v * scale_f; }, same);
    case GRADSYNC_FLOAT64:
      return divide_each<double>(
          data, count, [&](double v) { return v * scale_d; }, same);
    case GRADSYNC_FLOAT16:
      return divide_each<uint16_t>(
          data, count, [&](uint16_t v) { return half_to_float(v) * scale_f; }, float_to_half);
    case GRADSYNC_BFLOAT16:
      return divide_each<uint16_t>(
          data, count, [&](uint16_t v) { return bfloat16_to_float(v) * scale_f; },
          float_to_bfloat16);
    case GRADSYNC_INT32:
      return divide_each<int32_t>(
          data, count, [&](int32_t v) { return static_cast<int32_t>(v / d); }, same);
    case GRADSYNC_INT64:
      return divide_each<int64_t>(
          data, count, [&](int64_t v) { return v / d; }, same);
  }
}

const char* reduce_isa() {
  return selected().isa;
}

}  // namespace gradsync::kernels
