// AVX2 + F16C build of the reduction and codec loops (compile flags set in CMakeLists.txt).
#define GRADSYNC_KERNEL_NAMESPACE avx2
#include "kernels/cpu/codec_impl.h"
#include "kernels/cpu/reduce_impl.h"
