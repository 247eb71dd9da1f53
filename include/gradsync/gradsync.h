/* gradsync: the public C ABI of the client library.
 *
 * A training process ("rank") connects to the node's gradsyncd, allocates and registers host
 * buffers in shared memory, and submits collectives on them. Every call returns a
 * gradsync_result; on failure gradsync_last_error() names what went wrong.
 *
 * Threading: a communicator is used by one thread at a time (as an NCCL communicator is).
 * Distinct communicators are independent.
 *
 * ABI: functions and enum values are only ever added. GRADSYNC_API_VERSION rises with each
 * addition.
 */
#ifndef GRADSYNC_GRADSYNC_H
#define GRADSYNC_GRADSYNC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GRADSYNC_API_VERSION 14

#if defined(__GNUC__)
#define GRADSYNC_EXPORT __attribute__((visibility("default")))
#else
#define GRADSYNC_EXPORT
#endif

typedef enum gradsync_result {
  GRADSYNC_OK = 0,
  GRADSYNC_IN_PROGRESS = 1,          /* gradsync_test: not complete yet */
  GRADSYNC_ERR_INVALID_ARGUMENT = 2, /* bad argument, caught before or by the daemon */
  GRADSYNC_ERR_CONNECT = 3,          /* the daemon cannot be reached or refused the connection */
  GRADSYNC_ERR_PROTOCOL = 4,         /* protocol version or message error */
  GRADSYNC_ERR_PERMISSION = 5,       /* the job belongs to another user */
  GRADSYNC_ERR_MISMATCH = 6,         /* ranks disagree on a tensor's shape, dtype, op or root */
  GRADSYNC_ERR_PEER_FAILED = 7,      /* another rank of the job died or disconnected */
  GRADSYNC_ERR_DAEMON_GONE = 8,      /* the daemon shut down or closed the connection */
  GRADSYNC_ERR_OUT_OF_MEMORY = 9,    /* shared memory could not be allocated or mapped */
  GRADSYNC_ERR_INTERNAL = 10,
  GRADSYNC_ERR_TIMEOUT = 11,    /* a bounded wait expired */
  GRADSYNC_ERR_UNSUPPORTED = 12 /* this build or machine cannot serve it (e.g. device memory
                                   on a daemon without a GPU); API version 2 */
} gradsync_result;

typedef enum gradsync_dtype {
  GRADSYNC_FLOAT32 = 0,
  GRADSYNC_FLOAT64 = 1,
  GRADSYNC_FLOAT16 = 2,
  GRADSYNC_BFLOAT16 = 3,
  GRADSYNC_INT32 = 4,
  GRADSYNC_INT64 = 5
} gradsync_dtype;

typedef enum gradsync_op {
  GRADSYNC_SUM = 0,
  GRADSYNC_AVG = 1,
  GRADSYNC_MIN = 2,
  GRADSYNC_MAX = 3,
  GRADSYNC_PROD = 4,
  /* Bitwise and, or and exclusive or, of integer dtypes only (API version 12). */
  GRADSYNC_BAND = 5,
  GRADSYNC_BOR = 6,
  GRADSYNC_BXOR = 7
} gradsync_op;

typedef struct gradsync_comm gradsync_comm;
typedef uint64_t gradsync_request; /* 0 is never a valid request */

/* Where to connect and who this rank is. Zero-initialise and fill what you know;
 * gradsync_options_from_env() fills it from GRADSYNC_SOCKET, GRADSYNC_JOB, RANK, WORLD_SIZE,
 * LOCAL_RANK and LOCAL_WORLD_SIZE (torchrun's names), GRADSYNC_NODES and GRADSYNC_NODE_RANK. */
