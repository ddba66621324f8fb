#!/bin/bash
# Local etcd members for trials and cluster tests (Debian's etcd-server: harness/deps.sh).
#
#   harness/etcd.sh start N DIR   starts N members (1 to 7) of one cluster on 127.0.0.1, with
#                                 their data, logs and pids in DIR, waits until they have a
#                                 leader and prints their client URLs, comma-separated, on
#                                 stdout (the value for weft's etcd endpoints). Started again
#                                 on the same DIR after a stop, the members keep their data
#                                 and ports.
#   harness/etcd.sh stop DIR      stops the members running from DIR (SIGTERM, then SIGKILL
#                                 after 5 s); their data stays until DIR is removed.
#
# Ports come from a base, WEFT_ETCD_PORT_BASE (default 23790): member i serves clients on
# BASE+2i and its peers on BASE+2i+1. Elections are fast (50 ms heartbeats, 500 ms election
# timeout), for tests on one machine. Everything but the URL list goes to stderr.
# WEFT_ETCD_PKI=DIR (a cluster CA's directory, `weft cluster init --pki DIR`): clients and
# peers over TLS with etcd's certificate from it, and every client must present a
# certificate from that CA (--client-cert-auth); the URLs printed are then https://.
set -euo pipefail

usage() {
    echo "usage: $0 start N DIR | $0 stop DIR" >&2
    exit 2
}

need() {
    command -v "$1" >/dev/null 2>&1 || {
        echo "etcd.sh: $1 is not installed; run harness/deps.sh (as root)" >&2
        exit 1
    }
}

# listening PORT: whether something accepts connections on 127.0.0.1:PORT.
listening() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# running PIDFILE: whether the process named in PIDFILE runs.
running() {
    [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
}

start() {
    local count=$1 dir=$2
    [[ "$count" =~ ^[1-7]$ ]] || { echo "etcd.sh: N must be 1 to 7, not $count" >&2; exit 2; }
    need etcd
    need etcdctl
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    # A restart keeps the ports the data was made with.
    local base
    if [ -f "$dir/port-base" ]; then
        base=$(cat "$dir/port-base")
        [ "$(cat "$dir/members")" = "$count" ] || {
            echo "etcd.sh: $dir holds a cluster of $(cat "$dir/members") members, not $count" >&2
            exit 1
        }
    else
        base=${WEFT_ETCD_PORT_BASE:-23790}
    fi
    local i cluster="" clients=() scheme=http tls=() ctl_tls=()
    if [ -n "${WEFT_ETCD_PKI:-}" ]; then
        local pki
        pki=$(cd "$WEFT_ETCD_PKI" && pwd)
        scheme=https
        tls=(--cert-file "$pki/etcd.crt" --key-file "$pki/etcd.key" --client-cert-auth
             --trusted-ca-file "$pki/ca.crt"
             --peer-cert-file "$pki/etcd.crt" --peer-key-file "$pki/etcd.key"
             --peer-client-cert-auth --peer-trusted-ca-file "$pki/ca.crt")
        # etcd's certificate is a client's too (its peers present it).
        ctl_tls=(--cacert "$pki/ca.crt" --cert "$pki/etcd.crt" --key "$pki/etcd.key")
    fi
    for ((i = 0; i < count; i++)); do
        cluster+="${cluster:+,}m$i=$scheme://127.0.0.1:$((base + 2 * i + 1))"
        clients+=("$scheme://127.0.0.1:$((base + 2 * i))")
    done
    for ((i = 0; i < count; i++)); do
        if running "$dir/m$i.pid"; then
            echo "etcd.sh: member m$i of $dir runs already (pid $(cat "$dir/m$i.pid"))" >&2
            exit 1
        fi
        for port in $((base + 2 * i)) $((base + 2 * i + 1)); do
            if listening "$port"; then
                echo "etcd.sh: port $port is in use; set WEFT_ETCD_PORT_BASE to another base" >&2
                exit 1
            fi
        done
    done
    echo "$base" > "$dir/port-base"
    echo "$count" > "$dir/members"
    for ((i = 0; i < count; i++)); do
        local client="$scheme://127.0.0.1:$((base + 2 * i))" peer="$scheme://127.0.0.1:$((base + 2 * i + 1))"
        # setsid: the members outlive this script and the terminal it ran in.
        setsid etcd --name "m$i" --data-dir "$dir/m$i" \
            --listen-client-urls "$client" --advertise-client-urls "$client" \
            --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \
            --initial-cluster "$cluster" --initial-cluster-state new \
            --initial-cluster-token "weft-$base" \
            --heartbeat-interval 50 --election-timeout 500 \
            --logger zap --log-outputs stderr "${tls[@]}" \
            </dev/null >>"$dir/m$i.log" 2>&1 &
        echo $! > "$dir/m$i.pid"
    done
    local endpoints
    endpoints=$(IFS=,; echo "${clients[*]}")
    for _ in $(seq 200); do
        if ETCDCTL_API=3 etcdctl --endpoints "$endpoints" --dial-timeout 1s "${ctl_tls[@]}" endpoint health \
            >/dev/null 2>&1; then
            echo "etcd.sh: $count member(s) running from $dir" >&2
            echo "$endpoints"
            return 0
        fi
        for ((i = 0; i < count; i++)); do
            running "$dir/m$i.pid" || {
                echo "etcd.sh: member m$i exited; see $dir/m$i.log" >&2
                stop "$dir"
                exit 1
            }
        done
        sleep 0.1
    done
    echo "etcd.sh: no healthy cluster within 20 s; see $dir/m*.log" >&2
    stop "$dir"
    exit 1
}

stop() {
    local dir=$1 pidfile pid stopped=0
    [ -d "$dir" ] || { echo "etcd.sh: no directory $dir" >&2; exit 1; }
    for pidfile in "$dir"/m*.pid; do
        [ -f "$pidfile" ] || continue
        if running "$pidfile"; then
            pid=$(cat "$pidfile")
            kill -TERM "$pid" 2>/dev/null || true
            for _ in $(seq 50); do
                kill -0 "$pid" 2>/dev/null || break
                sleep 0.1
            done
            kill -KILL "$pid" 2>/dev/null || true
            stopped=$((stopped + 1))
        fi
        rm -f "$pidfile"
    done
    echo "etcd.sh: stopped $stopped member(s) of $dir" >&2
}

case "${1:-}" in
    start) [ $# -eq 3 ] || usage; start "$2" "$3" ;;
    stop) [ $# -eq 2 ] || usage; stop "$2" ;;
    *) usage ;;
esac
