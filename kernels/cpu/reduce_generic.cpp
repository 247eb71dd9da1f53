// Baseline x86-64 (SSE2) build of the reduction loops.
#define GRADSYNC_KERNEL_NAMESPACE generic
#include "kernels/cpu/reduce_impl.h"
