// The per-instruction-set builds of the reduction loops, for the dispatcher and for tests that
// check every build (not only the one this CPU would pick).
#pragma once

#include <gradsync/gradsync.h>

#include <cstddef>

namespace gradsync::kernels {

using ReduceFn = void (*)(gradsync_dtype, gradsync_op, const void* const*, size_t, void* const*,
                          size_t, size_t, bool);
using CopyFn = void (*)(void*, const void*, size_t, bool);

namespace generic {
void reduce_to_all(gradsync_dtype, gradsync_op, const void* const*, size_t, void* const*, size_t,
                   size_t, bool);
void copy(void*, const void*, size_t, bool);
}  // namespace generic
namespace avx2 {
void reduce_to_all(gradsync_dtype, gradsync_op, const void* const*, size_t, void* const*, size_t,
                   size_t, bool);
void copy(void*, const void*, size_t, bool);
}  // namespace avx2

bool cpu_has_avx2();

}  // namespace gradsync::kernels
