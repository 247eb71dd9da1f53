// The data of an allreduce across nodes as the algorithms see it: `count` elements in `work`.
//
// One collective runs in place: work is local rank 0's receive buffer (the reduction kernels
// allow outputs to alias inputs), so the local reduce, the network reduce and the result share
// one pass and no staging copy. Several small allreduces of one dtype and op are fused end to
// end in a buffer of their own (Horovod's tensor fusion): one network operation instead of one
// per tensor, for one copy in (fused into the local reduce) and one copy out.
#pragma once

#include "daemon/job.h"

#include <gradsync/gradsync.h>

#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace gradsync::daemon {

// Where an allreduce spent its local passes, for the trace: from the first reduce into the
// work buffer to the last, and from the first delivery to the last.
struct OperandTimes {
  using Clock = std::chrono::steady_clock;
  struct Span {
    Clock::time_point begin;
    Clock::time_point end;
    void cover(Clock::time_point from, Clock::time_point to) {
      if (begin == Clock::time_point{}) begin = from;
      end = to;
    }
  };
  Span reduce;
  Span deliver;
};

class AllreduceOperand {
 public:
  // One collective, in place in local rank 0's receive buffer, or in `work` when given.
  explicit AllreduceOperand(const ReadyCollective& collective, uint8_t* work = nullptr);
  // Several, all allreduces of one dtype and op, laid out in `buffer` (their bytes in all).
  AllreduceOperand(const std::vector<const ReadyCollective*>& fused, uint8_t* buffer);

  gradsync_dtype dtype() const { return dtype_; }
  gradsync_op op() const { return op_; }  // as submitted: an average is divided at the end
  uint64_t count() const { return count_; }
  uint8_t* work() const { return work_; }
  size_t element_bytes() const { return element_bytes_; }
  // The first collective's name, for logs.
  const std::string& name() const;

  // work[begin, end) = `op` over the local ranks' inputs for those elements, and over `extra`
  // (elements [begin, end) received from a peer) unless null.
  void reduce_into(gradsync_op op, uint64_t begin, uint64_t end, const uint8_t* extra) const;
  // Where the local input for elements [begin, end) already lies as it is, when a single local
  // rank contributes it to a single collective: that rank's send buffer (work itself when in
  // place). Null otherwise: the local ranks' inputs must be reduced (reduce_into) first.
  const uint8_t* sole_input(uint64_t begin, uint64_t end) const;
  // Copies finished elements work[begin, end) to every receive buffer that is not work.
  void deliver(uint64_t begin, uint64_t end) const;
  // Everything of the ranks' that UCX may touch: handed to the mesh if the allreduce fails.
  std::vector<std::shared_ptr<const void>> memory() const;
  // Times the passes of reduce_into and deliver into `times` (null: not timed).
  void time_into(OperandTimes* times) { times_ = times; }

 private:
  struct Member {
    const ReadyCollective* collective;
    uint64_t begin;  // where its elements start in work
  };
  // Calls fn(member, member's first element in range, that element's place in work, elements)
  // for each member that overlaps work[begin, end).
  template <typename Fn>
  void for_each_overlap(uint64_t begin, uint64_t end, Fn&& fn) const;

  std::span<const Member> members() const;

  Member single_{};            // one collective: no allocation on the per-tensor path
  std::vector<Member> fused_;  // several
  gradsync_dtype dtype_;
  gradsync_op op_;
  size_t element_bytes_;
  uint64_t count_ = 0;
  uint8_t* work_;
  OperandTimes* times_ = nullptr;
};

}  // namespace gradsync::daemon
