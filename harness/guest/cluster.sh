#!/bin/bash
# Cluster interop, guest side (started by harness/cluster-interop.sh): three weft nodes on
# the host (reached as $LAB_HOST_IP, ports WEFT_PORT..+2, APIs WEFT_API_PORT..+2) each hold
# one volume (v1 on n1, v2 on n2, v3 on n3). Registers this guest as a host through node
# 1's API, attaches the three volumes, then: node 1's discovery log lists v1 and referrals
# to nodes 2 and 3; `nvme connect-all` against node 1 alone connects all three volumes;
# fio write+verify on each; the replicated volume `rep` (a replica on each node) is one
# multipath device whose paths are one ANA optimized (its primary) and two inaccessible; a
# failover: fio writes to `rep` while the host kills its primary's node (asked through the
# share), without an I/O error, and reads everything back from the promoted replica, which
# serves the reservation this host took through the old primary; the
# killed node restarts and is rebuilt; the same through a hung primary (SIGSTOP, then
# SIGCONT; prints when the host gave up on its paths), a replica's death, a `node drain`, a
# snapshot and an online growth, and with ext4 on it (fsck clean, synced files intact after
# the primary's kill mid-write); `rep2`, a volume of two replicas, through a kill of its
# primary under fio with verify; `ec`, erasure-coded 2+1, under fio with verify through
# the death of a member's node and of its primary's, then a snapshot, a clone of it and a
# growth online; a persistent discovery connection gets a Discovery
# Log Page Change event when a fourth volume is attached; disconnect. Prints
# "cluster: PASS" when every check passed.
set -uo pipefail
ADDR=${LAB_HOST_IP:?needs slirp}
PORT=${WEFT_PORT:-14450} API_PORT=${WEFT_API_PORT:-14460}
FAILS=0
ok() { echo "  ok: $* [${SECONDS}s]"; }
fail() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }
weft_cli() {
    WEFT_API=https://$ADDR:$API_PORT WEFT_API_CA=$LAB_SHARE/ca.crt WEFT_API_TOKEN=$(cat "$LAB_SHARE/api-token") \
        timeout 120 "$WEFT_DIR/target/release/weft" "$@"
}
modprobe nvme-tcp
[ -s /etc/nvme/hostnqn ] || { mkdir -p /etc/nvme && nvme gen-hostnqn > /etc/nvme/hostnqn; }
HOSTNQN=$(cat /etc/nvme/hostnqn)

echo "=== register this host through node 1 and attach the volumes of all three nodes"
weft_cli host add guest --nqn "$HOSTNQN" && ok "host added" || fail "host add"
for v in v1 v2 v3 rep rep2 ec; do weft_cli volume attach "$v" --host guest && ok "$v attached" || fail "attach $v"; done
weft_cli node list

echo "=== node 1's discovery log: its volume and referrals to the others"
nvme discover -t tcp -a "$ADDR" -s "$PORT" > /tmp/disc.txt 2>&1 || fail "nvme discover"
cat /tmp/disc.txt
grep -q "nqn.2026-11.io.weft:vol:v1" /tmp/disc.txt && ok "v1 listed" || fail "v1 not listed"
grep -q "nqn.2026-11.io.weft:vol:v2" /tmp/disc.txt && fail "v2 listed by node 1 (it is node 2's)" || ok "v2 not listed by node 1"
referrals=$(grep -ci "referral" /tmp/disc.txt)
[ "$referrals" -ge 2 ] && ok "$referrals referral entries" || fail "referrals: $referrals, want 2"
for p in $((PORT + 1)) $((PORT + 2)); do
    grep -q "trsvcid: *$p" /tmp/disc.txt && ok "referral to port $p" || fail "no entry with port $p"
done

