#!/usr/bin/env bash
# The integration suite with every redis-server under valgrind memcheck, then a verdict on
# whether any memory error or definite leak comes from the module.
#
#   tests/memcheck.sh
#
# Two phases:
#  1. `cargo test --test contract --test blocking --test persistence` with REDIS_LOCK_VALGRIND
#     set: the harness (harness/src/valgrind.rs) runs every server as `valgrind --tool=memcheck
#     ... redis-server ...` (one log per process: <dir>/logs/vg-<pid>.log). This finds invalid
#     reads and writes, uses of uninitialised memory and bad frees as they happen. The harness
#     then stops each server with SIGTERM rather than SIGKILL, so valgrind also runs its leak
#     check for every server a test did not kill -9 on purpose; the script counts the logs
#     without one and says so.
#  2. A scripted workload (redis-cli: grants, retries, extends, releases,
#     errors, blocked waiters handed the lock by release, expiry and DEL, a timeout, a
#     disconnected waiter, a waiter failed by WRONGTYPE, DEBUG RELOAD, an AOF rewrite, a
#     thousand pipelined locks) against one server under valgrind, started by the harness
#     program (`target/debug/harness server`), that is then stopped with SHUTDOWN, so valgrind
#     runs its leak check.
#
# Then every log is read: each error record ("Invalid read", "Invalid write", "definitely
# lost", "uninitialised", "Invalid free", ...) is attributed to the module when one of its
# stack frames is in libredis_lock.so or a redis_lock:: / redis_module:: function, and to the
# server otherwise.
#
# Environment (all optional):
#   MEMCHECK_SERVER   server binary (default /usr/bin/redis-server)
#   MEMCHECK_DIR      output directory (default target/memcheck; emptied first)
#   MEMCHECK_THREADS  cargo test threads (default 1: each valgrind'd server takes a core)
#   MEMCHECK_TESTS    integration test crates (default "contract blocking persistence"; set it
#                     empty to run phase 2 only)
#
# Exit status: 0 nothing attributable to the module and every test passed; 1 an error or a
# definite leak attributable to the module; 2 setup failure; 3 nothing attributable to the
# module, but some tests failed (slowness under valgrind; see the cargo log).

set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
server="${MEMCHECK_SERVER:-/usr/bin/redis-server}"
out="${MEMCHECK_DIR:-$root/target/memcheck}"
threads="${MEMCHECK_THREADS:-1}"
tests="${MEMCHECK_TESTS-contract blocking persistence}"
module="$root/target/debug/libredis_lock.so"

say() { printf 'memcheck: %s\n' "$*"; }
die() { say "$*" >&2; exit 2; }

# --- Setup -------------------------------------------------------------------------

if ! command -v valgrind >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        say "installing valgrind"
        DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q valgrind >/dev/null
    else
        die "valgrind is missing: sudo apt-get install -y valgrind"
    fi
fi
[ -x "$server" ] || die "no server at $server (set MEMCHECK_SERVER)"
command -v redis-cli >/dev/null || die "redis-cli is missing (apt-get install redis-tools)"

say "building the module (debug, with symbols) and the harness program"
cargo build -q --workspace
[ -f "$module" ] || die "no module at $module"
harness="$root/target/debug/harness"

rm -rf "$out"
mkdir -p "$out/logs"
say "$(valgrind --version) on $("$server" --version | cut -d' ' -f1-3)"

# --- Phase 1: the integration suite ------------------------------------------------------

