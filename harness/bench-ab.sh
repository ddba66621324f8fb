#!/bin/bash
# A/B of two weft builds' data path on this machine: each serves a 256 MiB RAM namespace
# (1 reactor) and the same `weft bench` client (--new's) loads them alternately with 4k
# random reads, per iodepth and round; prints each run and the summed new/old IOPS ratio.
# For judging a data path change, e.g. against a build of an older commit:
#   git worktree add /tmp/before REV && (cd /tmp/before && CARGO_TARGET_DIR=/tmp/before-target cargo build --release -p weft)
#   harness/bench-ab.sh --old /tmp/before-target/release/weft
# Usage: harness/bench-ab.sh --old BIN [--new BIN] [--iodepths "1 32"] [--rounds N] [--runtime S]
set -euo pipefail
cd "$(dirname "$0")/.."
OLD='' NEW=target/release/weft IODEPTHS="1 32" ROUNDS=3 RUNTIME=4
while [ $# -gt 0 ]; do
    case "$1" in
        --old) OLD=$2; shift 2 ;;
        --new) NEW=$2; shift 2 ;;
        --iodepths) IODEPTHS=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --runtime) RUNTIME=$2; shift 2 ;;
        *) echo "usage: $0 --old BIN [--new BIN] [--iodepths \"1 32\"] [--rounds N] [--runtime S]" >&2; exit 2 ;;
    esac
done
[ -x "$OLD" ] && [ -x "$NEW" ] || { echo "bench-ab: --old and --new must be weft binaries" >&2; exit 2; }
DIR=$PWD/.cache/bench/ab
rm -rf "$DIR"; mkdir -p "$DIR"
. harness/lib.sh
declare -A PORTS=([old]=15500 [new]=15510)
for side in old new; do
    port=${PORTS[$side]}
    cat > "$DIR/$side.toml" <<EOF
data_dir = "$DIR/data-$side"
listen = ["127.0.0.1:$port"]
api_listen = "127.0.0.1:$((port + 1))"
reactors = 1
[[subsystem]]
nqn = "nqn.2026-11.io.weft:ab"
[[subsystem.namespace]]
backend = "ram"
size = "256MiB"
EOF
done
start_weft $((PORTS[old] + 1)) "$DIR/old.log" "$OLD" serve --config "$DIR/old.toml"
OLD_PID=$WEFT_PID
start_weft $((PORTS[new] + 1)) "$DIR/new.log" "$NEW" serve --config "$DIR/new.toml"
# the second start_weft's trap replaced the first's: stop both
trap 'kill $OLD_PID $WEFT_PID 2>/dev/null; wait 2>/dev/null' EXIT
result() { python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]["read"]; print(round(j["iops"]), round(j["lat_ns"]["mean"]/1000, 1))'; }
printf '%-8s %-6s %-5s %10s %10s\n' iodepth round side IOPS mean_us
for qd in $IODEPTHS; do
    declare -A sum=([old]=0 [new]=0)
    for round in $(seq "$ROUNDS"); do
        for side in old new; do
            read -r iops mean < <("$NEW" bench --target "nvme-tcp://127.0.0.1:${PORTS[$side]}/nqn.2026-11.io.weft:ab" \
                --rw randread --bs 4k --iodepth "$qd" --runtime "${RUNTIME}s" --ramp 1s --json | result)
            printf '%-8s %-6s %-5s %10s %10s\n' "$qd" "$round" "$side" "$iops" "$mean"
            sum[$side]=$((sum[$side] + iops))
        done
    done
    python3 -c "print(f'iodepth $qd: new/old IOPS {${sum[new]}/${sum[old]}:.3f} over $ROUNDS rounds')"
done
