#!/bin/bash
# In the Linux 6.12 guest (harness/bench-tls.sh): connects weft's two volumes, one in the
# clear and one over TLS 1.3 (tlshd, the PSK in $LAB_SHARE/tls-psk), then runs each load on
# each at a fixed rate, alternated per round, with fio (libaio, direct). Before and after each phase it
# creates $LAB_SHARE/mark-PHASE-start|end, where the host reads weft's CPU time; fio's JSON
# goes to $LAB_SHARE/fio-PHASE.json (PHASE: LOAD-MODE-ROUND). Prints "bench-tls: done".
set -u
ADDR=${LAB_HOST_IP:?needs slirp} PORT=${WEFT_PORT:?}
ROUNDS=${ROUNDS:-2} SECONDS_EACH=${SECONDS_EACH:-8}
modprobe nvme-tcp
tlshd > /tmp/tlshd.log 2>&1 &
sleep 1
CLEAR_NQN=nqn.2026-11.io.weft:vol:clearv TLS_NQN=nqn.2026-11.io.weft:vol:tlsv
nvme check-tls-key --keydata="$(cat "$LAB_SHARE/tls-psk")" --hostnqn="$TLS_HOSTNQN" \
    --subsysnqn="$TLS_NQN" --insert || { echo "bench-tls: key not inserted"; exit 1; }
# Two host NQNs on one machine: a host ID each (the kernel refuses one ID under two NQNs).
nvme connect -t tcp -a "$ADDR" -s "$PORT" -n "$CLEAR_NQN" --hostnqn "$CLEAR_HOSTNQN" \
    --hostid "${CLEAR_HOSTNQN##*:}" || exit 1
nvme connect -t tcp -a "$ADDR" -s "$PORT" -n "$TLS_NQN" --hostnqn "$TLS_HOSTNQN" \
    --hostid "${TLS_HOSTNQN##*:}" --tls || exit 1
device() { # the namespace of subsystem $1
    for _ in $(seq 50); do
        for d in /sys/class/nvme/nvme*; do
            [ "$(cat "$d/subsysnqn" 2>/dev/null)" = "$1" ] || continue
            for n in /dev/"${d##*/}"n*; do [ -b "$n" ] && { echo "$n"; return 0; }; done
        done
        sleep 0.2
    done
    return 1
}
CLEAR_DEV=$(device "$CLEAR_NQN") && TLS_DEV=$(device "$TLS_NQN") || { echo "bench-tls: no namespace"; exit 1; }
echo "clear: $CLEAR_DEV, TLS: $TLS_DEV"
# LOAD: fio arguments. At a fixed rate both modes reach here (this guest's CPU is emulated,
# and its own TLS slows it more than weft): weft's CPU per I/O then compares like with
# like (a reactor's spin after activity costs per wake-up, not per byte).
loads=(
    "randread-4k-1000iops:--rw=randread --bs=4k --iodepth=16 --rate_iops=1000"
    "randwrite-4k-1000iops:--rw=randwrite --bs=4k --iodepth=16 --rate_iops=1000"
    "read-128k-150iops:--rw=read --bs=128k --iodepth=4 --rate_iops=150"
)
for round in $(seq "$ROUNDS"); do
    for load in "${loads[@]}"; do
        name=${load%%:*} args=${load#*:}
        for mode in clear tls; do
            dev=$CLEAR_DEV; [ $mode = tls ] && dev=$TLS_DEV
            phase=$name-$mode-$round
            touch "$LAB_SHARE/mark-$phase-start"; sleep 0.2
            # shellcheck disable=SC2086
            fio --name=$phase --filename="$dev" --ioengine=libaio --direct=1 $args \
                --runtime="$SECONDS_EACH" --time_based --size=200M \
                --output-format=json --output="$LAB_SHARE/fio-$phase.json" > /dev/null 2>&1
            touch "$LAB_SHARE/mark-$phase-end"; sleep 0.2
            echo "  $phase: $(python3 -c "import json,sys;j=json.load(open(sys.argv[1]))['jobs'][0];print(int(j['read']['iops']+j['write']['iops']),'IOPS')" "$LAB_SHARE/fio-$phase.json")"
        done
    done
done
nvme disconnect-all > /dev/null 2>&1
echo "bench-tls: done"