typedef struct gradsync_options {
  char socket_path[108]; /* sun_path of the daemon's socket */
  char job[64];          /* job name shared by all ranks of the job */
  int32_t rank;
  int32_t world_size;
  int32_t local_rank;
  int32_t local_world_size;
  int32_t timeout_ms; /* bound on control-plane waits (connect, register); 0 = 30000 */
  /* Multi-node jobs: the node daemons' inter-node addresses (HOST:PORT), comma-separated in
   * node order, and this node's index (-1: the daemon finds its own address in the list).
   * Empty for a single-node job. */
  char nodes[1024];
  int32_t node_rank;
  /* Inter-node allreduce algorithm for the job: "auto", "ring", "rhd", "direct" (float sums
   * the same bits run after run), "aggregate", "split" or "" (the daemon's configuration
   * decides; docs/multi-node.md). Node 0's ranks' choice holds for the whole job. */
  char algorithm[16];
} gradsync_options;

GRADSYNC_EXPORT gradsync_result gradsync_options_from_env(gradsync_options* options);

typedef enum gradsync_autotune {
  GRADSYNC_AUTOTUNE_DEFAULT = 0, /* the daemon's configuration (`autotune`) decides */
  GRADSYNC_AUTOTUNE_ON = 1,
  GRADSYNC_AUTOTUNE_OFF = 2
} gradsync_autotune;

/* Settings of the job beyond gradsync_options, API version 3. Set struct_bytes to
 * sizeof(gradsync_job_settings): later versions add fields at the end, and the library reads
 * only the fields the caller's struct has. */
typedef struct gradsync_job_settings {
  uint32_t struct_bytes;
  /* What the job's f32 allreduces send between nodes: "bf16" (rounded to bfloat16 on the
   * inter-node ring: half the bytes; the local reduce and every addition stay f32, and every
   * rank gets the same result), "none" (the values), or "" (the daemon's configuration
   * decides). Node 0's ranks' choice holds for the whole job. */
  char wire_codec[16];
  /* API version 8: whether the daemons tune the job's fusion threshold, pipeline piece,
   * negotiation hold and ring crossover over its first steps (docs/autotune.md). Node 0's
   * ranks' choice holds for the whole job. */
  gradsync_autotune autotune;
  /* API version 9: the aggregators the job's allreduces across nodes may sum through
   * (docs/aggregators.md), HOST:PORT, comma-separated; "" for the daemon's configuration's.
   * Every node's ranks must name the same ones. */
  char aggregators[1024];
  /* API version 11: the job this one is a part of ("" for none), such as the whole group of a
   * subgroup or of a pair of ranks that exchange messages, and parent_ranks: world_size
   * entries, each rank's rank in that job (read while connecting only). A rank of the parent
   * job whose process ends without leaving it (it died), on any node, fails this job too where
   * that rank is one of its own, even before that rank has joined it: its other ranks hear of
   * it at once instead of waiting for a rank that will never come. Every rank of the job must
   * name the same parent and ranks. */
  char parent_job[64];
  const int32_t* parent_ranks;
} gradsync_job_settings;

/* The two groups of a hierarchical scheme, as options to connect with (API version 6), for a
 * job whose nodes hold local_world_size ranks each, numbered consecutively (as torchrun and
 * srun number them):
 *  - gradsync_options_node_group: this node's ranks (rank = local rank), a one-node job named
 *    "<job>.node" that never touches the network;
 *  - gradsync_options_across_nodes_group: one rank per node, those sharing this rank's local
 *    rank (rank = the node's index), a job named "<job>.local<L>" over every node of the job.
 * DASO, for one, synchronises in the first every step and in the second every few. Fails with
 * GRADSYNC_ERR_INVALID_ARGUMENT where the layout does not fit or a group's name would be too
 * long; gradsync_last_error(NULL) says which. */
GRADSYNC_EXPORT gradsync_result gradsync_options_node_group(const gradsync_options* job,
                                                            gradsync_options* group);
GRADSYNC_EXPORT gradsync_result gradsync_options_across_nodes_group(const gradsync_options* job,
                                                                    gradsync_options* group);
