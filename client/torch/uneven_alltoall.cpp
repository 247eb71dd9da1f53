#include "client/torch/uneven_alltoall.h"

#include "client/torch/point_to_point.h"
#include "client/torch/tensor_types.h"
#include "client/torch/transfers.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>

namespace gradsync::torch_backend {
namespace {

// A rank's split table as it travels: these words, then what it sends each rank (in units:
// rows of the first dimension, or elements), then what it receives from each.
enum Field : size_t {
  kElementType,    // c10::ScalarType
  kUnitBytes,      // bytes of a row (or an element)
  kProblem,        // Problem: what is wrong with the rank's own arguments
  kProblemDetail,  // the figure the problem's message names
  kSentTotal,      // units of the input
  kReceivedTotal,  // units of the output
  kFixedFields,
};

// What is wrong with a rank's own arguments: found where it calls, reported by every rank.
enum Problem : int64_t {
  kNoProblem,
  kInputSplitCount,   // detail: how many input split sizes it passed
  kOutputSplitCount,  // detail: how many output split sizes
  kInputUnequal,      // detail: its input's rows, which the group cannot share equally
  kOutputUnequal,     // detail: its output's rows
  kNegativeSplit,
  kRowShapes,     // input and output rows of different shapes, or no rows at all
  kElementTypes,  // tensors of more than one element type
};

size_t table_words(int world) {
  return kFixedFields + 2 * static_cast<size_t>(world);
}

// One rank's table inside the gathered ones.
class Table {
 public:
  Table(const int64_t* words, int world) : words_(words), world_(static_cast<size_t>(world)) {}
  int64_t operator[](Field field) const { return words_[field]; }
  int64_t sent(int to) const { return words_[kFixedFields + to]; }
  int64_t received(int from) const { return words_[kFixedFields + world_ + from]; }
  int64_t sent_sum() const {
    return std::accumulate(words_ + kFixedFields, words_ + kFixedFields + world_, int64_t{0});
  }
  int64_t received_sum() const {
    return std::accumulate(words_ + kFixedFields + world_, words_ + kFixedFields + 2 * world_,
                           int64_t{0});
  }

