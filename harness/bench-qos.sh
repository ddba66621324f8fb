#!/bin/bash
# QoS on one weft node, natively (release build, weft's user-space initiator as the host):
#  1. limits hold: each kind of limit (IOPS, bandwidth; total, read, write) set with
#     `weft volume set` on a filled volume loaded far above it (4 queues); the achieved rate
#     is measured by the target's own counters over a steady window (`weft top -o json`),
#     and compared with the limit;
#  2. noisy neighbour: p99 read latency of a quiet volume (4k randread QD1) alone, next to a
#     noisy volume saturating the node (64k randwrite, 2 queues x QD32) without a limit, and
#     with the noisy volume limited (--bw-max, --iops-max).
# Usage: harness/bench-qos.sh [--weft PATH] [--runtime S]
# Output: tables, and .cache/bench/qos.json.
set -euo pipefail
cd "$(dirname "$0")/.."
WEFT=target/release/weft RUNTIME=8
while [ $# -gt 0 ]; do
    case "$1" in
        --weft) WEFT=$2; shift 2 ;;
        --runtime) RUNTIME=$2; shift 2 ;;
        *) echo "usage: $0 [--weft PATH] [--runtime S]" >&2; exit 2 ;;
    esac
done
[ "$RUNTIME" -ge 5 ] || { echo "bench-qos: --runtime must be at least 5 (s)" >&2; exit 2; }
DIR=$PWD/.cache/bench/qos
rm -rf "$DIR"; mkdir -p "$DIR"
PORT=14470 API=127.0.0.1:14471
. harness/lib.sh
start_weft ${API##*:} "$DIR/serve.log" "$WEFT" serve --data-dir "$DIR/data" --listen 127.0.0.1:$PORT --api-listen $API
export WEFT_API=$API WEFT_API_TOKEN=$(cat "$DIR/data/api-token")
HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000000a5
"$WEFT" pool create bench --device "$DIR/pool.img" --device-size 2GiB > /dev/null
"$WEFT" host add bench --nqn $HOSTNQN > /dev/null
for v in limited:512MiB quiet:256MiB noisy:512MiB; do
    "$WEFT" volume create "${v%%:*}" --pool bench --size "${v##*:}" --thick > /dev/null
    "$WEFT" volume attach "${v%%:*}" --host bench > /dev/null
done
url() { echo "nvme-tcp://127.0.0.1:$PORT/nqn.2026-11.io.weft:vol:$1"; }
bench() { "$WEFT" bench --hostnqn $HOSTNQN --target "$(url "$1")" --json "${@:2}"; }
for v in limited quiet; do bench $v --rw write --bs 128k --iodepth 8 > /dev/null; done

# 1. Limits: LIMIT-OPTION VALUE PATTERN BS; the measured window is 3 s inside the run.
measure() { # VOLUME FIELD: rate of FIELD (read_iops, write_bytes_per_s, ...) over 3 s of top
    "$WEFT" top -o json --interval 3s --count 1 |
        python3 -c 'import json,sys; rows=json.loads(sys.stdin.read()); v,f=sys.argv[1:]; print([r for r in rows if r["name"]==v][0][f])' "$1" "$2"
}
limit_results=()
printf '%-18s %-10s %-9s %12s %12s %7s\n' limit value pattern limit achieved ratio
for spec in "iops-max 5000 randread 4k iops" "bw-max 40MiB randread 128k bytes" \
            "read-iops-max 3000 randread 4k iops" "read-bw-max 30MiB randread 64k bytes" \
            "write-iops-max 2000 randwrite 4k iops" "write-bw-max 20MiB randwrite 64k bytes"; do
    read -r option value rw bs unit <<< "$spec"
    "$WEFT" volume set limited --$option "$value" > /dev/null
    bench limited --rw $rw --bs $bs --iodepth 32 --queues 4 --runtime "${RUNTIME}s" > "$DIR/limit-$option.json" &
    load=$!
    sleep 2
    dir=${rw#rand}
    if [ "$unit" = iops ]; then field=${dir}_iops; else field=${dir}_bytes_per_s; fi
    achieved=$(measure limited "$field")
    wait $load
    "$WEFT" volume set limited --$option none > /dev/null
    target=$(python3 -c "import sys; t=sys.argv[1]; print(int(t[:-3])*1048576 if t.endswith('MiB') else int(t))" "$value")
    ratio=$(python3 -c "print(f'{$achieved/$target:.3f}')")
    printf '%-18s %-10s %-9s %12s %12.0f %7s\n' "--$option" "$value" "$rw $bs" "$target" "$achieved" "$ratio"
    limit_results+=("{\"limit\": \"$option\", \"value\": $target, \"pattern\": \"$rw $bs\", \"achieved\": $achieved, \"ratio\": $ratio}")
done

# 2. Noisy neighbour: quiet 4k randread QD1 p99, with the noisy volume idle / unlimited / limited.
p99() { python3 -c 'import json,sys; r=json.load(sys.stdin)["jobs"][0]["read"]; print(round(r["lat_ns"]["percentile"]["99.000000"]/1000), round(r["iops"]))'; }
noisy_results=()
printf '\n%-34s %14s %12s %14s\n' "quiet volume 4k randread QD1" "p99 (us)" "IOPS" "noisy MiB/s"
for case in alone unlimited "bw-max 100MiB" "iops-max 800"; do
    load='' name=${case// /}
    if [ "$case" != alone ]; then
        if [ "$case" != unlimited ]; then "$WEFT" volume set noisy --${case% *} "${case#* }" > /dev/null; fi
        bench noisy --rw randwrite --bs 64k --iodepth 32 --queues 2 --runtime "$((RUNTIME + 3))s" > "$DIR/noisy-$name.json" &
        load=$!
        sleep 1
    fi
    bench quiet --rw randread --bs 4k --iodepth 1 --runtime "${RUNTIME}s" > "$DIR/quiet-$name.json" &
    quiet=$!
    noisy_mib=0
    if [ -n "$load" ]; then
        sleep 1
        noisy_mib=$(measure noisy write_bytes_per_s | python3 -c 'import sys; print(round(float(sys.stdin.read())/1048576, 1))')
    fi
    wait $quiet
    read -r lat iops < <(p99 < "$DIR/quiet-$name.json")
    if [ -n "$load" ]; then
        wait $load
        "$WEFT" volume set noisy --iops-max none --bw-max none > /dev/null
    fi
    printf '%-34s %14s %12s %14s\n' "noisy: $case" "$lat" "$iops" "$noisy_mib"
    noisy_results+=("{\"noisy\": \"$case\", \"quiet_read_p99_us\": $lat, \"quiet_read_iops\": $iops, \"noisy_write_mib_s\": $noisy_mib}")
done
printf '{"runtime_s": %s, "limits": [%s], "noisy_neighbour": [%s]}\n' "$RUNTIME" \
    "$(IFS=,; echo "${limit_results[*]}")" "$(IFS=,; echo "${noisy_results[*]}")" > .cache/bench/qos.json
echo "JSON: .cache/bench/qos.json"
