#!/bin/bash
# Runs in the application benchmark's guest (harness/bench-apps.sh boots it): the same
# applications on a weft volume (weft serving in this guest from /dev/vdc, the kernel's
# NVMe/TCP host over loopback) and on the guest's own virtio disk /dev/vdb, both ext4,
# alternated per round (local first in odd rounds, remote first in even ones):
#   rocksdb-800b, rocksdb-10kb  db_bench: fillrandom, then readrandomwriterandom at 80% reads,
#                               direct I/O for reads and for flush/compaction, one thread
#                               (each read waits for the one before: a QD1 latency test)
#   rocksdb-800b-4t, -10kb-4t   then the same mix again with 4 threads (as the MariaDB
#                               clients below) on that database, after the one-thread mix's
#                               writes: the comparison with concurrency
#   sysbench                    oltp_read_write on MariaDB
#   tpcc                        go-tpc tpcc on MariaDB (1 warehouse)
#   ycsb-a .. ycsb-f            go-ycsb workloads A-F on MariaDB (a fixed operation count:
#                               500 per second of RUNTIME; every run inserts from the same
#                               key on, so D's and E's inserts after the first run are
#                               ignored duplicates, the same on both sides)
# Each side's MariaDB lives on that side's filesystem (prepared once, restarted per round).
# (No process substitution here: the guest has no /dev/fd.)
# Env: RUNTIME (seconds per measured run), ROUNDS, SCALE (smoke|full), APPS (which of
# rocksdb,sysbench,tpcc,ycsb; default all), WEFT_SERVE_ARGS (more `weft serve` options),
# WEFT_BIN, GO_BIN, YCSB_WORKLOADS, YCSB_RUN (which workloads: default "a b c d e f"). Writes apps/results.jsonl (one line per run: app, side, round, ops_s,
# avg_us, p99_us, unit) and every raw output to apps/raw/ in the share.
set -uo pipefail
RUNTIME=${RUNTIME:-20} ROUNDS=${ROUNDS:-3} SCALE=${SCALE:-full}
APPS=${APPS:-rocksdb,sysbench,tpcc,ycsb}
YCSB_RUN=${YCSB_RUN:-a b c d e f}
wanted() { [[ ",$APPS," == *",$1,"* ]]; }
MARIADB=0
for app in sysbench tpcc ycsb; do wanted $app && MARIADB=1; done
OUT=$LAB_SHARE/apps
mkdir -p "$OUT/raw"
: > "$OUT/results.jsonl"
FAILS=0
fail() { echo "FAIL $*"; FAILS=$((FAILS + 1)); }
if [ "$SCALE" = smoke ]; then
    KEYS_800=2000 KEYS_10K=500 SB_ROWS=1000 YCSB_RECORDS=1000 YCSB_OPS=500
else
    KEYS_800=200000 KEYS_10K=20000 SB_ROWS=20000 YCSB_RECORDS=20000 YCSB_OPS=$((RUNTIME * 500))
fi

# The Go tools start faster from the guest's memory than from the 9p share.
mkdir -p /tmp/bin && cp "$GO_BIN/go-tpc" "$GO_BIN/go-ycsb" /tmp/bin/ && GO_BIN=/tmp/bin ||
    { echo "FAIL Go tools missing in $GO_BIN"; exit 1; }
echo "=== weft in the guest: a pool on /dev/vdc, a volume over NVMe/TCP on loopback"
modprobe nvme-tcp || { echo "FAIL modprobe nvme-tcp"; exit 1; }
mkdir -p /tmp/weft
# shellcheck disable=SC2086 # WEFT_SERVE_ARGS: extra options, word-split on purpose
"$WEFT_BIN" serve --data-dir /tmp/weft --listen 127.0.0.1:4420 ${WEFT_SERVE_ARGS:-} \
    > "$OUT/raw/weft-serve.log" 2>&1 &
for _ in $(seq 300); do [ -s /tmp/weft/api-token ] && (exec 3<>/dev/tcp/127.0.0.1/9440) 2>/dev/null && break; sleep 0.2; done
export WEFT_API=127.0.0.1:9440 WEFT_API_TOKEN=$(cat /tmp/weft/api-token)
HOSTNQN=$(cat /etc/nvme/hostnqn)
VOLUME_MIB=$(( $(blockdev --getsize64 /dev/vdc) / 1048576 - 256 ))
{ "$WEFT_BIN" pool create apps --device /dev/vdc --force &&
  "$WEFT_BIN" volume create bench --pool apps --size "${VOLUME_MIB}MiB" &&
  "$WEFT_BIN" host add guest --nqn "$HOSTNQN" &&
  "$WEFT_BIN" volume attach bench --host guest; } > "$OUT/raw/weft-setup.log" 2>&1 ||
    { cat "$OUT/raw/weft-setup.log"; echo "FAIL weft setup"; exit 1; }
