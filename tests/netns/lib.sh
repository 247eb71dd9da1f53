# Shared by the namespace-cluster tests: sourced after setting `build`, `source`, `nodes`,
# `ranks_per_node` and GRADSYNC_NETNS_PREFIX; exits 77 (skipped) without root. Brings the
# cluster up with one gradsyncd per node (UCX over TCP on the node's veth, a shared cluster
# key, extra daemon flags in `daemon_flags`; links shaped to `cluster_rate` when it is set,
# say 1gbit), and tears it all down on exit.
#
#   start_cluster              namespaces, key, daemons; waits for every socket
#   start_daemon n             node n's daemon (again, after it died: its log goes on)
#   run_ranks JOB SCENARIO...  ranks_per_node ranks per node; returns their worst status
#   node_log n                 node n's daemon log
#   daemon_usage n             node n's daemon: fds, memfd mappings, resident KiB
#   daemon_running n           whether node n's daemon runs
#   wait_daemon_gone n         until it has exited (10 s at most)
# Network namespaces need root: without it, skip (77, as ctest expects).
if (( EUID != 0 )); then
  echo "skipped: the namespace cluster needs root (network namespaces)"
  exit 77
fi
cluster="$source/scripts/netns-cluster"
work=$(mktemp -d)
daemons=()
addresses=""
[[ -n "${daemon_flags+set}" ]] || daemon_flags=()
cluster_rate=${cluster_rate:-}

cleanup() {
  for pid in "${daemons[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for n in "${!daemons[@]}"; do wait_daemon_gone "$n"; done
  "$cluster" down "$nodes"
  rm -rf "$work"
}
trap cleanup EXIT

start_cluster() {
  "$cluster" up "$nodes" ${cluster_rate:+--rate "$cluster_rate"}
  for ((n = 0; n < nodes; n++)); do
    addresses+="${addresses:+,}$("$cluster" address "$n"):9478"
  done
  # The nodes authenticate each other with a shared cluster key, as in production.
  (umask 077 && head -c 32 /dev/urandom >"$work/cluster.key")
  # All started first, then waited for: their start-ups overlap.
  for ((n = 0; n < nodes; n++)); do launch_daemon "$n"; done
  for ((n = 0; n < nodes; n++)); do wait_for_socket "$n"; done
}

start_daemon() {
  launch_daemon "$1"
  wait_for_socket "$1"
}

launch_daemon() {
  local n=$1
  # A daemon killed outright leaves its socket file; the new one replaces it.
  rm -f "$work/node$n.sock"
  # Nodes share no memory: UCX must use TCP, on the node's veth.
  "$cluster" exec "$n" env UCX_TLS=tcp UCX_NET_DEVICES=eth0 "$build/gradsyncd" \
    --socket "$work/node$n.sock" --listen "$("$cluster" address "$n"):9478" \
    --cluster-key-file "$work/cluster.key" --metrics-listen "" "${daemon_flags[@]}" \
    >>"$work/node$n.log" 2>&1 &
  daemons[n]=$!
  # Not a job of this shell: one killed on purpose (scripts/soak) is not reported as killed.
  disown "${daemons[n]}"
}

wait_for_socket() {
  local n=$1
  for _ in $(seq 100); do [[ -S "$work/node$n.sock" ]] && break; sleep 0.1; done
  [[ -S "$work/node$n.sock" ]] || { cat "$work/node$n.log"; echo "node $n's daemon did not start"; exit 1; }
}

node_log() { cat "$work/node$1.log"; }

# fds, memfd mappings and resident KiB of node n's daemon.
daemon_usage() {
  local pid=${daemons[$1]}
  echo "$(ls "/proc/$pid/fd" | wc -l) $(grep -c 'memfd:gradsync' "/proc/$pid/maps" || true)" \
    "$(awk '/^VmRSS/ {print $2}' "/proc/$pid/status")"
}

daemon_running() {
  local state
  state=$(awk '{print $3}' "/proc/${daemons[$1]}/stat" 2>/dev/null) || return 1
  [[ -n "$state" && "$state" != Z ]]
}

wait_daemon_gone() {
  for _ in $(seq 200); do daemon_running "$1" || return 0; sleep 0.05; done
}

# Prints the daemons' last lines and the reason, and exits.
fail() {
  for ((n = 0; n < nodes; n++)); do echo "--- node $n"; tail -40 "$work/node$n.log"; done
  # GRADSYNC_KEEP_LOGS=DIR keeps every log of the run there.
  if [[ -n "${GRADSYNC_KEEP_LOGS:-}" ]]; then cp "$work"/*.log "$GRADSYNC_KEEP_LOGS"/; fi
  echo "FAILED: $*"
  exit 1
}

run_ranks() {
  local job=$1; shift
  local pids=() world=$((nodes * ranks_per_node)) worst=0 status
  for ((n = 0; n < nodes; n++)); do
    for ((l = 0; l < ranks_per_node; l++)); do
      "$cluster" exec "$n" env GRADSYNC_SOCKET="$work/node$n.sock" GRADSYNC_JOB="$job" \
        GRADSYNC_NODES="$addresses" GRADSYNC_NODE_RANK="$n" RANK=$((n * ranks_per_node + l)) \
        WORLD_SIZE="$world" LOCAL_RANK="$l" LOCAL_WORLD_SIZE="$ranks_per_node" \
        timeout 120 "$build/gradsync-test-rank" "$@" &
      pids+=($!)
    done
  done
  for pid in "${pids[@]}"; do
    status=0
    wait "$pid" || status=$?
    (( status > worst )) && worst=$status
  done
  return "$worst"
}

# run_ranks that must pass: prints the daemons' last lines and exits when it does not.
expect_ranks_pass() {
  local job=$1
  run_ranks "$@" || fail "$job (${*:2})"
  echo "passed: $job (${*:2})"
}
