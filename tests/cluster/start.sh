#!/usr/bin/env bash
# A local Redis Cluster to try redis-lock on: six redis-server processes on 127.0.0.1
# (3 masters, 3 replicas), the module loaded on each, started and created by the harness
# program (`harness cluster`, see harness/README.md) in the background.
#
#   tests/cluster/start.sh          start it and print its ports (`make cluster`)
#   tests/cluster/start.sh stop     stop it and remove its directories (`make cluster-stop`)
#   tests/cluster/start.sh status   print CLUSTER NODES of the running cluster
#
# The harness picks each port (the OS chooses it; P and its bus port P+10000 both free), runs
# each node in its own directory under <tmp>/redis-lock-tests/ with nothing persisted, and
# stops them all when it gets SIGTERM. CLUSTER_DIR keeps its pid, its JSON line and its log.
#
# Environment: REDIS_SERVER (default as the harness), REDIS_CLI (default redis-cli),
# REDIS_LOCK_MODULE (default target/release/libredis_lock.so, else target/debug/...),
# HARNESS (default target/debug/harness), CLUSTER_DIR (default target/cluster).
#
# The Rust test tests/cluster/main.rs starts and stops a cluster of its own; this script is for
# trying things by hand.

set -Eeuo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
dir=${CLUSTER_DIR:-$root/target/cluster}
cli=${REDIS_CLI:-redis-cli}
harness=${HARNESS:-$root/target/debug/harness}
me=${0#"$root/"}

die() {
    echo "cluster: $*" >&2
    exit 1
}

# The pid of this cluster's harness if it is running (and is a harness: a stale pid file must
# not make us signal someone else).
running_pid() {
    local pid
    pid=$(cat "$dir/harness.pid" 2>/dev/null) || return 0
    if [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q harness; then
        echo "$pid"
    fi
}

# The nodes' ports, from the harness's JSON line.
ports() {
    grep -o '"port":[0-9]*' "$dir/cluster.json" 2>/dev/null | cut -d: -f2 | tr '\n' ' '
}

stop() {
    local pid
    pid=$(running_pid)
    if [ -n "$pid" ]; then
        kill "$pid"
        for _ in $(seq 100); do
            [ -d "/proc/$pid" ] || break
            sleep 0.1
        done
        echo "cluster: stopped (harness $pid), removed its nodes' directories and $dir"
    fi
    rm -rf "$dir"
}

status() {
    local port
    port=$(ports | awk '{print $1}')
    [ -n "$port" ] && [ -n "$(running_pid)" ] || die "not running (start it with $me)"
    "$cli" -p "$port" cluster nodes
}

start() {
    if [ -n "$(running_pid)" ]; then
        echo "cluster: already running on ports $(ports); stop it with: $me stop"
        return 0
    fi
    rm -rf "$dir"

    local module=${REDIS_LOCK_MODULE:-}
    if [ -z "$module" ]; then
        module=$root/target/release/libredis_lock.so
        [ -f "$module" ] || module=$root/target/debug/libredis_lock.so
    fi
    [ -f "$module" ] || die "module not found at $module (run make build, or set REDIS_LOCK_MODULE)"
    module=$(cd "$(dirname "$module")" && pwd)/$(basename "$module")
    [ -x "$harness" ] || die "no harness program at $harness (run cargo build -p redis-lock-harness)"
    command -v "$cli" >/dev/null || die "$cli not found (apt-get install redis-tools)"

    mkdir -p "$dir"
    REDIS_LOCK_MODULE=$module REDIS_CLI=$cli nohup "$harness" cluster --until-signal \
        </dev/null >"$dir/cluster.json" 2>"$dir/harness.log" &
    local pid=$!
    echo "$pid" >"$dir/harness.pid"
    # The harness prints its line once every node agrees (30 s at the most).
    for _ in $(seq 600); do
        [ -s "$dir/cluster.json" ] && break
        [ -d "/proc/$pid" ] || { cat "$dir/harness.log" >&2; die "the harness failed (log above)"; }
        sleep 0.1
    done
    [ -s "$dir/cluster.json" ] || { kill "$pid"; die "no cluster after 60 s; see $dir/harness.log"; }

    local first nodes_dir
    first=$(ports | awk '{print $1}')
    nodes_dir=$(grep -o '"dir":"[^"]*"' "$dir/cluster.json" | head -1 | cut -d'"' -f4)
    echo "redis-lock cluster is up on 127.0.0.1: 3 masters, 3 replicas; module $module"
    "$cli" -p "$first" cluster nodes | tr -d '\r' | sort -k9 -n | awk '
        $3 ~ /master/ { split($2, a, "@"); slots = ""; for (i = 9; i <= NF; i++) slots = slots " " $i;
                        m[$1] = a[1]; printf "  master  %s  slots%s\n", a[1], slots }
        $3 ~ /slave/  { split($2, a, "@"); r[$4] = r[$4] " " a[1] }
        END           { for (id in r) printf "  replica%s  of %s\n", r[id], m[id] }'
    echo "Try:   $cli -c -p $first LOCK.ACQUIRE invoice:42 worker-a 30000"
    echo "Logs:  $(dirname "$nodes_dir")/node<i>/logfile"
    echo "Stop:  $me stop   (or make cluster-stop)"
}

case "${1:-start}" in
start) start ;;
stop) stop ;;
status) status ;;
*) die "usage: $me [start|stop|status]" ;;
esac
