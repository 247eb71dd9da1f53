// Picks the widest build of the reduction loops this CPU runs, once.
#include "kernels/reduce.h"

#include "kernels/cpu/reduce_variants.h"

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
  const char* isa;
};

// Immutable after the first call (a function-local static, initialised thread-safely).
const Kernels& selected() {
  static const Kernels kernels = cpu_has_avx2()
                                     ? Kernels{&avx2::reduce_to_all, &avx2::copy, "avx2"}
                                     : Kernels{&generic::reduce_to_all, &generic::copy, "generic"};
  return kernels;
}
}  // namespace

void reduce_to_all(gradsync_dtype dtype, gradsync_op op, const void* const* inputs,
                   size_t num_inputs, void* const* outputs, size_t num_outputs, size_t count,
                   bool streaming) {
  selected().reduce(dtype, op, inputs, num_inputs, outputs, num_outputs, count, streaming);
}

void copy(void* dst, const void* src, size_t bytes, bool streaming) {
  selected().copy(dst, src, bytes, streaming);
}

const char* reduce_isa() {
  return selected().isa;
}

}  // namespace gradsync::kernels