/* Makes `group`, from either of the two above on `job`, a part of `job` (API version 14):
 * sets settings' parent_job to job's name and its parent_ranks to `ranks`, filled with each
 * rank of the group as its rank in the job (capacity entries, at least group->world_size; read
 * while connecting). Connected with those settings, the group fails at once where a rank of the
 * job that it holds dies, even one that never joined it, instead of waiting for it. The other
 * fields of settings stay as they are; settings->struct_bytes must include parent_ranks. Fails
 * with GRADSYNC_ERR_INVALID_ARGUMENT where `group` is neither of job's groups. */
GRADSYNC_EXPORT gradsync_result gradsync_job_settings_for_group(const gradsync_options* job,
                                                                const gradsync_options* group,
                                                                gradsync_job_settings* settings,
                                                                int32_t* ranks, size_t capacity);

/* Fills settings from GRADSYNC_WIRE_CODEC (API version 3), GRADSYNC_AUTOTUNE (1 or 0; unset
 * or empty: the daemon decides; API version 8) and GRADSYNC_AGGREGATORS (API version 9); the
 * other fields zero. Set settings->struct_bytes first (API version 11): only that many bytes
 * are written. */
GRADSYNC_EXPORT gradsync_result gradsync_job_settings_from_env(gradsync_job_settings* settings);

/* Connects with the job settings of the environment (gradsync_job_settings_from_env). */
GRADSYNC_EXPORT gradsync_result gradsync_connect(const gradsync_options* options,
                                                 gradsync_comm** comm);
/* Connects with these job settings (null: from the environment), API version 3. */
GRADSYNC_EXPORT gradsync_result gradsync_connect_with(const gradsync_options* options,
                                                      const gradsync_job_settings* settings,
                                                      gradsync_comm** comm);
/* Where other nodes reach the daemon at socket_path (NULL: GRADSYNC_SOCKET or the default),
 * HOST:PORT into address (capacity bytes with the NUL), asked without joining a job: for
 * launchers that publish each node's daemon to a job's other nodes (API version 5). Fails with
 * GRADSYNC_ERR_UNSUPPORTED and the daemon's reason where it cannot say; gradsync_last_error(NULL)
 * has the message. */
GRADSYNC_EXPORT gradsync_result gradsync_node_address(const char* socket_path, char* address,
                                                      size_t capacity);

/* Fails every request still in flight, releases all buffers and closes the connection. */
GRADSYNC_EXPORT void gradsync_disconnect(gradsync_comm* comm);

/* Host memory in a shared segment the daemon can map. Must be registered before use. */
GRADSYNC_EXPORT gradsync_result gradsync_alloc(gradsync_comm* comm, size_t bytes, void** ptr);
GRADSYNC_EXPORT gradsync_result gradsync_free(gradsync_comm* comm, void* ptr);
/* Registers [ptr, ptr+bytes), which must lie inside memory from gradsync_alloc. Collectives
 * may then use any range inside it. Registering an overlapping range twice is an error. */
GRADSYNC_EXPORT gradsync_result gradsync_register(gradsync_comm* comm, void* ptr, size_t bytes);
GRADSYNC_EXPORT gradsync_result gradsync_unregister(gradsync_comm* comm, void* ptr);

/* A heap of shared host memory of the process rather than of one communicator (API version
 * 10): for a framework that allocates its tensors from it, so that collectives run on them in
 * place, with no copy into a buffer of gradsync_alloc. A heap is thread-safe. Collectives of a
 * communicator the heap is attached to take its memory without gradsync_register: the
 * communicator registers each arena of the heap whole on first use, and lets go of it once
 * every allocation in it is freed. Errors of the heap's own calls are in gradsync_last_error(NULL).
 * Memory of a heap is shared with the children the process forks, as any MAP_SHARED memory is;
 * a heap serves only the process that created it: in a child, gradsync_heap_alloc fails and
 * gradsync_heap_free of the parent's memory does nothing. */
typedef struct gradsync_heap gradsync_heap;
GRADSYNC_EXPORT gradsync_result gradsync_heap_create(gradsync_heap** heap);
/* Drops the caller's hold: memory still allocated stays valid while an attached communicator
 * uses it, and goes when the last of them disconnects. */