 private:
  const int64_t* words_;
  size_t world_;
};

std::string rank_of(int rank) {
  return "rank " + std::to_string(rank);
}

// "1 row", "3 rows": `unit` in the plural.
std::string amount(int64_t n, const std::string& unit) {
  return std::to_string(n) + " " + (n == 1 ? unit.substr(0, unit.size() - 1) : unit);
}

// The first thing wrong with any rank's table, in words every rank finds alike; empty where
// nothing is. `unit`: what the sizes count ("rows", "elements").
std::string check_tables(const std::vector<int64_t>& gathered, int world, const std::string& unit) {
  const size_t words = table_words(world);
  auto table = [&](int rank) { return Table(gathered.data() + rank * words, world); };
  const Table first = table(0);
  for (int r = 0; r < world; ++r) {
    const Table t = table(r);
    const std::string detail = std::to_string(t[kProblemDetail]);
    const std::string group = " for a group of " + std::to_string(world);
    switch (t[kProblem]) {
      case kNoProblem:
        break;
      case kInputSplitCount:
        return rank_of(r) + " passed " + detail + " input split sizes" + group;
      case kOutputSplitCount:
        return rank_of(r) + " passed " + detail + " output split sizes" + group;
      case kInputUnequal:
        return rank_of(r) + "'s input has " + detail + " " + unit + ", which do not split equally" +
               group + " (no input split sizes given)";
      case kOutputUnequal:
        return rank_of(r) + "'s output has " + detail + " " + unit +
               ", which do not split equally" + group + " (no output split sizes given)";
      case kNegativeSplit:
        return rank_of(r) + " passed a negative split size";
      case kRowShapes:
        return rank_of(r) + "'s input and output rows differ in shape (or it has no rows)";
      default:
        return rank_of(r) + "'s tensors are not all of one element type";
    }
    if (t[kElementType] != first[kElementType]) {
      return rank_of(r) + "'s tensors are " +
             c10::toString(static_cast<c10::ScalarType>(t[kElementType])) + ", rank 0's " +
             c10::toString(static_cast<c10::ScalarType>(first[kElementType]));
    }
    if (t[kUnitBytes] != first[kUnitBytes]) {
      return rank_of(r) + "'s " + unit + " are " + std::to_string(t[kUnitBytes]) +
             " bytes, rank 0's " + std::to_string(first[kUnitBytes]);
    }
    if (t.sent_sum() != t[kSentTotal]) {
      return rank_of(r) + "'s input split sizes add up to " + amount(t.sent_sum(), unit) +
             ", its input has " + std::to_string(t[kSentTotal]);
    }
    if (t.received_sum() != t[kReceivedTotal]) {
      return rank_of(r) + "'s output split sizes add up to " + amount(t.received_sum(), unit) +
             ", its output has " + std::to_string(t[kReceivedTotal]);
    }
  }
  for (int from = 0; from < world; ++from) {
    for (int to = 0; to < world; ++to) {
      const int64_t sent = table(from).sent(to);
      const int64_t expected = table(to).received(from);
      if (sent != expected) {
        return rank_of(from) + " sends " + amount(sent, unit) + " to " + rank_of(to) +
               ", which expects " + std::to_string(expected) + " from it";
      }
    }
  }
  return {};
}

// What one rank found of its own arguments: its table, and its tensors cut into blocks by
// rank (empty where its table is wrong, as every rank will then say).
struct RankSide {
  std::vector<int64_t> table;
  std::vector<at::Tensor> sources;
  std::vector<at::Tensor> targets;
  std::string unit;
  bool aliased = false;  // an output shares memory with an input
};

// The second stage on a group on one node: each block a message to its target in their pair's
// job, of its own size, and this rank's own block copied across. Where this rank's output
// overlaps its input (`aliased`), what it receives and its own block go through staging memory
// and are written out once every message is over, after the input has been read: the messages
// and their sizes stay those of the other ranks, which need not know.
std::vector<Transfer> messages_between_pairs(const std::vector<at::Tensor>& sources,
                                             const std::vector<at::Tensor>& targets, int rank,
                                             bool aliased) {
  std::vector<Transfer> messages;
  for (int r = 0; r < static_cast<int>(sources.size()); ++r) {
    const at::Tensor& source = sources[static_cast<size_t>(r)];
    const at::Tensor& target = targets[static_cast<size_t>(r)];
    if (r == rank) {
      if (source.numel() > 0) messages.push_back(local_copy(source, target, aliased));
      continue;
    }
    // The tables agree, so a block left out here is left out by its peer too.
    if (source.numel() > 0) {
      messages.push_back(pair_message(source, true, rank, r, alltoall_block_name(rank, r)));
    }
    if (target.numel() > 0) {
      messages.push_back(
          pair_message(target, false, r, rank, alltoall_block_name(r, rank), aliased));
    }
  }
  return messages;
}

// Both stages, from this rank's side.
UnevenExchange stages(RankSide side, int rank, int world, bool in_pairs) {
  auto gathered = std::make_shared<std::vector<int64_t>>(table_words(world) * world);
  const size_t table_bytes = side.table.size() * sizeof(int64_t);
  UnevenExchange exchange;
  Transfer& tables = exchange.tables.emplace_back(word_gather(
      table_bytes, world,
      [table = std::move(side.table)](std::byte* send) {
        std::memcpy(send, table.data(), table.size() * sizeof(int64_t));
      },
      [gathered, table_bytes, world](const std::byte* recv) {
        for (int r = 0; r < world; ++r) {
          std::memcpy(gathered->data() + r * table_words(world),
                      recv + r * padded_to_words(table_bytes), table_bytes);
        }
      }));
  tables.on_host = true;
  exchange.then = [gathered, rank, world, in_pairs, aliased = side.aliased,
                   unit = std::move(side.unit), sources = std::move(side.sources),
                   targets = std::move(side.targets)]() -> std::vector<Transfer> {
    const std::string problem = check_tables(*gathered, world, unit);
    if (!problem.empty()) throw std::runtime_error(problem);
    if (in_pairs) return messages_between_pairs(sources, targets, rank, aliased);
    int64_t largest = 0;  // units
    for (int r = 0; r < world; ++r) {
      const Table t(gathered->data() + r * table_words(world), world);
      for (int to = 0; to < world; ++to) largest = std::max(largest, t.sent(to));
    }
    const auto block = static_cast<size_t>(largest * (*gathered)[kUnitBytes]);
    if (block == 0) return {};  // nothing anywhere: every rank skips alike
    const size_t stride = padded_to_words(block);
    std::vector<Transfer> padded;
    padded.push_back(word_exchange(
        block, world,
        [sources, stride](std::byte* send) {
          for (size_t r = 0; r < sources.size(); ++r) {
            if (sources[r].numel() > 0) copy_in(send + r * stride, sources[r]);
          }
        },
        [targets, stride](const std::byte* recv) {
          for (size_t r = 0; r < targets.size(); ++r) {
            if (targets[r].numel() > 0) copy_out(recv + r * stride, targets[r]);
          }
        }));
    return padded;
  };
  return exchange;
}

// Rows of `tensor`'s first dimension cut by `splits` (which add up to its rows).
std::vector<at::Tensor> cut_rows(const at::Tensor& tensor, const std::vector<int64_t>& splits) {
  std::vector<at::Tensor> blocks;
  int64_t row = 0;
  for (const int64_t rows : splits) {
    blocks.push_back(tensor.narrow(0, row, rows));
    row += rows;
  }
  return blocks;
}

// `given`, or `rows` shared equally where it is empty; sets `problem` where neither works.
std::vector<int64_t> resolve_splits(const std::vector<int64_t>& given, int64_t rows, int world,
                                    Problem wrong_count, Problem unequal,
                                    std::vector<int64_t>& table) {
  auto fail = [&](Problem problem, int64_t detail) {
    if (table[kProblem] == kNoProblem) {
      table[kProblem] = problem;
      table[kProblemDetail] = detail;
    }
    return std::vector<int64_t>(world, 0);
  };
  if (given.empty()) {
    if (rows % world != 0) return fail(unequal, rows);
    return std::vector<int64_t>(world, rows / world);
  }
  if (given.size() != static_cast<size_t>(world)) {
    return fail(wrong_count, static_cast<int64_t>(given.size()));
  }
  if (std::any_of(given.begin(), given.end(), [](int64_t s) { return s < 0; })) {
    return fail(kNegativeSplit, 0);
  }
  return given;
}

}  // namespace

UnevenExchange uneven_alltoall_base(const at::Tensor& output, const at::Tensor& input,
                                    const std::vector<int64_t>& output_splits,
                                    const std::vector<int64_t>& input_splits, int rank, int world,
                                    bool in_pairs) {
  RankSide side;
  side.unit = "rows";
  side.aliased = output.is_alias_of(input);
  std::vector<int64_t>& table = side.table;
  table.assign(table_words(world), 0);
  table[kElementType] = static_cast<int64_t>(input.scalar_type());
  const bool rows =
      input.dim() > 0 && output.dim() > 0 && input.sizes().slice(1) == output.sizes().slice(1);
  if (!rows) {
    table[kProblem] = kRowShapes;
  } else if (output.scalar_type() != input.scalar_type()) {
    table[kProblem] = kElementTypes;
  }
  if (rows) {
    table[kUnitBytes] =
        static_cast<int64_t>(input.element_size()) * c10::multiply_integers(input.sizes().slice(1));
    table[kSentTotal] = input.size(0);
    table[kReceivedTotal] = output.size(0);
  }
  const std::vector<int64_t> sent = resolve_splits(input_splits, table[kSentTotal], world,
                                                   kInputSplitCount, kInputUnequal, table);
  const std::vector<int64_t> received = resolve_splits(output_splits, table[kReceivedTotal], world,
                                                       kOutputSplitCount, kOutputUnequal, table);
  std::copy(sent.begin(), sent.end(), table.begin() + kFixedFields);
  std::copy(received.begin(), received.end(), table.begin() + kFixedFields + world);
  const auto adds_up = [](const std::vector<int64_t>& splits, int64_t total) {
    return std::accumulate(splits.begin(), splits.end(), int64_t{0}) == total;
  };
  if (table[kProblem] == kNoProblem && adds_up(sent, table[kSentTotal]) &&
      adds_up(received, table[kReceivedTotal])) {
    side.sources = cut_rows(input, sent);
    side.targets = cut_rows(output, received);
  }
  return stages(std::move(side), rank, world, in_pairs);
}

UnevenExchange uneven_alltoall(const std::vector<at::Tensor>& outputs,
                               const std::vector<at::Tensor>& inputs, int rank, int world,
                               bool in_pairs) {
  RankSide side;
  side.unit = "elements";
  for (const at::Tensor& output : outputs) {
    for (const at::Tensor& input : inputs) side.aliased = side.aliased || output.is_alias_of(input);
  }
  std::vector<int64_t>& table = side.table;
  table.assign(table_words(world), 0);
  const at::ScalarType type = inputs.front().scalar_type();
  table[kElementType] = static_cast<int64_t>(type);
  table[kUnitBytes] = static_cast<int64_t>(c10::elementSize(type));
  for (int r = 0; r < world; ++r) {
    if (inputs[r].scalar_type() != type || outputs[r].scalar_type() != type) {
      table[kProblem] = kElementTypes;
    }
    table[kFixedFields + r] = inputs[r].numel();
    table[kFixedFields + world + r] = outputs[r].numel();
    table[kSentTotal] += inputs[r].numel();
    table[kReceivedTotal] += outputs[r].numel();
  }
  if (table[kProblem] == kNoProblem) {
    side.sources = inputs;
    side.targets = outputs;
  }
  return stages(std::move(side), rank, world, in_pairs);
}

}  // namespace gradsync::torch_backend
