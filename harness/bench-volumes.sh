#!/bin/bash
# Thin volume vs raw backing file, through the same weft target on this machine: 4k
# randread and randwrite at QD32 on a thin volume (after its allocation units exist) and on
# a file namespace, alternated per round; plus the cost of first writes (4k randwrite on a
# fresh thin volume, every write allocating a 1 MiB unit at first) against the same on
# allocated units.
# Usage: harness/bench-volumes.sh [--weft PATH] [--runtime S] [--rounds N]
# Output: a table, and .cache/bench/volumes.json (every run's fio-layout JSON).
set -euo pipefail
cd "$(dirname "$0")/.."
WEFT=target/release/weft RUNTIME=5 ROUNDS=3
while [ $# -gt 0 ]; do
    case "$1" in
        --weft) WEFT=$2; shift 2 ;;
        --runtime) RUNTIME=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        *) echo "usage: $0 [--weft PATH] [--runtime S] [--rounds N]" >&2; exit 2 ;;
    esac
done
DIR=$PWD/.cache/bench/volumes
rm -rf "$DIR"; mkdir -p "$DIR"
PORT=14460 API=127.0.0.1:14461
cat > "$DIR/weft.toml" <<EOF
data_dir = "$DIR/data"
listen = ["127.0.0.1:$PORT"]
api_listen = "$API"
[[subsystem]]
nqn = "nqn.2026-11.io.weft:raw"
[[subsystem.namespace]]
backend = "file"
path = "$DIR/raw.img"
size = "512MiB"
EOF
. harness/lib.sh
start_weft ${API##*:} "$DIR/serve.log" "$WEFT" serve --config "$DIR/weft.toml"
export WEFT_API=$API WEFT_API_TOKEN=$(cat "$DIR/data/api-token")
HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-00000000be0c
"$WEFT" pool create bench --device "$DIR/pool.img" --device-size 1GiB > /dev/null
"$WEFT" volume create thin --pool bench --size 512MiB > /dev/null
"$WEFT" volume create fresh --pool bench --size 256MiB > /dev/null
"$WEFT" host add bench --nqn $HOSTNQN > /dev/null
for v in thin fresh; do "$WEFT" volume attach $v --host bench > /dev/null; done
RAW=nvme-tcp://127.0.0.1:$PORT/nqn.2026-11.io.weft:raw
THIN=nvme-tcp://127.0.0.1:$PORT/nqn.2026-11.io.weft:vol:thin
FRESH=nvme-tcp://127.0.0.1:$PORT/nqn.2026-11.io.weft:vol:fresh
bench() { "$WEFT" bench --hostnqn $HOSTNQN --target "$1" --json "${@:2}"; }
iops() { python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; print(int(j["read"]["iops"] + j["write"]["iops"]))'; }
lat() { # mean, p99 and max write latency in us, and the write count
    python3 -c 'import json,sys; s=json.load(sys.stdin)["jobs"][0]["write"]["lat_ns"]; print(round(s["mean"]/1000, 1), round(s["percentile"]["99.000000"]/1000, 1), round(s["max"]/1000, 1))'
}
# Fill both (sequential 128k): reads then hit data on both sides, and the volume's units exist.
bench "$RAW" --rw write --bs 128k --iodepth 8 > "$DIR/fill-raw.json"
bench "$THIN" --rw write --bs 128k --iodepth 8 > "$DIR/fill-thin.json"
# First writes: every 4k randwrite to a fresh volume lands in a new unit until all 256 exist.
bench "$FRESH" --rw randwrite --bs 4k --iodepth 1 --size 256MiB --runtime 3s > "$DIR/first-write.json"
bench "$THIN" --rw randwrite --bs 4k --iodepth 1 --runtime 3s > "$DIR/allocated-write.json"
printf '%-10s %-6s %10s %10s %7s\n' pattern round raw thin thin/raw
results=()
for rw in randread randwrite; do
    for round in $(seq "$ROUNDS"); do
        raw=$(bench "$RAW" --rw $rw --bs 4k --iodepth 32 --runtime "${RUNTIME}s" --ramp 1s | tee "$DIR/$rw-raw-$round.json" | iops)
        thin=$(bench "$THIN" --rw $rw --bs 4k --iodepth 32 --runtime "${RUNTIME}s" --ramp 1s | tee "$DIR/$rw-thin-$round.json" | iops)
        ratio=$(python3 -c "print(f'{$thin/$raw:.3f}')")
        printf '%-10s %-6s %10s %10s %7s\n' "$rw" "$round" "$raw" "$thin" "$ratio"
        results+=("{\"pattern\": \"$rw\", \"round\": $round, \"raw_iops\": $raw, \"thin_iops\": $thin, \"ratio\": $ratio}")
    done
done
read -r f_mean f_p99 f_max < <(lat < "$DIR/first-write.json")
read -r a_mean a_p99 a_max < <(lat < "$DIR/allocated-write.json")
echo "4k randwrite QD1, 3 s (us)      mean      p99      max"
printf '%-30s %8s %8s %8s\n' "fresh volume (allocating)" "$f_mean" "$f_p99" "$f_max" "allocated units" "$a_mean" "$a_p99" "$a_max"
printf '{"rounds": [%s], "first_writes_us": {"mean": %s, "p99": %s, "max": %s}, "allocated_writes_us": {"mean": %s, "p99": %s, "max": %s}}\n' \
    "$(IFS=,; echo "${results[*]}")" "$f_mean" "$f_p99" "$f_max" "$a_mean" "$a_p99" "$a_max" > .cache/bench/volumes.json
echo "JSON: .cache/bench/volumes.json"
