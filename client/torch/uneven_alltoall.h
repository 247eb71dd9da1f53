// All-to-all with blocks of uneven sizes (alltoall_base with split sizes, alltoall with a list
// of tensors), built on gradsync's all-to-all of equal blocks as the two stages of one task:
//  1. every rank's split table (the sizes of its blocks to and from every rank, its totals and
//     its element type) is gathered to every rank, and every rank checks all of them alike: a
//     table that does not add up, or a block that one rank sends and its target does not
//     expect, fails the call on every rank with the same error;
//  2. on a group across nodes, one all-to-all of blocks padded to the largest block between any
//     two ranks (the padding costs bytes where blocks differ much in size: docs/python.md); on
//     a group on one node, each block a message of its own in its pair's job
//     (point_to_point.h), of its own size, run where it lies in gradsync's shared memory.
#pragma once

#include "client/torch/collective_worker.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace gradsync::torch_backend {

// The two stages: Task::transfers and Task::then.
struct UnevenExchange {
  std::vector<Transfer> tables;
  std::function<std::vector<Transfer>()> then;
};

// alltoall_base: `input_splits[j]` rows of `input`'s first dimension go to rank j, in order,
// and `output_splits[i]` rows from rank i land in `output`, in order; an empty list cuts its
// tensor into equal parts.
// `rank` of `world`; `in_pairs`: the blocks go as messages between pairs (a group on one node).
UnevenExchange uneven_alltoall_base(const at::Tensor& output, const at::Tensor& input,
                                    const std::vector<int64_t>& output_splits,
                                    const std::vector<int64_t>& input_splits, int rank, int world,
                                    bool in_pairs);

// alltoall: inputs[j] goes to rank j, and what rank i sends lands in outputs[i]; the tensors
// may differ in size, not in element type.
UnevenExchange uneven_alltoall(const std::vector<at::Tensor>& outputs,
                               const std::vector<at::Tensor>& inputs, int rank, int world,
                               bool in_pairs);

}  // namespace gradsync::torch_backend
