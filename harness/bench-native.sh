#!/bin/bash
# The native benchmark suite of the benchmark issue, on this machine, in one run: weft serves
# a RAM namespace and a file namespace on loopback and `weft bench` measures, side by side:
#   1. QD1 4k randread on the RAM namespace vs `weft bench floor` (cross-CPU TCP echo with
#      the same sizes), alternated ROUNDS times: mean and p99 ratios (goal <= 1.3x / 1.5x)
#   2. QD32 4k randread, remote file namespace vs the same file locally (io_uring, O_DIRECT),
#      `weft bench compare --rounds ROUNDS`: IOPS ratio (goal >= 0.95), and the target's CPU
#      while it served (goal <= 1 core)
#   3. 128k sequential read, same comparison: bandwidth ratio (goal >= 0.95); and 1 MiB
#      (the largest transfer, MDTS), one command per I/O on both sides
#   4. the target's CPU while idle for 10 s (goal ~0)
#   5. where the time goes (harness/stages.py): QD1 RAM, QD32 4k and QD8 128k on the file,
#      each stage's mean time per I/O, the host's and the target's, and how many of the
#      host's I/Os were in it on average
# Prints a table and writes .cache/bench/native.json (raw outputs next to it).
# Usage: harness/bench-native.sh [--weft PATH] [--runtime S] [--rounds N] [--file-mib N]
#   defaults: target/release/weft, 5 s per measurement, 3 rounds, 1024 MiB file (written once
#   with random data and kept in .cache/bench/; a sparse file would read holes, not the disk)
set -euo pipefail
cd "$(dirname "$0")/.."
WEFT=target/release/weft RUNTIME=5 ROUNDS=3 FILE_MIB=1024 PORT=14460
while [ $# -gt 0 ]; do
    case "$1" in
        --weft) WEFT=$2; shift 2 ;;
        --runtime) RUNTIME=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --file-mib) FILE_MIB=$2; shift 2 ;;
        *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2 ;;
    esac
done
[ -x "$WEFT" ] || { echo "bench-native: no weft binary at $WEFT (cargo build --release)" >&2; exit 2; }
WEFT=$(realpath "$WEFT")
DIR=$PWD/.cache/bench
mkdir -p "$DIR/data"
FILE=$DIR/file-$FILE_MIB.img
if [ ! -s "$FILE" ]; then
    echo "bench-native: writing $FILE ($FILE_MIB MiB of random data, once)"
    dd if=/dev/urandom of="$FILE.tmp" bs=1M count="$FILE_MIB" status=none && sync && mv "$FILE.tmp" "$FILE"
fi
NQN=nqn.2026-11.io.weft:bench
URL=nvme-tcp://127.0.0.1:$PORT/$NQN
. harness/lib.sh
bench_config "$DIR/weft.toml" "$DIR/data" "$PORT" "$FILE"
start_weft $((PORT + 1)) "$DIR/serve.log" "$WEFT" serve --config "$DIR/weft.toml"
PID=$WEFT_PID
cpu_ticks() { awk '{print $14 + $15}' "/proc/$PID/stat"; }
HZ=$(getconf CLK_TCK)

echo "== 4. idle target CPU (10 s)"
T0=$(cpu_ticks); sleep 10; IDLE_TICKS=$(( $(cpu_ticks) - T0 ))

echo "== 1. QD1 4k randread, RAM namespace vs the TCP floor ($ROUNDS rounds)"
"$WEFT" bench --target "$URL" --nsid 1 --runtime 2s > /dev/null   # warm-up: buffers, caches
for round in $(seq "$ROUNDS"); do
    "$WEFT" bench floor --runtime "${RUNTIME}s" --json | tail -1 > "$DIR/floor-$round.json"
    "$WEFT" bench --target "$URL" --nsid 1 --iodepth 1 --runtime "${RUNTIME}s" --json > "$DIR/qd1-$round.json"
done

echo "== 2. QD32 4k randread, file namespace: remote vs local"
T0=$(cpu_ticks)
"$WEFT" bench compare --local "$FILE" --remote "$URL" --nsid 2 --rw randread --bs 4k --iodepth 32 \
    --rounds "$ROUNDS" --runtime "${RUNTIME}s" --json "$DIR/qd32.json" | tee "$DIR/qd32.txt"
QD32_TICKS=$(( $(cpu_ticks) - T0 ))

echo "== 3. 128k sequential read, file namespace: remote vs local"
"$WEFT" bench compare --local "$FILE" --remote "$URL" --nsid 2 --rw read --bs 128k --iodepth 8 \
    --rounds "$ROUNDS" --runtime "${RUNTIME}s" --json "$DIR/seq128k.json" | tee "$DIR/seq128k.txt"
