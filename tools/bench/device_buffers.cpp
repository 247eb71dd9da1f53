// gradsync-bench's sweep buffers on a GPU (--device), through the CUDA runtime. Collectives on
// them are host-synchronous, or (--stream) ordered on a stream of the buffers' own, each
// iteration timed to the end of the stream's work. The inputs are uploaded and synchronized
// before the timed iterations, as a training step's gradients are written before they are
// reduced.
#include "tools/bench/sweep_buffers.h"

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

namespace gradsync::bench {
namespace {

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw Error(GRADSYNC_ERR_UNSUPPORTED,
                std::string("--device: ") + what + ": " + cudaGetErrorString(status));
  }
}

// One cudaMalloc'd allocation, freed with its owner.
class DeviceAllocation {
 public:
  explicit DeviceAllocation(size_t bytes) { check_cuda(cudaMalloc(&data_, bytes), "cudaMalloc"); }
  ~DeviceAllocation() { cudaFree(data_); }
  DeviceAllocation(const DeviceAllocation&) = delete;
  DeviceAllocation& operator=(const DeviceAllocation&) = delete;
  void* data() const { return data_; }

 private:
  void* data_ = nullptr;
};

// Makes `device` the calling thread's current one, before the allocations that follow it.
struct CurrentDevice {
  explicit CurrentDevice(int device) { check_cuda(cudaSetDevice(device), "cudaSetDevice"); }
};

// A stream the communicator orders its device collectives on while it lives (none: null).
class OrderingStream {
 public:
  OrderingStream(Communicator& comm, bool ordered) : comm_(comm) {
    if (!ordered) return;
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    comm.set_cuda_stream(stream_);
  }
  ~OrderingStream() {
    if (stream_ == nullptr) return;
    try {
      comm_.unset_cuda_stream();
    } catch (const Error&) {  // the communicator failed: nothing is ordered on the stream now
    }
    cudaStreamDestroy(stream_);
  }
  OrderingStream(const OrderingStream&) = delete;
  OrderingStream& operator=(const OrderingStream&) = delete;
  void synchronize() const {
    if (stream_ != nullptr) check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

 private:
  Communicator& comm_;
  cudaStream_t stream_ = nullptr;
};

class DeviceBuffers final : public SweepBuffers {
 public:
  DeviceBuffers(Communicator& comm, size_t bytes, int device, bool stream_ordered)
      : device_(device),
        send_(bytes),
        recv_(bytes),
        send_registration_(comm.register_device(send_.data(), bytes)),
        recv_registration_(comm.register_device(recv_.data(), bytes)),
        stream_(comm, stream_ordered),
        host_input_(bytes),
        host_result_(bytes) {}
  void* send() override { return send_.data(); }
  void* recv() override { return recv_.data(); }
  void* staged_input() override { return host_input_.data(); }
  void upload(size_t bytes) override {
    check_cuda(cudaMemcpy(send_.data(), host_input_.data(), bytes, cudaMemcpyHostToDevice),
               "uploading the inputs");
    // From pageable memory the copy may still be in flight when cudaMemcpy returns.
    check_cuda(cudaDeviceSynchronize(), "uploading the inputs");
  }
  const void* download(const void* buffer, size_t bytes) override {
    check_cuda(cudaMemcpy(host_result_.data(), buffer, bytes, cudaMemcpyDeviceToHost),
               "downloading the results");
    return host_result_.data();
  }
  void finish() override { stream_.synchronize(); }
  const char* memory() const override { return "device"; }

 private:
  CurrentDevice device_;
  DeviceAllocation send_;
  DeviceAllocation recv_;
  DeviceRegistration send_registration_;  // after the allocations: unregistered before freed
  DeviceRegistration recv_registration_;
  OrderingStream stream_;  // after the registrations: unset before they go
  std::vector<uint8_t> host_input_;
  std::vector<uint8_t> host_result_;
};

}  // namespace

std::unique_ptr<SweepBuffers> make_device_buffers(Communicator& comm, size_t bytes, int local_rank,
                                                  bool stream_ordered) {
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess || devices == 0) {
    throw Error(GRADSYNC_ERR_UNSUPPORTED,
                std::string("--device: no usable CUDA device (") +
                    (status != cudaSuccess ? cudaGetErrorString(status) : "none") + ")");
  }
  return std::make_unique<DeviceBuffers>(comm, bytes, local_rank % devices, stream_ordered);
}

}  // namespace gradsync::bench