echo "=== nvme connect-all through node 1 alone"
dmesg -C
# A keep-alive timeout of 1 s (Linux's default is 5): a hung (not dead) node's paths hold the
# host's I/O until the host's keep-alive gives up on them (docs/guide/05-replication-and-failover.md).
timeout 300 nvme connect-all -t tcp -a "$ADDR" -s "$PORT" --keep-alive-tmo=1 2>&1 | tail -5
sleep 2
dmesg | tail -20 | sed 's/^/  kernel: /'
nvme list-subsys 2>&1 | grep -E "nqn|tcp" | sed 's/^/  /'
for v in v1 v2 v3 rep; do
    dev=''
    for _ in $(seq 20); do
        # The multipath head of the volume's subsystem (not a path's nvmeXcYnZ).
        for subsys in /sys/class/nvme-subsystem/nvme-subsys*; do
            [ "$(cat "$subsys/subsysnqn" 2>/dev/null)" = "nqn.2026-11.io.weft:vol:$v" ] || continue
            dev=$(ls "$subsys" | grep -E '^nvme[0-9]+n[0-9]+$' | head -1)
        done
        [ -n "$dev" ] && break
        sleep 0.5
    done
    if [ -z "$dev" ]; then fail "$v: no block device after connect-all"; continue; fi
    ok "$v connected as /dev/$dev"
    if timeout 300 fio --name="verify-$v" --filename="/dev/$dev" --rw=randwrite --bs=4k --size=16m \
        --direct=1 --ioengine=libaio --iodepth=8 --verify=crc32c --do_verify=1 \
        --output-format=terse > "/tmp/fio-$v.txt" 2>&1; then
        ok "$v: fio write+verify"
    else
        fail "$v: fio: $(tail -3 "/tmp/fio-$v.txt")"
    fi
done
echo "=== the replicated volume: one multipath device, one optimized path, the others inaccessible"
for subsys in /sys/class/nvme-subsystem/nvme-subsys*; do
    [ "$(cat "$subsys/subsysnqn" 2>/dev/null)" = "nqn.2026-11.io.weft:vol:rep" ] || continue
    states=$(cat "$subsys"/nvme*/nvme*c*n*/ana_state 2>/dev/null | sort | tr '\n' ' ')
    paths=$(ls -d "$subsys"/nvme[0-9]* 2>/dev/null | grep -cE '/nvme[0-9]+$')
    echo "  rep: $paths paths, ANA states: $states"
    [ "$paths" = 3 ] && ok "rep: 3 paths (one per node)" || fail "rep: $paths paths, want 3"
    [ "$states" = "inaccessible inaccessible optimized " ] && ok "rep: one optimized path, two inaccessible" \
        || fail "rep: ANA states '$states'"
    for ctrl in "$subsys"/nvme[0-9]*; do
        [[ $(basename "$ctrl") =~ ^nvme[0-9]+$ ]] || continue
        echo "  $(basename "$ctrl"): cntlid $(cat "$ctrl/cntlid") $(cat "$ctrl/address")"
    done
done
dmesg | grep -iE "I/O error|duplicate|IDs don't match|ANA" | sed 's/^/  kernel: /'
dmesg | grep -qiE "I/O error|duplicate cntlid|IDs don't match" && fail "kernel errors (above)" || ok "no kernel I/O or identity errors"

echo "=== failover: fio writes to rep while its primary's node is killed"
weft_on() { # INDEX ARGS: the CLI against node INDEX's API (1-based)
    local i=$1; shift
    WEFT_API=https://$ADDR:$((API_PORT + i - 1)) WEFT_API_CA=$LAB_SHARE/ca.crt WEFT_API_TOKEN=$(cat "$LAB_SHARE/api-token") \
        timeout 60 "$WEFT_DIR/target/release/weft" "$@"
}
request() { # VERB NODE: the host kills or starts a node; waits until it did
    rm -f "$LAB_SHARE/REQUEST.done"
    echo "$1 $2" > "$LAB_SHARE/REQUEST.tmp" && mv "$LAB_SHARE/REQUEST.tmp" "$LAB_SHARE/REQUEST"
    for _ in $(seq 300); do [ -e "$LAB_SHARE/REQUEST.done" ] && return 0; sleep 0.2; done
    return 1
}
rep_field() { # INDEX [VOLUME]: "NODE ROLE STATE" per replica of VOLUME (rep) through node INDEX
    weft_on "$1" volume show "${2:-rep}" -o json 2>/dev/null | tr -d ' \n' | tr '{' '\n' | grep '"role"' |
        sed -n "s/.*\"node\":\"\([^\"]*\)\"[^}]*\"role\":\"\([^\"]*\)\"[^}]*\"state\":\"\([^\"]*\)\".*/\1 \2 \3/p"
}
rep_dev=''
for subsys in /sys/class/nvme-subsystem/nvme-subsys*; do
    [ "$(cat "$subsys/subsysnqn" 2>/dev/null)" = "nqn.2026-11.io.weft:vol:rep" ] || continue
    rep_dev=$(ls "$subsys" | grep -E '^nvme[0-9]+n[0-9]+$' | head -1)
