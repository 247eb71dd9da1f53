// The C ABI: each entry point catches everything, records the message, returns a code.
#include <gradsync/gradsync.h>

#include "client/communicator.h"
#include "client/cuda_driver.h"
#include "client/daemon_socket.h"
#include "client/groups.h"
#include "client/slurm.h"

#include <kj/exception.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

struct gradsync_heap {
  // Shared with the communicators it is attached to (gradsync_heap_destroy).
  std::shared_ptr<gradsync::client::SharedHeap> heap;
};

struct gradsync_comm {
  std::unique_ptr<gradsync::client::Communicator> communicator;
  std::string last_error;
};

namespace {

using gradsync::client::Communicator;
using gradsync::client::Error;

// The message of a failed call that has no communicator to hold it (gradsync_connect, the
// heap's calls), per thread like errno.
thread_local std::string error_without_comm;

// A daemon answers a question from its control thread, at once or with an engine snapshot.
constexpr int kQuestionTimeoutMs = 10'000;

// Where node daemons listen unless configured otherwise (gradsyncd's `listen`).
constexpr int32_t kDefaultNodePort = 9478;

template <typename Body>
gradsync_result guarded(std::string& last_error, Body body) {
  try {
    return body();
  } catch (const Error& e) {
    last_error = e.what();
    return e.code();
  } catch (const kj::Exception& e) {
    last_error = std::string("malformed reply from gradsyncd: ") + e.getDescription().cStr();
    return GRADSYNC_ERR_PROTOCOL;
  } catch (const std::bad_alloc&) {
    last_error = "out of memory";
    return GRADSYNC_ERR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    last_error = e.what();
    return GRADSYNC_ERR_INTERNAL;
  }
}

template <typename Body>
gradsync_result with_comm(gradsync_comm* comm, Body body) {
  if (comm == nullptr || !comm->communicator) return GRADSYNC_ERR_INVALID_ARGUMENT;
  return guarded(comm->last_error, [&] { return body(*comm->communicator); });
}

gradsync_result read_int(const char* name, int32_t fallback, int32_t* out, std::string& error) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') {
    *out = fallback;
    return GRADSYNC_OK;
  }
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (*end != '\0' || value < 0 || value > INT32_MAX) {
    error = std::string(name) + "='" + text + "' is not a non-negative integer";
    return GRADSYNC_ERR_INVALID_ARGUMENT;
  }
  *out = static_cast<int32_t>(value);
  return GRADSYNC_OK;
}

gradsync_result copy_string(const char* name, const char* value, char* out, size_t capacity,
                            std::string& error) {
  if (std::strlen(value) >= capacity) {
    error = std::string(name) + " is longer than " + std::to_string(capacity - 1) + " bytes";
    return GRADSYNC_ERR_INVALID_ARGUMENT;
  }
  std::strncpy(out, value, capacity - 1);
  out[capacity - 1] = '\0';
  return GRADSYNC_OK;
}

gradsync_result collective(gradsync_comm* comm, const gradsync::client::CollectiveArgs& args,
                           gradsync_request* request) {
  return with_comm(comm, [&](Communicator& c) {
    if (request == nullptr) throw Error(GRADSYNC_ERR_INVALID_ARGUMENT, "request is NULL");
    *request = c.submit(args);
    return GRADSYNC_OK;
  });
}

// GRADSYNC_SOCKET, or where the packaged daemon listens.
const char* socket_from_env() {
  const char* socket = std::getenv("GRADSYNC_SOCKET");
  return socket != nullptr ? socket : "/run/gradsync/gradsyncd.sock";
}

}  // namespace

