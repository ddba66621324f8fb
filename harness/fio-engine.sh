#!/bin/bash
# Debian's fio (3.33) with weft's external I/O engine (target/release/libweft_fio.so,
# crates/weft-fio) against a weft node on loopback: no kernel module, fio's own job options.
# Checks, on a thin volume: 4k random writes verified with crc32c in the same run, the same
# data verified again by a second fio process (a new connection), a trim that must make that
# verification fail (so it is real), mixed I/O with fsync from two jobs, 1 MiB reads, and the
# errors a user gets for a transfer over the target's limit and for an unknown subsystem, and
# the target killed under load (fio ends with the I/O in flight failed, instead of hanging).
# Usage: harness/fio-engine.sh [--weft PATH] [--engine PATH]
set -euo pipefail
cd "$(dirname "$0")/.."
WEFT=target/release/weft ENGINE=target/release/libweft_fio.so
while [ $# -gt 0 ]; do
    case "$1" in
        --weft) WEFT=$2; shift 2 ;;
        --engine) ENGINE=$2; shift 2 ;;
        *) echo "usage: $0 [--weft PATH] [--engine PATH]" >&2; exit 2 ;;
    esac
done
ENGINE=$(realpath "$ENGINE")
DIR=$PWD/.cache/fio-engine
rm -rf "$DIR"; mkdir -p "$DIR"
PORT=14470 API=127.0.0.1:14471
. harness/lib.sh
start_weft ${API##*:} "$DIR/serve.log" "$WEFT" serve --data-dir "$DIR/data" \
    --listen 127.0.0.1:$PORT --api-listen $API
export WEFT_API=$API WEFT_API_TOKEN=$(cat "$DIR/data/api-token")
export WEFT_HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000f1f00
"$WEFT" pool create fio --device "$DIR/pool.img" --device-size 1GiB > /dev/null
"$WEFT" volume create v --pool fio --size 256MiB > /dev/null
"$WEFT" host add fio --nqn $WEFT_HOSTNQN > /dev/null
"$WEFT" volume attach v --host fio > /dev/null
# fio splits file names at colons: escape them.
TARGET="nvme-tcp\\://127.0.0.1\\:$PORT/nqn.2026-11.io.weft\\:vol\\:v"
fails=0
run() { # NAME EXPECT(ok|fail) FIO-ARGS...: runs fio, checks its exit status
    local name=$1 expect=$2; shift 2
    local status=0
    fio --ioengine=external:"$ENGINE" --filename="$TARGET" --name="$name" \
        --output-format=normal "$@" > "$DIR/$name.out" 2>&1 || status=$?
    local iops
    iops=$(grep -oE '(read|write|trim): IOPS=[^,]*' "$DIR/$name.out" | tr '\n' ' ' || true)
    if { [ "$expect" = ok ] && [ $status = 0 ]; } || { [ "$expect" = fail ] && [ $status != 0 ]; }; then
        printf 'ok    %-14s %s\n' "$name" "$iops"
    else
        printf 'FAIL  %-14s exit %s (expected %s); see %s\n' "$name" $status "$expect" "$DIR/$name.out"
        tail -n 20 "$DIR/$name.out"
        fails=$((fails + 1))
    fi
}
expect_message() { # NAME TEXT: the run's output names the problem
    if grep -qF "$2" "$DIR/$1.out"; then
        printf 'ok    %-14s says: %s\n' "$1" "$(grep -F "$2" "$DIR/$1.out" | head -n 1)"
    else
        printf 'FAIL  %-14s does not say "%s"\n' "$1" "$2"; fails=$((fails + 1))
    fi
}
COMMON=(--size=64m --bs=4k --verify=crc32c --verify_fatal=1 --verify_state_save=0)
run write-verify ok "${COMMON[@]}" --rw=randwrite --iodepth=16 --do_verify=1
run verify-again ok "${COMMON[@]}" --rw=randwrite --iodepth=16 --verify_only=1
run trim ok --size=1m --bs=64k --rw=trim --iodepth=4
run verify-trimmed fail "${COMMON[@]}" --rw=randwrite --iodepth=16 --verify_only=1
expect_message verify-trimmed "verify: bad magic header 0"
run mixed-fsync ok --size=64m --bs=4k --rw=randrw --iodepth=8 --fsync=16 --numjobs=2 \
    --group_reporting --time_based --runtime=2
run threads ok --size=64m --bs=16k --rw=randread --iodepth=32 --thread --numjobs=2 \
    --group_reporting --time_based --runtime=2
run read-1m ok --size=256m --bs=1m --rw=read --iodepth=4
run too-large fail --size=16m --bs=2m --rw=read
expect_message too-large "larger than the target's transfer size of 1048576 bytes"
TARGET="nvme-tcp\\://127.0.0.1\\:$PORT/nqn.2026-11.io.weft\\:vol\\:nope"
run unknown-nqn fail --size=1m --rw=read
expect_message unknown-nqn "does not export nqn.2026-11.io.weft:vol:nope"
# Last: the target dies under load; fio must end (not hang) with the I/O in flight failed.
TARGET="nvme-tcp\\://127.0.0.1\\:$PORT/nqn.2026-11.io.weft\\:vol\\:v"
(   # once fio's I/O queue is connected (admin and I/O: two connections), not before
    for _ in $(seq 200); do
        [ "$(ss -Htn state established "( sport = :$PORT )" | wc -l)" -ge 2 ] && break
        sleep 0.05
    done
    sleep 0.5; kill -9 "$WEFT_PID"
) &
run target-killed fail --size=64m --bs=4k --rw=randwrite --iodepth=16 --time_based --runtime=30
expect_message target-killed "weft: the connection to the target failed"
if [ $fails -gt 0 ]; then
    echo "fio engine: $fails check(s) failed"; exit 1
fi
echo "fio engine: all checks passed"
