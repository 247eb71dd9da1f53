# Control messages between node daemons of a job (over the UCX mesh, tag kind "control").
@0xd7a4c3b2e1f09a85;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("gradsync::daemon::wire");

# A collective (or a group, named by its first member) is ready on the sending node.
struct Ready {
  key @0 :Text;
  collective @1 :UInt8;
  dtype @2 :UInt8;
  op @3 :UInt8;
  count @4 :UInt64;
  members @5 :UInt32;
  root @6 :Int32;
}

# From the coordinator (node 0): run `key` as collective number `sequence` of the job, or fail
# it with `error` when the nodes disagree.
struct Go {
  key @0 :Text;
  sequence @1 :UInt64;
  error @2 :Text;
}

struct NodeMessage {
  job @0 :Text;
  node @1 :UInt32;
  union {
    ready @2 :Ready;
    go @3 :Go;
    abort @4 :Text;   # the job failed on the sender: fail it here too
  }
}