"$WEFT" bench compare --local "$FILE" --remote "$URL" --nsid 2 --rw read --bs 1m --iodepth 4 \
    --rounds "$ROUNDS" --runtime "${RUNTIME}s" --json "$DIR/seq1m.json" | tee "$DIR/seq1m.txt"

echo "== 5. where the time goes"
STAGES=(python3 harness/stages.py --api "http://127.0.0.1:$((PORT + 1))" --token "$DIR/data/api-token")
"${STAGES[@]}" --label "QD1 4k randread, RAM" --json "$DIR/stages-qd1.json" -- \
    "$WEFT" bench --target "$URL" --nsid 1 --iodepth 1 --runtime "${RUNTIME}s" --json
"${STAGES[@]}" --label "QD32 4k randread, file" --json "$DIR/stages-qd32.json" -- \
    "$WEFT" bench --target "$URL" --nsid 2 --iodepth 32 --runtime "${RUNTIME}s" --json
"${STAGES[@]}" --label "QD8 128k read, file" --json "$DIR/stages-128k.json" -- \
    "$WEFT" bench --target "$URL" --nsid 2 --rw read --bs 128k --iodepth 8 --runtime "${RUNTIME}s" --json

python3 - "$DIR" "$ROUNDS" "$RUNTIME" "$IDLE_TICKS" "$QD32_TICKS" "$HZ" <<'PY'
import json, statistics, sys
d, rounds, runtime, idle_ticks, qd32_ticks, hz = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
mean_ratios, p99_ratios = [], []
for r in range(1, rounds + 1):
    floor = next(row for row in json.load(open(f'{d}/floor-{r}.json'))['weft_bench_floor']
                 if row['iodepth'] == 1 and row['placement'] == 'cross-CPU')['read']['lat_ns']
    weft = json.load(open(f'{d}/qd1-{r}.json'))['jobs'][0]['read']['lat_ns']
    mean_ratios.append(weft['mean'] / floor['mean'])
    p99_ratios.append(weft['percentile']['99.000000'] / floor['percentile']['99.000000'])
    print(f"  round {r}: floor mean {floor['mean']/1000:.1f} us p99 {floor['percentile']['99.000000']/1000:.1f} us;"
          f" weft mean {weft['mean']/1000:.1f} us p99 {weft['percentile']['99.000000']/1000:.1f} us")
qd32 = json.load(open(f'{d}/qd32.json'))['weft_bench_compare']['points'][0]
seq = json.load(open(f'{d}/seq128k.json'))['weft_bench_compare']['points'][0]
seq1m = json.load(open(f'{d}/seq1m.json'))['weft_bench_compare']['points'][0]
target_cores = qd32_ticks / hz / (rounds * runtime)
# The remote side's IOPS over the same comparison: what a core of target buys.
cores_per_100k = target_cores / max(qd32['remote']['read']['iops'] / 100_000, 1e-9)
rows = [
    ('QD1 RAM mean / floor (median of rounds)', statistics.median(mean_ratios), '<= 1.3', statistics.median(mean_ratios) <= 1.3),
    ('QD1 RAM p99 / floor (median of rounds)', statistics.median(p99_ratios), '<= 1.5', statistics.median(p99_ratios) <= 1.5),
    ('QD32 4k randread remote/local IOPS', qd32['iops_ratio'], '>= 0.95', qd32['iops_ratio'] >= 0.95),
    ('QD32 target CPU (cores, while serving)', target_cores, '<= 1', target_cores <= 1),
    ('QD32 target CPU per 100K IOPS (cores)', cores_per_100k, 'recorded', True),
    ('128k seq read remote/local MiB/s', seq['bw_ratio'], '>= 0.95', seq['bw_ratio'] >= 0.95),
    ('1M seq read remote/local MiB/s', seq1m['bw_ratio'], '>= 0.95', seq1m['bw_ratio'] >= 0.95),
    ('idle target CPU (cores, 10 s)', idle_ticks / hz / 10, '~0', idle_ticks / hz / 10 < 0.01),
]
print()
print(f"{'measure':<42} {'value':>8}  {'goal':<8} met")
for name, value, goal, met in rows:
    print(f"{name:<42} {value:>8.3f}  {goal:<8} {'yes' if met else 'NO'}")
json.dump({'rounds': rounds, 'runtime_s': runtime,
           'results': [{'measure': n, 'value': round(v, 4), 'goal': g, 'met': m} for n, v, g, m in rows]},
          open(f'{d}/native.json', 'w'), indent=1)
print(f"\nJSON: {d}/native.json")
PY
