// gradsync-bench's sweep buffers in host memory shared with the daemon.
#include "tools/bench/sweep_buffers.h"

namespace gradsync::bench {
namespace {

class HostBuffers final : public SweepBuffers {
 public:
  HostBuffers(Communicator& comm, size_t bytes)
      : send_(comm.allocate(bytes)), recv_(comm.allocate(bytes)) {}
  void* send() override { return send_.data(); }
  void* recv() override { return recv_.data(); }
  void* staged_input() override { return send_.data(); }
  void upload(size_t /*bytes*/) override {}  // written in place
  const void* download(const void* buffer, size_t /*bytes*/) override { return buffer; }
  const char* memory() const override { return "host"; }

 private:
  SharedBuffer send_;
  SharedBuffer recv_;
};

}  // namespace

std::unique_ptr<SweepBuffers> make_host_buffers(Communicator& comm, size_t bytes) {
  return std::make_unique<HostBuffers>(comm, bytes);
}

}  // namespace gradsync::bench
