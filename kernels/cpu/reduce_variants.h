// The per-instruction-set builds of the reduction loops, for the dispatcher and for tests that
// check every build (not only the one this CPU would pick).
#pragma once

#include <gradsync/gradsync.h>

#include <cstddef>

namespace gradsync::kernels {

using ReduceFn = void (*)(gradsync_dtype, gradsync_op, const void* const*, size_t, void* const*,
                          size_t, size_t);

namespace generic {
void reduce_to_all(gradsync_dtype, gradsync_op, const void* const*, size_t, void* const*, size_t,
                   size_t);
}
namespace avx2 {
void reduce_to_all(gradsync_dtype, gradsync_op, const void* const*, size_t, void* const*, size_t,
                   size_t);
}

bool cpu_has_avx2();

}  // namespace gradsync::kernels
