#!/bin/bash
# Cluster interop: the Linux 6.1 NVMe/TCP host (nvme-cli 2.3, fio) in the QEMU guest against
# a weft cluster on this machine: etcd (harness/etcd.sh, one member) and three
# `weft serve --cluster` nodes on loopback, advertising 10.0.2.2 (the host as the guest sees
# it through slirp). A volume lives on each node; the guest (harness/guest/cluster.sh)
# registers itself as a host and attaches the volumes through node 1's API, checks that
# node 1's discovery log refers to nodes 2 and 3, connects everything with one
# `nvme connect-all` against node 1, and runs fio write+verify on each volume. A volume with
# three replicas is one multipath device with one ANA-optimized path and two inaccessible ones;
# fio writes to it while its primary's node is killed (kill -9, on the guest's request through
# the share: REQUEST files "kill nI" / "start nI", answered with REQUEST.done): the host's
# multipath resumes on the promoted replica with no I/O error, and everything written reads back.
# Then the same through a hung primary (SIGSTOP/SIGCONT: "stop nI" / "cont nI"), a replica's
# death, a node drain, and ext4 on the volume through a kill mid-write. An erasure-coded
# volume (2+1, a shard on each node) takes fio writes with verify through the death of a
# member's node and its return, then of its primary's node and its return.
# Set up as the guide says (docs/guide/04-cluster.md): the cluster's own CA (`weft cluster init`), etcd over TLS asking
# every client for a certificate from it, and each node started with its own (`--pki`), its
# API over TLS (the guest calls it with the CA, WEFT_API_CA): nodes 1 and 2 are given theirs
# (`weft cluster issue`), node 3 joins with a one-time token (`weft token join`, node 1
# holding the CA's key) and nothing copied.
# Usage: harness/cluster-interop.sh [--weft BIN]   (as root; the guest image is built once)
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
WEFT=target/release/weft
while [ $# -gt 0 ]; do
    case "$1" in
        --weft) WEFT=$2; shift 2 ;;
        *) echo "usage: $0 [--weft BIN]" >&2; exit 2 ;;
    esac
done
die() { echo "cluster-interop: $*" >&2; exit 2; }
[ "$(id -u)" = 0 ] || die "run as root (qemu)"
[ -x "$WEFT" ] || die "no weft binary at $WEFT (cargo build --release, or --weft PATH)"
WEFT=$(realpath "$WEFT")
echo "cluster-interop: guest image $(harness/vm/build-image.sh)"

WORK=$REPO/.cache/cluster-interop
SHARE=$WORK/share
NVME_PORT=14450 API_PORT=14460
harness/etcd.sh stop "$WORK/etcd" >/dev/null 2>&1 || true
rm -rf "$WORK"
mkdir -p "$SHARE"
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    # Nodes the guest had restarted (from the request server's subshell).
    pkill -TERM -f -- "--data-dir $WORK/n" 2>/dev/null || true
    wait 2>/dev/null || true
    harness/etcd.sh stop "$WORK/etcd" >/dev/null 2>&1 || true
}
trap cleanup EXIT
PKI=$WORK/pki
"$WEFT" cluster init --pki "$PKI" > /dev/null
for i in 1 2; do
    # The guest reaches the nodes' APIs at 10.0.2.2: their certificates name it.
    "$WEFT" cluster issue "n$i" --pki "$PKI" --address 10.0.2.2 > /dev/null
done
cp "$PKI/ca.crt" "$SHARE/ca.crt"
ENDPOINTS=$(WEFT_ETCD_PKI=$PKI WEFT_ETCD_PORT_BASE=23850 harness/etcd.sh start 1 "$WORK/etcd")

