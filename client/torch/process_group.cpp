#include "client/torch/process_group.h"

#include "client/torch/shared_memory_allocator.h"
#include "client/torch/tensor_types.h"
#include "client/torch/transfers.h"
#include "client/torch/uneven_alltoall.h"

#include <Python.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include <functional>
#include <optional>
#include <utility>

namespace gradsync::torch_backend {
namespace {

using c10d::OpType;

// From this many bytes a rank, an equal all-to-all of host tensors to be staged goes on one node
// as a message between each pair of ranks, as uneven ones do: each block staged as it goes,
// instead of the whole input in and the whole output out around one exchange (decision 0026).
constexpr size_t kPairedAllToAllMinBytes = 256 << 10;

void check_tensor(const at::Tensor& tensor, const char* call) {
  TORCH_CHECK(tensor.device().is_cpu() || tensor.device().is_cuda(), "gradsync: ", call,
              " got a tensor on ", tensor.device(),
              "; the gradsync backend carries host (CPU) and CUDA tensors");
  TORCH_CHECK(tensor.layout() == at::kStrided, "gradsync: ", call, " got a ", tensor.layout(),
              " tensor; gradsync carries dense (strided) tensors");
}

template <typename Visit>
void for_each_tensor(const at::Tensor& tensor, const Visit& visit) {
  visit(tensor);
}
template <typename Visit>
void for_each_tensor(const std::vector<at::Tensor>& tensors, const Visit& visit) {
  for (const at::Tensor& tensor : tensors) visit(tensor);
}
template <typename Visit>
void for_each_tensor(const std::vector<std::vector<at::Tensor>>& lists, const Visit& visit) {
  for (const std::vector<at::Tensor>& list : lists) for_each_tensor(list, visit);
}

// The one device every tensor of a call lies on: the host, or one GPU (as NCCL, a process
// group's collectives run where their tensors are, one device per call).
template <typename... Tensors>
c10::Device call_device(const char* call, const Tensors&... parts) {
  std::optional<c10::Device> device;
  const auto check = [&](const at::Tensor& tensor) {
    check_tensor(tensor, call);
    if (!device) device = tensor.device();
    TORCH_CHECK(tensor.device() == *device, "gradsync: ", call, " got tensors on ", *device,
                " and on ", tensor.device(), "; a call's tensors must be on one device");
  };
  (for_each_tensor(parts, check), ...);
  return device.value_or(c10::Device(c10::kCPU));
}

const at::Tensor& only_tensor(const std::vector<at::Tensor>& tensors, const char* call) {
  TORCH_CHECK(tensors.size() == 1, "gradsync: ", call, " takes one tensor per process, got ",
              tensors.size());
  return tensors.front();
}

void check_like(const at::Tensor& tensor, const at::Tensor& model, const char* call) {
  TORCH_CHECK(tensor.scalar_type() == model.scalar_type() && tensor.numel() == model.numel(),
              "gradsync: ", call, " needs tensors of one dtype and size: got ",
              tensor.scalar_type(), " of ", tensor.numel(), " elements beside ",
              model.scalar_type(), " of ", model.numel());
}

// The same, for a reduction of the tensor's elements as `type`.
std::byte* direct_elements(const at::Tensor& tensor, ReducedType type) {
  return type.scalar == tensor.scalar_type() ? direct_memory(tensor) : nullptr;
}

// `recv`, unless its `recv_bytes` share memory with `send`'s `send_bytes` in any other way than
// as the collective's in place layout (`in_place`: where recv would then lie; null for none):
// gradsync refuses other overlaps, which staging the receive region resolves.
std::byte* unless_aliased(const std::byte* send, size_t send_bytes, std::byte* recv,
                          size_t recv_bytes, const std::byte* in_place) {
  if (send == nullptr || recv == nullptr || recv == in_place) return recv;
  const bool overlap = send < recv + recv_bytes && recv < send + send_bytes;
  return overlap ? nullptr : recv;
}

// Copies `blocks` end to end into staging, as `type`, multiplied by PREMUL_SUM's factor where
// the reduction has one.
std::function<void(std::byte*)> fill_with(std::vector<at::Tensor> blocks, ReducedType type,
                                          const at::Tensor& premultiplier = {}) {
  return [blocks = std::move(blocks), type, premultiplier](std::byte* send) {
    for (const at::Tensor& block : blocks) {
      if (premultiplier.defined()) {
        multiply_in(send, block, type.scalar, premultiplier);
      } else {
        copy_in(send, block, type.scalar);
      }
      send += static_cast<size_t>(block.numel()) * type.bytes();
    }
  };
}

// An allreduce of `tensor` whose result lands back in it (where `keep`).
Transfer reduction_in_place(const at::Tensor& tensor, const Reduction& reduction, const char* call,
                            bool keep = true) {
  const ReducedType type = reduced_type(tensor, reduction, call);
  Transfer transfer;
  transfer.kind = TransferKind::kAllreduce;
  transfer.count = static_cast<size_t>(tensor.numel());
  transfer.send_bytes = transfer.count * type.bytes();
  transfer.dtype = type.dtype;
  transfer.op = reduction.op;
  transfer.fill = fill_with({tensor}, type, reduction.premultiplier);
  transfer.deliver = [tensor, type, keep](const std::byte* recv) {
    if (keep) copy_out(recv, tensor, type.scalar);
  };
  // In place only where the result is kept: a reduce leaves its other ranks' tensors as they
  // are. A premultiplied input is staged: the staging copy multiplies.
  std::byte* memory = keep && !reduction.premultiplied() ? direct_elements(tensor, type) : nullptr;
  if (memory != nullptr) run_direct(transfer, memory, memory, {tensor});
  return transfer;
}

// A reduce-scatter of `blocks` (one per rank, of one size) laid end to end in staging, as
// `type`; `output` takes this rank's reduced block.
Transfer scatter_reduction(const std::vector<at::Tensor>& blocks, size_t block_elements,
                           ReducedType type, const Reduction& reduction, const at::Tensor& output) {
  Transfer transfer;
  transfer.kind = TransferKind::kReduceScatter;
  transfer.count = block_elements;
  transfer.recv_bytes = block_elements * type.bytes();
  for (const at::Tensor& block : blocks) {
    transfer.send_bytes += static_cast<size_t>(block.numel()) * type.bytes();
  }
  transfer.dtype = type.dtype;
  transfer.op = reduction.op;
  transfer.fill = fill_with(blocks, type, reduction.premultiplier);
  transfer.deliver = [output, type](const std::byte* recv) { copy_out(recv, output, type.scalar); };
  return transfer;
}

// An allgather of every rank's `input` into `targets` (rank r's into targets[r]; none where
// `targets` is empty, as on a gather's other ranks).
Transfer gather_into(const at::Tensor& input, std::vector<at::Tensor> targets, int world) {
  const size_t block = padded_to_words(bytes_of(input));
  return word_gather(
      bytes_of(input), world, [input](std::byte* send) { copy_in(send, input); },
      [targets = std::move(targets), block](const std::byte* recv) {
        for (size_t r = 0; r < targets.size(); ++r) copy_out(recv + r * block, targets[r]);
      });
}

// `bytes` bytes of staging memory, on the device of the tensors they stage.
at::Tensor staged_bytes(const std::byte* staging, size_t bytes, const at::Tensor& like) {
  // from_blob takes a mutable pointer; views of the receive region are only read.
  return at::from_blob(const_cast<std::byte*>(staging), {static_cast<int64_t>(bytes)},
                       like.options().dtype(at::kByte));
}

// A dense tensor's elements as bytes (a view of its memory).
at::Tensor bytes_view(const at::Tensor& dense) {
  return dense.view({-1}).view(at::kByte);
}

// Copies `input` (any strides), cut end to end into `world` blocks of `bytes` bytes, into
// staging, `stride` apart: the inverse of unpack_blocks.
void pack_blocks(const at::Tensor& input, std::byte* staging, size_t bytes, size_t stride,
                 int world) {
  const at::Tensor source_bytes = bytes_view(input.contiguous());
  for (int r = 0; r < world; ++r) {
    staged_bytes(staging + r * stride, bytes, input)
        .copy_(
            source_bytes.narrow(0, static_cast<int64_t>(r * bytes), static_cast<int64_t>(bytes)));
  }
}

// Copies `world` blocks of `bytes` bytes, `stride` apart in staging, end to end into `output`
// (any strides: through a dense copy where it is not dense).
void unpack_blocks(const at::Tensor& output, const std::byte* staging, size_t bytes, size_t stride,
                   int world) {
  const bool dense = output.is_contiguous();
  const at::Tensor target = dense ? output : at::empty(output.sizes(), output.options());
  const at::Tensor target_bytes = bytes_view(target);
  for (int r = 0; r < world; ++r) {
    target_bytes.narrow(0, static_cast<int64_t>(r * bytes), static_cast<int64_t>(bytes))
        .copy_(staged_bytes(staging + r * stride, bytes, output));
  }
  if (!dense) output.copy_(target);
}

}  // namespace

ProcessGroupGradsync::ProcessGroupGradsync(const gradsync_options& options,
                                           const gradsync_job_settings& settings,
                                           GroupLayout layout, std::chrono::milliseconds timeout)
    : c10d::ProcessGroup(options.rank, options.world_size),
      timeout_(timeout),
      one_node_(layout.on_one_node()),
      worker_(std::make_unique<CollectiveWorker>(options, settings, std::move(layout),
                                                 SharedMemoryAllocator::instance().heap())) {}

ProcessGroupGradsync::~ProcessGroupGradsync() {
  // Python drops the last reference to a group with the GIL held, and the worker may need the
  // GIL to finish: releasing the last reference to a tensor whose Python object outlived
  // Python's own references takes it. Joining the worker with the GIL held would deadlock.
  if (Py_IsInitialized() != 0 && PyGILState_Check() != 0) {
    PyThreadState* const state = PyEval_SaveThread();
    worker_.reset();
    PyEval_RestoreThread(state);
  }
}

std::chrono::milliseconds ProcessGroupGradsync::bound(std::chrono::milliseconds requested) const {
  return requested == c10d::kUnsetTimeout ? timeout_ : requested;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::run(
    std::string call, c10d::OpType type, c10::Device device, std::vector<Transfer> transfers,
    std::vector<at::Tensor> outputs, std::chrono::milliseconds timeout,
    std::function<std::vector<Transfer>()> then, int peer) {
  auto work = c10::make_intrusive<GradsyncWork>(rank_, type, std::move(outputs), device);
  Task task;
  task.call = std::move(call);
  task.device = device;
  if (!device.is_cpu()) {
    // The point on the caller's stream the inputs are written by (the worker's copies wait for
    // it on the device, not here).
    const c10::impl::VirtualGuardImpl guard_impl(device.type());
    task.inputs_ready = std::make_unique<c10::Event>(device.type());
    task.inputs_ready->record(guard_impl.getStream(device));
  }
  // A zero-byte tensor has nothing to send: every rank leaves it out alike.
  for (Transfer& transfer : transfers) {
    if (transfer.kind == TransferKind::kBarrier || transfer.count > 0) {
      task.transfers.push_back(std::move(transfer));
    }
  }
  task.then = std::move(then);
  task.work = work;
  task.timeout = timeout;
  task.priority = priority_;
  task.peer = peer;
  worker_->enqueue(std::move(task));
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::allreduce(std::vector<at::Tensor>& tensors,
                                                               const c10d::AllreduceOptions& opts) {
  const at::Tensor& tensor = only_tensor(tensors, "allreduce");
  const c10::Device device = call_device("allreduce", tensor);
  std::vector<Transfer> transfers;
  transfers.push_back(
      reduction_in_place(tensor, reduction_of(opts.reduceOp, "allreduce"), "allreduce"));
  return run("allreduce", OpType::ALLREDUCE, device, std::move(transfers), tensors,
             bound(opts.timeout));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  const Reduction reduction = reduction_of(opts.reduceOp, "allreduce_coalesced");
  const c10::Device device = call_device("allreduce_coalesced", tensors);
  std::vector<Transfer> transfers;
  transfers.reserve(tensors.size());
  for (const at::Tensor& tensor : tensors) {
    transfers.push_back(reduction_in_place(tensor, reduction, "allreduce_coalesced"));
  }
  return run("allreduce_coalesced", OpType::ALLREDUCE_COALESCED, device, std::move(transfers),
             tensors, bound(opts.timeout));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::reduce(std::vector<at::Tensor>& tensors,
                                                            const c10d::ReduceOptions& opts) {
  // An allreduce whose result only the root keeps: gradsync has no rooted reduction.
  const at::Tensor& tensor = only_tensor(tensors, "reduce");
  const c10::Device device = call_device("reduce", tensor);
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_, "gradsync: reduce root ", opts.rootRank,
              " is not a rank of this group of ", size_);
  const bool root = opts.rootRank == rank_;
  std::vector<Transfer> transfers;
  transfers.push_back(
      reduction_in_place(tensor, reduction_of(opts.reduceOp, "reduce"), "reduce", root));
  return run("reduce", OpType::REDUCE, device, std::move(transfers), tensors, bound(opts.timeout));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::broadcast(std::vector<at::Tensor>& tensors,
                                                               const c10d::BroadcastOptions& opts) {
  const at::Tensor& tensor = only_tensor(tensors, "broadcast");
  const c10::Device device = call_device("broadcast", tensor);
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_, "gradsync: broadcast root ",
              opts.rootRank, " is not a rank of this group of ", size_);
  const bool root = opts.rootRank == rank_;
  std::vector<Transfer> transfers;
  transfers.push_back(word_broadcast(
      bytes_of(tensor), static_cast<int>(opts.rootRank),
      [tensor, root](std::byte* send) {
        if (root) copy_in(send, tensor);
      },
      [tensor, root](const std::byte* recv) {
        if (!root) copy_out(recv, tensor);
      }));
  std::byte* memory = direct_words(tensor);
  run_direct(transfers.back(), memory, memory, {tensor});
  return run("broadcast", OpType::BROADCAST, device, std::move(transfers), tensors,
             bound(opts.timeout));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const at::Tensor& input = only_tensor(inputs, "allgather");
  TORCH_CHECK(outputs.size() == 1 && outputs.front().size() == static_cast<size_t>(size_),
              "gradsync: allgather needs one list of ", size_, " output tensors");
  const std::vector<at::Tensor> targets = outputs.front();
  const c10::Device device = call_device("allgather", input, targets);
  for (const at::Tensor& target : targets) check_like(target, input, "allgather");
  std::vector<Transfer> transfers;
  transfers.push_back(gather_into(input, targets, size_));
  return run("allgather", OpType::ALLGATHER, device, std::move(transfers), targets,
             bound(opts.timeout));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  const c10::Device device = call_device("_allgather_base", input, output);
  TORCH_CHECK(
      output.scalar_type() == input.scalar_type() && output.numel() == input.numel() * size_,
      "gradsync: _allgather_base needs an output of the input's dtype and ", size_,
      " times its size");
  const size_t bytes = bytes_of(input);
  const size_t block = padded_to_words(bytes);
  const int world = size_;
  std::vector<Transfer> transfers;
  transfers.push_back(word_gather(
      bytes, size_, [input](std::byte* send) { copy_in(send, input); },
      [output, bytes, block, world](const std::byte* recv) {
        unpack_blocks(output, recv, bytes, block, world);
      }));
  if (block == bytes) {  // the output's blocks lie as the collective lays them out
    std::byte* send = direct_memory(input);
    std::byte* recv = direct_memory(output);
    // In place: the input is this rank's block of the output.
    const std::byte* in_place =
        send != nullptr ? send - static_cast<size_t>(rank_) * block : nullptr;
    run_direct(transfers.back(), send,
               unless_aliased(send, bytes, recv, block * static_cast<size_t>(world), in_place),
               {input, output});
  }
  return run("_allgather_base", OpType::_ALLGATHER_BASE, device, std::move(transfers), {output},
             bound(opts.timeout));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(),
              "gradsync: allgather_coalesced needs one output list per input");
  const c10::Device device = call_device("allgather_coalesced", inputs, outputs);
  std::vector<Transfer> transfers;
  std::vector<at::Tensor> results;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& input = inputs[i];
    const std::vector<at::Tensor> targets = outputs[i];
    TORCH_CHECK(targets.size() == static_cast<size_t>(size_),
                "gradsync: allgather_coalesced needs lists of ", size_, " output tensors");
    for (const at::Tensor& target : targets) {
      check_like(target, input, "allgather_coalesced");
      results.push_back(target);
    }
    transfers.push_back(gather_into(input, targets, size_));
  }
  return run("allgather_coalesced", OpType::ALLGATHER_COALESCED, device, std::move(transfers),
             std::move(results), bound(opts.timeout));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  // An allgather whose result only the root keeps.
  const at::Tensor& input = only_tensor(inputs, "gather");
  const c10::Device device = call_device("gather", input, outputs);
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_, "gradsync: gather root ", opts.rootRank,
              " is not a rank of this group of ", size_);
  std::vector<at::Tensor> targets;
  if (opts.rootRank == rank_) {
    TORCH_CHECK(outputs.size() == 1 && outputs.front().size() == static_cast<size_t>(size_),
                "gradsync: gather needs one list of ", size_, " output tensors on the root");
    targets = outputs.front();
    for (const at::Tensor& target : targets) check_like(target, input, "gather");
  } else {
    TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs.front().empty()),
                "gradsync: gather takes output tensors on the root only");
  }
  std::vector<Transfer> transfers;
  transfers.push_back(gather_into(input, targets, size_));
  return run("gather", OpType::GATHER, device, std::move(transfers), targets, bound(opts.timeout));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  // The root's blocks broadcast whole; each rank keeps its own.
  const at::Tensor& output = only_tensor(outputs, "scatter");
  const c10::Device device = call_device("scatter", output, inputs);
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_, "gradsync: scatter root ", opts.rootRank,
              " is not a rank of this group of ", size_);
  const bool root = opts.rootRank == rank_;
  std::vector<at::Tensor> sources;
  if (root) {
    TORCH_CHECK(inputs.size() == 1 && inputs.front().size() == static_cast<size_t>(size_),
                "gradsync: scatter needs one list of ", size_, " input tensors on the root");
    sources = inputs.front();
    for (const at::Tensor& source : sources) check_like(source, output, "scatter");
  } else {
    TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs.front().empty()),
                "gradsync: scatter takes input tensors on the root only");
  }
  const size_t block = padded_to_words(bytes_of(output));
  const size_t own = block * static_cast<size_t>(rank_);
  std::vector<Transfer> transfers;
  transfers.push_back(word_broadcast(
      block * static_cast<size_t>(size_), static_cast<int>(opts.rootRank),
      [sources, block](std::byte* send) {
        for (size_t r = 0; r < sources.size(); ++r) copy_in(send + r * block, sources[r]);
      },
      [output, own](const std::byte* recv) { copy_out(recv + own, output); }));
  return run("scatter", OpType::SCATTER, device, std::move(transfers), outputs,
             bound(opts.timeout));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const at::Tensor& output = only_tensor(outputs, "reduce_scatter");
  TORCH_CHECK(inputs.size() == 1 && inputs.front().size() == static_cast<size_t>(size_),
              "gradsync: reduce_scatter needs one list of ", size_, " input tensors");
  const std::vector<at::Tensor> sources = inputs.front();
  const c10::Device device = call_device("reduce_scatter", output, sources);
  for (const at::Tensor& source : sources) check_like(source, output, "reduce_scatter");
  const Reduction reduction = reduction_of(opts.reduceOp, "reduce_scatter");
  std::vector<Transfer> transfers;
  transfers.push_back(scatter_reduction(sources, static_cast<size_t>(output.numel()),
                                        reduced_type(output, reduction, "reduce_scatter"),
                                        reduction, output));
  return run("reduce_scatter", OpType::REDUCE_SCATTER, device, std::move(transfers), outputs,
             bound(opts.timeout));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  const c10::Device device = call_device("_reduce_scatter_base", input, output);
  TORCH_CHECK(
      output.scalar_type() == input.scalar_type() && input.numel() == output.numel() * size_,
      "gradsync: _reduce_scatter_base needs an input of the output's dtype and ", size_,
      " times its size");
  const Reduction reduction = reduction_of(opts.reduceOp, "_reduce_scatter_base");
  const ReducedType type = reduced_type(input, reduction, "_reduce_scatter_base");
  std::vector<Transfer> transfers;
  transfers.push_back(
      scatter_reduction({input}, static_cast<size_t>(output.numel()), type, reduction, output));
  // A premultiplied input is staged: the staging copy multiplies, and the input stays as it is.
  std::byte* send = reduction.premultiplied() ? nullptr : direct_elements(input, type);
  std::byte* recv = direct_elements(output, type);
  const size_t block = bytes_of(output);
  // In place: the output is this rank's block of the input.
  const std::byte* in_place = send != nullptr ? send + static_cast<size_t>(rank_) * block : nullptr;
  run_direct(transfers.back(), send,
             unless_aliased(send, block * static_cast<size_t>(size_), recv, block, in_place),
             {input, output});
  return run("_reduce_scatter_base", OpType::_REDUCE_SCATTER_BASE, device, std::move(transfers),
             {output}, bound(opts.timeout));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_split_sizes,
    std::vector<int64_t>& input_split_sizes, const c10d::AllToAllOptions& opts) {
  const c10::Device device = call_device("alltoall_base", input, output);
  auto in_two_steps = [&](const std::vector<int64_t>& output_rows,
                          const std::vector<int64_t>& input_rows) {
    UnevenExchange uneven =
        uneven_alltoall_base(output, input, output_rows, input_rows, rank_, size_, one_node_);
    return run("alltoall_base", OpType::ALLTOALL_BASE, device, std::move(uneven.tables), {output},
               bound(opts.timeout), std::move(uneven.then));
  };
  if (!output_split_sizes.empty() || !input_split_sizes.empty()) {
    return in_two_steps(output_split_sizes, input_split_sizes);
  }
  check_like(output, input, "alltoall_base");
  TORCH_CHECK(input.dim() > 0 && input.size(0) % size_ == 0, "gradsync: alltoall_base needs a ",
              "first dimension divisible by the group's size ", size_);
  if (one_node_ && device.is_cpu() && bytes_of(input) >= kPairedAllToAllMinBytes &&
      direct_memory(input) == nullptr) {
    const std::vector<int64_t> rows(static_cast<size_t>(size_), input.size(0) / size_);
    return in_two_steps(rows, rows);
  }
  const size_t block = bytes_of(input) / static_cast<size_t>(size_);
  const size_t stride = padded_to_words(block);
  const int world = size_;
  std::vector<Transfer> transfers;
  transfers.push_back(word_exchange(
      block, world,
      [input, block, stride, world](std::byte* send) {
        pack_blocks(input, send, block, stride, world);
      },
      [output, block, stride, world](const std::byte* recv) {
        unpack_blocks(output, recv, block, stride, world);
      }));
  if (stride == block) {
    std::byte* send = direct_memory(input);
    const size_t whole = block * static_cast<size_t>(world);
    run_direct(transfers.back(), send,
               unless_aliased(send, whole, direct_memory(output), whole, nullptr), {input, output});
  }
  return run("alltoall_base", OpType::ALLTOALL_BASE, device, std::move(transfers), {output},
             bound(opts.timeout));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::alltoall(std::vector<at::Tensor>& outputs,
                                                              std::vector<at::Tensor>& inputs,
                                                              const c10d::AllToAllOptions& opts) {
  TORCH_CHECK(inputs.size() == static_cast<size_t>(size_) && outputs.size() == inputs.size(),
              "gradsync: alltoall needs ", size_, " input and ", size_, " output tensors");
  const c10::Device device = call_device("alltoall", inputs, outputs);
  // Every rank learns every block's size first: the tensors may differ in size from rank to
  // rank, which no rank can tell from its own.
  UnevenExchange uneven = uneven_alltoall(outputs, inputs, rank_, size_, one_node_);
  return run("alltoall", OpType::ALLTOALL, device, std::move(uneven.tables), outputs,
             bound(opts.timeout), std::move(uneven.then));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::barrier(const c10d::BarrierOptions& opts) {
  std::vector<Transfer> transfers(1);
  transfers.front().kind = TransferKind::kBarrier;
  return run("barrier", OpType::BARRIER, c10::Device(c10::kCPU), std::move(transfers), {},
             bound(opts.timeout));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::send(std::vector<at::Tensor>& tensors,
                                                          int dstRank, int tag) {
  return exchange("send", tensors, dstRank, tag, true);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::recv(std::vector<at::Tensor>& tensors,
                                                          int srcRank, int tag) {
  return exchange("recv", tensors, srcRank, tag, false);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::exchange(const char* call,
                                                              std::vector<at::Tensor>& tensors,
                                                              int peer, int tag, bool sending) {
  const at::Tensor& tensor = only_tensor(tensors, call);
  const c10::Device device = call_device(call, tensor);
  TORCH_CHECK(peer >= 0 && peer < size_ && peer != rank_, "gradsync: ", call, " ",
              sending ? "to" : "from", " rank ", peer, ": not another rank of this group of ",
              size_);
  const int source = sending ? rank_ : peer;
  const int target = sending ? peer : rank_;
  std::vector<Transfer> transfers;
  transfers.push_back(
      pair_message(tensor, sending, source, target, message_name(source, target, tag)));
  return run(std::string(call) + (sending ? " to rank " : " from rank ") + std::to_string(peer),
             sending ? OpType::SEND : OpType::RECV, device, std::move(transfers), tensors, timeout_,
             {}, peer);
}

}  // namespace gradsync::torch_backend
