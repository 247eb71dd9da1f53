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
  }
  return "?";
}

}  // namespace gradsync::ipc
