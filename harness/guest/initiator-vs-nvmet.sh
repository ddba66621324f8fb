#!/bin/bash
# Guest script: weft's user-space initiator against an independent NVMe/TCP target, the
# guest kernel's nvmet-tcp (Linux 6.1), on guest loopback. nvmet serves
# nqn.2026-11.io.weft:peer (ns 1 = a 128 MiB file on ext4 over brd, any host) and
# nqn.2026-11.io.weft:peer-closed (no allowed hosts) on 127.0.0.1:4420. Then:
#   peer_check   connect with and without digests, identify, 16-deep writes and reads from
#                one block to MDTS (in-capsule and R2T), Flush, Write Zeroes, Deallocate,
#                keep-alive over 5 s idle with KATO 2 s, unknown-NQN and refused-host errors
#   weft bench   --verify runs: randrw 4k 2 queues x 16, randrw 64k with both digests,
#                sequential 128k reads over 32 MiB (fill pass first)
# Prints "ok"/"FAIL" lines and exits non-zero on any failure.
# Run from the host: harness/initiator-peers.sh.
# Env: WEFT_BIN, PEER_CHECK_BIN (default /mnt/weft/target/release/{weft,examples/peer_check})
set -uo pipefail
WEFT_BIN=${WEFT_BIN:-/mnt/weft/target/release/weft}
PEER_CHECK_BIN=${PEER_CHECK_BIN:-/mnt/weft/target/release/examples/peer_check}
FIO_ENGINE=${FIO_ENGINE:-/mnt/weft/target/release/libweft_fio.so}
NQN=nqn.2026-11.io.weft:peer
CLOSED=nqn.2026-11.io.weft:peer-closed
URL=nvme-tcp://127.0.0.1:4420/$NQN
NVMET=/sys/kernel/config/nvmet
FAILS=0
step() { echo; echo "=== $*"; }
fail() { echo "FAIL $*"; FAILS=$((FAILS + 1)); }

step "nvmet-tcp on 127.0.0.1:4420"
modprobe nvmet && modprobe nvmet-tcp && modprobe brd rd_nr=1 rd_size=$((256 * 1024)) max_part=0 ||
    { echo "FAIL modules"; exit 1; }
mkfs.ext4 -q /dev/ram0 && mkdir -p /tmp/peer && mount /dev/ram0 /tmp/peer && truncate -s 128M /tmp/peer/ns1.img ||
    { echo "FAIL ext4 on /dev/ram0"; exit 1; }
S=$NVMET/subsystems/$NQN
mkdir "$S" && echo 1 > "$S/attr_allow_any_host" && mkdir "$S/namespaces/1" &&
    echo -n /tmp/peer/ns1.img > "$S/namespaces/1/device_path" && echo 1 > "$S/namespaces/1/enable" &&
    mkdir "$NVMET/subsystems/$CLOSED" && mkdir "$NVMET/ports/1" &&
    echo tcp > "$NVMET/ports/1/addr_trtype" && echo ipv4 > "$NVMET/ports/1/addr_adrfam" &&
    echo 127.0.0.1 > "$NVMET/ports/1/addr_traddr" && echo 4420 > "$NVMET/ports/1/addr_trsvcid" &&
    ln -s "$S" "$NVMET/ports/1/subsystems/$NQN" &&
    ln -s "$NVMET/subsystems/$CLOSED" "$NVMET/ports/1/subsystems/$CLOSED" ||
    { echo "FAIL nvmet configuration"; exit 1; }
echo "  ok: $NQN (file ns on ext4) and $CLOSED (no hosts allowed)"
mkdir -p /tmp/bin && cp "$WEFT_BIN" "$PEER_CHECK_BIN" "$FIO_ENGINE" /tmp/bin/ || { echo "FAIL binaries missing"; exit 1; }

step "peer_check against nvmet"
/tmp/bin/peer_check "$URL" --refused "$CLOSED" --idle-s 5 || fail "peer_check"

bench() { # WHAT ARGS...: one verified weft bench run against nvmet
    local what=$1; shift
    local out
    if out=$(/tmp/bin/weft bench --target "$URL" --verify "$@" 2>&1) && grep -q "all intact" <<<"$out"; then
        echo "  ok: $what: $(grep -E '^(read|write) ' <<<"$out" | awk '{printf "%s %s IOPS; ", $1, $2}')$(grep -o 'verify: [0-9]* reads' <<<"$out")"
    else
        fail "$what: $out"
    fi
}
step "weft bench --verify against nvmet"
bench "randrw 4k, 2 queues x 16" --rw randrw --bs 4k --iodepth 16 --queues 2 --runtime 3s
bench "randrw 64k, header+data digests" --rw randrw --bs 64k --iodepth 8 --runtime 3s --hdr-digest --data-digest
bench "read 128k over 32 MiB" --rw read --bs 128k --iodepth 4 --size 32m

step "Debian's fio with weft's I/O engine (libweft_fio.so) against nvmet"
FIO_TARGET="nvme-tcp\\://127.0.0.1\\:4420/${NQN//:/\\:}"
if out=$(fio --ioengine=external:/tmp/bin/libweft_fio.so --filename="$FIO_TARGET" --name=engine \
        --rw=randrw --bs=4k --iodepth=16 --size=32m --verify=crc32c --verify_fatal=1 \
        --verify_state_save=0 2>&1) &&
        grep -q "err= 0" <<<"$out"; then
    echo "  ok: randrw 4k QD16 verify=crc32c: $(grep -oE '(read|write): IOPS=[^,]*' <<<"$out" | tr '\n' ' ')"
else
    fail "fio engine: $out"
fi

step "result"
if [ "$FAILS" = 0 ]; then echo "PASS initiator vs nvmet"; else echo "FAIL initiator vs nvmet: $FAILS failure(s)"; fi
[ "$FAILS" = 0 ]
