// gradsync-bench's --device in a build without CUDA: refused, saying why.
#include "tools/bench/sweep_buffers.h"

namespace gradsync::bench {

std::unique_ptr<SweepBuffers> make_device_buffers(Communicator& /*comm*/, size_t /*bytes*/,
                                                  int /*local_rank*/, bool /*stream_ordered*/) {
  throw Error(GRADSYNC_ERR_UNSUPPORTED,
              "--device: this gradsync-bench was built without CUDA (GRADSYNC_CUDA=OFF or no "
              "toolkit)");
}

}  // namespace gradsync::bench
