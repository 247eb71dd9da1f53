// The transfers of the backend's calls that only move bytes, and the copies between tensors and
// staging memory they are built from. Bytes travel as 4-byte words (any element type), each
// rank's block padded to whole words.
#pragma once

#include "client/torch/collective_worker.h"

#include <ATen/ATen.h>

#include <cstddef>
#include <functional>

namespace gradsync::torch_backend {

size_t bytes_of(const at::Tensor& tensor);

// Copies between a tensor (any strides) and staging memory, which holds it densely, as
// elements of `as` (converted where that is not the tensor's own type).
void copy_in(std::byte* staging, const at::Tensor& tensor, at::ScalarType as);
void copy_in(std::byte* staging, const at::Tensor& tensor);
void copy_out(const std::byte* staging, const at::Tensor& tensor, at::ScalarType as);
void copy_out(const std::byte* staging, const at::Tensor& tensor);

// An allgather of `block_bytes` bytes from each rank: rank r's block lands at
// r * padded_to_words(block_bytes) of the receive region.
Transfer word_gather(size_t block_bytes, int world, std::function<void(std::byte*)> fill,
                     std::function<void(const std::byte*)> deliver);

// An all-to-all of blocks of `block_bytes` bytes: the block for (and from) rank r at
// r * padded_to_words(block_bytes) of the send (and receive) region.
Transfer word_exchange(size_t block_bytes, int world, std::function<void(std::byte*)> fill,
                       std::function<void(const std::byte*)> deliver);

// A broadcast of `bytes` bytes from `root`, in place.
Transfer word_broadcast(size_t bytes, int root, std::function<void(std::byte*)> fill,
                        std::function<void(const std::byte*)> deliver);

}  // namespace gradsync::torch_backend