nvme connect -t tcp -a 127.0.0.1 -s 4420 -n nqn.2026-11.io.weft:vol:bench > /dev/null ||
    { echo "FAIL nvme connect"; exit 1; }
REMOTE_DEV=
for _ in $(seq 100); do
    for dev in /sys/block/nvme*; do
        [ -e "$dev" ] && grep -q "vol:bench" "$dev/device/subsysnqn" 2>/dev/null && REMOTE_DEV=/dev/${dev##*/}
    done
    [ -n "$REMOTE_DEV" ] && [ -b "$REMOTE_DEV" ] && break
    sleep 0.2
done
[ -b "$REMOTE_DEV" ] || { echo "FAIL no block device for the volume"; exit 1; }
for side in local remote; do
    dev=/dev/vdb; [ $side = remote ] && dev=$REMOTE_DEV
    # No lazy initialization: it would write in the background during the first runs.
    mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$dev" && mkdir -p /mnt/$side &&
        mount -o noatime "$dev" /mnt/$side ||
        { echo "FAIL mkfs/mount $side"; exit 1; }
    echo "  $side: $dev, $(( $(blockdev --getsize64 "$dev") / 1048576 )) MiB, ext4 on /mnt/$side"
done

record() { # APP SIDE ROUND OPS_S AVG_US P99_US UNIT
    if [ -z "$4" ] || [ -z "$5" ]; then fail "$1 on $2 (round $3): no result, see raw/$1-$2-$3.txt"; return; fi
    printf '{"app":"%s","side":"%s","round":%s,"ops_s":%s,"avg_us":%s,"p99_us":%s,"unit":"%s"}\n' \
        "$1" "$2" "$3" "$4" "$5" "${6:-null}" "$7" >> "$OUT/results.jsonl"
    printf '  %-16s %-6s round %s: %10.1f %s, avg %9.1f us, p99 %9s us\n' "$1" "$2" "$3" "$4" "$7" "$5" "${6:-?}"
}

rocksdb() { # NAME VALUE_BYTES KEYS SIDE ROUND
    local raw=$OUT/raw/$1-$4-$5.txt dir=/mnt/$4/rocksdb
    local common=(--db="$dir" --num="$3" --value_size="$2" --use_direct_reads=true
        --use_direct_io_for_flush_and_compaction=true --compression_type=none)
    rm -rf "$dir"
    # The whole load first, one thread (--duration would cut fillrandom short too, and each
    # run would then read a different amount of data; more threads would each load --num).
    timeout 1800 db_bench "${common[@]}" --threads=1 --benchmarks=fillrandom > "$raw" 2>&1 || {
        record "$1" "$4" "$5" "" "" "" "ops/s"; return; }
    rocksdb_mix "$1" 1 "$4" "$5" "$raw" "${common[@]}"
    rocksdb_mix "$1-4t" 4 "$4" "$5" "$OUT/raw/$1-4t-$4-$5.txt" "${common[@]}"
}

rocksdb_mix() { # NAME THREADS SIDE ROUND RAW DB_BENCH_ARGS...: the timed 80% read mix
    local name=$1 threads=$2 side=$3 round=$4 raw=$5
    shift 5
    timeout $((RUNTIME * 4 + 600)) db_bench "$@" --threads="$threads" --use_existing_db=1 \
        --benchmarks=readrandomwriterandom --readwritepercent=80 --duration="$RUNTIME" \
        --histogram=1 >> "$raw" 2>&1
    local ops= avg= p99=
    read -r ops avg p99 <<< "$(python3 - "$raw" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
m = re.search(r"^readrandomwriterandom\s*:\s*([\d.]+) micros/op\s+(\d+) ops/sec", text, re.M)
if not m:
    sys.exit()
p = re.search(r"Percentiles:.*?P99: ([\d.]+)", text[m.end():])
print(m.group(2), m.group(1), p.group(1) if p else "")
PY
)"
    record "$name" "$side" "$round" "$ops" "$avg" "$p99" "ops/s"
}

