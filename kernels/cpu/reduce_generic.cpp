// Baseline x86-64 (SSE2) build of the reduction and codec loops.
#define GRADSYNC_KERNEL_NAMESPACE generic
#include "kernels/cpu/codec_impl.h"
#include "kernels/cpu/reduce_impl.h"