test_args=()
for t in $tests; do test_args+=(--test "$t"); done
tests_status=0
if [ ${#test_args[@]} -gt 0 ]; then
    say "phase 1: cargo test ${test_args[*]} -- --test-threads=$threads (every server under valgrind)"
    started=$(date +%s)
    set +e
    REDIS_SERVER="$server" REDIS_LOCK_MODULE="$module" REDIS_LOCK_VALGRIND="$out/logs" \
        cargo test "${test_args[@]}" -- --test-threads="$threads" >"$out/cargo-test.log" 2>&1
    tests_status=$?
    set -e
    say "phase 1: cargo test exited $tests_status after $(( $(date +%s) - started )) s; log: $out/cargo-test.log"
    grep -E '^test result:|^test .* FAILED$' "$out/cargo-test.log" | sed 's/^/    /' || true
else
    say "phase 1: skipped (MEMCHECK_TESTS is empty)"
fi

# --- Phase 2: a workload that ends with SHUTDOWN, for the leak check ----------------------

say "phase 2: scripted workload, then SHUTDOWN so that valgrind checks for leaks"
work="$out/workload"
mkdir -p "$work"
# The harness prints {"port":...,"pid":...,"dir":...} once the server answers, and stops it
# when its stdin closes; its exit status is then the server's (99: valgrind found errors).
coproc HARNESS { REDIS_SERVER="$server" REDIS_LOCK_MODULE="$module" REDIS_LOCK_VALGRIND="$out/logs" \
    "$harness" server -- --appendonly yes 2>"$work/harness.stderr"; }
harness_pid=$HARNESS_PID
read -r line <&"${HARNESS[0]}" || die "phase 2: the server did not start; see $work/harness.stderr"
port=$(sed -n 's/.*"port":\([0-9]*\).*/\1/p' <<<"$line")
server_pid=$(sed -n 's/.*"pid":\([0-9]*\).*/\1/p' <<<"$line")
cli() { redis-cli -p "$port" "$@"; }
[ "$(cli PING 2>/dev/null)" = PONG ] || die "phase 2: the server does not answer; see $work"

waiters() { cli INFO lock | tr -d '\r' | sed -n 's/^lock_waiters://p'; }
wait_waiters() {
    for _ in $(seq 1 600); do
        [ "$(waiters)" = "$1" ] && return 0
        sleep 0.05
    done
    die "phase 2: lock_waiters never reached $1"
}
# A blocked waiter in the background; its reply goes to $work/<name>.out.
waiter_pids=()
waiter() {
    # redis-cli itself, not the cli function: $! must be the client, so that killing it
    # closes the connection.
    redis-cli -p "$port" LOCK.ACQUIRE "$1" "$2" 5000 BLOCK "${3:-0}" >"$work/$2.out" 2>&1 &
    waiter_pid=$!
    waiter_pids+=("$waiter_pid")
}
# Whatever happens, do not leave the server (or a waiter) running: the harness kills the
# server on SIGTERM.
stop_phase2() {
    for pid in "${waiter_pids[@]}" "$harness_pid"; do
        kill "$pid" 2>/dev/null || true
    done
}
trap stop_phase2 EXIT

{
    cli LOCK.ACQUIRE a alice 60000
    cli LOCK.ACQUIRE a alice 60000
    cli LOCK.ACQUIRE a bob 60000
    cli LOCK.EXTEND a alice 120000
    cli LOCK.FENCE a
    cli LOCK.FENCE a 1
    cli LOCK.INFO a
    cli LOCK.RELEASE a bob
    cli LOCK.RELEASE a alice
    # Refusals.
    cli LOCK.ACQUIRE a "" 10
    cli LOCK.ACQUIRE a x 0
    cli LOCK.ACQUIRE a x 99999999999999999999
    cli LOCK.ACQUIRE a x 10 BLOCK -1
    cli LOCK.ACQUIRE a x 10 BLOCK 1 BLOCK 2
    cli LOCK.ACQUIRE a x 10 FOO
    cli LOCK.FENCE a x
    cli LOCK.INFO
    cli LOCK.LOAD a x 1 1
    cli SET s v
    cli LOCK.ACQUIRE s x 10
    cli LOCK.FENCE s
    # Blocked waiters handed the lock by LOCK.RELEASE, in order.
    cli LOCK.ACQUIRE b holder 60000
    waiter b w1; wait_waiters 1
    waiter b w2; wait_waiters 2
    cli LOCK.RELEASE b holder; wait_waiters 1
    cli LOCK.RELEASE b w1; wait_waiters 0
    cli LOCK.RELEASE b w2
    # A timeout, and a waiter that disconnects.
    cli LOCK.ACQUIRE c holder 60000
    cli LOCK.ACQUIRE c w3 1000 BLOCK 50
    waiter c w4; wait_waiters 1
    kill "$waiter_pid"; wait "$waiter_pid" 2>/dev/null || true; wait_waiters 0
    # Handoff at the holder's deadline, on DEL, and a waiter failed by WRONGTYPE.
    cli LOCK.ACQUIRE d holder 300
    waiter d w5; wait_waiters 1; wait_waiters 0
    cli LOCK.ACQUIRE e holder 60000
    waiter e w6; wait_waiters 1
    cli DEL e; wait_waiters 0
    cli LOCK.ACQUIRE f holder 60000
    waiter f w7; wait_waiters 1
    cli SET f overwritten; wait_waiters 0
    for pid in "${waiter_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    # Persistence: RDB through DEBUG RELOAD, and an AOF rewrite.
    cli LOCK.ACQUIRE g holder 60000
    cli DEBUG RELOAD
    cli LOCK.FENCE g
    cli BGREWRITEAOF
    sleep 2
    # A thousand locks, then FLUSHALL.
    for i in $(seq 1 1000); do
        printf 'LOCK.ACQUIRE many:%d owner-%d 60000\n' "$i" "$i"
    done | cli >/dev/null
    cli INFO lock
    cli MEMORY USAGE many:1
    cli FLUSHALL
} >"$work/workload.log" 2>&1
cli SHUTDOWN NOSAVE >/dev/null 2>&1 || true
# Give valgrind's leak check time to finish (until the server is a zombie its harness has
# not reaped yet), then close the harness's stdin: it reaps the server and exits with its status.
for _ in $(seq 1 600); do
    state=$(ps -o stat= -p "$server_pid" 2>/dev/null) || break
    [[ $state == Z* ]] && break
    sleep 0.1
done
exec {HARNESS[1]}>&-
set +e
wait "$harness_pid"
workload_status=$?
set -e
trap - EXIT
say "phase 2: the server exited $workload_status (99: valgrind found errors); log: $work/workload.log"
for w in w1 w2 w3 w5 w6 w7; do
    [ -f "$work/$w.out" ] && printf '    waiter %s answered: %s\n' "$w" "$(tr '\n' ' ' <"$work/$w.out")"
done

# --- Verdict ---------------------------------------------------------------------------

# One line per error record: "<log>\t<module|server>\t<kind>\t<first frame in the module or
# the first frame>". A record starts with a line that is not indented and ends at a blank one.
report="$out/errors.tsv"
: >"$report"
for log in "$out"/logs/vg-*.log; do
    [ -e "$log" ] || continue
    awk -v logname="$(basename "$log")" '
        function flush() {
            if (kind != "") {
                print logname "\t" (mod != "" ? "module" : "server") "\t" kind "\t" (mod != "" ? mod : first)
            }
            kind = ""; mod = ""; first = ""
        }
        {
            sub(/^==[0-9]+== ?/, "")
            if ($0 == "") { flush(); next }
            if ($0 ~ /^ /) {
                if (kind != "" && ($0 ~ /libredis_lock/ || $0 ~ /redis_lock::/ || $0 ~ /redis_module::/) && mod == "") {
                    mod = $0; sub(/^ +(at|by) 0x[0-9A-F]+: /, "", mod)
                }
                if (kind != "" && first == "" && $0 ~ /(at|by) 0x/) {
                    first = $0; sub(/^ +(at|by) 0x[0-9A-F]+: /, "", first)
                }
                next
            }
            if ($0 ~ /^Invalid (read|write|free)/ || $0 ~ /definitely lost in loss record/ ||
                $0 ~ /^Conditional jump/ || $0 ~ /^Use of uninitialised/ ||
                $0 ~ /^Mismatched free/ || $0 ~ /^Syscall param/ ||
                $0 ~ /^Source and destination overlap/ || $0 ~ /^Argument .* of function/) {
                kind = $0; sub(/ \(.*$/, "", kind)
                if (kind ~ /definitely lost/) kind = "definitely lost"
            }
        }
        END { flush() }
    ' "$log" >>"$report"
done

logs=$(find "$out/logs" -name 'vg-*.log' | wc -l)
with_leak_check=$(grep -l 'LEAK SUMMARY' "$out"/logs/vg-*.log 2>/dev/null | wc -l || true)
module_errors=$(awk -F'\t' '$2 == "module"' "$report" | wc -l)
server_errors=$(awk -F'\t' '$2 == "server"' "$report" | wc -l)
definitely=$(grep -h 'definitely lost:' "$out"/logs/vg-*.log 2>/dev/null |
    awk '{gsub(",", "", $4); b += $4} END {print b + 0}')

say "valgrind logs: $logs ($with_leak_check ran the leak check; the others were SIGKILLed by the harness)"
say "definitely lost in total: $definitely bytes"
say "error records attributable to the module: $module_errors; to the server: $server_errors (all in $report)"
if [ "$module_errors" -gt 0 ]; then
    awk -F'\t' '$2 == "module" {print "    " $3 ": " $4 "  [" $1 "]"}' "$report" | sort | uniq -c | sort -rn | head -20
fi
if [ "$server_errors" -gt 0 ]; then
    awk -F'\t' '$2 == "server" {print "    " $3 ": " $4}' "$report" | sort | uniq -c | sort -rn | head -10
fi

if [ "$module_errors" -gt 0 ]; then
    say "FAIL: memory errors or definite leaks in the module"
    exit 1
fi
if [ "$tests_status" -ne 0 ] || [ "$workload_status" -ne 0 ]; then
    say "nothing attributable to the module, but phase 1 exited $tests_status and phase 2 $workload_status"
    exit 3
fi
say "OK: nothing attributable to the module"
