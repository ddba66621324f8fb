#!/bin/bash
# Applications on weft against the same applications on a local disk, in the Linux guest:
# RocksDB db_bench (800 B and 10 KB values, 80% reads), sysbench OLTP read/write on MariaDB,
# TPC-C (go-tpc) on MariaDB and YCSB A-F (go-ycsb) on MariaDB, each on a weft volume (weft
# serving in the guest from its second virtio disk, the kernel's NVMe/TCP host over
# loopback) and on the guest's own first virtio disk, alternated per round; see
# harness/guest/apps.sh. Both disks are files here with the same qemu settings.
# Usage (root): harness/bench-apps.sh [--weft PATH] [--runtime S] [--rounds N] [--smoke]
#   --runtime S   seconds per measured run (default 20)
#   --rounds N    alternations (default 3; the median per side is reported)
#   --smoke       tiny datasets, 2 s runs, one round, RocksDB's small values, sysbench and
#                 YCSB's A and E only (what CI runs; TPC-C's load of one warehouse alone takes
#                 over three minutes under emulation)
#   --apps LIST   which, comma-separated: rocksdb,sysbench,tpcc,ycsb (default all)
#   --serve-args "ARGS"  more options for the guest's `weft serve` (e.g. "--poll-us 0")
# Output: a table (ops/s, average and p99 latency per side, remote/local ratios),
# .cache/bench/apps/result.json, apps-ops.svg and apps-latency.svg beside it, and every raw
# output in .cache/bench/apps/share/apps/raw/.
# The guest is emulated (TCG): only the ratios of one run mean anything. What the emulation
# does to each side is in docs/PERFORMANCE.md.
set -euo pipefail
cd "$(dirname "$0")/.."
WEFT=target/release/weft RUNTIME=20 ROUNDS=3 SCALE=full DISK_GIB=4 APPS=rocksdb,sysbench,tpcc,ycsb SERVE_ARGS=''
YCSB_RUN="a b c d e f"
while [ $# -gt 0 ]; do
    case "$1" in
        --weft) WEFT=$2; shift 2 ;;
        --runtime) RUNTIME=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --smoke) RUNTIME=2 ROUNDS=1 SCALE=smoke DISK_GIB=2 APPS=rocksdb,sysbench,ycsb YCSB_RUN="a e"; shift ;;
        --apps) APPS=$2; shift 2 ;;
        --serve-args) SERVE_ARGS=$2; shift 2 ;;
        *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2 ;;
    esac
done
for app in ${APPS//,/ }; do
    case "$app" in
        rocksdb | sysbench | tpcc | ycsb) ;;
        *) echo "bench-apps: --apps: unknown application '$app' (rocksdb, sysbench, tpcc, ycsb)" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" = 0 ] || { echo "bench-apps: run as root" >&2; exit 2; }
