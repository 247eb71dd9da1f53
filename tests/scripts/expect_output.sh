#!/usr/bin/env bash
# Runs a command and passes only if it exits with the expected status AND its output (stdout
# and stderr together) matches an extended regular expression: ctest's PASS_REGULAR_EXPRESSION
# alone ignores the exit status, so a tool that printed the right message and then crashed
# would pass.
#
#   expect_output.sh STATUS REGEX COMMAND...
set -uo pipefail
[[ $# -ge 3 ]] || { echo "usage: expect_output.sh STATUS REGEX COMMAND..." >&2; exit 64; }
expected=$1 regex=$2
shift 2
output="$("$@" 2>&1)"
status=$?
printf '%s\n' "$output"
if [[ $status -ne $expected ]]; then
  echo "expect_output: exit $status, expected $expected" >&2
  exit 1
fi
if ! grep -Eq -- "$regex" <<<"$output"; then
  echo "expect_output: the output does not match /$regex/" >&2
  exit 1
fi
