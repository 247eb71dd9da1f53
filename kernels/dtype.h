// The size of each element type: what the kernels need of the dtypes beyond the public header.
// The lowest layer: it includes nothing of gradsync but the public C ABI, so that kernels/
// depends on no other part (ipc/ uses it too).
#pragma once

#include <gradsync/gradsync.h>

#include <cstddef>

namespace gradsync::kernels {

// Size of one element; 0 for an invalid dtype.
constexpr size_t dtype_bytes(gradsync_dtype d) {
  switch (d) {
    case GRADSYNC_FLOAT16:
    case GRADSYNC_BFLOAT16:
      return 2;
    case GRADSYNC_FLOAT32:
    case GRADSYNC_INT32:
      return 4;
    case GRADSYNC_FLOAT64:
    case GRADSYNC_INT64:
      return 8;
  }
  return 0;
}

}  // namespace gradsync::kernels