done
first=$(rep_field 1 | awk '$2 == "primary" {print $1}')
echo "  rep on /dev/$rep_dev, primary $first"
survivor=1; [ "$first" = n1 ] && survivor=2
FIO_REP=(--filename="/dev/$rep_dev" --rw=randwrite --bs=4k --size=24m --direct=1
    --ioengine=libaio --iodepth=4 --verify=crc32c --randseed=7)
# This host takes a reservation (Write Exclusive, key c1) through the primary: the
# promoted replica must serve it (the store holds it, not the node).
resv_state() { # the reservation of rep as "TYPE REGISTRANTS HOLDER-KEY" (resv-report --eds)
    nvme resv-report "/dev/$rep_dev" --eds -o json 2>/dev/null | python3 -c '
import json, sys
r = json.load(sys.stdin)
regs = next((v for v in r.values() if isinstance(v, list)), [])
held = [("%x" % int(x["rkey"])) for x in regs if int(x["rcsts"]) & 1]
print(r["rtype"], r["regctl"], ",".join(held) or "-")'
}
nvme resv-register "/dev/$rep_dev" --nrkey=0xc1 --rrega=0 --cptpl=3 > /dev/null &&
    nvme resv-acquire "/dev/$rep_dev" --crkey=0xc1 --rtype=1 --racqa=0 > /dev/null &&
    [ "$(resv_state)" = "1 1 c1" ] && ok "rep: this host holds Write Exclusive with key c1" ||
    fail "rep: reservation not taken ($(resv_state))"
dmesg -C
timeout 300 fio --name=failover "${FIO_REP[@]}" --rate_iops=200 --do_verify=0 --output-format=json \
    > /tmp/fio-failover.txt 2>&1 &
fio_pid=$!
sleep 5
killed_at=$(date +%s.%N)
request kill "$first" && ok "host killed $first (kill -9)" || fail "kill $first not done"
second=''
for _ in $(seq 60); do
    second=$(rep_field "$survivor" | awk '$2 == "primary" {print $1}')
    [ -n "$second" ] && [ "$second" != "$first" ] && break
    sleep 0.5
done
promoted_at=$(date +%s.%N)
[ -n "$second" ] && [ "$second" != "$first" ] && ok "rep: $second promoted $(awk "BEGIN {print $promoted_at - $killed_at}") s after the kill" \
    || fail "rep: no promotion (primary '$second')"
max_write_ms() { # FIO_JSON: the longest a write took, in ms (the host's pause)
    sed -n '/"write"/,/"trim"/p' "$1" | grep -A3 '"clat_ns"' | grep '"max"' | head -1 |
        tr -dc '0-9' | awk '{printf "%d", $1 / 1000000}'
}
if wait "$fio_pid"; then
    ok "rep: fio wrote through the failover without an error (longest write $(max_write_ms /tmp/fio-failover.txt) ms)"
else
    fail "rep: fio: $(tail -3 /tmp/fio-failover.txt)"
fi
if timeout 300 fio --name=failover "${FIO_REP[@]}" --verify_only > /tmp/fio-reread.txt 2>&1; then
    ok "rep: everything fio wrote reads back from the new primary"
else
    fail "rep: verify after failover: $(tail -3 /tmp/fio-reread.txt)"
fi
dmesg | grep -iE "I/O error|ANA|nvme" | tail -12 | sed 's/^/  kernel: /'
dmesg | grep -qi "I/O error" && fail "kernel I/O errors during the failover" || ok "no kernel I/O error"
state=$(resv_state)
[ "$state" = "1 1 c1" ] && ok "rep: the reservation holds on $second (Write Exclusive, key c1)" ||
    fail "rep: reservation on $second: '$state', want '1 1 c1'"
nvme resv-release "/dev/$rep_dev" --crkey=0xc1 --rrela=1 > /dev/null && ok "rep: reservation cleared" ||
    fail "rep: clearing the reservation"
request start "$first" && ok "host restarted $first" || fail "restart $first not done"
in_sync=0
for _ in $(seq 60); do
    in_sync=$(rep_field "$survivor" | grep -c "in-sync")
    [ "$in_sync" = 3 ] && break
    sleep 1
done
[ "$in_sync" = 3 ] && ok "rep: $first rebuilt, every replica in sync" || fail "rep: $in_sync replicas in sync, want 3"
rep_field "$survivor" | sed 's/^/  /'
# The host reconnects to a restarted node every 10 s (its reconnect delay):
# the move is measured once every path of rep is live again.
live=0
for _ in $(seq 40); do
    live=0
    for subsys in /sys/class/nvme-subsystem/nvme-subsys*; do
        [ "$(cat "$subsys/subsysnqn" 2>/dev/null)" = "nqn.2026-11.io.weft:vol:rep" ] || continue
        live=$(cat "$subsys"/nvme[0-9]*/state 2>/dev/null | grep -c '^live$')
    done
    [ "$live" = 3 ] && break
    sleep 0.5