extern "C" {

gradsync_result gradsync_options_from_env(gradsync_options* options) {
  if (options == nullptr) return GRADSYNC_ERR_INVALID_ARGUMENT;
  std::string& error = error_without_comm;
  *options = gradsync_options{};
  // Under srun without torchrun, Slurm's variables stand in for those left unset.
  std::optional<gradsync::client::slurm::TaskLayout> task;
  try {
    task = gradsync::client::slurm::layout_from_env();
  } catch (const std::invalid_argument& e) {
    error = e.what();
    return GRADSYNC_ERR_INVALID_ARGUMENT;
  }
  const char* socket = socket_from_env();
  const char* job = std::getenv("GRADSYNC_JOB");
  if (job == nullptr || *job == '\0') job = std::getenv("TORCHELASTIC_RUN_ID");
  if ((job == nullptr || *job == '\0') && task) job = task->job.c_str();
  gradsync_result r = copy_string("GRADSYNC_SOCKET", socket, options->socket_path,
                                  sizeof(options->socket_path), error);
  if (r == GRADSYNC_OK) {
    r = copy_string("GRADSYNC_JOB", job != nullptr && *job != '\0' ? job : "default", options->job,
                    sizeof(options->job), error);
  }
  if (r == GRADSYNC_OK) r = read_int("RANK", task ? task->rank : 0, &options->rank, error);
  if (r == GRADSYNC_OK) {
    r = read_int("WORLD_SIZE", task ? task->world_size : 1, &options->world_size, error);
  }
  if (r == GRADSYNC_OK) {
    r = read_int("LOCAL_RANK", task ? task->local_rank : options->rank, &options->local_rank,
                 error);
  }
  if (r == GRADSYNC_OK) {
    r = read_int("LOCAL_WORLD_SIZE", task ? task->local_world_size : options->world_size,
                 &options->local_world_size, error);
  }
  std::string nodes = std::getenv("GRADSYNC_NODES") != nullptr ? std::getenv("GRADSYNC_NODES") : "";
  int32_t node_rank = -1;
  if (r == GRADSYNC_OK && nodes.empty() && task && task->hosts.size() > 1) {
    // Every node's daemon on the port of this node's (the packaged default, or as set).
    int32_t port = kDefaultNodePort;
    r = read_int("GRADSYNC_NODE_PORT", kDefaultNodePort, &port, error);
    if (r == GRADSYNC_OK && port > UINT16_MAX) {
      error = "GRADSYNC_NODE_PORT=" + std::to_string(port) + " is not a port";
      r = GRADSYNC_ERR_INVALID_ARGUMENT;
    }
    if (r == GRADSYNC_OK) {
      try {
        nodes = gradsync::client::slurm::node_list(task->hosts, static_cast<uint16_t>(port));
        node_rank = task->node;
      } catch (const std::runtime_error& e) {
        error = e.what();
        r = GRADSYNC_ERR_INVALID_ARGUMENT;
      }
    }
  }
  if (r == GRADSYNC_OK) {
    r = copy_string("GRADSYNC_NODES", nodes.c_str(), options->nodes, sizeof(options->nodes), error);
  }
  options->node_rank = node_rank;
  if (r == GRADSYNC_OK && std::getenv("GRADSYNC_NODE_RANK") != nullptr) {
    r = read_int("GRADSYNC_NODE_RANK", -1, &options->node_rank, error);
  }
  const char* algorithm = std::getenv("GRADSYNC_ALGO");
  if (r == GRADSYNC_OK) {
    r = copy_string("GRADSYNC_ALGO", algorithm != nullptr ? algorithm : "", options->algorithm,
                    sizeof(options->algorithm), error);
  }
  return r;
}

namespace {

gradsync_result job_settings_from_env(gradsync_job_settings* settings) {
  *settings = gradsync_job_settings{};
  settings->struct_bytes = sizeof(gradsync_job_settings);
  const char* codec = std::getenv("GRADSYNC_WIRE_CODEC");
  if (const gradsync_result r =
          copy_string("GRADSYNC_WIRE_CODEC", codec != nullptr ? codec : "", settings->wire_codec,
                      sizeof(settings->wire_codec), error_without_comm);
      r != GRADSYNC_OK) {
    return r;
  }
  const char* aggregators = std::getenv("GRADSYNC_AGGREGATORS");
  if (const gradsync_result r =
          copy_string("GRADSYNC_AGGREGATORS", aggregators != nullptr ? aggregators : "",
                      settings->aggregators, sizeof(settings->aggregators), error_without_comm);
      r != GRADSYNC_OK) {
    return r;
  }
  const char* autotune = std::getenv("GRADSYNC_AUTOTUNE");
  const std::string_view value = autotune != nullptr ? autotune : "";
  if (value.empty()) {
    settings->autotune = GRADSYNC_AUTOTUNE_DEFAULT;
  } else if (value == "1") {
    settings->autotune = GRADSYNC_AUTOTUNE_ON;
  } else if (value == "0") {
    settings->autotune = GRADSYNC_AUTOTUNE_OFF;
  } else {
    error_without_comm = "GRADSYNC_AUTOTUNE must be 1 or 0, not '" + std::string(value) + "'";
    return GRADSYNC_ERR_INVALID_ARGUMENT;
  }
  return GRADSYNC_OK;
}

}  // namespace

gradsync_result gradsync_job_settings_from_env(gradsync_job_settings* settings) {
  if (settings == nullptr) return GRADSYNC_ERR_INVALID_ARGUMENT;
  if (settings->struct_bytes < sizeof(uint32_t)) {
    error_without_comm = "gradsync_job_settings.struct_bytes is not set";
    return GRADSYNC_ERR_INVALID_ARGUMENT;
  }
  // The caller's struct may be older (smaller) than this library's: only what it has is
  // written.
  const uint32_t caller_bytes = settings->struct_bytes;
  gradsync_job_settings full{};
  if (const gradsync_result r = job_settings_from_env(&full); r != GRADSYNC_OK) return r;
  std::memcpy(settings, &full, std::min<size_t>(caller_bytes, sizeof(full)));
  settings->struct_bytes = caller_bytes;
  return GRADSYNC_OK;
}

gradsync_result gradsync_connect(const gradsync_options* options, gradsync_comm** comm) {
  return gradsync_connect_with(options, nullptr, comm);
}

gradsync_result gradsync_connect_with(const gradsync_options* options,
                                      const gradsync_job_settings* settings, gradsync_comm** comm) {
  if (comm == nullptr) return GRADSYNC_ERR_INVALID_ARGUMENT;
  *comm = nullptr;
  gradsync_options from_env{};
  if (options == nullptr) {
    if (const gradsync_result r = gradsync_options_from_env(&from_env); r != GRADSYNC_OK) return r;
    options = &from_env;
  }
  // The caller's struct may be older (smaller) than this library's: take what it has.
  gradsync_job_settings job{};
  if (settings == nullptr) {
    if (const gradsync_result r = job_settings_from_env(&job); r != GRADSYNC_OK) return r;
  } else {
    if (settings->struct_bytes < sizeof(uint32_t)) {
      error_without_comm = "gradsync_job_settings.struct_bytes is not set";
      return GRADSYNC_ERR_INVALID_ARGUMENT;
    }
    std::memcpy(&job, settings, std::min<size_t>(settings->struct_bytes, sizeof(job)));
  }
  return guarded(error_without_comm, [&] {
    auto created = std::make_unique<gradsync_comm>();
    created->communicator = std::make_unique<Communicator>(*options, job);
    *comm = created.release();
    return GRADSYNC_OK;
  });
}

void gradsync_disconnect(gradsync_comm* comm) {
  delete comm;
}

gradsync_result gradsync_alloc(gradsync_comm* comm, size_t bytes, void** ptr) {
  return with_comm(comm, [&](Communicator& c) {
    if (ptr == nullptr) throw Error(GRADSYNC_ERR_INVALID_ARGUMENT, "ptr is NULL");
    *ptr = c.allocate(bytes);
    return GRADSYNC_OK;
  });
}

gradsync_result gradsync_free(gradsync_comm* comm, void* ptr) {
  return with_comm(comm, [&](Communicator& c) {
    c.free(ptr);
    return GRADSYNC_OK;
  });
}

gradsync_result gradsync_heap_create(gradsync_heap** heap) {
  return guarded(error_without_comm, [&] {
    if (heap == nullptr) throw Error(GRADSYNC_ERR_INVALID_ARGUMENT, "heap is NULL");
    *heap = new gradsync_heap{std::make_shared<gradsync::client::SharedHeap>()};
    return GRADSYNC_OK;
  });
}

void gradsync_heap_destroy(gradsync_heap* heap) {
  delete heap;
}

gradsync_result gradsync_heap_alloc(gradsync_heap* heap, size_t bytes, void** ptr) {
  return guarded(error_without_comm, [&] {
    if (heap == nullptr || ptr == nullptr) {
      throw Error(GRADSYNC_ERR_INVALID_ARGUMENT, "heap alloc: heap or ptr is NULL");
    }
    *ptr = heap->heap->allocate(bytes);
    if (*ptr == nullptr && !heap->heap->owned_here()) {
      throw Error(GRADSYNC_ERR_INVALID_ARGUMENT,
                  "heap alloc: the heap serves the process that created it, not a child it "
                  "forked (the children share its arenas but not its lock)");
    }
    if (*ptr == nullptr) {
      throw Error(GRADSYNC_ERR_OUT_OF_MEMORY,
                  "cannot allocate " + std::to_string(bytes) + " bytes of shared memory");
    }
    return GRADSYNC_OK;
  });
}

gradsync_result gradsync_heap_free(gradsync_heap* heap, void* ptr) {
  return guarded(error_without_comm, [&] {
    if (heap == nullptr) throw Error(GRADSYNC_ERR_INVALID_ARGUMENT, "heap free: heap is NULL");
    if (ptr != nullptr && !heap->heap->deallocate(ptr)) {
      throw Error(GRADSYNC_ERR_INVALID_ARGUMENT,
                  "heap free: pointer was not returned by gradsync_heap_alloc of this heap");
    }
    return GRADSYNC_OK;
  });
}

gradsync_result gradsync_attach_heap(gradsync_comm* comm, gradsync_heap* heap) {
  return with_comm(comm, [&](Communicator& c) {
    if (heap == nullptr) throw Error(GRADSYNC_ERR_INVALID_ARGUMENT, "attach heap: heap is NULL");
    c.attach_heap(heap->heap);
    return GRADSYNC_OK;
  });
}

int gradsync_heap_contains(const gradsync_heap* heap, const void* ptr, size_t bytes) {
  if (heap == nullptr || ptr == nullptr) return 0;
  return heap->heap->contains(ptr, bytes) ? 1 : 0;
}

gradsync_result gradsync_register(gradsync_comm* comm, void* ptr, size_t bytes) {
  return with_comm(comm, [&](Communicator& c) {
    c.register_range(ptr, bytes);
    return GRADSYNC_OK;
  });
}

gradsync_result gradsync_register_cuda_ipc(gradsync_comm* comm, void* ptr, size_t bytes,
                                           const gradsync_cuda_ipc_memory* memory) {
  return with_comm(comm, [&](Communicator& c) {
    if (memory == nullptr) {
      throw Error(GRADSYNC_ERR_INVALID_ARGUMENT, "register device memory: no description");
    }
    gradsync::client::DeviceMemory described;
    described.description = *memory;
    c.register_device(ptr, bytes, std::move(described));
    return GRADSYNC_OK;
  });
}

gradsync_result gradsync_register_device(gradsync_comm* comm, void* ptr, size_t bytes) {
  return with_comm(comm, [&](Communicator& c) {
    if (ptr == nullptr || bytes == 0) {
      throw Error(GRADSYNC_ERR_INVALID_ARGUMENT,
                  "register device memory: null pointer or zero bytes");
    }
    c.register_device(ptr, bytes, gradsync::client::describe_device_memory(ptr, bytes));
    return GRADSYNC_OK;
  });
}

gradsync_result gradsync_set_cuda_stream(gradsync_comm* comm, void* stream) {
  return with_comm(comm, [&](Communicator& c) {
    c.set_stream(stream);
    return GRADSYNC_OK;
  });
}

gradsync_result gradsync_unset_cuda_stream(gradsync_comm* comm) {
  return with_comm(comm, [&](Communicator& c) {
    c.unset_stream();
    return GRADSYNC_OK;
  });
}

gradsync_result gradsync_set_priority(gradsync_comm* comm, int32_t priority) {
  return with_comm(comm, [&](Communicator& c) {
    c.set_priority(priority);
    return GRADSYNC_OK;
  });
}

gradsync_result gradsync_unregister(gradsync_comm* comm, void* ptr) {
  return with_comm(comm, [&](Communicator& c) {
    c.unregister(ptr);
    return GRADSYNC_OK;
  });
}

gradsync_result gradsync_allreduce(gradsync_comm* comm, const char* name, const void* send,
                                   void* recv, size_t count, gradsync_dtype dtype, gradsync_op op,
                                   gradsync_request* request) {
  return collective(comm,
                    {gradsync::ipc::Collective::kAllreduce, name, send, recv, count, dtype, op, 0},
                    request);
}

gradsync_result gradsync_broadcast(gradsync_comm* comm, const char* name, const void* send,
                                   void* recv, size_t count, gradsync_dtype dtype, int32_t root,
                                   gradsync_request* request) {
  return collective(
      comm,
      {gradsync::ipc::Collective::kBroadcast, name, send, recv, count, dtype, GRADSYNC_SUM, root},
      request);
}

gradsync_result gradsync_allgather(gradsync_comm* comm, const char* name, const void* send,
                                   void* recv, size_t count, gradsync_dtype dtype,
                                   gradsync_request* request) {
  return collective(
      comm,
      {gradsync::ipc::Collective::kAllgather, name, send, recv, count, dtype, GRADSYNC_SUM, 0},
      request);
}

gradsync_result gradsync_reduce_scatter(gradsync_comm* comm, const char* name, const void* send,
                                        void* recv, size_t count, gradsync_dtype dtype,
                                        gradsync_op op, gradsync_request* request) {
  return collective(
      comm, {gradsync::ipc::Collective::kReduceScatter, name, send, recv, count, dtype, op, 0},
      request);
}

gradsync_result gradsync_alltoall(gradsync_comm* comm, const char* name, const void* send,
                                  void* recv, size_t count, gradsync_dtype dtype,
                                  gradsync_request* request) {
  return collective(
      comm, {gradsync::ipc::Collective::kAllToAll, name, send, recv, count, dtype, GRADSYNC_SUM, 0},
      request);
}

namespace {

// A group's options from the job's by `derive` (groups.h), its errors the caller's to fix.
gradsync_result derive_group(const gradsync_options* job, gradsync_options* group,
                             gradsync_options (*derive)(const gradsync_options&)) {
  return guarded(error_without_comm, [&] {
    if (job == nullptr || group == nullptr) {
      throw Error(GRADSYNC_ERR_INVALID_ARGUMENT, "job or group options are NULL");
    }
    try {
      *group = derive(*job);
    } catch (const std::invalid_argument& e) {
      throw Error(GRADSYNC_ERR_INVALID_ARGUMENT, e.what());
    }
    return GRADSYNC_OK;
  });
}

}  // namespace

gradsync_result gradsync_options_node_group(const gradsync_options* job, gradsync_options* group) {
  return derive_group(job, group, &gradsync::client::groups::node_group);
}

gradsync_result gradsync_options_across_nodes_group(const gradsync_options* job,
                                                    gradsync_options* group) {
  return derive_group(job, group, &gradsync::client::groups::across_nodes_group);
}

gradsync_result gradsync_job_settings_for_group(const gradsync_options* job,
                                                const gradsync_options* group,
                                                gradsync_job_settings* settings, int32_t* ranks,
                                                size_t capacity) {
  return guarded(error_without_comm, [&] {
    if (job == nullptr || group == nullptr || settings == nullptr || ranks == nullptr) {
      throw Error(GRADSYNC_ERR_INVALID_ARGUMENT, "job, group, settings or ranks is NULL");
    }
    constexpr size_t kNeeded =
        offsetof(gradsync_job_settings, parent_ranks) + sizeof(gradsync_job_settings::parent_ranks);
    if (settings->struct_bytes < kNeeded) {
      throw Error(GRADSYNC_ERR_INVALID_ARGUMENT, "gradsync_job_settings.struct_bytes is " +
                                                     std::to_string(settings->struct_bytes) +
                                                     ": a group's parent needs a struct of " +
                                                     std::to_string(kNeeded) +
                                                     " bytes or more (API version 11)");
    }
    std::vector<int32_t> in_job;
    try {
      in_job = gradsync::client::groups::ranks_in_job(*job, *group);
    } catch (const std::invalid_argument& e) {
      throw Error(GRADSYNC_ERR_INVALID_ARGUMENT, e.what());
    }
    if (capacity < in_job.size()) {
      throw Error(GRADSYNC_ERR_INVALID_ARGUMENT,
                  "room for " + std::to_string(capacity) + " ranks, where group '" +
                      std::string(group->job, strnlen(group->job, sizeof(group->job))) + "' has " +
                      std::to_string(in_job.size()));
    }
    std::copy(in_job.begin(), in_job.end(), ranks);
    static_assert(sizeof(settings->parent_job) == sizeof(job->job));
    std::memcpy(settings->parent_job, job->job, sizeof(settings->parent_job));
    settings->parent_ranks = ranks;
    return GRADSYNC_OK;
  });
}

gradsync_result gradsync_node_address(const char* socket_path, char* address, size_t capacity) {
  return guarded(error_without_comm, [&] {
    if (address == nullptr || capacity == 0) {
      throw Error(GRADSYNC_ERR_INVALID_ARGUMENT, "no room for the address");
    }
    const std::string answer = gradsync::client::ask_node_address(
        socket_path != nullptr ? socket_path : socket_from_env(), kQuestionTimeoutMs);
    if (answer.size() >= capacity) {
      throw Error(GRADSYNC_ERR_INVALID_ARGUMENT, "the address " + answer + " needs " +
                                                     std::to_string(answer.size() + 1) + " bytes");
    }
    std::memcpy(address, answer.c_str(), answer.size() + 1);
    return GRADSYNC_OK;
  });
}

gradsync_result gradsync_waiting_for(gradsync_comm* comm, char* text, size_t capacity) {
  return with_comm(comm, [&](Communicator& c) {
    if (text == nullptr || capacity == 0) {
      throw Error(GRADSYNC_ERR_INVALID_ARGUMENT, "no room for the answer");
    }
    const gradsync_options& options = c.options();
    const std::string answer = gradsync::client::ask_waiting_for(
        std::string(options.socket_path, strnlen(options.socket_path, sizeof(options.socket_path))),
        std::string(options.job, strnlen(options.job, sizeof(options.job))), kQuestionTimeoutMs);
    const size_t kept = std::min(answer.size(), capacity - 1);
    std::memcpy(text, answer.data(), kept);
    text[kept] = '\0';
    return GRADSYNC_OK;
  });
}

gradsync_result gradsync_barrier(gradsync_comm* comm, gradsync_request* request) {
  return collective(comm,
                    {gradsync::ipc::Collective::kBarrier, nullptr, nullptr, nullptr, 0,
                     GRADSYNC_FLOAT32, GRADSYNC_SUM, 0},
                    request);
}

gradsync_result gradsync_group_start(gradsync_comm* comm) {
  return with_comm(comm, [&](Communicator& c) {
    c.group_start();
    return GRADSYNC_OK;
  });
}

gradsync_result gradsync_group_end(gradsync_comm* comm) {
  return with_comm(comm, [&](Communicator& c) {
    c.group_end();
    return GRADSYNC_OK;
  });
}

gradsync_result gradsync_wait(gradsync_comm* comm, gradsync_request request) {
  return with_comm(comm, [&](Communicator& c) {
    const gradsync_result status = c.wait(request, &comm->last_error);
    return status;
  });
}

gradsync_result gradsync_wait_timeout(gradsync_comm* comm, gradsync_request request,
                                      int32_t timeout_ms) {
  return with_comm(comm, [&](Communicator& c) {
    if (timeout_ms < 0) {
      throw Error(GRADSYNC_ERR_INVALID_ARGUMENT, "wait_timeout: timeout_ms must be >= 0");
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    return c.wait_until_deadline(request, deadline, &comm->last_error);
  });
}

gradsync_result gradsync_test(gradsync_comm* comm, gradsync_request request) {
  return with_comm(comm, [&](Communicator& c) { return c.test(request, &comm->last_error); });
}

const char* gradsync_last_error(const gradsync_comm* comm) {
  if (comm == nullptr) return error_without_comm.c_str();
  return comm->last_error.c_str();
}

const char* gradsync_result_string(gradsync_result result) {
  switch (result) {
    case GRADSYNC_OK:
      return "ok";
    case GRADSYNC_IN_PROGRESS:
      return "in progress";
    case GRADSYNC_ERR_INVALID_ARGUMENT:
      return "invalid argument";
    case GRADSYNC_ERR_CONNECT:
      return "cannot connect to gradsyncd";
    case GRADSYNC_ERR_PROTOCOL:
      return "protocol error";
    case GRADSYNC_ERR_PERMISSION:
      return "permission denied";
    case GRADSYNC_ERR_MISMATCH:
      return "ranks disagree";
    case GRADSYNC_ERR_PEER_FAILED:
      return "another rank failed";
    case GRADSYNC_ERR_DAEMON_GONE:
      return "gradsyncd is gone";
    case GRADSYNC_ERR_OUT_OF_MEMORY:
      return "out of memory";
    case GRADSYNC_ERR_INTERNAL:
      return "internal error";
    case GRADSYNC_ERR_TIMEOUT:
      return "timed out";
    case GRADSYNC_ERR_UNSUPPORTED:
      return "not supported here";
  }
  return "unknown result";
}

size_t gradsync_dtype_size(gradsync_dtype dtype) {
  return gradsync::ipc::dtype_bytes(dtype);
}

}  // extern "C"
