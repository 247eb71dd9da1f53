# Control protocol between libgradsync and gradsyncd over the unix socket.
# Each message is one frame: a 4-byte little-endian length, then a Cap'n Proto flat array.
# File descriptors ride along a frame with SCM_RIGHTS. The fast path (collectives) does not use
# this socket: it goes through the shared-memory rings of ipc/segment.h.
@0xc1f3a9d2e84b7f61;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("gradsync::ipc::wire");

struct Hello {
  protocolVersion @0 :UInt32;
  job @1 :Text;
  rank @2 :Int32;
  worldSize @3 :Int32;
  localRank @4 :Int32;
  localWorldSize @5 :Int32;
  # The job's node daemons (HOST:PORT of their inter-node listeners) in node order, and this
  # node's index among them (-1: the daemon finds its own listen address in the list). Empty
  # for a single-node job.
  nodes @6 :List(Text);
  nodeRank @7 :Int32;
  # Inter-node allreduce algorithm: "ring", "rhd", "auto", or "" for the daemon's default.
  algorithm @8 :Text;
  # What the job's f32 allreduces send between nodes: "none", "bf16", or "" for the daemon's
  # default.
  wireCodec @9 :Text;
  # Whether the daemons tune the job's settings over its first steps (docs/autotune.md).
  autotune @10 :Autotune;
  # The aggregators the job sums through (HOST:PORT), empty for the daemon's default.
  aggregators @11 :List(Text);
  # The job this one is a part of (empty: none), and each of this job's ranks' rank in it
  # (worldSize entries): a rank that job loses to a fault fails this job too (gradsync.h).
  parentJob @12 :Text;
  parentRanks @13 :List(Int32);
}

enum Autotune {
  default @0;  # the daemon's configuration decides
  on @1;
  off @2;
}

# Sent with two fds: the control segment (memfd) and the doorbell (eventfd).
struct Welcome {
  clientId @0 :UInt64;
  ringEntries @1 :UInt32;
  segmentBytes @2 :UInt64;
}

# Registers [offset, offset + bytes) of some memory as buffer `bufferId`.
struct RegisterBuffer {
  bufferId @0 :UInt32;
  offset @1 :UInt64;
  bytes @2 :UInt64;
  memory :union {
    # Sent with one fd: the sealed memfd holding the buffer.
    host @3 :Void;
    # Device memory, no fd: the offset is from the base of the allocation the handle names.
    cudaIpc @4 :CudaIpcMemory;
    # Device memory from the CUDA VMM API (cuMemCreate: PyTorch's expandable segments), which
    # CUDA IPC cannot share: sent with one POSIX fd per physical segment the range spans, in
    # address order, the segments mapped one after the other; the offset is from the start of
    # the first.
    cudaVmm @5 :CudaVmmMemory;
  }
  # Device memory: whether the rank's context on the device is shared through NVIDIA MPS. The
  # daemon warns where it differs from its own (the two then time-slice the GPU).
  rankMps @6 :MpsState;
}

enum MpsState {
  unknown @0;    # not asked (host memory, a framework's own IPC handles)
  shared @1;
  notShared @2;
}

struct CudaVmmMemory {
  segmentBytes @0 :List(UInt64);  # each segment's mapped size, in address order
  deviceUuid @1 :Data;            # the device's UUID, 16 bytes
}

struct CudaIpcMemory {
  handle @0 :Data;      # cudaIpcMemHandle_t of the allocation, 64 bytes
  deviceUuid @1 :Data;  # the device's UUID (cudaDeviceProp::uuid), 16 bytes
}

# The events a rank records on its CUDA stream after writing a gradient, one per slot
# (cudaIpcEventHandle_t, 64 bytes each), made on the device named. Answered with the daemon's
# completion events, one per slot, which it records after the collective that used the slot.
struct RegisterEvents {
  readyEvents @0 :List(Data);
  deviceUuid @1 :Data;
}

struct RegisteredEvents {
  completionEvents @0 :List(Data);
}

struct UnregisterBuffer {
  bufferId @0 :UInt32;
}

# An operator's question (gradsyncctl). Allowed instead of a hello: an inspecting connection
# never joins a job. Answered with a Report.
struct Inspect {
  union {
    status @0 :Void;  # daemon, configuration, clients, jobs and peers
    trace @1 :TraceRequest;
    nodeAddress @2 :Void;  # where other nodes reach this daemon: answered with nodeAddress
    # A job of the asker's (by name): answered with waitingFor, what its oldest collective that
    # some of its ranks or nodes submitted waits for, naming the others ("" for nothing).
    waitingFor @3 :Text;
  }
}

# Records a job's per-tensor events on this node for `steps` steps (a step ends when the
# first tensor recorded becomes ready again), at most `maxEvents`, at most `timeoutSeconds`.
struct TraceRequest {
  job @0 :Text;
  steps @1 :UInt32;
  maxEvents @2 :UInt32;
  timeoutSeconds @3 :UInt32;
}

struct Request {
  union {
    hello @0 :Hello;
    registerBuffer @1 :RegisterBuffer;
    unregisterBuffer @2 :UnregisterBuffer;
    goodbye @3 :Void;
    inspect @4 :Inspect;
    registerEvents @5 :RegisterEvents;
  }
}

struct Error {
  code @0 :UInt32;     # a gradsync_result
  message @1 :Text;
}

struct Reply {
  union {
    ok @0 :Void;
    welcome @1 :Welcome;
    error @2 :Error;
    report @3 :Report;
    events @4 :RegisteredEvents;
    nodeAddress @5 :Text;  # HOST:PORT
    waitingFor @6 :Text;
  }
}

# Sent with one fd: a sealed memfd holding the answer as JSON (status: an object; trace: the
# Chrome trace-event format), too large for a frame in general.
struct Report {
  bytes @0 :UInt64;
}
