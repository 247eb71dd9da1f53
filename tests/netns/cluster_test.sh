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
if (( EUID != 0 )); then
  echo "skipped: the namespace cluster needs root (network namespaces)"
  exit 77
fi
export GRADSYNC_NETNS_PREFIX="gsct$$"
cluster="$source/scripts/netns-cluster"
work=$(mktemp -d)
daemons=()
cleanup() {
  for pid in "${daemons[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${daemons[@]}"; do wait "$pid" 2>/dev/null || true; done
  "$cluster" down "$nodes"
  rm -rf "$work"
}
trap cleanup EXIT

"$cluster" up "$nodes"
addresses=""
for ((n = 0; n < nodes; n++)); do
  addresses+="${addresses:+,}$("$cluster" address "$n"):9478"
done
# The nodes authenticate each other with a shared cluster key, as in production.
(umask 077 && head -c 32 /dev/urandom >"$work/cluster.key")
for ((n = 0; n < nodes; n++)); do
  # Nodes share no memory: UCX must use TCP, on the node's veth.
  "$cluster" exec "$n" env UCX_TLS=tcp UCX_NET_DEVICES=eth0 "$build/gradsyncd" \
    --socket "$work/node$n.sock" --listen "$("$cluster" address "$n"):9478" \
    --cluster-key-file "$work/cluster.key" --metrics-listen "" >"$work/node$n.log" 2>&1 &
  daemons+=($!)
done
for ((n = 0; n < nodes; n++)); do
  for _ in $(seq 100); do [[ -S "$work/node$n.sock" ]] && break; sleep 0.1; done
  [[ -S "$work/node$n.sock" ]] || { cat "$work/node$n.log"; echo "node $n's daemon did not start"; exit 1; }
done

tx_bytes() { "$cluster" exec "$1" cat /sys/class/net/eth0/statistics/tx_bytes; }
declare -a before
for ((n = 0; n < nodes; n++)); do before[n]=$(tx_bytes "$n"); done

run_ranks() {
  local job=$1; shift
  local pids=() world=$((nodes * ranks_per_node)) failed=0
  for ((n = 0; n < nodes; n++)); do
    for ((l = 0; l < ranks_per_node; l++)); do
      "$cluster" exec "$n" env GRADSYNC_SOCKET="$work/node$n.sock" GRADSYNC_JOB="$job" \
        GRADSYNC_NODES="$addresses" GRADSYNC_NODE_RANK="$n" RANK=$((n * ranks_per_node + l)) \
        WORLD_SIZE="$world" LOCAL_RANK="$l" LOCAL_WORLD_SIZE="$ranks_per_node" \
        timeout 240 "$build/gradsync-test-rank" "$@" &
      pids+=($!)
    done
  done
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  if (( failed )); then
    for ((n = 0; n < nodes; n++)); do echo "--- node $n"; tail -20 "$work/node$n.log"; done
    echo "FAILED: $job ($*)"
    exit 1
  fi
  echo "passed: $job ($*)"
}

run_ranks every_collective cluster
run_ranks training_steps steps 30

for ((n = 0; n < nodes; n++)); do
  sent=$(( $(tx_bytes "$n") - before[n] ))
  echo "node $n sent $sent bytes on its link"
  # The allreduces alone move tens of megabytes through every node's link.
  (( sent > 10000000 )) || { echo "FAILED: node $n's link carried only $sent bytes"; exit 1; }
done
for ((n = 0; n < nodes; n++)); do
  if grep -q "refused" "$work/node$n.log"; then
    grep "refused" "$work/node$n.log"
    echo "FAILED: node $n refused a node that holds the cluster key"
    exit 1
  fi
done