done
[ "$live" = 3 ] && ok "rep: every path live again" || fail "rep: $live paths live, want 3"
echo "=== a planned move back to $first while fio writes"
dmesg -C
timeout 300 fio --name=move "${FIO_REP[@]}" --size=8m --rate_iops=200 --do_verify=0 \
    --output-format=json > /tmp/fio-move.txt 2>&1 &
fio_pid=$!
sleep 3
moved=$(weft_on "$survivor" volume move-primary rep --to "$first" 2>&1)
echo "  $moved"
[ "$(rep_field "$survivor" | awk '$2 == "primary" {print $1}')" = "$first" ] && ok "rep: $first is primary again" \
    || fail "rep: move to $first: $moved"
dmesg | grep -iE "ana|nvme" | tail -8 | sed 's/^/  kernel: /'
if wait "$fio_pid"; then
    ok "rep: fio wrote through the move without an error (longest write $(max_write_ms /tmp/fio-move.txt) ms)"
else
    fail "rep: fio during the move: $(tail -3 /tmp/fio-move.txt)"
fi

primary_via() { rep_field "$1" "${2:-rep}" | awk '$2 == "primary" {print $1}'; }
up_except() { # NODE: the index of another node (an API to ask while NODE is down)
    local i
    for i in 1 2 3; do [ "n$i" != "$1" ] && { echo "$i"; return; }; done
}
wait_in_sync() { # INDEX WANT [VOLUME]: until `volume show` through node INDEX lists WANT in sync
    local n=0
    for _ in $(seq 90); do
        n=$(rep_field "$1" "${3:-rep}" | grep -c "in-sync")
        [ "$n" = "$2" ] && return 0
        sleep 1
    done
    echo "  $n in sync, want $2"; rep_field "$1" "${3:-rep}" | sed 's/^/  /'; return 1
}
wait_paths_live() { # [VOLUME WANT]: WANT paths of VOLUME (rep, 3) live (the host reconnects every 10 s)
    local live=0
    for _ in $(seq 60); do
        for subsys in /sys/class/nvme-subsystem/nvme-subsys*; do
            [ "$(cat "$subsys/subsysnqn" 2>/dev/null)" = "nqn.2026-11.io.weft:vol:${1:-rep}" ] || continue
            live=$(cat "$subsys"/nvme[0-9]*/state 2>/dev/null | grep -c '^live$')
        done
        [ "$live" = "${2:-3}" ] && return 0
        sleep 0.5
    done
    return 1
}
since() { # UPTIME: seconds since then, one decimal
    awk -v t="$1" -v now="$(cut -d' ' -f1 /proc/uptime)" 'BEGIN {printf "%.1f", now - t}'
}
wait_promotion() { # OLD INDEX: until a node other than OLD is primary; prints it
    local now=''
    for _ in $(seq 120); do
        now=$(primary_via "$2")
        [ -n "$now" ] && [ "$now" != "$1" ] && { echo "$now"; return 0; }
        sleep 0.5
    done
    return 1
}
fio_under() { # NAME: fio writes to rep in the background (FIO_PID), verified later
    dmesg -C
    timeout 300 fio --name="$1" "${FIO_REP[@]}" --size=16m --rate_iops=200 --do_verify=0 \
        --output-format=json > "/tmp/fio-$1.txt" 2>&1 &
    FIO_PID=$!
    sleep 3
}
fio_result() { # NAME WHAT: fio ended without an error, and what it wrote reads back
    if wait "$FIO_PID"; then
        ok "rep: fio wrote through $2 without an error (longest write $(max_write_ms "/tmp/fio-$1.txt") ms)"
    else
        fail "rep: fio during $2: $(tail -3 "/tmp/fio-$1.txt")"
    fi
    if timeout 300 fio --name="$1" "${FIO_REP[@]}" --size=16m --verify_only > "/tmp/fio-$1-verify.txt" 2>&1; then
        ok "rep: everything fio wrote through $2 reads back"
    else
        fail "rep: verify after $2: $(tail -3 "/tmp/fio-$1-verify.txt")"
    fi
    dmesg | grep -qi "I/O error" && fail "kernel I/O errors during $2" || ok "no kernel I/O error during $2"
}

