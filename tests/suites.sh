#!/usr/bin/env bash
# Run test suites side by side, each with its output in target/test-logs/NAME.log, and print each
# log whole once all have ended (in the order given, never interleaved). Fails, naming them, if
# any suite failed.
#
#   tests/suites.sh NAME 'command' [NAME 'command' ...]
#
# Why side by side: the client suites (Python with two redis-py versions, Node) spend their time
# waiting on servers, timeouts and child processes, not on the CPU (redis-py 8's suite: 8 s of
# CPU in 90 s), so on CI's 2 cores running them together takes the time of the longest instead of
# the sum. Every suite starts its own servers on ports the OS picks, so they never share one.
set -uo pipefail
cd "$(dirname "$0")/.."
logs=target/test-logs
mkdir -p "$logs"
names=()
pids=()
while [ $# -ge 2 ]; do
  name=$1 cmd=$2
  shift 2
  names+=("$name")
  (
    start=$SECONDS
    bash -c "$cmd"
    rc=$?
    echo "== $name: exit $rc after $((SECONDS - start)) s"
    exit $rc
  ) >"$logs/$name.log" 2>&1 &
  pids+=($!)
  echo "== $name: started (output in $logs/$name.log)"
done
failed=()
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || failed+=("${names[$i]}")
done
for name in "${names[@]}"; do
  echo "==================== $name"
  cat "$logs/$name.log"
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED: ${failed[*]}"
  exit 1
fi
echo "== all passed: ${names[*]}"
