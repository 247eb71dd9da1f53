// Picks the widest build of the reduction loops this CPU runs, once.
#include "kernels/reduce.h"

#include "kernels/cpu/reduce_variants.h"


namespace gradsync::kernels {
bool cpu_has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") &&
         __builtin_cpu_supports("fma");
}

namespace {
// Immutable after the first call (a function-local static, initialised thread-safely).
ReduceFn selected() {
  static const ReduceFn fn = cpu_has_avx2() ? &avx2::reduce_to_all : &generic::reduce_to_all;
  return fn;
}
}  // namespace

void reduce_to_all(gradsync_dtype dtype, gradsync_op op, const void* const* inputs,
                   size_t num_inputs, void* const* outputs, size_t num_outputs, size_t count) {
  selected()(dtype, op, inputs, num_inputs, outputs, num_outputs, count);
}

const char* reduce_isa() { return selected() == &avx2::reduce_to_all ? "avx2" : "generic"; }

}  // namespace gradsync::kernels
