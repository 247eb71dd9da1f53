#include "ipc/protocol.h"

#include <algorithm>

namespace gradsync::ipc {

std::vector<std::string> split_addresses(std::string_view list) {
  std::vector<std::string> addresses;
  for (size_t start = 0; start < list.size();) {
    const size_t comma = std::min(list.find(',', start), list.size());
    std::string_view address = list.substr(start, comma - start);
    // "a:1, b:2" as written by hand: the spaces are no part of an address.
    while (!address.empty() && (address.front() == ' ' || address.front() == '\t')) {
      address.remove_prefix(1);
    }
    while (!address.empty() && (address.back() == ' ' || address.back() == '\t')) {
      address.remove_suffix(1);
    }
    if (!address.empty()) addresses.emplace_back(address);
    start = comma + 1;
  }
  return addresses;
}

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::kAllreduce:
      return "allreduce";
    case Collective::kBroadcast:
      return "broadcast";
    case Collective::kAllgather:
      return "allgather";
    case Collective::kBarrier:
      return "barrier";
    case Collective::kReduceScatter:
      return "reduce_scatter";
    case Collective::kAllToAll:
      return "alltoall";
  }
  return "?";
}

const char* dtype_name(gradsync_dtype d) {
  switch (d) {
    case GRADSYNC_FLOAT32:
      return "float32";
    case GRADSYNC_FLOAT64:
      return "float64";
    case GRADSYNC_FLOAT16:
      return "float16";
    case GRADSYNC_BFLOAT16:
      return "bfloat16";
    case GRADSYNC_INT32:
      return "int32";
    case GRADSYNC_INT64:
      return "int64";
  }
  return "?";
}

const char* op_name(gradsync_op op) {
  switch (op) {
    case GRADSYNC_SUM:
      return "sum";
    case GRADSYNC_AVG:
      return "avg";
    case GRADSYNC_MIN:
      return "min";
    case GRADSYNC_MAX:
      return "max";
    case GRADSYNC_PROD:
      return "prod";
    case GRADSYNC_BAND:
      return "band";
    case GRADSYNC_BOR:
      return "bor";
    case GRADSYNC_BXOR:
      return "bxor";
  }
  return "?";
}

}  // namespace gradsync::ipc