node() { # INDEX: starts node nINDEX (1-based)
    local i=$1 extra=()
    case $i in
        1) extra=(--ca-key "$PKI/ca.key") ;; # it signs the certificates of nodes that join
        2) extra=(--api-token-file "$WORK/n1/api-token") ;;
        # Its key, certificate (naming 10.0.2.2, its --advertise) and the API token come
        # with the join; started again, it has them and skips the token.
        *) extra=(--join "$JOIN_TOKEN" --join-via "https://127.0.0.1:$API_PORT") ;;
    esac
    # Hosts (the guest) reach the nodes as 10.0.2.2, the nodes each other on loopback.
    "$WEFT" serve --cluster "$ENDPOINTS" --node "n$i" --pki "$PKI/nodes/n$i" --advertise 10.0.2.2 \
        --api-advertise "https://127.0.0.1:$((API_PORT + i - 1))" \
        --listen "127.0.0.1:$((NVME_PORT + i - 1))" --api-listen "127.0.0.1:$((API_PORT + i - 1))" \
        --data-dir "$WORK/n$i" "${extra[@]}" > "$WORK/n$i.out" 2>> "$WORK/n$i.log" &
    PIDS+=($!)
    for _ in $(seq 100); do grep -q "nvme discover" "$WORK/n$i.out" 2>/dev/null && return; sleep 0.1; done
    die "node n$i did not start: $(tail -3 "$WORK/n$i.log")"
}
declare -A PID_OF
node 1
PID_OF[n1]=${PIDS[-1]}
cp "$WORK/n1/api-token" "$SHARE/api-token"
node 2
PID_OF[n2]=${PIDS[-1]}
JOIN_TOKEN=$(WEFT_API=https://127.0.0.1:$API_PORT WEFT_API_CA=$PKI/ca.crt WEFT_API_TOKEN=$(cat "$WORK/n1/api-token") \
    "$WEFT" token join --node n3 | grep -o 'weftjoin-1:[^ ]*' | head -1)
[ -n "$JOIN_TOKEN" ] || die "weft token join printed no token"
node 3
PID_OF[n3]=${PIDS[-1]}
cli() { WEFT_API=https://127.0.0.1:$API_PORT WEFT_API_CA=$PKI/ca.crt WEFT_API_TOKEN=$(cat "$WORK/n1/api-token") "$WEFT" "$@"; }
for i in 1 2 3; do
    cli pool create p --node "n$i" --device "$WORK/n$i/p.img" --device-size 1GiB >/dev/null
    cli volume create "v$i" --size 64MiB --node "n$i" >/dev/null
done
# A replicated volume: a replica on each node, one primary (ANA optimized).
cli volume create rep --size 64MiB --replicas 3 >/dev/null
# And one of two replicas (on two of the three nodes).
cli volume create rep2 --size 32MiB --replicas 2 >/dev/null
# And an erasure-coded one: a shard on each node (2 data, 1 parity).
cli volume create ec --size 32MiB --ec 2+1 >/dev/null
cli volume list
cli volume show rep
cli volume show ec

# The guest asks for node kills and restarts through the share (it cannot reach our processes).
serve_requests() {
    while sleep 0.2; do
        [ -e "$SHARE/REQUEST" ] || continue
        # Written whole by a rename; a read that fails is tried again.
        read -r verb name < "$SHARE/REQUEST" || continue
        rm -f "$SHARE/REQUEST"
        case "$verb" in
            kill) kill -9 "${PID_OF[$name]}" && echo "cluster-interop: killed $name" ;;
            stop) kill -STOP "${PID_OF[$name]}" && echo "cluster-interop: stopped $name" ;;
            cont) kill -CONT "${PID_OF[$name]}" && echo "cluster-interop: continued $name" ;;
            start) node "${name#n}"; PID_OF[$name]=${PIDS[-1]}; echo "cluster-interop: started $name" ;;
        esac
        touch "$SHARE/REQUEST.done"
    done
}
serve_requests &
PIDS+=($!)

echo "cluster-interop: etcd $ENDPOINTS, nodes on 127.0.0.1:$NVME_PORT-$((NVME_PORT + 2)) (API $API_PORT-$((API_PORT + 2))); console -> $WORK/run.log"
set +e
harness/vm/vm-run.sh -n slirp -s "$SHARE" -c 2 -t 1500 -e "WEFT_PORT=$NVME_PORT" \
    -e "WEFT_API_PORT=$API_PORT" harness/guest/cluster.sh 2>&1 | tee "$WORK/run.log"
rc=${PIPESTATUS[0]}
set -e
echo "cluster-interop: rebuilds, as the primaries logged them:"
grep -h "rebuilt:" "$WORK"/n*.log | sed 's/^/  /' || true
panics=$(grep -lE "panicked at|fatal runtime error" "$WORK"/n*.log || true)
[ -z "$panics" ] || { echo "cluster-interop: panic in $panics"; rc=1; }
[ "$rc" = 0 ] && grep -q '^cluster: PASS' "$SHARE/.lab/console.log" || { echo "cluster-interop: FAIL (guest exit $rc)"; exit 1; }
echo "cluster-interop: PASS"
