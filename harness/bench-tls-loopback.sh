#!/bin/bash
# What NVMe/TCP TLS costs when weft's own initiator is the host (as a replica link's primary
# would be), A/B against the clear on loopback: one weft node, two volumes of one pool on
# /dev/shm, one attached to a host NQN in the clear and one to a host NQN given a TLS PSK
# (`weft host add --tls`); `weft bench` runs each load on each, alternated per round (clear,
# then TLS). Both ends run on this machine's cores, so each byte is sealed and opened here
# twice: the ratios are what a host and a target sharing two cores pay, an upper bound of
# either's share. Reads of never-written blocks of a thin volume answer zeroes without I/O:
# the protocol and TLS alone. Prints a table, writes JSON (default
# .cache/bench/tls-loopback/result.json).
# Usage: harness/bench-tls-loopback.sh [--weft BIN] [--rounds 3] [--seconds 4] [--json FILE]
#        (a benchmark: outside CI; --rounds 1 --seconds 1 is its smoke)
set -euo pipefail
cd "$(dirname "$0")/.."
WEFT=target/release/weft ROUNDS=3 SECONDS_EACH=4 JSON=.cache/bench/tls-loopback/result.json
while [ $# -gt 0 ]; do
    case "$1" in
        --weft) WEFT=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --seconds) SECONDS_EACH=$2; shift 2 ;;
        --json) JSON=$2; shift 2 ;;
        *) echo "usage: $0 [--weft BIN] [--rounds N] [--seconds S] [--json FILE]" >&2; exit 2 ;;
    esac
done
die() { echo "bench-tls-loopback: $*" >&2; exit 2; }
[ -x "$WEFT" ] || die "no weft binary at $WEFT (cargo build --release, or --weft PATH)"
WEFT=$(realpath "$WEFT")
WORK=$PWD/.cache/bench/tls-loopback/work
POOL=/dev/shm/weft-bench-tls-loopback.img
PORT=14490 API_PORT=14499
rm -rf "$WORK" "$POOL"
mkdir -p "$WORK" "$(dirname "$JSON")"
"$WEFT" serve --data-dir "$WORK/node" --listen "127.0.0.1:$PORT" --api-listen "127.0.0.1:$API_PORT" \
    > "$WORK/node.out" 2> "$WORK/node.log" &
PID=$!
trap 'kill -TERM $PID 2>/dev/null; wait 2>/dev/null; rm -f "$POOL"' EXIT
for _ in $(seq 100); do grep -q "nvme discover" "$WORK/node.out" 2>/dev/null && break; sleep 0.1; done
cli() { WEFT_API=127.0.0.1:$API_PORT WEFT_API_TOKEN=$(cat "$WORK/node/api-token") "$WEFT" "$@"; }
cli pool create p --device "$POOL" --device-size 1GiB > /dev/null
TLS_HOST=nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-00000000aa01
CLEAR_HOST=nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-00000000aa02
for side in tls clear; do cli volume create "$side" --size 256MiB --pool p > /dev/null; done
cli host add tlshost --nqn "$TLS_HOST" --tls > "$WORK/tls-host.out"
KEY=$(grep -o 'NVMeTLSkey-1:01:[^ ]*:' "$WORK/tls-host.out" | head -1)
[ -n "$KEY" ] || die "weft host add --tls printed no PSK"
cli host add clearhost --nqn "$CLEAR_HOST" > /dev/null 2>&1
cli volume attach tls --host tlshost > /dev/null
cli volume attach clear --host clearhost > /dev/null
LOADS=("randread 4k 1" "randread 4k 32" "randwrite 4k 32" "read 128k 8" "write 128k 8")
: > "$WORK/runs.txt"
for round in $(seq "$ROUNDS"); do
    for load in "${LOADS[@]}"; do
        read -r rw bs depth <<< "$load"
        for side in clear tls; do
            target=nvme-tcp://127.0.0.1:$PORT/nqn.2026-11.io.weft:vol:$side
            if [ "$side" = tls ]; then
                access=(--hostnqn "$TLS_HOST" --tls-psk "$KEY")
            else
                access=(--hostnqn "$CLEAR_HOST")
            fi
            "$WEFT" bench --target "$target" "${access[@]}" --rw "$rw" --bs "$bs" \
                --iodepth "$depth" --runtime "${SECONDS_EACH}s" --json > "$WORK/run.json"
            python3 - "$WORK/run.json" "$round" "$side" "$rw" "$bs" "$depth" >> "$WORK/runs.txt" <<'PY'
import json, sys
job = json.load(open(sys.argv[1]))["jobs"][0]
side = job["read"] if job["read"]["io_bytes"] else job["write"]
print(json.dumps({"round": int(sys.argv[2]), "side": sys.argv[3], "rw": sys.argv[4],
                  "bs": sys.argv[5], "iodepth": int(sys.argv[6]), "iops": side["iops"],
                  "mib_s": side["bw_bytes"] / 1048576, "lat_us_mean": side["lat_ns"]["mean"] / 1000}))
PY
        done
    done
done
python3 - "$WORK/runs.txt" "$JSON" <<'PY'
import json, statistics, sys
runs = [json.loads(line) for line in open(sys.argv[1])]
loads = []
for run in runs:
    key = (run["rw"], run["bs"], run["iodepth"])
    if key not in loads:
        loads.append(key)
rows = []
print(f"{'load':<22} {'clear IOPS':>11} {'TLS IOPS':>11} {'TLS/clear':>10} {'clear us':>9} {'TLS us':>9}")
for rw, bs, depth in loads:
    def side(name):
        return [r for r in runs if (r["rw"], r["bs"], r["iodepth"], r["side"]) == (rw, bs, depth, name)]
    clear, tls = side("clear"), side("tls")
    ratios = [t["iops"] / c["iops"] for c, t in zip(clear, tls)]
    row = {"load": f"{rw} {bs} QD{depth}",
           "clear_iops_median": statistics.median(r["iops"] for r in clear),
           "tls_iops_median": statistics.median(r["iops"] for r in tls),
           "tls_over_clear_median": statistics.median(ratios),
           "clear_lat_us_median": statistics.median(r["lat_us_mean"] for r in clear),
           "tls_lat_us_median": statistics.median(r["lat_us_mean"] for r in tls)}
    rows.append(row)
    print(f"{row['load']:<22} {row['clear_iops_median']:>11.0f} {row['tls_iops_median']:>11.0f} "
          f"{row['tls_over_clear_median']:>10.2f} {row['clear_lat_us_median']:>9.1f} {row['tls_lat_us_median']:>9.1f}")
json.dump({"method": "harness/bench-tls-loopback.sh: weft bench (weft's initiator) against one weft node on loopback, "
                     "clear then TLS per load, alternated per round; per-round TLS/clear ratios, medians",
           "rows": rows, "runs": runs}, open(sys.argv[2], "w"), indent=1)
PY
echo "bench-tls-loopback: JSON in $JSON"