echo "=== a hung primary: its node stopped (SIGSTOP) while fio writes, continued after the failover"
wait_paths_live || fail "rep: not every path live"
hung=$(primary_via "$survivor")
via=$(up_except "$hung")
fio_under hung
# Rough timings: uptime against the kernel log's timestamps (near enough, not the same
# clock), from just before the request (the host stops the node within 0.2 s).
stopped_at=$(cut -d' ' -f1 /proc/uptime)
request stop "$hung" && ok "host stopped $hung (SIGSTOP)" || fail "stop $hung not done"
promoted=$(wait_promotion "$hung" "$via") && ok "rep: $promoted promoted while $hung hangs" \
    || fail "rep: no promotion while $hung hangs"
echo "  the CLI shows $promoted primary $(since "$stopped_at") s after the stop"
request cont "$hung" && ok "host continued $hung (SIGCONT)" || fail "cont $hung not done"
fio_result hung "a hung primary"
dmesg | grep -E "timeout request|Reconnecting" | head -4 | sed 's/^/  kernel: /'
gave_up=$(dmesg | grep -m1 "Reconnecting" | tr -d '[' | awk '{print $1}')
[ -n "$gave_up" ] && echo "  the host gave up on $hung's paths $(awk -v a="$gave_up" -v b="$stopped_at" \
    'BEGIN {printf "%.1f", a - b}') s after the stop (keep-alive timeout 1 s)"
wait_in_sync "$via" 3 && ok "rep: $hung back in sync (it stepped down when its lease lapsed)" \
    || fail "rep: $hung not back in sync"

echo "=== a replica's node killed while fio writes, restarted, partially rebuilt"
wait_paths_live || fail "rep: not every path live"
primary=$(primary_via "$via")
victim=''
for i in 1 2 3; do [ "n$i" != "$primary" ] && victim=n$i; done
via=$(up_except "$victim")
fio_under secondary
request kill "$victim" && ok "host killed $victim, a replica (kill -9)" || fail "kill $victim not done"
sleep 3
request start "$victim" && ok "host restarted $victim" || fail "restart $victim not done"
fio_result secondary "a replica's death"
wait_in_sync "$via" 3 && ok "rep: $victim rebuilt (the harness prints what was copied), in sync" \
    || fail "rep: $victim not back in sync"

echo "=== node drain of the primary's node while fio writes"
wait_paths_live || fail "rep: not every path live"
primary=$(primary_via "$via")
fio_under drain
drained=$(weft_on "$via" node drain "$primary" 2>&1)
echo "  $drained"
now=$(primary_via "$via")
[ -n "$now" ] && [ "$now" != "$primary" ] && ok "rep: drained $primary, $now is primary" \
    || fail "rep: drain of $primary: $drained"
fio_result drain "a drain"
weft_on "$via" node uncordon "$primary" > /dev/null || fail "uncordon $primary"

echo "=== a snapshot of rep and its growth online while fio writes"
wait_paths_live || fail "rep: not every path live"
fio_under barrier
taken=$(weft_on "$via" snapshot create rep@s1 2>&1) && ok "rep: snapshot s1 taken under fio" \
    || fail "rep: snapshot: $taken"
grown=$(weft_on "$via" volume resize rep --size 96MiB 2>&1) && ok "rep: grown to 96 MiB under fio" \
    || fail "rep: resize: $grown"
fio_result barrier "a snapshot and a growth"
for _ in $(seq 40); do
    [ "$(blockdev --getsize64 "/dev/$rep_dev")" = $((96 << 20)) ] && break
    sleep 0.5
done
size=$(blockdev --getsize64 "/dev/$rep_dev")
[ "$size" = $((96 << 20)) ] && ok "the host's multipath device is 96 MiB now" \
    || fail "the host sees $size bytes, not 96 MiB"
# The output is read whole first: grep -q leaves at its match, and under pipefail a
# writer that meets the closed pipe would fail the pipeline.
shown=$(weft_on "$via" volume show rep)
grep -q "snapshot    s1: taken, on n[1-3], n[1-3], n[1-3]" <<< "$shown" \
    && ok "rep: s1 is held by all three copies" || fail "rep: $(grep snapshot <<< "$shown")"
weft_on "$via" snapshot delete rep@s1 > /dev/null || fail "rep: snapshot delete"

