#!/bin/bash
# How many reactors by default: the same loads against two `weft serve` on this machine,
# one with --reactors 1 and one with one reactor per CPU (the default), alternated per round
# (both stay up; an idle reactor sleeps). Loads, all 4k random reads unless named (weft bench,
# weft's interrupt-driven initiator, on the same machine): QD1 and QD32 on a RAM namespace
# (the target's own cost), QD32 over 2 queues on it, QD32 and 128k QD8 on a file namespace
# (the disk), and QD32 from fio with weft's engine (a second load generator).
# Usage: harness/bench-reactors.sh [--weft PATH] [--runtime S] [--rounds N]
# Output: a table (median of the rounds per side, ratio default/one) and .cache/bench/reactors.json.
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
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null' EXIT
serve() { # NAME PORT REACTORS...
    local name=$1 port=$2; shift 2
    cat > "$DIR/$name.toml" <<TOML
data_dir = "$DIR/$name-data"
listen = ["127.0.0.1:$port"]
api_listen = "127.0.0.1:$((port + 1))"
[[subsystem]]
nqn = "$NQN"
[[subsystem.namespace]]
nsid = 1
backend = "ram"
size = "256MiB"
[[subsystem.namespace]]
nsid = 2
backend = "file"
path = "$FILE"
TOML
    "$WEFT" serve --config "$DIR/$name.toml" "$@" > "$DIR/$name.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$((port + 1))") 2>/dev/null && return 0; sleep 0.1; done
    echo "weft did not start; see $DIR/$name.log" >&2; exit 1
}
serve one 14480 --reactors 1
serve default 14490
port() { [ "$1" = one ] && echo 14480 || echo 14490; }
json_get() { python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))["jobs"][0]; d=j["read"]; print(round(d["iops"]), round(d["lat_ns"]["mean"]/1000,1), round(d["bw_bytes"]/1048576,1))' "$1"; }
load() { # SIDE LOAD ROUND
    local side=$1 load=$2 round=$3 url="nvme-tcp://127.0.0.1:$(port "$1")/$NQN"
    local out="$DIR/$load-$side-$round.json"
    case $load in
        ram-qd1) "$WEFT" bench --target "$url" --nsid 1 --iodepth 1 --runtime "${RUNTIME}s" --json > "$out" ;;
        ram-qd32) "$WEFT" bench --target "$url" --nsid 1 --iodepth 32 --runtime "${RUNTIME}s" --json > "$out" ;;
        ram-qd32x2) "$WEFT" bench --target "$url" --nsid 1 --iodepth 16 --queues 2 --runtime "${RUNTIME}s" --json > "$out" ;;
        file-qd32) "$WEFT" bench --target "$url" --nsid 2 --iodepth 32 --runtime "${RUNTIME}s" --json > "$out" ;;
        file-128k) "$WEFT" bench --target "$url" --nsid 2 --rw read --bs 128k --iodepth 8 --runtime "${RUNTIME}s" --json > "$out" ;;
        fio-ram-qd32)
            fio --ioengine=external:"$ENGINE" --filename="${url//:/\\:}?nsid=1" --name=r \
                --rw=randread --bs=4k --iodepth=32 --time_based --runtime="$RUNTIME" \
                --output-format=json > "$out" 2>/dev/null ;;
    esac
    json_get "$out"
}
LOADS=(ram-qd1 ram-qd32 ram-qd32x2 file-qd32 file-128k fio-ram-qd32)
for side in one default; do "$WEFT" bench --target "nvme-tcp://127.0.0.1:$(port $side)/$NQN" --nsid 1 --runtime 1s > /dev/null; done
for round in $(seq "$ROUNDS"); do
    for load in "${LOADS[@]}"; do
        for side in one default; do
            read -r iops mean bw < <(load $side "$load" "$round")
            echo "$load $side $round $iops $mean $bw" >> "$DIR/results.txt"
        done
    done
done
python3 - "$DIR" "$(nproc)" <<'PY'
import json, statistics, sys
d, cpus = sys.argv[1], sys.argv[2]
rows = {}
for line in open(f"{d}/results.txt"):
    load, side, _, iops, mean, bw = line.split()
    rows.setdefault(load, {}).setdefault(side, []).append((float(iops), float(mean), float(bw)))
out = {"cpus": int(cpus), "loads": {}}
print(f"{'load (4k randread unless named)':<34} {'1 reactor':>18} {cpus + ' reactors (default)':>24} {'default/1':>10}")
for load, sides in rows.items():
    med = {s: (statistics.median(v[0] for v in vals), statistics.median(v[1] for v in vals), statistics.median(v[2] for v in vals)) for s, vals in sides.items()}
    one, dflt = med["one"], med["default"]
    if load == "file-128k":
        fmt = lambda m: f"{m[2]:.0f} MiB/s"; ratio = dflt[2] / one[2]
    elif load == "ram-qd1":
        fmt = lambda m: f"{m[1]:.1f} us mean"; ratio = dflt[1] / one[1]
    else:
        fmt = lambda m: f"{m[0]:,.0f} IOPS"; ratio = dflt[0] / one[0]
    print(f"{load:<34} {fmt(one):>18} {fmt(dflt):>24} {ratio:>9.2f}x")
    out["loads"][load] = {"one_reactor": {"iops": one[0], "mean_us": one[1], "mib_s": one[2]}, "default": {"iops": dflt[0], "mean_us": dflt[1], "mib_s": dflt[2]}, "ratio": ratio}
json.dump(out, open(f"{d}/../reactors.json", "w"), indent=1)
PY
