#include "daemon/collectives/internode/allreduce_operand.h"

#include "kernels/reduce.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <cstring>

namespace gradsync::daemon {

AllreduceOperand::AllreduceOperand(const ReadyCollective& collective, uint8_t* work)
    : single_{&collective, 0},
      dtype_(collective.first().dtype),
      op_(collective.first().op),
      element_bytes_(ipc::dtype_bytes(dtype_)),
      count_(collective.first().count),
      work_(work != nullptr ? work : collective.ranks.front().recv) {}

AllreduceOperand::AllreduceOperand(const std::vector<const ReadyCollective*>& fused,
                                   uint8_t* buffer, Layout layout)
    : dtype_(fused.front()->first().dtype),
      op_(fused.front()->first().op),
      element_bytes_(ipc::dtype_bytes(dtype_)),
      work_(layout == Layout::kInPlace ? nullptr : buffer),
      layout_(layout) {
  fused_.reserve(fused.size());
  for (const ReadyCollective* collective : fused) {
    fused_.push_back({collective, count_});
    count_ += collective->first().count;
  }
}

AllreduceOperand AllreduceOperand::slice(uint64_t begin, uint64_t end) const {
  assert(layout_ != Layout::kInPlace && begin <= end && end <= count_);
  AllreduceOperand part = *this;
  part.offset_ = offset_ + begin;
  part.count_ = end - begin;
  return part;
}

std::span<const AllreduceOperand::Member> AllreduceOperand::members() const {
  return fused_.empty() ? std::span(&single_, 1) : std::span(fused_);
}

const std::string& AllreduceOperand::name() const {
  return members().front().collective->first().name;
}

const AllreduceOperand::Member& AllreduceOperand::member_of(uint64_t at) const {
  const std::span<const Member> all = members();
  // The last member that starts at or before `at` (the first starts at 0).
  const auto after = std::upper_bound(
      all.begin(), all.end(), at, [](uint64_t value, const Member& m) { return value < m.begin; });
  return *std::prev(after);
}

uint8_t* AllreduceOperand::at(uint64_t begin, uint64_t /*end*/) const {
  if (layout_ != Layout::kInPlace) return work() + begin * element_bytes_;
  const Member& member = member_of(begin);
  return member.collective->ranks.front().recv + (begin - member.begin) * element_bytes_;
}

void AllreduceOperand::reduce_into(gradsync_op op, uint64_t begin, uint64_t end,
                                   const uint8_t* extra) const {
  const auto start =
      times_ != nullptr ? OperandTimes::Clock::now() : OperandTimes::Clock::time_point{};
  // The members' elements are the whole operand's: a slice's are offset_ further on.
  for_each_overlap(
      begin + offset_, end + offset_,
      [&](const ReadyCollective& c, uint64_t first, uint64_t from, uint64_t elements) {
        std::array<const void*, ipc::kMaxLocalRanks + 1> inputs;  // 2 KiB: not zeroed per call
        size_t n = 0;
        for (const auto& s : c.ranks) inputs[n++] = s.send + first * element_bytes_;
        if (extra != nullptr) inputs[n++] = extra + (from - offset_ - begin) * element_bytes_;
        void* output = at(from - offset_, from - offset_ + elements);
        if (n == 1) {
          // One rank, nothing received: in place it is already there, else a copy (small
          // tensors come this way one by one, and a copy skips the kernel's dispatch).
          if (inputs[0] != output) std::memcpy(output, inputs[0], elements * element_bytes_);
          return;
        }
        kernels::reduce_to_all(dtype_, op, inputs.data(), n, &output, 1, elements, false);
      });
  if (times_ != nullptr) times_->reduce.cover(start, OperandTimes::Clock::now());
}

const uint8_t* AllreduceOperand::sole_input(uint64_t begin, uint64_t end) const {
  if (end > count_) return nullptr;
  begin += offset_;
  end += offset_;
  const Member& member = member_of(begin);
  if (end > member.begin + member.collective->first().count ||
      member.collective->ranks.size() != 1) {
    return nullptr;
  }
  return member.collective->ranks.front().send + (begin - member.begin) * element_bytes_;
}

void AllreduceOperand::deliver(uint64_t begin, uint64_t end) const {
  const auto start =
      times_ != nullptr ? OperandTimes::Clock::now() : OperandTimes::Clock::time_point{};
  for_each_overlap(
      begin + offset_, end + offset_,
      [&](const ReadyCollective& c, uint64_t first, uint64_t offset, uint64_t elements) {
        const uint8_t* from = at(offset - offset_, offset - offset_ + elements);
        const uint64_t bytes = elements * element_bytes_;
        const bool streaming = bytes >= kernels::kStreamingMinBytes;
        for (const auto& s : c.ranks) {
          uint8_t* to = s.recv + first * element_bytes_;
          if (to != from) kernels::copy(to, from, bytes, streaming);
        }
      });
  if (times_ != nullptr) times_->deliver.cover(start, OperandTimes::Clock::now());
}

std::vector<std::shared_ptr<const void>> AllreduceOperand::memory() const {
  std::vector<std::shared_ptr<const void>> memory;
  for (const Member& m : members()) m.collective->append_memory(memory);
  return memory;
}

}  // namespace gradsync::daemon