REPO=$PWD
WEFT=$(realpath -m "$WEFT")
case "$WEFT" in "$REPO"/*) ;; *) echo "bench-apps: $WEFT is outside the repository, the guest cannot see it" >&2; exit 2 ;; esac
[ -x "$WEFT" ] || { echo "bench-apps: no weft binary at $WEFT (cargo build --release)" >&2; exit 2; }
IMAGE=$(harness/vm/build-apps-image.sh)
GOBIN=$(harness/app-tools.sh)
DIR=$REPO/.cache/bench/apps
mkdir -p "$DIR"
exec 9> "$DIR.lock"
flock -n 9 || { echo "bench-apps: another run is active ($DIR.lock)" >&2; exit 2; }
rm -rf "$DIR/share" "$DIR"/*.img
mkdir -p "$DIR/share"
trap 'rm -f "$DIR"/*.img' EXIT
for disk in local pool; do fallocate -l "${DISK_GIB}G" "$DIR/$disk.img"; done
DRIVE=format=raw,if=virtio,cache=none,aio=threads
export LAB_IMAGE_DIR=$IMAGE
# Linux 6.1's hardened usercopy check kills a user-space target's receive of data the
# kernel's own NVMe/TCP host sent over loopback from huge pages (MariaDB's buffer pool):
# "usercopy: Kernel memory exposure attempt detected from page alloc", kernel BUG in
# tcp_recvmsg (Mayastor users meet it too: openebs/mayastor#1330, #1693). The copy itself
# is sound (skb fragments coalesced across adjacent compound pages); only this guest, where
# host and target share a kernel, turns the check off.
export LAB_APPEND="hardened_usercopy=off"
export LAB_QEMU_EXTRA="-drive file=$DIR/local.img,$DRIVE -drive file=$DIR/pool.img,$DRIVE"
status=0
harness/vm/vm-run.sh -s "$DIR/share" -n none -c 2 -m 4096 -t $((RUNTIME * ROUNDS * 40 + 3600)) \
    -e RUNTIME="$RUNTIME" -e ROUNDS="$ROUNDS" -e SCALE="$SCALE" -e APPS="$APPS" \
    -e WEFT_SERVE_ARGS="$SERVE_ARGS" -e YCSB_RUN="$YCSB_RUN" \
    -e WEFT_BIN="/mnt/weft/${WEFT#"$REPO"/}" -e GO_BIN="/mnt/weft/${GOBIN#"$REPO"/}" \
    -e YCSB_WORKLOADS=/mnt/weft/.cache/go/ycsb-workloads \
    harness/guest/apps.sh || status=$?
rm -f "$DIR"/*.img
if [ ! -s "$DIR/share/apps/results.jsonl" ]; then
    echo "bench-apps: no results (guest exit $status); see $DIR/share/.lab/console.log" >&2
    exit $((status ? status : 1))
fi
python3 - "$DIR" "$RUNTIME" "$ROUNDS" "$SCALE" <<'PY'
import json, statistics, sys
d, runtime, rounds, scale = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
runs = [json.loads(l) for l in open(f"{d}/share/apps/results.jsonl") if l.strip()]
apps = list(dict.fromkeys(r["app"] for r in runs))
def med(app, side, key):
    vals = [r[key] for r in runs if r["app"] == app and r["side"] == side and r[key] is not None]
    return statistics.median(vals) if vals else None
def ratio(a, b):
    return a / b if a is not None and b else None
out = {"runtime_s": int(runtime), "rounds": int(rounds), "scale": scale, "apps": {}}
print(f"{'application':<17}{'unit':<16}{'local':>10}{'remote':>10}{'ratio':>7}"
      f"{'avg us local':>14}{'remote':>10}{'ratio':>7}{'p99 us local':>14}{'remote':>10}{'ratio':>7}")
for app in apps:
    unit = next(r["unit"] for r in runs if r["app"] == app)
    row = {s: {k: med(app, s, k) for k in ("ops_s", "avg_us", "p99_us")} for s in ("local", "remote")}
    row["ratio"] = {k: ratio(row["remote"][k], row["local"][k]) for k in ("ops_s", "avg_us", "p99_us")}
    row["unit"] = unit
    out["apps"][app] = row
    f = lambda v, w, p=0: f"{v:>{w},.{p}f}" if v is not None else f"{'-':>{w}}"
    print(f"{app:<17}{unit:<16}{f(row['local']['ops_s'], 10, 1)}{f(row['remote']['ops_s'], 10, 1)}"
          f"{f(row['ratio']['ops_s'], 7, 2)}{f(row['local']['avg_us'], 14)}{f(row['remote']['avg_us'], 10)}"
          f"{f(row['ratio']['avg_us'], 7, 2)}{f(row['local']['p99_us'], 14)}{f(row['remote']['p99_us'], 10)}"
          f"{f(row['ratio']['p99_us'], 7, 2)}")
json.dump(out, open(f"{d}/result.json", "w"), indent=1)

def chart(path, title, keys):
    """Horizontal bars of remote/local per application, a line at 1.0."""
    rows = [(a, [out["apps"][a]["ratio"][k] for k, _ in keys]) for a in apps]
    largest = max([v for _, vs in rows for v in vs if v is not None] + [1.0])
    w, left, bar, gap = 720, 130, 12, 10
    scale_x = (w - left - 60) / largest
    h = 60 + len(rows) * (bar * len(keys) + gap) + 30
    colours = ["#3a6ea5", "#e07b39", "#6a9f58"]
    s = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
         f'<text x="10" y="20" font-size="14">{title}</text>']
    for i, (_, label) in enumerate(keys):
        s.append(f'<rect x="{left + i * 170}" y="32" width="10" height="10" fill="{colours[i]}"/>'
                 f'<text x="{left + i * 170 + 14}" y="41">{label}</text>')
    y = 55
    for app, values in rows:
        s.append(f'<text x="10" y="{y + bar * len(keys) / 2 + 4}">{app}</text>')
        for i, v in enumerate(values):
            if v is not None:
                s.append(f'<rect x="{left}" y="{y + i * bar}" width="{v * scale_x:.1f}" height="{bar - 2}" fill="{colours[i]}"/>'
                         f'<text x="{left + v * scale_x + 4:.1f}" y="{y + i * bar + bar - 3}" font-size="10">{v:.2f}</text>')
        y += bar * len(keys) + gap
    s.append(f'<line x1="{left + scale_x}" y1="50" x2="{left + scale_x}" y2="{y}" stroke="#000" stroke-dasharray="4 3"/>'
             f'<text x="{left + scale_x - 8}" y="{y + 14}">1.0</text></svg>')
    open(path, "w").write("\n".join(s))
chart(f"{d}/apps-ops.svg", "remote / local throughput (1.0 = as fast as the local disk)", [("ops_s", "ops/s")])
chart(f"{d}/apps-latency.svg", "remote / local latency (1.0 = as fast as the local disk)",
      [("avg_us", "average"), ("p99_us", "p99")])
print(f"JSON: {d}/result.json; charts: {d}/apps-ops.svg, {d}/apps-latency.svg; raw: {d}/share/apps/raw/")
PY
exit $status
