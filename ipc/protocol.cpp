#include "ipc/protocol.h"

namespace gradsync::ipc {

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
  }
  return "?";
}

std::optional<Collective> parse_collective(uint32_t raw) {
  if (raw > static_cast<uint32_t>(Collective::kBarrier)) return std::nullopt;
  return static_cast<Collective>(raw);
}

std::optional<gradsync_dtype> parse_dtype(uint32_t raw) {
  if (raw > GRADSYNC_INT64) return std::nullopt;
  return static_cast<gradsync_dtype>(raw);
}

std::optional<gradsync_op> parse_op(uint32_t raw) {
  if (raw > GRADSYNC_PROD) return std::nullopt;
  return static_cast<gradsync_op>(raw);
}

std::optional<uint64_t> checked_bytes(uint64_t count, gradsync_dtype d) {
  uint64_t bytes = 0;
  const size_t element = dtype_bytes(d);
  if (element == 0 || __builtin_mul_overflow(count, element, &bytes)) return std::nullopt;
  return bytes;
}

}  // namespace gradsync::ipc