echo "=== ext4 on rep: the primary killed mid-write; fsck clean, synced files intact"
wait_paths_live || fail "rep: not every path live"
primary=$(primary_via "$via")
via=$(up_except "$primary")
mkdir -p /mnt/rep
if mkfs.ext4 -q -F "/dev/$rep_dev" && mount "/dev/$rep_dev" /mnt/rep; then
    for i in $(seq 8); do head -c 1M /dev/urandom > "/mnt/rep/synced$i"; done
    sync
    (cd /mnt/rep && sha256sum synced*) > /tmp/synced.sha256
    ( for i in $(seq 40); do head -c 256K /dev/urandom > "/mnt/rep/more$i" && sync "/mnt/rep/more$i" || exit 1; done ) \
        > /tmp/writer.txt 2>&1 &
    writer=$!
    sleep 2
    dmesg -C
    request kill "$primary" && ok "host killed $primary mid-write" || fail "kill $primary not done"
    wait_promotion "$primary" "$via" > /dev/null && ok "rep: a replica promoted" || fail "rep: no promotion"
    wait "$writer" && ok "rep: the writer carried on through the failover" || fail "rep: writer: $(cat /tmp/writer.txt)"
    umount /mnt/rep || fail "umount"
    if fsck.ext4 -fn "/dev/$rep_dev" > /tmp/fsck.txt 2>&1; then ok "fsck.ext4 -fn: clean"; else fail "fsck: $(tail -5 /tmp/fsck.txt)"; fi
    mount "/dev/$rep_dev" /mnt/rep && (cd /mnt/rep && sha256sum -c --quiet /tmp/synced.sha256) \
        && ok "every file synced before the kill matches its checksum" || fail "synced files differ"
    umount /mnt/rep
else
    fail "mkfs.ext4 or mount of /dev/$rep_dev"
fi
dmesg | grep -qi "I/O error\|EXT4-fs error" && fail "kernel I/O or ext4 errors" || ok "no kernel I/O or ext4 error"
request start "$primary" && ok "host restarted $primary" || fail "restart $primary not done"
wait_in_sync "$via" 3 && ok "rep: $primary rebuilt, in sync" || fail "rep: $primary not back in sync"

echo "=== two replicas: rep2's primary killed while fio writes and verifies, then back and rebuilt"
# A path to the node the ext4 test killed may still wait for the host's reconnect (and show
# the state it had before).
wait_paths_live rep2 2 || fail "rep2: not both paths live"
rep2_dev='' states=''
for subsys in /sys/class/nvme-subsystem/nvme-subsys*; do
    [ "$(cat "$subsys/subsysnqn" 2>/dev/null)" = "nqn.2026-11.io.weft:vol:rep2" ] || continue
    rep2_dev=$(ls "$subsys" | grep -E '^nvme[0-9]+n[0-9]+$' | head -1)
    states=$(cat "$subsys"/nvme*/nvme*c*n*/ana_state 2>/dev/null | sort | tr '\n' ' ')
done
[ "$states" = "inaccessible optimized " ] && ok "rep2: two paths, one optimized, one inaccessible" \
    || fail "rep2: ANA states '$states'"
primary2=$(primary_via "$via" rep2)
if [ -z "$rep2_dev" ] || [ -z "$primary2" ]; then
    fail "rep2: device '$rep2_dev', primary '$primary2': skipped"
else
    via2=$(up_except "$primary2")
    echo "  rep2 on /dev/$rep2_dev, primary $primary2"
    dmesg -C
    timeout 300 fio --name=rep2 --filename="/dev/$rep2_dev" --rw=randwrite --bs=4k --size=16m \
        --direct=1 --ioengine=libaio --iodepth=16 --verify=crc32c --randseed=9 --rate_iops=200 \
        --do_verify=0 --output-format=json > /tmp/fio-rep2.txt 2>&1 &
    FIO_PID=$!
    sleep 3
    request kill "$primary2" && ok "host killed $primary2, rep2's primary (kill -9)" || fail "kill $primary2 not done"
    if wait "$FIO_PID"; then
        ok "rep2: fio wrote through the failover without an error (longest write $(max_write_ms /tmp/fio-rep2.txt) ms)"
    else
        fail "rep2: fio: $(tail -3 /tmp/fio-rep2.txt)"
    fi
    timeout 300 fio --name=rep2 --filename="/dev/$rep2_dev" --rw=randwrite --bs=4k --size=16m \
        --direct=1 --ioengine=libaio --iodepth=16 --verify=crc32c --randseed=9 --verify_only \
        > /tmp/fio-rep2-verify.txt 2>&1 && ok "rep2: everything fio wrote reads back from the one copy left" \
        || fail "rep2: verify: $(tail -3 /tmp/fio-rep2-verify.txt)"
    dmesg | grep -qi "I/O error" && fail "kernel I/O errors during rep2's failover" || ok "no kernel I/O error"
    request start "$primary2" && ok "host restarted $primary2" || fail "restart $primary2 not done"
    wait_in_sync "$via2" 2 rep2 && ok "rep2: $primary2 rebuilt, both copies in sync" || fail "rep2: not back in sync"
    wait_in_sync "$via2" 3 && ok "rep: in sync again too" || fail "rep: not back in sync"