GRADSYNC_EXPORT void gradsync_heap_destroy(gradsync_heap* heap);
GRADSYNC_EXPORT gradsync_result gradsync_heap_alloc(gradsync_heap* heap, size_t bytes, void** ptr);
GRADSYNC_EXPORT gradsync_result gradsync_heap_free(gradsync_heap* heap, void* ptr);
/* Lets comm's collectives use memory of heap (attaching one twice is no error). */
GRADSYNC_EXPORT gradsync_result gradsync_attach_heap(gradsync_comm* comm, gradsync_heap* heap);
/* 1 where [ptr, ptr + bytes) lies inside memory of heap, which an attached communicator's
 * collectives take as it is; 0 otherwise (a framework then copies into registered memory). */
GRADSYNC_EXPORT int gradsync_heap_contains(const gradsync_heap* heap, const void* ptr,
                                           size_t bytes);

/* Device memory (CUDA), API version 2. The daemon opens the allocation through CUDA IPC and
 * reduces on its own streams. gradsync_unregister releases it as for host memory. A daemon
 * without a usable GPU refuses with GRADSYNC_ERR_UNSUPPORTED and says why. */
typedef struct gradsync_cuda_ipc_memory {
  uint8_t handle[64];      /* cudaIpcMemHandle_t of the allocation holding the range */
  uint64_t offset;         /* of the range from the allocation's base address */
  uint8_t device_uuid[16]; /* cudaDeviceProp::uuid of the allocation's device */
} gradsync_cuda_ipc_memory;
/* Registers [ptr, ptr + bytes) of device memory described by `memory`: for frameworks that
 * export IPC handles themselves (PyTorch's CUDA storage sharing does). */
GRADSYNC_EXPORT gradsync_result gradsync_register_cuda_ipc(gradsync_comm* comm, void* ptr,
                                                           size_t bytes,
                                                           const gradsync_cuda_ipc_memory* memory);
/* The same, finding the allocation, its handle and its device through the CUDA driver
 * (libcuda.so.1, loaded on first use; libgradsync does not link CUDA). */
GRADSYNC_EXPORT gradsync_result gradsync_register_device(gradsync_comm* comm, void* ptr,
                                                         size_t bytes);
/* Orders the collectives on device memory submitted from now on on `stream` (a cudaStream_t;
 * NULL is the legacy default stream), the host submitting without synchronising: each waits on
 * the device for what the stream was given before it (the gradient's writes), and what the
 * stream is given after gradsync_wait (or a gradsync_test that reports completion) runs after
 * the collective. gradsync_wait returns once the work is done on the device (the stream is
 * then not made to wait: without NVIDIA MPS a stream's wait on another process's event costs
 * a switch between the processes' contexts even when it is done). The CUDA context of the stream's
 * device must be current on the calling thread. Without a stream, device collectives are
 * host-synchronous: finish the writes before submitting; the result is there when gradsync_wait
 * returns. */
GRADSYNC_EXPORT gradsync_result gradsync_set_cuda_stream(gradsync_comm* comm, void* stream);
GRADSYNC_EXPORT gradsync_result gradsync_unset_cuda_stream(gradsync_comm* comm);

/* The priority of the collectives this communicator submits from now on (API version 7);
 * 0 until set. Where several of a job's collectives are ready, the daemon runs the one of
 * highest priority first, and a large one yields to it between pieces (docs/priority.md). Every
 * rank must give a collective the same priority (a mismatch fails it, as a different dtype
 * would); a group runs at the highest of its members'. Within one priority the order stays
 * first in, first out, and waiting raises a collective's priority, so none starves. */
GRADSYNC_EXPORT gradsync_result gradsync_set_priority(gradsync_comm* comm, int32_t priority);

/* Collectives. `name` identifies the tensor across ranks (ranks may submit in different
 * orders); NULL means "the n-th unnamed collective of this communicator", of whatever kind
 * (ranks whose n-th differ in kind get GRADSYNC_ERR_MISMATCH). send == recv is in place. All are
 * asynchronous: wait on the returned request. */
