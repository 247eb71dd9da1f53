# Control messages between the node daemons of a job (over the UCX mesh, tag kind "control").
@0xd7a4c3b2e1f09a85;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("gradsync::daemon::wire");

# All local ranks of the job have connected on the sending node. The job runs with node 0's
# settings (every node must agree, or their response caches would diverge).
struct Joined {
  cacheCapacity @0 :UInt32;
  algorithm @1 :Text;   # "auto", "ring" or "rhd"
  # Allreduces decided in one cycle are fused up to this many bytes (every node must cut the
  # same batches).
  fusionThresholdBytes @2 :UInt64;
  wireCodec @3 :Text;   # "none" or "bf16": what f32 allreduces send between nodes
  # Where a link is slow, bulk data goes in messages of at most this many bytes (0: never
  # cut): node 0's is agreed.
  slowLinkMessageBytes @4 :UInt64;
  # The job ranks of the sending node's ranks: with every node's, each node knows where every
  # rank is (a broadcast's chain starts at its root's node).
  ranks @5 :List(Int32);
  # Jobs of at least this many nodes relay their negotiation cycles (RelayedCycle): node 0's is
  # agreed.
  relayMinNodes @6 :UInt32;
  # The ring allreduce pipelines each block in pieces of about this many bytes: node 0's is
  # agreed (every node must cut the same pieces).
  pieceBytes @7 :UInt64;
  # The aggregators the sending node's ranks named (docs/aggregators.md): every node's must be
  # the same list, or their chunks would go to different places.
  aggregators @8 :List(Text);
  # Allreduces through aggregators go in chunks of at most this many bytes: node 0's is agreed.
  aggregationChunkBytes @9 :UInt64;
}

# A collective (or a group, named by its first member) ready on the sending node and not in
# the response cache. Every node keeps the reports of a name's instance until every node has
# made one, and then decides it alike (negotiator.h).
struct Ready {
  key @0 :Text;
  collective @1 :UInt8;
  dtype @2 :UInt8;
  op @3 :UInt8;
  count @4 :UInt64;
  members @5 :UInt32;
  root @6 :Int32;
  ranks @7 :Text;   # the sending node's ranks, for error messages: "ranks 2, 3"
  onDevice @8 :Bool;   # on GPU memory: staged, fused only with its kind, never sent eagerly
  priority @9 :Int32;  # gradsync_set_priority's: every node queues it by it (docs/priority.md)
  # A small collective's contribution comes with its report, as a cached one's comes with the
  # cycle (Cycle.eagerData): when every node's came, it runs from them with no further messages.
  piggybacks @10 :Bool;
  eager @11 :Data;
}

# One node's part of a negotiation cycle, sent to every other node (or relayed: RelayedCycle).
# The AND of readyBits over all nodes says which cached collectives run; the OR of invalidBits
# which cache entries are evicted (a node has that name with another size or type). The link
# figures feed the algorithm chooser: every node uses the largest of each, so every node
# chooses the same.
struct Cycle {
  number @0 :UInt64;
  readyBits @1 :List(UInt64);
  invalidBits @2 :List(UInt64);
  uncached @3 :List(Ready);
  alphaSeconds @4 :Float64;
  betaSecondsPerByte @5 :Float64;
  gammaSecondsPerByte @6 :Float64;
  # Small cached collectives piggyback on it: this node's contribution for some of the bits in
  # readyBits, by ascending bit (an allreduce's reduced over its ranks, an allgather's its
  # ranks' blocks, a broadcast's the root's data on the root's node and nothing, size 0,
  # elsewhere). A collective every node sent its contribution for in the same cycle runs from
  # these, in node order, with no further messages. The contributions lie in eagerData one
  # after another, each starting at the next multiple of 16 bytes (the reduce kernels read
  # them in place as arrays of their dtype): one blob for the lot, where a list of blobs cost
  # a pointer and a copy per tensor on each side.
  eagerBits @7 :List(UInt32);
  eagerSizes @8 :List(UInt32);
  eagerData @9 :Data;
  # Node 0's part only, in a job that autotunes (docs/autotune.md): the settings every node
  # applies to what this cycle decides, and to the cycles after until node 0 sends others.
  tuned @10 :TunedSettings;
}

struct TunedSettings {
  fusionThresholdBytes @0 :UInt64;
  pieceBytes @1 :UInt64;
  negotiationHoldMicroseconds @2 :UInt32;
  ringMinBytes @3 :UInt64;   # 0: the cost model chooses between the ring and halving-doubling
  searchDone @4 :Bool;       # node 0's search has ended: these settings stay
}

# A node's cycle passed on by another (recursive doubling, negotiator.h): `origin` wrote it.
struct RelayedCycle {
  origin @0 :UInt32;
  cycle @1 :Cycle;
}

# Ranks of a job whose connections ended on the sender without leaving it (their processes
# died): the receiver fails the jobs that are parts of this one (gradsync_job_settings
# parent_job) and hold one of them, which may never have reached the sender.
struct RanksLost {
  ranks @0 :List(Int32);
  reason @1 :Text;
}

struct NodeMessage {
  job @0 :Text;
  node @1 :UInt32;
  union {
    joined @2 :Joined;
    cycle @3 :Cycle;
    abort @4 :Text;   # the job failed on the sender: fail it here too
    relay @7 :List(RelayedCycle);   # the cycles of one number the sender knows and passes on
    ranksLost @10 :RanksLost;   # ranks of the sender's ended without leaving the job
  }
  # With abort: the sender gave up collectives every node had agreed on and it had not finished
  # (the receiver cannot finish them either: fail at once). Without: it finished all it agreed
  # to (its ranks left after their last step), and the receiver finishes those first.
  abortAbandoned @5 :Bool;
  # With abort: the last negotiation cycle the sender completed. The receiver completes it too
  # before it fails the job, and runs what it decided: the sender may have finished its part
  # of a collective decided in it (and its ranks left), while the other nodes' messages that
  # decide it here are still on their way, on connections of their own.
  abortAfterCycle @6 :UInt64;
  # A job's name may be taken again at once (an elastic restart, a script's next run): each
  # node's instance of a job has a random number of its own, which every message carries, with
  # the receiver's as the sender learnt it from the receiver's join (0: not yet). A node's
  # next instance of a job joins with a new number; a message that names another instance of
  # the receiver's job was meant for an earlier one.
  incarnation @8 :UInt64;
  peerIncarnation @9 :UInt64;
}
