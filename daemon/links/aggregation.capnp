# Messages between a job's node daemons ("workers") and its aggregators (docs/aggregators.md),
# over the UCX mesh, tag kind "aggregation". The data itself goes under the kinds "push"
# (a worker's chunk, to its aggregator) and "sum" (the chunk summed over every worker, back).
@0x9b1f6e0c2d7a4e53;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("gradsync::daemon::wire");

# A worker's job has formed across its nodes: the aggregator serves it from now on.
struct AggregationJoin {
  nodes @0 :List(Text);        # the job's worker node daemons, in node order
  aggregators @1 :List(Text);  # the job's aggregators, in order
  index @2 :UInt32;            # the receiver's place among them
  chunkBytes @3 :UInt64;       # the largest chunk (aggregation_plan.h)
}

# A collective the worker pushes chunks of (the receiver's share of them; aggregation_plan.h
# cuts them alike on every side). Every worker announces it; all must agree.
struct AggregationBatch {
  sequence @0 :UInt32;   # the collective's number in the job: its tags name it
  dtype @1 :UInt8;
  op @2 :UInt8;          # what the aggregator applies (an average's sum: workers divide)
  count @3 :UInt64;      # elements in the whole collective
  bf16 @4 :Bool;         # f32 values travel as bf16 both ways (the wire codec)
}

struct AggregationMessage {
  job @0 :Text;
  node @1 :UInt32;          # the sending worker's node index (0 from an aggregator)
  incarnation @2 :UInt64;   # the sending worker's instance of the job (internode.capnp)
  union {
    join @3 :AggregationJoin;
    batch @4 :AggregationBatch;
    leave @5 :Text;   # worker: the job ended here ("") or failed (why); its state may go
    error @6 :Text;   # aggregator: the job cannot go on (sent to every node of it)
  }
  from @7 :Text;      # the sender's inter-node address (an aggregator names itself)
}
