// The data of an allreduce across nodes as the algorithms see it: `count` elements in `work`.
//
// One collective runs in place: work is local rank 0's receive buffer (the reduction kernels
// allow outputs to alias inputs), so the local reduce, the network reduce and the result share
// one pass and no staging copy. Several allreduces of one dtype and op are fused (Horovod's
// tensor fusion): one network operation instead of one per tensor, their elements one after
// the other in the work, laid out one of two ways:
//  - packed, end to end in a buffer of their own, for one copy in (fused into the local
//    reduce) and one copy out: the work is one block, which any algorithm can cut as it likes.
//    For small tensors, whose copies cost less than the messages they save.
//  - in place, each member in its own local rank 0's receive buffer, as one collective is: no
//    copies, but the work is one block per member, and an algorithm moves a range of it as
//    one message per block (for_each_block). For large tensors.
#pragma once

#include "daemon/job/ready_unit.h"

#include <gradsync/gradsync.h>

#include <algorithm>
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
  enum class Layout : uint8_t { kPacked, kInPlace };
  // Several, all allreduces of one dtype and op: packed in `buffer` (their bytes in all), or
  // in place (`buffer` unused).
  AllreduceOperand(const std::vector<const ReadyCollective*>& fused, uint8_t* buffer,
                   Layout layout = Layout::kPacked);

  // Elements [begin, end) of this one, as an operand of their own (its element 0 is this
  // one's `begin`): for running parts of one allreduce by different algorithms. Not in the
  // in-place layout.
  AllreduceOperand slice(uint64_t begin, uint64_t end) const;

  gradsync_dtype dtype() const { return dtype_; }
  gradsync_op op() const { return op_; }  // as submitted: an average is divided at the end
  uint64_t count() const { return count_; }
  // The work as one block: not in the in-place layout (at()).
  uint8_t* work() const { return work_ + offset_ * element_bytes_; }
  // Where work elements [begin, end) are; they must lie in one block.
  uint8_t* at(uint64_t begin, uint64_t end) const;
  // Calls fn(begin, end, index) for each block's part of work[begin, end), in order, index
  // counting them from 0: one call, even for an empty range, unless the layout is in place.
  // Both ends of a message cut a range the same way: the blocks depend on the layout only.
  template <typename Fn>
  void for_each_block(uint64_t begin, uint64_t end, Fn&& fn) const;
  // Calls fn(collective, from) for each tensor in the work, in order: its elements are work
  // [from, from + its count), in one block (at()).
  template <typename Fn>
  void for_each_tensor(Fn&& fn) const {
    for (const Member& m : members()) fn(*m.collective, m.begin);
  }
  // The most blocks a range can have.
  size_t max_blocks() const { return layout_ == Layout::kInPlace ? members().size() : 1; }
  size_t element_bytes() const { return element_bytes_; }
  // The first collective's name, for logs.
  const std::string& name() const;

  // Work elements [begin, end) = `op` over the local ranks' inputs for them, and over `extra`
  // (elements [begin, end) received from a peer, as one block) unless null.
  void reduce_into(gradsync_op op, uint64_t begin, uint64_t end, const uint8_t* extra) const;
  // Where the local input for elements [begin, end) already lies as it is, when they belong to
  // one collective that a single local rank contributes: that rank's send buffer (the work
  // itself when in place). Null otherwise: the local ranks' inputs must be reduced
  // (reduce_into) first.
  const uint8_t* sole_input(uint64_t begin, uint64_t end) const;
  // Copies finished work elements [begin, end) to every receive buffer they are not in.
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
  // The member that element `at` (< count) belongs to.
  const Member& member_of(uint64_t at) const;

  Member single_{};            // one collective: no allocation on the per-tensor path
  std::vector<Member> fused_;  // several
  gradsync_dtype dtype_;
  gradsync_op op_;
  size_t element_bytes_;
  uint64_t count_ = 0;
  uint8_t* work_;        // packed (or one collective's); null in place
  uint64_t offset_ = 0;  // a slice's first element in work_ (and in the members' elements)
  Layout layout_ = Layout::kPacked;
  OperandTimes* times_ = nullptr;
};

template <typename Fn>
void AllreduceOperand::for_each_block(uint64_t begin, uint64_t end, Fn&& fn) const {
  if (layout_ != Layout::kInPlace) {
    fn(begin, end, size_t{0});
    return;
  }
  size_t index = 0;
  for_each_overlap(begin, end,
                   [&](const ReadyCollective&, uint64_t, uint64_t from, uint64_t elements) {
                     fn(from, from + elements, index++);
                   });
}

template <typename Fn>
void AllreduceOperand::for_each_overlap(uint64_t begin, uint64_t end, Fn&& fn) const {
  const std::span<const Member> all = members();
  for (const Member* m = &member_of(begin); m != all.data() + all.size() && m->begin < end; ++m) {
    const uint64_t member_end = m->begin + m->collective->first().count;
    const uint64_t from = std::max(begin, m->begin);
    const uint64_t to = std::min(end, member_end);
    if (from < to) fn(*m->collective, from - m->begin, from, to - from);
  }
}

}  // namespace gradsync::daemon