fi

echo "=== erasure-coded 2+1 (ec): fio through the death of a member's node and its return, then of its primary's"
ec_dev=''
for subsys in /sys/class/nvme-subsystem/nvme-subsys*; do
    [ "$(cat "$subsys/subsysnqn" 2>/dev/null)" = "nqn.2026-11.io.weft:vol:ec" ] || continue
    ec_dev=$(ls "$subsys" | grep -E '^nvme[0-9]+n[0-9]+$' | head -1)
done
wait_in_sync "$via" 3 ec && ok "ec: its three members in sync" || fail "ec: members not in sync"
ec_primary=$(primary_via "$via" ec)
ec_member=$(rep_field "$via" ec | awk '$2 == "member" {print $1}' | head -1)
if [ -z "$ec_dev" ] || [ -z "$ec_primary" ] || [ -z "$ec_member" ]; then
    fail "ec: device '$ec_dev', primary '$ec_primary', member '$ec_member': skipped"
else
    echo "  ec on /dev/$ec_dev, primary $ec_primary"
    FIO_EC=(--filename="/dev/$ec_dev" --rw=randwrite --bs=4k --size=16m --direct=1 --ioengine=libaio
        --iodepth=8 --verify=crc32c --randseed=11)
    ec_through() { # NODE WHAT: fio writes while NODE is killed, then verifies; NODE restarts, rebuilt
        local via_ec
        via_ec=$(up_except "$1")
        dmesg -C
        timeout 300 fio --name="ec-$2" "${FIO_EC[@]}" --rate_iops=200 --do_verify=0 --output-format=json \
            > "/tmp/fio-ec-$2.txt" 2>&1 &
        local fio_pid=$!
        sleep 3
        request kill "$1" && ok "host killed $1, ec's $2 (kill -9)" || fail "kill $1 not done"
        if wait "$fio_pid"; then
            ok "ec: fio wrote through the $2's death without an error (longest write $(max_write_ms "/tmp/fio-ec-$2.txt") ms)"
        else
            fail "ec: fio during the $2's death: $(tail -3 "/tmp/fio-ec-$2.txt")"
        fi
        timeout 300 fio --name="ec-$2" "${FIO_EC[@]}" --verify_only > "/tmp/fio-ec-$2-verify.txt" 2>&1 \
            && ok "ec: everything fio wrote reads back with the $2 gone (rebuilt from the others)" \
            || fail "ec: verify with the $2 gone: $(tail -3 "/tmp/fio-ec-$2-verify.txt")"
        dmesg | grep -qi "I/O error" && fail "kernel I/O errors during ec's $2's death" || ok "no kernel I/O error"
        request start "$1" && ok "host restarted $1" || fail "restart $1 not done"
        wait_in_sync "$via_ec" 3 ec && ok "ec: $1 rebuilt, every member in sync" || fail "ec: $1 not back in sync"
        timeout 300 fio --name="ec-$2" "${FIO_EC[@]}" --verify_only > "/tmp/fio-ec-$2-back.txt" 2>&1 \
            && ok "ec: everything reads back once $1 is back" \
            || fail "ec: verify once $1 is back: $(tail -3 "/tmp/fio-ec-$2-back.txt")"
    }
    ec_through "$ec_member" member
    ec_through "$ec_primary" primary
    weft_on "$(up_except "$ec_primary")" volume show ec | sed 's/^/  /'

    echo "=== ec: a snapshot, a clone of it and a growth online while fio writes"
    via_ec=$(up_except none)
    dmesg -C
    timeout 300 fio --name=ec-barrier "${FIO_EC[@]}" --rate_iops=200 --do_verify=0 --output-format=json \
        > /tmp/fio-ec-barrier.txt 2>&1 &
    fio_pid=$!
    sleep 3
    taken=$(weft_on "$via_ec" snapshot create ec@s1 2>&1) && ok "ec: snapshot s1 taken under fio" \
        || fail "ec: snapshot: $taken"
    grown=$(weft_on "$via_ec" volume resize ec --size 48MiB 2>&1) && ok "ec: grown to 48 MiB under fio" \
        || fail "ec: resize: $grown"
    if wait "$fio_pid"; then
        ok "ec: fio wrote through a snapshot and a growth without an error (longest write $(max_write_ms /tmp/fio-ec-barrier.txt) ms)"
    else
        fail "ec: fio during a snapshot and a growth: $(tail -3 /tmp/fio-ec-barrier.txt)"
    fi
    timeout 300 fio --name=ec-barrier "${FIO_EC[@]}" --verify_only > /tmp/fio-ec-barrier-verify.txt 2>&1 \
        && ok "ec: everything fio wrote reads back after the snapshot and the growth" \
        || fail "ec: verify after the snapshot and the growth: $(tail -3 /tmp/fio-ec-barrier-verify.txt)"
    dmesg | grep -qi "I/O error" && fail "kernel I/O errors during ec's snapshot and growth" || ok "no kernel I/O error"
    for _ in $(seq 40); do
        [ "$(blockdev --getsize64 "/dev/$ec_dev")" = $((48 << 20)) ] && break
        sleep 0.5
    done
    size=$(blockdev --getsize64 "/dev/$ec_dev")
    [ "$size" = $((48 << 20)) ] && ok "ec: the host's device is 48 MiB now" \
        || fail "ec: the host sees $size bytes, not 48 MiB"
    shown=$(weft_on "$via_ec" volume show ec)
    grep -q "snapshot    s1: taken, on n[1-3], n[1-3], n[1-3]" <<< "$shown" \
        && ok "ec: s1 is held by all three members" || fail "ec: $(grep snapshot <<< "$shown")"
    # A clone of the snapshot, on the same members, served to this host.
    weft_on "$via_ec" volume clone ec@s1 ec-clone > /dev/null && ok "ec: cloned s1 to ec-clone" \
        || fail "ec: clone of s1"
    weft_on "$via_ec" volume attach ec-clone --host guest > /dev/null || fail "attach ec-clone"
    clone_dev=''
    for _ in $(seq 60); do
        for subsys in /sys/class/nvme-subsystem/nvme-subsys*; do
            [ "$(cat "$subsys/subsysnqn" 2>/dev/null)" = "nqn.2026-11.io.weft:vol:ec-clone" ] || continue
            clone_dev=$(ls "$subsys" | grep -E '^nvme[0-9]+n[0-9]+$' | head -1)
        done
        [ -n "$clone_dev" ] && break
        nvme connect-all -t tcp -a "$ADDR" -s "$PORT" > /dev/null 2>&1
        sleep 1
    done
    if [ -n "$clone_dev" ]; then
        # The clone holds what fio verified before the snapshot: the writes of the
        # member's and the primary's deaths (the same seed and offsets).
        timeout 300 fio --name=ec-primary "${FIO_EC[@]}" --filename="/dev/$clone_dev" --verify_only \
            > /tmp/fio-ec-clone.txt 2>&1 && ok "ec-clone: what fio wrote before the snapshot reads back from the clone" \
            || fail "ec-clone: verify: $(tail -3 /tmp/fio-ec-clone.txt)"
    else
        fail "ec-clone: no block device"
    fi
    weft_on "$via_ec" snapshot delete ec@s1 > /dev/null || fail "ec: snapshot delete"
fi

echo "=== a persistent discovery connection hears of a volume attached later"
udevadm monitor --kernel --property > /tmp/uevents 2>&1 &
monitor=$!
nvme discover -t tcp -a "$ADDR" -s "$PORT" --persistent > /dev/null 2>&1 || fail "nvme discover --persistent"
sleep 1
weft_cli volume create v4 --size 16MiB --node n1 > /dev/null && weft_cli volume attach v4 --host guest \
    || fail "create and attach v4"
for _ in $(seq 20); do grep -q "NVME_AEN=0x70f002" /tmp/uevents && break; sleep 0.5; done
kill "$monitor" 2>/dev/null
grep -q "NVME_AEN=0x70f002" /tmp/uevents && ok "kernel event NVME_AEN=0x70f002 (Discovery Log Page Change)" \
    || fail "no Discovery Log Page Change event: $(grep NVME_AEN /tmp/uevents | head -3)"

nvme disconnect-all >/dev/null 2>&1
for v in v1 v2 v3 v4 rep rep2 ec; do weft_cli volume detach "$v" --host guest >/dev/null || fail "detach $v"; done

if [ "$FAILS" = 0 ]; then echo "cluster: PASS"; else echo "cluster: FAIL ($FAILS)"; exit 1; fi
