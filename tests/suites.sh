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
#
# A suite cannot hang the run: each has a budget of SUITE_BUDGET seconds (default 1200; a whole
# make test takes about 6 min here, make test-servers runs four suites of about 2 min side by
# side). Past it, its log gets every process the suite still runs (the test binary or file names
# the test: libtest also prints "has been running for over 60 seconds" for it) and, where gdb is
# installed, every thread's stack of each Rust test binary among them; then the suite is ended
# (SIGTERM to its process group, SIGKILL 10 s later) and counts as failed. Inside the suites a
# single test has its own limit: pytest-timeout (clients/python/pyproject.toml), node
# --test-timeout (clients/node/package.json), the harness's deadlines on every wait and read.
set -uo pipefail
cd "$(dirname "$0")/.."
logs=target/test-logs
mkdir -p "$logs"
budget=${SUITE_BUDGET:-1200}

# Report what suite NAME (session SID) is still running, with stacks, then end it.
overran() {
  local name=$1 sid=$2 pid exe
  echo "== $name: still running after its budget of $budget s; its processes:"
  ps -s "$sid" -o pid=,etimes=,args= | sed 's/^/   /'
  if command -v gdb >/dev/null; then
    for pid in $(ps -s "$sid" -o pid=); do
      exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || continue
      case $exe in
        */target/debug/deps/*)
          echo "== stacks of $pid ($exe):"
          timeout 60 gdb -p "$pid" -batch -nx -ex 'thread apply all bt' 2>/dev/null | grep -E '^(Thread|#)'
          ;;
      esac
    done
  fi
  kill -TERM -- "-$sid" 2>/dev/null
  for _ in $(seq 10); do
    kill -0 "$sid" 2>/dev/null || return 0
    sleep 1
  done
  kill -KILL -- "-$sid" 2>/dev/null
}

names=()
pids=()
# At most SUITE_JOBS suites at once (0, the default: all). make test-servers' thirteen suites
# side by side on CI's 2 cores stretched the waits of timing-bound tests past their windows
# (CI run 35); it runs six at a time, the longest first.
max=${SUITE_JOBS:-0}
while [ $# -ge 2 ]; do
  name=$1 cmd=$2
  shift 2
  while ((max > 0)) && (($(jobs -rp | wc -l) >= max)); do
    sleep 1
  done
  names+=("$name")
  (
    start=$SECONDS
    # Its own session (and process group), so the watchdog can end all of it; an interrupt of
    # the run is passed on.
    setsid bash -c "$cmd" &
    suite=$!
    trap 'kill -TERM -- -$suite 2>/dev/null' INT TERM
    while kill -0 "$suite" 2>/dev/null; do
      if ((SECONDS - start > budget)); then
        overran "$name" "$suite"
        break
      fi
      sleep 1
    done
    wait "$suite"
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