GRADSYNC_EXPORT gradsync_result gradsync_allreduce(gradsync_comm* comm, const char* name,
                                                   const void* send, void* recv, size_t count,
                                                   gradsync_dtype dtype, gradsync_op op,
                                                   gradsync_request* request);
GRADSYNC_EXPORT gradsync_result gradsync_broadcast(gradsync_comm* comm, const char* name,
                                                   const void* send, void* recv, size_t count,
                                                   gradsync_dtype dtype, int32_t root,
                                                   gradsync_request* request);
/* recv holds count * world_size elements, rank r's contribution at r * count. Broadcast roots
 * and allgather slots are ranks (RANK). */
GRADSYNC_EXPORT gradsync_result gradsync_allgather(gradsync_comm* comm, const char* name,
                                                   const void* send, void* recv, size_t count,
                                                   gradsync_dtype dtype, gradsync_request* request);
/* send holds count * world_size elements, block r for rank r; recv receives this rank's block
 * reduced over every rank (API version 5). In place: recv == send + rank * count elements. */
GRADSYNC_EXPORT gradsync_result gradsync_reduce_scatter(gradsync_comm* comm, const char* name,
                                                        const void* send, void* recv, size_t count,
                                                        gradsync_dtype dtype, gradsync_op op,
                                                        gradsync_request* request);
/* send and recv hold count * world_size elements each: block r of send goes to rank r, block r
 * of recv comes from rank r (API version 5). Never in place: the ranges must not overlap. */
GRADSYNC_EXPORT gradsync_result gradsync_alltoall(gradsync_comm* comm, const char* name,
                                                  const void* send, void* recv, size_t count,
                                                  gradsync_dtype dtype, gradsync_request* request);
GRADSYNC_EXPORT gradsync_result gradsync_barrier(gradsync_comm* comm, gradsync_request* request);

/* Grouped submission: collectives submitted between group_start and group_end are negotiated
 * and executed as one unit (fused whole). Groups do not nest. */
GRADSYNC_EXPORT gradsync_result gradsync_group_start(gradsync_comm* comm);
GRADSYNC_EXPORT gradsync_result gradsync_group_end(gradsync_comm* comm);

/* Blocks until the request completes; returns its outcome. A request is consumed by a wait
 * or by a test that returns anything but GRADSYNC_IN_PROGRESS. */
GRADSYNC_EXPORT gradsync_result gradsync_wait(gradsync_comm* comm, gradsync_request request);
GRADSYNC_EXPORT gradsync_result gradsync_test(gradsync_comm* comm, gradsync_request request);
/* As gradsync_wait, for at most timeout_ms milliseconds (API version 4): GRADSYNC_IN_PROGRESS
 * when the request is still in flight then (as gradsync_test), to be waited on or tested
 * again. */
GRADSYNC_EXPORT gradsync_result gradsync_wait_timeout(gradsync_comm* comm, gradsync_request request,
                                                      int32_t timeout_ms);
/* What the communicator's job waits for, as its daemon says (API version 13): its oldest
 * collective that some of its ranks (or nodes) submitted a second or more ago and others have
 * not, naming the tensor and those that have not; "" when nothing waits. For a call that takes
 * too long: a rank that hangs, died or called something else. Into text (capacity bytes with
 * the NUL; a longer answer is cut short). */
GRADSYNC_EXPORT gradsync_result gradsync_waiting_for(gradsync_comm* comm, char* text,
                                                     size_t capacity);

/* The message of the last failed call on this communicator (never NULL). */
GRADSYNC_EXPORT const char* gradsync_last_error(const gradsync_comm* comm);
GRADSYNC_EXPORT const char* gradsync_result_string(gradsync_result result);
GRADSYNC_EXPORT size_t gradsync_dtype_size(gradsync_dtype dtype);

#ifdef __cplusplus
}
#endif
#endif /* GRADSYNC_GRADSYNC_H */
