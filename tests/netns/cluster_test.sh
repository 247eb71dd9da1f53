#!/usr/bin/env bash
# Three nodes in network namespaces (scripts/netns-cluster), each with its own gradsyncd
# talking UCX over TCP on its veth, and real ranks: every collective, dtype and op, then
# training-shaped steps through the response cache, each result checked against the
# reference. Checks that the bytes really crossed the namespaces' links.
#
#   tests/netns/cluster_test.sh BUILD_DIR SOURCE_DIR
#
# Needs root; exits 77 (skipped) without it. CI runs as root.
set -euo pipefail
build=$1
source=$2
nodes=3
ranks_per_node=2
export GRADSYNC_NETNS_PREFIX="gsct$$"
source "$source/tests/netns/lib.sh"
start_cluster

tx_bytes() { "$cluster" exec "$1" cat /sys/class/net/eth0/statistics/tx_bytes; }
declare -a before
for ((n = 0; n < nodes; n++)); do before[n]=$(tx_bytes "$n"); done

expect_ranks_pass every_collective cluster
expect_ranks_pass training_steps steps 30

for ((n = 0; n < nodes; n++)); do
  sent=$(( $(tx_bytes "$n") - before[n] ))
  echo "node $n sent $sent bytes on its link"
  # The allreduces alone move tens of megabytes through every node's link.
  (( sent > 10000000 )) || { echo "FAILED: node $n's link carried only $sent bytes"; exit 1; }
done
for ((n = 0; n < nodes; n++)); do
  if node_log "$n" | grep -q "refused"; then
    node_log "$n" | grep "refused"
    echo "FAILED: node $n refused a node that holds the cluster key"
    exit 1
  fi
done