mariadb_start() { # SIDE
    local data=/mnt/$1/mysql
    if [ ! -d "$data/mysql" ]; then
        mariadb-install-db --user=root --datadir="$data" --auth-root-authentication-method=normal \
            > "$OUT/raw/mariadb-install-$1.txt" 2>&1 || { fail "mariadb-install-db on $1"; return 1; }
    fi
    mariadbd --user=root --datadir="$data" --socket=/tmp/mysqld.sock --port=3306 \
        --bind-address=127.0.0.1 --skip-name-resolve --pid-file=/tmp/mysqld.pid \
        --innodb-buffer-pool-size=64M --innodb-flush-method=O_DIRECT --innodb-log-file-size=64M \
        --max-connections=64 >> "$OUT/raw/mariadbd-$1.log" 2>&1 &
    MARIADB_PID=$!
    for _ in $(seq 600); do mariadb-admin --socket=/tmp/mysqld.sock -uroot ping > /dev/null 2>&1 && break; sleep 0.2; done
    mariadb --socket=/tmp/mysqld.sock -uroot -e "CREATE USER IF NOT EXISTS bench@'127.0.0.1' IDENTIFIED BY 'bench';
        GRANT ALL ON *.* TO bench@'127.0.0.1'; CREATE DATABASE IF NOT EXISTS sbtest;
        CREATE DATABASE IF NOT EXISTS tpcc; CREATE DATABASE IF NOT EXISTS ycsb;" ||
        { fail "MariaDB did not start on $1"; return 1; }
    # The server answering is this side's (not one left running on the other side's disk).
    [ "$(mariadb --socket=/tmp/mysqld.sock -uroot -N -e 'SELECT @@datadir')" = "$data/" ] ||
        { fail "MariaDB on $1 does not serve $data"; return 1; }
}
mariadb_stop() { # stops the server started last, whatever state it is in
    mariadb-admin --socket=/tmp/mysqld.sock -uroot shutdown > /dev/null 2>&1
    for _ in $(seq 600); do kill -0 "$MARIADB_PID" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$MARIADB_PID" 2>/dev/null
    wait "$MARIADB_PID" 2>/dev/null
    rm -f /tmp/mysqld.sock /tmp/mysqld.pid
}

SB=(--db-driver=mysql --mysql-host=127.0.0.1 --mysql-user=bench --mysql-password=bench
    --mysql-db=sbtest --tables=4 --table-size=$SB_ROWS --threads=4)
TPC=(-H 127.0.0.1 -P 3306 -U bench -p bench -D tpcc --warehouses 1)
YCSB=(-p mysql.host=127.0.0.1 -p mysql.port=3306 -p mysql.user=bench -p mysql.password=bench
      -p mysql.db=ycsb -p recordcount=$YCSB_RECORDS -p threadcount=4)

prepare_sql() { # SIDE: tables for sysbench, go-tpc and go-ycsb (those wanted), once per side
    if wanted sysbench; then
        timeout 3600 sysbench oltp_read_write "${SB[@]}" prepare > "$OUT/raw/sysbench-prepare-$1.txt" 2>&1 ||
            fail "sysbench prepare on $1"
    fi
    # --no-check: go-tpc's consistency queries after the load take longer than the load
    # under emulation (over 15 minutes for one warehouse).
    if wanted tpcc; then
        timeout 3600 "$GO_BIN/go-tpc" tpcc "${TPC[@]}" --threads 4 prepare --no-check \
            > "$OUT/raw/tpcc-prepare-$1.txt" 2>&1 ||
            fail "go-tpc prepare on $1"
    fi
    if wanted ycsb; then
        timeout 3600 "$GO_BIN/go-ycsb" load mysql -P "$YCSB_WORKLOADS/workloada" "${YCSB[@]}" \
            > "$OUT/raw/ycsb-load-$1.txt" 2>&1 || fail "go-ycsb load on $1"
    fi
}

sysbench_run() { # SIDE ROUND
    local raw=$OUT/raw/sysbench-$1-$2.txt
    timeout $((RUNTIME + 600)) sysbench oltp_read_write "${SB[@]}" --time="$RUNTIME" --percentile=99 \
        --events=0 run > "$raw" 2>&1
    local tps avg p99
    tps=$(sed -n 's/.*transactions: *[0-9]* *(\([0-9.]*\) per sec.).*/\1/p' "$raw")
    avg=$(awk '/^ *avg:/ {print $2 * 1000; exit}' "$raw")
    p99=$(awk '/99th percentile:/ {print $3 * 1000; exit}' "$raw")
    record sysbench "$1" "$2" "$tps" "$avg" "$p99" "transactions/s"
}

