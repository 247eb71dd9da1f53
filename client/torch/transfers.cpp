#include "client/torch/transfers.h"

#include "client/torch/shared_memory_allocator.h"
#include "client/torch/tensor_types.h"

#include <cstdint>
#include <utility>

namespace gradsync::torch_backend {

size_t bytes_of(const at::Tensor& tensor) {
  return static_cast<size_t>(tensor.numel()) * tensor.element_size();
}

void copy_in(std::byte* staging, const at::Tensor& tensor, at::ScalarType as) {
  at::from_blob(staging, tensor.sizes(), tensor.options().dtype(as)).copy_(tensor);
}
void copy_in(std::byte* staging, const at::Tensor& tensor) {
  copy_in(staging, tensor, tensor.scalar_type());
}
void multiply_in(std::byte* staging, const at::Tensor& tensor, at::ScalarType as,
                 const at::Tensor& factor) {
  at::Tensor target = at::from_blob(staging, tensor.sizes(), tensor.options().dtype(as));
  at::mul_out(target, tensor, factor);
}
void copy_out(const std::byte* staging, const at::Tensor& tensor, at::ScalarType as) {
  // from_blob takes a mutable pointer; the view is only read.
  tensor.copy_(
      at::from_blob(const_cast<std::byte*>(staging), tensor.sizes(), tensor.options().dtype(as)));
}
void copy_out(const std::byte* staging, const at::Tensor& tensor) {
  copy_out(staging, tensor, tensor.scalar_type());
}

Transfer word_gather(size_t block_bytes, int world, std::function<void(std::byte*)> fill,
                     std::function<void(const std::byte*)> deliver) {
  Transfer transfer;
  transfer.kind = TransferKind::kAllgather;
  transfer.send_bytes = padded_to_words(block_bytes);
  transfer.recv_bytes = transfer.send_bytes * static_cast<size_t>(world);
  transfer.count = transfer.send_bytes / kWordBytes;
  transfer.dtype = kWordDtype;
  transfer.fill = std::move(fill);
  transfer.deliver = std::move(deliver);
  return transfer;
}

Transfer word_exchange(size_t block_bytes, int world, std::function<void(std::byte*)> fill,
                       std::function<void(const std::byte*)> deliver) {
  Transfer transfer;
  transfer.kind = TransferKind::kAllToAll;
  transfer.count = padded_to_words(block_bytes) / kWordBytes;
  transfer.send_bytes = padded_to_words(block_bytes) * static_cast<size_t>(world);
  transfer.recv_bytes = transfer.send_bytes;
  transfer.dtype = kWordDtype;
  transfer.fill = std::move(fill);
  transfer.deliver = std::move(deliver);
  return transfer;
}

Transfer word_broadcast(size_t bytes, int root, std::function<void(std::byte*)> fill,
                        std::function<void(const std::byte*)> deliver) {
  Transfer transfer;
  transfer.kind = TransferKind::kBroadcast;
  transfer.send_bytes = padded_to_words(bytes);
  transfer.count = transfer.send_bytes / kWordBytes;
  transfer.dtype = kWordDtype;
  transfer.root = root;
  transfer.fill = std::move(fill);
  transfer.deliver = std::move(deliver);
  return transfer;
}

Transfer pair_message(const at::Tensor& tensor, bool sending, int source, int target,
                      std::string name, bool staged) {
  // The pair's job numbers the lower group rank 0.
  Transfer transfer = word_broadcast(
      bytes_of(tensor), source < target ? 0 : 1,
      [tensor, sending](std::byte* send) {
        if (sending) copy_in(send, tensor);
      },
      [tensor, sending](const std::byte* recv) {
        if (!sending) copy_out(recv, tensor);
      });
  transfer.name = std::move(name);
  transfer.peer = sending ? target : source;
  std::byte* memory = staged ? nullptr : direct_words(tensor);
  run_direct(transfer, memory, memory, {tensor});
  return transfer;
}

Transfer local_copy(at::Tensor source, at::Tensor target, bool staged) {
  Transfer transfer;
  transfer.kind = TransferKind::kLocal;
  if (!staged) {
    transfer.fill = [source = std::move(source), target = std::move(target)](std::byte*) {
      target.copy_(source);
    };
    return transfer;
  }
  transfer.send_bytes = bytes_of(source);
  transfer.fill = [source](std::byte* send) { copy_in(send, source); };
  transfer.deliver = [target = std::move(target)](const std::byte* recv) {
    copy_out(recv, target);
  };
  return transfer;
}

std::byte* direct_memory(const at::Tensor& tensor) {
  if (!tensor.is_contiguous() || !SharedMemoryAllocator::holds(tensor)) return nullptr;
  return static_cast<std::byte*>(tensor.data_ptr());
}

std::byte* direct_words(const at::Tensor& tensor) {
  std::byte* memory = bytes_of(tensor) % kWordBytes == 0 ? direct_memory(tensor) : nullptr;
  // A view may begin between words (a slice of 1- or 2-byte elements): the daemon takes words
  // on word boundaries only.
  return reinterpret_cast<uintptr_t>(memory) % kWordBytes == 0 ? memory : nullptr;
}

void run_direct(Transfer& transfer, std::byte* send, std::byte* recv,
                std::vector<at::Tensor> tensors) {
  if (send == nullptr && recv == nullptr) return;
  if (send != nullptr) {
    transfer.direct_send = send;
    transfer.fill = nullptr;
  }
  if (recv != nullptr) {
    transfer.direct_recv = recv;
    transfer.deliver = nullptr;
  }
  transfer.direct_tensors = std::move(tensors);
}

}  // namespace gradsync::torch_backend
