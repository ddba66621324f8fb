#!/bin/bash
# What NVMe/TCP TLS costs weft's data path, A/B against the clear, from the Linux 6.12 host
# (Debian trixie guest, tlshd) with fio: one weft node on this machine, two volumes of the
# same pool (on /dev/shm, so the disk is out of it), one attached to a host NQN in the clear
# and one to a host NQN given a TLS PSK (`weft host add --tls`). The guest connects both
# and runs each load on each at a fixed rate both reach, alternated per round
# (harness/guest/bench-tls.sh); it marks
# each phase's start and end in the share, where this script reads weft's CPU time
# (/proc/PID/stat) at each mark. Figures: IOPS and MiB/s (fio), and weft's CPU per I/O and
# per MiB: the target's cost, which is what TLS adds here (the guest's own throughput is
# an emulated CPU's). Prints a table, writes JSON (default .cache/bench/tls/result.json).
# Usage: harness/bench-tls.sh [--weft BIN] [--rounds 2] [--seconds 8] [--json FILE]
#        (a benchmark: outside CI; --rounds 1 --seconds 2 is its smoke)
set -euo pipefail
cd "$(dirname "$0")/.."
WEFT=target/release/weft ROUNDS=2 SECONDS_EACH=8 JSON=.cache/bench/tls/result.json
while [ $# -gt 0 ]; do
    case "$1" in
        --weft) WEFT=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --seconds) SECONDS_EACH=$2; shift 2 ;;
        --json) JSON=$2; shift 2 ;;
        *) echo "usage: $0 [--weft BIN] [--rounds N] [--seconds S] [--json FILE]" >&2; exit 2 ;;
    esac
done
die() { echo "bench-tls: $*" >&2; exit 2; }
[ "$(id -u)" = 0 ] || die "run as root (qemu)"
[ -x "$WEFT" ] || die "no weft binary at $WEFT (cargo build --release, or --weft PATH)"
WEFT=$(realpath "$WEFT")
IMAGE=$(LAB_SUITE=trixie harness/vm/build-image.sh)
WORK=$PWD/.cache/bench/tls/run
SHARE=$WORK/share
POOL=/dev/shm/weft-bench-tls.img
PORT=14480 API_PORT=14489
CLEAR_HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-00000000c1ea
TLS_HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000007a5
rm -rf "$WORK" "$POOL"
mkdir -p "$SHARE" "$(dirname "$JSON")"
"$WEFT" serve --data-dir "$WORK/node" --listen "127.0.0.1:$PORT" --api-listen "127.0.0.1:$API_PORT" \
    > "$WORK/node.out" 2> "$WORK/node.log" &
PID=$!
trap 'kill -TERM $PID 2>/dev/null; wait 2>/dev/null; rm -f "$POOL"' EXIT
for _ in $(seq 100); do grep -q "nvme discover" "$WORK/node.out" 2>/dev/null && break; sleep 0.1; done
cli() { WEFT_API=127.0.0.1:$API_PORT WEFT_API_TOKEN=$(cat "$WORK/node/api-token") "$WEFT" "$@"; }
cli pool create p --device "$POOL" --device-size 1GiB > /dev/null
for v in clearv tlsv; do cli volume create $v --size 256MiB --pool p --thick > /dev/null; done
cli host add clear --nqn "$CLEAR_HOSTNQN" > /dev/null 2>&1
cli host add tls --nqn "$TLS_HOSTNQN" --tls > "$WORK/tls-host.out"
grep -o 'NVMeTLSkey-1:01:[^ ]*:' "$WORK/tls-host.out" | head -1 > "$SHARE/tls-psk"
cli volume attach clearv --host clear > /dev/null
cli volume attach tlsv --host tls > /dev/null
# weft's CPU time (user + system, clock ticks) at each mark the guest makes.
(
    seen=0
    while kill -0 $PID 2>/dev/null; do
        for mark in "$SHARE"/mark-*; do
            [ -e "$mark" ] || continue
            name=${mark##*/mark-}
            [ -e "$WORK/cpu-$name" ] && continue
            awk '{print $14 + $15}' /proc/$PID/stat > "$WORK/cpu-$name"
        done
        sleep 0.05
    done
) &
LAB_IMAGE_DIR=$IMAGE harness/vm/vm-run.sh -n slirp -s "$SHARE" -c 2 -t 1800 -e "WEFT_PORT=$PORT" \
    -e "CLEAR_HOSTNQN=$CLEAR_HOSTNQN" -e "TLS_HOSTNQN=$TLS_HOSTNQN" -e "ROUNDS=$ROUNDS" \
    -e "SECONDS_EACH=$SECONDS_EACH" harness/guest/bench-tls.sh > "$WORK/run.log" 2>&1 || true
grep -q '^bench-tls: done' "$SHARE/.lab/console.log" || { tail -20 "$WORK/run.log"; die "the guest did not finish ($WORK)"; }
python3 - "$WORK" "$SHARE" "$JSON" "$(getconf CLK_TCK)" "$(git rev-parse --short HEAD)" <<'PY'
import glob, json, os, statistics, sys
work, share, out, tck, commit = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
cpu = lambda name: int(open(os.path.join(work, "cpu-" + name)).read()) / tck
phases = {}
for path in sorted(glob.glob(os.path.join(share, "fio-*.json"))):
    phase = os.path.basename(path)[4:-5]          # LOAD-MODE-ROUND
    load, mode, rnd = phase.rsplit("-", 2)
    job = json.load(open(path))["jobs"][0]
    ios = job["read"]["total_ios"] + job["write"]["total_ios"]
    mib = (job["read"]["io_bytes"] + job["write"]["io_bytes"]) / 2**20
    secs = max(job["job_runtime"] / 1000, 1e-9)
    used = cpu(phase + "-end") - cpu(phase + "-start")
    phases.setdefault((load, mode), []).append({
        "round": int(rnd), "iops": ios / secs, "mib_s": mib / secs,
        "weft_cpu_s": used, "cpu_us_per_io": used * 1e6 / max(ios, 1),
        "cpu_ms_per_mib": used * 1e3 / max(mib, 1e-9)})
loads = sorted({load for load, _ in phases})
result = {"commit": commit, "what": "weft's CPU per I/O with NVMe/TCP TLS 1.3 against the clear, Linux 6.12 host (trixie guest, tlshd, fio libaio direct)", "loads": {}}
print(f"{'load':<18} {'clear IOPS':>11} {'TLS IOPS':>9} {'ratio':>6} {'clear us/IO':>12} {'TLS us/IO':>10} {'ratio':>6} {'clear ms/MiB':>13} {'TLS ms/MiB':>11}")
for load in loads:
    med = lambda mode, key: statistics.median(r[key] for r in phases[(load, mode)])
    row = {mode: {key: med(mode, key) for key in ("iops", "mib_s", "cpu_us_per_io", "cpu_ms_per_mib")}
           for mode in ("clear", "tls")}
    row["runs"] = {mode: phases[(load, mode)] for mode in ("clear", "tls")}
    result["loads"][load] = row
    c, t = row["clear"], row["tls"]
    print(f"{load:<18} {c['iops']:>11.0f} {t['iops']:>9.0f} {t['iops']/c['iops']:>6.2f} "
          f"{c['cpu_us_per_io']:>12.1f} {t['cpu_us_per_io']:>10.1f} {t['cpu_us_per_io']/c['cpu_us_per_io']:>6.2f} "
          f"{c['cpu_ms_per_mib']:>13.2f} {t['cpu_ms_per_mib']:>11.2f}")
json.dump(result, open(out, "w"), indent=1)
print(f"(JSON: {out})")
PY
