#include "client/torch/transfers.h"

#include "client/torch/tensor_types.h"

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

}  // namespace gradsync::torch_backend
