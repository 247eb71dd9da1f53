#!/usr/bin/env bash
# gradsync-transport-bench end to end on loopback, small sizes: one way, both ways from one
# thread and from two, rendezvous and eager; each side checks the bytes of a transfer it received, and
# both sides must exit 0 and print their rates. A peer that never comes is an error within the
# timeout. Not a measurement.
#
#   transport_bench_test.sh TOOL
set -uo pipefail
[[ $# -eq 1 ]] || { echo "usage: transport_bench_test.sh TOOL" >&2; exit 64; }
tool=$1
# Below the kernel's ephemeral ports (32768 and up), which other tests' connections take.
port=$((20000 + RANDOM % 12000))
logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT
failed=0

# pair NAME EXPECT_A EXPECT_B ARGS_A -- ARGS_B: both sides at once; each must exit 0 and match.
pair() {
  local name=$1 expect_a=$2 expect_b=$3
  shift 3
  local a=() b=()
  while [[ $1 != -- ]]; do a+=("$1"); shift; done
  shift
  b=("$@")
  port=$((port + 2))
  local common=(--bytes 3M --piece 1M --transfers 2 --warmup 1 --timeout-s 30)
  "$tool" --listen "127.0.0.1:$port" --peer "127.0.0.1:$((port + 1))" "${common[@]}" "${a[@]}" \
    >"$logs/$name.a" 2>&1 &
  local first=$!
  "$tool" --listen "127.0.0.1:$((port + 1))" --peer "127.0.0.1:$port" "${common[@]}" "${b[@]}" \
    >"$logs/$name.b" 2>&1
  local status_b=$? status_a=0
  wait "$first" || status_a=$?
  for side in a b; do
    local status expect
    status=$status_b expect=$expect_b
    [[ $side == a ]] && status=$status_a expect=$expect_a
    if [[ $status -ne 0 ]] || ! grep -Eq "$expect" "$logs/$name.$side"; then
      echo "FAILED $name, side $side: exit $status, expected /$expect/:"
      cat "$logs/$name.$side"
      failed=1
    else
      echo "ok $name, side $side: $(grep -E 'GB/s' "$logs/$name.$side" | tr -s ' ' | tr '\n' ' ')"
    fi
  done
}

both='sent +[0-9.]+ GB/s.*received +[0-9.]+ GB/s|received +[0-9.]+ GB/s'
pair one_way 'sent +[0-9.]+ GB/s' 'received +[0-9.]+ GB/s' --direction out -- --direction in
pair one_way_eager 'sent' 'received' --direction out --bulk-protocol eager -- \
  --direction in --bulk-protocol eager
pair both_one_thread "$both" "$both" --threads 1 -- --threads 1
pair both_two_threads "$both" "$both" --threads 2 -- --threads 2
pair both_two_threads_eager "$both" "$both" --threads 2 --bulk-protocol eager -- \
  --threads 2 --bulk-protocol eager
# Sent from memory never written: the receiver checks zeros.
pair one_way_untouched 'sent +[0-9.]+ GB/s' 'received +[0-9.]+ GB/s' --direction out \
  --send-memory untouched -- --direction in --send-memory untouched
# Both sides' JSON carries both rates.
pair json '"received_gbytes_per_s":[0-9.]+' '"sent_gbytes_per_s":[0-9.]+' --json -- --json

# Nobody at the peer's address: an error naming it, within the timeout.
started=$SECONDS
output="$("$tool" --listen "127.0.0.1:$((port + 10))" --peer "127.0.0.1:$((port + 11))" \
  --timeout-s 2 2>&1)"
status=$?
if [[ $status -ne 1 ]] || ! grep -q "no connection to 127.0.0.1:$((port + 11))" <<<"$output" ||
  ((SECONDS - started > 10)); then
  echo "FAILED no_peer: exit $status after $((SECONDS - started)) s: $output"
  failed=1
else
  echo "ok no_peer: $output"
fi
# Sides told different memories: the receiver finds the bytes wrong and says what to check;
# the sender, its peer gone, fails as well.
port=$((port + 12))
"$tool" --listen "127.0.0.1:$port" --peer "127.0.0.1:$((port + 1))" --bytes 1M --transfers 1 \
  --timeout-s 10 --direction out --send-memory untouched >"$logs/mismatch.a" 2>&1 &
mismatch_sender=$!
output="$("$tool" --listen "127.0.0.1:$((port + 1))" --peer "127.0.0.1:$port" --bytes 1M \
  --transfers 1 --timeout-s 10 --direction in 2>&1)"
status=$?
wait "$mismatch_sender"
sender_status=$?
if [[ $status -ne 1 ]] || ! grep -q "same --send-memory" <<<"$output" || [[ $sender_status -eq 0 ]]; then
  echo "FAILED send_memory_mismatch: receiver exit $status, sender exit $sender_status: $output"
  failed=1
else
  echo "ok send_memory_mismatch: $output"
fi
# Two threads need both directions: a usage error.
output="$("$tool" --listen 127.0.0.1:1 --peer 127.0.0.1:2 --threads 2 --direction out 2>&1)"
if [[ $? -ne 1 ]] || ! grep -q "direction both" <<<"$output"; then
  echo "FAILED threads_need_both: $output"
  failed=1
fi
exit "$failed"
