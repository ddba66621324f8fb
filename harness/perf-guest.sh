#!/bin/bash
# Host side of the in-guest comparison of weft with the kernel's nvmet-tcp target: boots the
# test guest without network (2 vCPUs) and runs harness/guest/perf-nvmet-vs-weft.sh there
# (4k randread QD1 latency and QD32 IOPS over guest loopback, both RAM-backed), then copies
# its JSON result to OUT_JSON. Without a weft binary only the nvmet half is measured.
#
# Usage (as root): harness/perf-guest.sh [--weft PATH] [--runtime S] [OUT_JSON]
#   --weft PATH    weft binary inside this repository (default target/release/weft); the
#                  guest sees the repository read-only at /mnt/weft
#   --runtime S    seconds per fio job (default 10)
#   OUT_JSON       default .cache/perf/perf-nvmet-vs-weft.json
# Env: PERF_SIZE_MIB (namespace size, default 256).
# The VM gets its own share directory, .cache/perf/share (other VM runs in this checkout
# overwrite vm-run.sh's default .cache/vm-share); one run at a time (.cache/perf.lock).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
WEFT=target/release/weft RUNTIME=10
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2; }
while [ $# -gt 0 ]; do
    case "$1" in
        --weft) WEFT=$2; shift 2 ;;
        --runtime) RUNTIME=$2; shift 2 ;;
        -h|--help) usage ;;
        -*) echo "perf-guest: unknown option $1" >&2; usage ;;
        *) break ;;
    esac
done
OUT=${1:-.cache/perf/perf-nvmet-vs-weft.json}
[ "$(id -u)" = 0 ] || { echo "perf-guest: run as root" >&2; exit 2; }

VM_ARGS=(-n none -c 2 -t 900 -e "PERF_SIZE_MIB=${PERF_SIZE_MIB:-256}")
WEFT=$(realpath -m "$WEFT")
case "$WEFT" in
    "$REPO"/*) VM_ARGS+=(-e "WEFT_BIN=/mnt/weft/${WEFT#"$REPO"/}") ;;
    *) echo "perf-guest: $WEFT is outside the repository, the guest cannot see it" >&2; exit 2 ;;
esac
[ -x "$WEFT" ] || echo "perf-guest: no weft binary at $WEFT: measuring nvmet only"
echo "perf-guest: guest image $(harness/vm/build-image.sh)"
mkdir -p .cache/perf
exec 9> .cache/perf.lock
flock -n 9 || { echo "perf-guest: another run is active (.cache/perf.lock)" >&2; exit 2; }
SHARE=.cache/perf/share
rm -rf "$SHARE"
mkdir -p "$SHARE"
harness/vm/vm-run.sh -s "$SHARE" "${VM_ARGS[@]}" harness/guest/perf-nvmet-vs-weft.sh "$RUNTIME"
mkdir -p "$(dirname "$OUT")"
cp "$SHARE/perf-nvmet-vs-weft.json" "$OUT"
echo "perf-guest: $OUT"
