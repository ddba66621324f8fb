#!/bin/bash
# How many reactors by default, and what polling buys: the same loads against three `weft
# serve` on this machine, alternated per round (all stay up; an idle reactor sleeps):
#   one      --reactors 1, the default spin (50 us after activity)
#   default  one reactor per CPU, the default spin (weft's defaults)
#   polled   --reactors 1 --poll-us 1000000 (the reactor, on CPU 0, spins while busy), and
#            the host side polled too (weft bench --poll, on the last CPU), as SPDK runs:
#            one core each
# Loads, all 4k random reads unless named (weft bench on the same machine): QD1 and QD32 on
# a RAM namespace (the target's own cost), QD32 over 2 queues on it, QD32 and 128k QD8 on a
# file namespace (the disk), and QD32 from fio with weft's engine (not polled).
# Usage: harness/bench-reactors.sh [--weft PATH] [--runtime S] [--rounds N]
# Output: a table (median of the rounds per side, each side's ratio to the default, the
# target's CPU in cores over the load's wall time) and .cache/bench/reactors.json.
set -euo pipefail
cd "$(dirname "$0")/.."
WEFT=target/release/weft RUNTIME=4 ROUNDS=3
while [ $# -gt 0 ]; do
    case "$1" in
        --weft) WEFT=$2; shift 2 ;;
        --runtime) RUNTIME=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2 ;;
    esac
done
WEFT=$(realpath "$WEFT")
ENGINE=$(realpath target/release/libweft_fio.so)
DIR=$PWD/.cache/bench/reactors
rm -rf "$DIR"; mkdir -p "$DIR"
FILE=$PWD/.cache/bench/file-1024.img
if [ ! -s "$FILE" ]; then
    dd if=/dev/urandom of="$FILE.tmp" bs=1M count=1024 status=none && sync && mv "$FILE.tmp" "$FILE"
fi
NQN=nqn.2026-11.io.weft:bench
. harness/lib.sh
pids=()
# The 1 GiB file goes too: left behind, benchmarks fill a CI machine's disk.
trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null; rm -f "$FILE"' EXIT
serve() { # NAME PORT REACTORS...
    local name=$1 port=$2; shift 2
    bench_config "$DIR/$name.toml" "$DIR/$name-data" "$port" "$FILE"
    "$WEFT" serve --config "$DIR/$name.toml" "$@" > "$DIR/$name.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$((port + 1))") 2>/dev/null && return 0; sleep 0.1; done
    echo "weft did not start; see $DIR/$name.log" >&2; exit 1
}
SIDES=(one default polled)
serve one 14480 --reactors 1
serve default 14490
serve polled 14500 --reactors 1 --poll-us 1000000
port() { case $1 in one) echo 14480 ;; default) echo 14490 ;; polled) echo 14500 ;; esac; }
pid_of() { case $1 in one) echo "${pids[0]}" ;; default) echo "${pids[1]}" ;; polled) echo "${pids[2]}" ;; esac; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$(pid_of "$1")/stat"; }
json_get() { python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))["jobs"][0]; d=j["read"]; print(round(d["iops"]), round(d["lat_ns"]["mean"]/1000,1), round(d["bw_bytes"]/1048576,1))' "$1"; }
load() { # SIDE LOAD ROUND
    local side=$1 load=$2 round=$3 url="nvme-tcp://127.0.0.1:$(port "$1")/$NQN"
    local out="$DIR/$load-$side-$round.json"
    local poll=() pin=()
    # Two spinners on one CPU take turns by the scheduler's slice: keep them apart.
    [ "$side" = polled ] && poll=(--poll) pin=(taskset -c $(($(nproc) - 1)))
    bench() { "${pin[@]}" "$WEFT" bench --target "$url" "${poll[@]}" --runtime "${RUNTIME}s" --json "$@" > "$out"; }
    case $load in
        ram-qd1) bench --nsid 1 --iodepth 1 ;;
        ram-qd32) bench --nsid 1 --iodepth 32 ;;
        ram-qd32x2) bench --nsid 1 --iodepth 16 --queues 2 ;;
        file-qd32) bench --nsid 2 --iodepth 32 ;;
        file-128k) bench --nsid 2 --rw read --bs 128k --iodepth 8 ;;
        fio-ram-qd32)
            fio --ioengine=external:"$ENGINE" --filename="${url//:/\\:}?nsid=1" --name=r \
                --rw=randread --bs=4k --iodepth=32 --time_based --runtime="$RUNTIME" \
                --output-format=json > "$out" 2>/dev/null ;;
    esac
    json_get "$out"
}
LOADS=(ram-qd1 ram-qd32 ram-qd32x2 file-qd32 file-128k fio-ram-qd32)
for side in "${SIDES[@]}"; do "$WEFT" bench --target "nvme-tcp://127.0.0.1:$(port $side)/$NQN" --nsid 1 --runtime 1s > /dev/null; done
HZ=$(getconf CLK_TCK)
for round in $(seq "$ROUNDS"); do
    for load in "${LOADS[@]}"; do
        for side in "${SIDES[@]}"; do
            t0=$(cpu_ticks $side) start=$(date +%s.%N)
            read -r iops mean bw < <(load $side "$load" "$round")
            # The polled reactor spins on for up to a second: let it stop before the next
            # side (its CPU and that time then counted too).
            [ "$side" = polled ] && sleep 1.2
            cores=$(python3 -c "print(round(($(cpu_ticks $side) - $t0) / $HZ / ($(date +%s.%N) - $start), 2))")
            echo "$load $side $round $iops $mean $bw $cores" >> "$DIR/results.txt"
        done
    done
done
python3 - "$DIR" "$(nproc)" <<'PY'
import json, statistics, sys
d, cpus = sys.argv[1], sys.argv[2]
rows = {}
for line in open(f"{d}/results.txt"):
    load, side, _, iops, mean, bw, cores = line.split()
    rows.setdefault(load, {}).setdefault(side, []).append(tuple(map(float, (iops, mean, bw, cores))))
sides = ["one", "default", "polled"]
names = {"one": "1 reactor", "default": f"{cpus} reactors (default)", "polled": "polled, 1 reactor"}
out = {"cpus": int(cpus), "loads": {}}
print(f"{'load (4k randread unless named)':<22}" + "".join(f"{names[s]:>34}" for s in sides))
for load, by_side in rows.items():
    med = {s: tuple(statistics.median(v[i] for v in vals) for i in range(4)) for s, vals in by_side.items()}
    def value(m):
        if load == "file-128k":
            return m[2], f"{m[2]:.0f} MiB/s"
        if load == "ram-qd1":
            return m[1], f"{m[1]:.1f} us"
        return m[0], f"{m[0]:,.0f} IOPS"
    base = value(med["default"])[0]
    cells = []
    for s in sides:
        v, text = value(med[s])
        cells.append(f"{text} {v / base:.2f}x {med[s][3]:.2f}c")
    print(f"{load:<22}" + "".join(f"{c:>34}" for c in cells))
    out["loads"][load] = {s: {"iops": med[s][0], "mean_us": med[s][1], "mib_s": med[s][2], "target_cores": med[s][3], "to_default": value(med[s])[0] / base} for s in sides}
print("(each cell: the median, its ratio to the default, the target's CPU in cores)")
json.dump(out, open(f"{d}/../reactors.json", "w"), indent=1)
PY
