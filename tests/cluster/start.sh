#!/usr/bin/env bash
# A local Redis Cluster to try redis-lock on: six redis-server processes on 127.0.0.1
# (3 masters, 3 replicas), the module loaded on each, created with
# `redis-cli --cluster create ... --cluster-replicas 1`.
#
#   tests/cluster/start.sh          start it and print its ports (`make cluster`)
#   tests/cluster/start.sh stop     stop it and remove its directory (`make cluster-stop`)
#   tests/cluster/start.sh status   print CLUSTER NODES of the running cluster
#
# Ports: the OS picks each one (a bind to 127.0.0.1:0), keeping only ports P whose cluster bus
# port P+10000 is free too. Each node runs in its own directory under CLUSTER_DIR, with its
# log, pid file and nodes.conf; nothing is persisted (no RDB, no AOF).
#
# Environment: REDIS_SERVER (default redis-server), REDIS_CLI (default redis-cli),
# REDIS_LOCK_MODULE (default target/release/libredis_lock.so, else target/debug/...),
# CLUSTER_DIR (default target/cluster).
#
# The Rust test tests/cluster/main.rs starts and stops a cluster of its own; this script is for
# trying things by hand.

set -Eeuo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
dir=${CLUSTER_DIR:-$root/target/cluster}
server=${REDIS_SERVER:-redis-server}
cli=${REDIS_CLI:-redis-cli}
nodes=6
me=${0#"$root/"}

die() {
    echo "cluster: $*" >&2
    exit 1
}

# The pids of this cluster's nodes that are still running (from their pid files, and only if
# the process is a redis-server: a stale pid file must not make us signal someone else).
running_pids() {
    local pidfile pid
    for pidfile in "$dir"/*/redis.pid; do
        # A node deletes its pid file as it exits, possibly between the glob and the read.
        pid=$(cat "$pidfile" 2>/dev/null) || continue
        if [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q redis; then
            echo "$pid"
        fi
    done
}

stop() {
    local pids pid
    pids=$(running_pids)
    for pid in $pids; do
        kill "$pid" 2>/dev/null || true
    done
    for _ in $(seq 50); do
        [ -z "$(running_pids)" ] && break
        sleep 0.1
    done
    for pid in $(running_pids); do
        kill -9 "$pid" 2>/dev/null || true
    done
    rm -rf "$dir"
    [ -n "$pids" ] && echo "cluster: stopped $(echo "$pids" | wc -w) node(s), removed $dir"
    return 0
}

# Print $nodes ports P, each with P and P+10000 free right now. The sockets are held until all
# are picked, so the ports are distinct.
pick_ports() {
    command -v python3 >/dev/null || die "python3 is needed to pick free ports (apt-get install python3)"
    python3 - "$nodes" <<'EOF'
import socket, sys
n, held, ports = int(sys.argv[1]), [], []
for _ in range(1000):
    if len(ports) == n:
        break
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    if port + 10000 > 65535:
        s.close()
        continue
    bus = socket.socket()
    try:
        bus.bind(("127.0.0.1", port + 10000))
    except OSError:
        s.close()
        bus.close()
        continue
    held += [s, bus]
    ports.append(port)
if len(ports) < n:
    sys.exit("no free ports")
print(" ".join(map(str, ports)))
EOF
}

# Wait until `$cli -p $1 $2...` prints $want, for up to $deadline seconds.
wait_reply() {
    local port=$1 want=$2 deadline=$3
    shift 3
    for _ in $(seq $((deadline * 10))); do
        [ "$("$cli" -p "$port" "$@" 2>/dev/null | tr -d '\r')" = "$want" ] && return 0
        sleep 0.1
    done
    return 1
}

# True if node $1 reports cluster_state:ok, knows the 3 replicas, and flags no node as failing
# or still joining; and, if it is a replica, its link to its master is up.
settled() {
    local port=$1 nodes_out info
    info=$("$cli" -p "$port" cluster info 2>/dev/null | tr -d '\r')
    nodes_out=$("$cli" -p "$port" cluster nodes 2>/dev/null | tr -d '\r')
    grep -qx 'cluster_state:ok' <<<"$info" || return 1
    [ "$(awk '$3 ~ /slave/' <<<"$nodes_out" | wc -l)" -eq 3 ] || return 1
    ! awk '{print $3}' <<<"$nodes_out" | grep -Eq 'fail|handshake|noaddr' || return 1
    if "$cli" -p "$port" info replication | tr -d '\r' | grep -qx 'role:slave'; then
        "$cli" -p "$port" info replication | tr -d '\r' | grep -qx 'master_link_status:up' ||
            return 1
    fi
}

# Wait until node $1 is settled, for up to 30 seconds.
wait_settled() {
    for _ in $(seq 300); do
        settled "$1" && return 0
        sleep 0.1
    done
    return 1
}

status() {
    local port
    port=$(cat "$dir/ports" 2>/dev/null | awk '{print $1}')
    [ -n "$port" ] && [ -n "$(running_pids)" ] || die "not running (start it with $me)"
    "$cli" -p "$port" cluster nodes
}

start() {
    if [ -n "$(running_pids)" ]; then
        echo "cluster: already running on ports $(cat "$dir/ports"); stop it with: $me stop"
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
    command -v "$server" >/dev/null || die "$server not found (apt-get install redis-server)"
    command -v "$cli" >/dev/null || die "$cli not found (apt-get install redis-tools)"

    local ports port
    ports=$(pick_ports)
    mkdir -p "$dir"
    echo "$ports" >"$dir/ports"
    trap 'echo "cluster: start failed; logs in $dir" >&2; stop >/dev/null' ERR
    for port in $ports; do
        mkdir -p "$dir/$port"
        "$server" --port "$port" --bind 127.0.0.1 --dir "$dir/$port" \
            --logfile "$dir/$port/redis.log" --pidfile "$dir/$port/redis.pid" --daemonize yes \
            --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 5000 \
            --save "" --appendonly no --repl-diskless-sync-delay 0 --loadmodule "$module"
    done
    for port in $ports; do
        wait_reply "$port" PONG 10 ping ||
            { tail -5 "$dir/$port/redis.log" >&2; false; }
    done

    local addrs=()
    for port in $ports; do addrs+=("127.0.0.1:$port"); done
    "$cli" --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes \
        >"$dir/create.log" 2>&1 || { cat "$dir/create.log" >&2; false; }
    for port in $ports; do
        wait_settled "$port" ||
            { echo "cluster: node $port has not settled after 30 s" >&2; false; }
    done
    trap - ERR

    local first
    first=$(echo "$ports" | awk '{print $1}')
    echo "redis-lock cluster is up on 127.0.0.1: 3 masters, 3 replicas; module $module"
    "$cli" -p "$first" cluster nodes | tr -d '\r' | sort -k9 -n | awk '
        $3 ~ /master/ { split($2, a, "@"); slots = ""; for (i = 9; i <= NF; i++) slots = slots " " $i;
                        m[$1] = a[1]; printf "  master  %s  slots%s\n", a[1], slots }
        $3 ~ /slave/  { split($2, a, "@"); r[$4] = r[$4] " " a[1] }
        END           { for (id in r) printf "  replica%s  of %s\n", r[id], m[id] }'
    echo "Try:   $cli -c -p $first LOCK.ACQUIRE invoice:42 worker-a 30000"
    echo "Logs:  $dir/<port>/redis.log"
    echo "Stop:  $me stop   (or make cluster-stop)"
}

case "${1:-start}" in
start) start ;;
stop) stop ;;
status) status ;;
*) die "usage: $me [start|stop|status]" ;;
esac
