// The transfers of the backend's calls that only move bytes, the copies between tensors and
// staging memory they are built from, and where a transfer runs on a tensor's own memory
// instead. Bytes travel as 4-byte words (any element type), each rank's block padded to whole
// words.
#pragma once

#include "client/torch/collective_worker.h"

#include <ATen/ATen.h>

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace gradsync::torch_backend {

size_t bytes_of(const at::Tensor& tensor);

// Copies between a tensor (any strides) and staging memory, which holds it densely, as
// elements of `as` (converted where that is not the tensor's own type).
void copy_in(std::byte* staging, const at::Tensor& tensor, at::ScalarType as);
void copy_in(std::byte* staging, const at::Tensor& tensor);
// copy_in, each element multiplied by `factor` (a scalar tensor) on the way: one pass.
void multiply_in(std::byte* staging, const at::Tensor& tensor, at::ScalarType as,
                 const at::Tensor& factor);
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

// A message of `tensor`'s bytes from group rank `source` to `target` in their pair's job
// (point_to_point.h), one of them this rank (`sending`: the source): a broadcast from the
// source named `name`, run on the tensor itself where it lies in gradsync's shared memory
// (unless `staged`: then always through staging memory).
Transfer pair_message(const at::Tensor& tensor, bool sending, int source, int target,
                      std::string name, bool staged = false);

// `source` copied into `target` (of one size and type) on this rank: no collective. Copied as
// the transfer is submitted, or, `staged`, read into staging then and written out once the
// task's collectives are over (for a target that other transfers' sources overlap).
Transfer local_copy(at::Tensor source, at::Tensor target, bool staged);

// A tensor's own memory, where a collective can run on it as it lies (dense, in gradsync's
// shared memory); null where it must be staged.
std::byte* direct_memory(const at::Tensor& tensor);
// The same, for a collective that moves the tensor's bytes as whole 4-byte words (whole words
// on word boundaries).
std::byte* direct_words(const at::Tensor& tensor);

// Runs `transfer`'s send region on `send` and its receive region on `recv` where they are not
// null (the tensors' own memory, which `tensors` hold), dropping the copy in or out it no
// longer needs.
void run_direct(Transfer& transfer, std::byte* send, std::byte* recv,
                std::vector<at::Tensor> tensors);

}  // namespace gradsync::torch_backend