tpcc_run() { # SIDE ROUND
    local raw=$OUT/raw/tpcc-$1-$2.txt
    timeout $((RUNTIME + 600)) "$GO_BIN/go-tpc" tpcc "${TPC[@]}" --threads 4 --time "${RUNTIME}s" run > "$raw" 2>&1
    local tpmc= avg= p99=
    read -r tpmc avg p99 <<< "$(python3 - "$raw" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
t = re.findall(r"tpmC: ([\d.]+)", text)
s = [l for l in text.splitlines() if "[Summary] NEW_ORDER " in l and "ERR" not in l]
if not t or not s:
    sys.exit()
avg = re.search(r"Avg\(ms\): ([\d.]+)", s[-1]).group(1)
p99 = re.search(r"99th\(ms\): ([\d.]+)", s[-1]).group(1)
print(t[-1], float(avg) * 1000, float(p99) * 1000)
PY
)"
    record tpcc "$1" "$2" "$tpmc" "$avg" "$p99" "tpmC"
}

ycsb_run() { # WORKLOAD SIDE ROUND
    local raw=$OUT/raw/ycsb-$1-$2-$3.txt
    # A fixed count (go-ycsb ignores maxexecutiontime); it times the operations itself.
    timeout $((RUNTIME * 20 + 600)) "$GO_BIN/go-ycsb" run mysql -P "$YCSB_WORKLOADS/workload$1" \
        "${YCSB[@]}" -p operationcount=$YCSB_OPS > "$raw" 2>&1
    local ops= avg= p99=
    read -r ops avg p99 <<< "$(python3 - "$raw" <<'PY'
import re, sys
rows = {}
text = open(sys.argv[1]).read()
for line in text[text.find("Run finished"):].splitlines():
    m = re.match(r"^(\w+)\s+- Takes\(s\): [\d.]+, Count: (\d+), OPS: ([\d.]+), Avg\(us\): (\d+).*?99th\(us\): (\d+)", line)
    if m and not m.group(1).endswith("_ERROR"):
        rows[m.group(1)] = tuple(float(x) for x in m.groups()[1:])
if "TOTAL" in rows:
    rows = {"TOTAL": rows["TOTAL"]}
if not rows:
    sys.exit()
count = sum(r[0] for r in rows.values())
print(sum(r[1] for r in rows.values()), sum(r[0] * r[2] for r in rows.values()) / max(count, 1),
      max(r[3] for r in rows.values()))
PY
)"
    record "ycsb-$1" "$2" "$3" "$ops" "$avg" "$p99" "ops/s"
}

if [ "$MARIADB" = 1 ]; then
    echo "=== preparing the databases (once per side)"
    for side in local remote; do
        mariadb_start $side && prepare_sql $side
        mariadb_stop
    done
fi

for round in $(seq "$ROUNDS"); do
    order=(local remote); [ $((round % 2)) = 0 ] && order=(remote local)
    echo "=== round $round (${order[*]})"
    for side in "${order[@]}"; do
        if wanted rocksdb; then
            rocksdb rocksdb-800b 800 "$KEYS_800" "$side" "$round"
            # The smoke runs the small values only (CI time).
            [ "$SCALE" = smoke ] || rocksdb rocksdb-10kb 10240 "$KEYS_10K" "$side" "$round"
        fi
        sync; echo 3 > /proc/sys/vm/drop_caches
        [ "$MARIADB" = 1 ] || continue
        mariadb_start "$side" || { mariadb_stop; continue; }
        wanted sysbench && sysbench_run "$side" "$round"
        wanted tpcc && tpcc_run "$side" "$round"
        # shellcheck disable=SC2086 # YCSB_RUN: a list of workload letters
        if wanted ycsb; then for w in $YCSB_RUN; do ycsb_run $w "$side" "$round"; done; fi
        mariadb_stop
        sync; echo 3 > /proc/sys/vm/drop_caches
    done
done

# weft's counters over the whole run (the reactors' spin rests among them).
python3 -c 'import os, urllib.request as u
r = u.Request("http://%s/api/v1/stats" % os.environ["WEFT_API"],
              headers={"Authorization": "Bearer " + os.environ["WEFT_API_TOKEN"]})
print(u.urlopen(r, timeout=10).read().decode())' > "$OUT/raw/weft-stats.json" 2>&1
echo "=== result"
if [ "$FAILS" = 0 ]; then echo "PASS applications: $(wc -l < "$OUT/results.jsonl") runs"; else echo "FAIL applications: $FAILS failure(s)"; fi
[ "$FAILS" = 0 ]
