#!/bin/bash
# Kernel-interop test, guest side: the Linux NVMe/TCP host (nvme-tcp, nvme-cli 2.3,
# fio, ext4) against a weft target, in steps:
#   a discovery   b connect + identify   c fio write+verify   d header/data digests
#   e ext4 persistence across reconnect   f restart (SIGTERM)   g malformed PDUs
#   h data written with O_DIRECT+fsync survives kill -9
#   i volumes (weft only): a pool over two files (grown online by a third under I/O), two
#     volumes connected at once (one thick and encrypted at rest, the key from a key file), ext4
#     snapshot after fsfreeze, a clone mounted alongside shows the snapshot's files, online
#     resize seen through the namespace-attribute-changed event + resize2fs, data intact
#     after a weft restart, delete refused while a host is connected; host access: an
#     unattached host NQN is refused at Connect and sees no volume in discovery while the
#     attached one connects; fio verify across a kill -9 of weft (the host reconnects by
#     itself, every acknowledged write reads back)
#   j csi-sanity   k CSI compute-node failover
#   l reservations (weft only): two host identities register, acquire, preempt and clear
#     with nvme-cli; a conflicting write is refused; the state is kept across a restart
# Each step prints "=== name", "  ok: ..." per passed check, "FAIL name: why" per failed
# check and "PASS name" when all its checks passed; a summary follows. Exit code 1 if any
# step failed. There is no `set -e` on purpose: later steps still run after a failure,
# so one run shows every problem; a step stops early only where later checks depend on it.
#
# Normally started by the host side, harness/interop.sh, which runs weft on the host
# (reached as $LAB_HOST_IP over slirp) and a supervisor that restarts it when this script
# creates $LAB_SHARE/ctl/restart (SIGTERM) or $LAB_SHARE/ctl/kill9 (SIGKILL); the
# supervisor answers in ctl/<request>.done ("ok ..." or "error: ...") and records
# unexpected exits of weft in ctl/events.
# Env: WEFT_PORT     target port (default 14430)
#      WEFT_TARGET   weft (default) or nvmet: the guest kernel's nvmet-tcp target on
#                    127.0.0.1, configured like weft's interop config, as a reference run
#                    of the same checks (restart and kill -9 become a port down/up; nvmet
#                    closes bad connections without a C2HTermReq, which is accepted there)
#      GARBAGE_SEED  seed of the random bytes of step g (default 1)
#      WEFT_API_PORT weft's API port on the host (step i; default 9440)
#      WEFT_POOL_DIR host directory for step i's pool devices (default: step i skipped)
set -uo pipefail

PORT=${WEFT_PORT:-14430}
TARGET=${WEFT_TARGET:-weft}
NQN1=nqn.2026-11.io.weft:default   # ns1: file 512 MiB, ns2: ram 64 MiB
NQN2=nqn.2026-11.io.weft:second    # ns1: ram 32 MiB
MIB=1048576
CTL=$LAB_SHARE/ctl                 # requests to / answers from the host supervisor
OUT=$LAB_SHARE/interop             # fio JSON output
TMP=/tmp/interop
MNT=/mnt/interop
MNT2=/mnt/interop-clone
VOLA=nqn.2026-11.io.weft:vol:vol-a VOLB=nqn.2026-11.io.weft:vol:vol-b VOLC=nqn.2026-11.io.weft:vol:vol-a-copy
VOLT=nqn.2026-11.io.weft:vol:vol-t
VOLZ=nqn.2026-11.io.weft:vol:vol-z
case "$TARGET" in
    weft)  ADDR=${LAB_HOST_IP:?weft runs on the host: needs vm-run.sh -n slirp}; MODEL=weft ;;
    nvmet) ADDR=127.0.0.1; MODEL=Linux ;;
    *) echo "WEFT_TARGET must be weft or nvmet" >&2; exit 2 ;;
esac
rm -rf "$OUT" "$TMP"
mkdir -p "$OUT" "$TMP" "$MNT" "$MNT2"
# nvme-cli sends the NQN in this file; weft allows volumes to it by name
[ -s /etc/nvme/hostnqn ] || { mkdir -p /etc/nvme && nvme gen-hostnqn > /etc/nvme/hostnqn; }
HOSTNQN=$(cat /etc/nvme/hostnqn)
# (no process substitution below: the guest has no /dev/fd)

# ---- reporting -------------------------------------------------------------------
STEP='' STEP_FAILS=0 STEP_T0=0 RESULTS=()
fail() { echo "FAIL $STEP: $*"; STEP_FAILS=$((STEP_FAILS + 1)); }
nonempty() { local v; for v; do [ -n "$v" ] || return 1; done; }
check() { # WHAT CMD [ARGS...]: run CMD; "ok: WHAT" or "FAIL step: WHAT"; returns CMD's status
    local what=$1 t0=$SECONDS; shift
    if "$@"; then echo "  ok: $what$(took_note "$t0")"; else fail "$what"; return 1; fi
}
took_note() { # T0: " (Ns)" when the check took 5 s or more, to show where a step's time goes
    local took=$((SECONDS - $1))
    [ "$took" -lt 5 ] || echo " (${took}s)"
}
run_step() { # NAME FUNCTION: run one step from a clean host state and record its result
    # INTEROP_STEPS (harness/interop.sh --steps): only the steps it names.
    [ -z "${INTEROP_STEPS:-}" ] || [[ ",$INTEROP_STEPS," == *",$1,"* ]] || return 0
    STEP=$1 STEP_FAILS=0 STEP_T0=$SECONDS
    echo; echo "=== $STEP"
    reset_host
    "$2"
    local took=$((SECONDS - STEP_T0))
    if [ "$STEP_FAILS" -eq 0 ]; then
        echo "PASS $STEP (${took}s)"; RESULTS+=("PASS $STEP (${took}s)")
    else
        RESULTS+=("FAIL $STEP: $STEP_FAILS failed check(s) (${took}s)")
    fi
}

# ---- host (initiator) helpers ----------------------------------------------------
reset_host() { # leftovers of a step that stopped early
    if grep -q " $MNT " /proc/mounts; then umount "$MNT"; fi
    if grep -q " $MNT2 " /proc/mounts; then umount "$MNT2"; fi
    local nqn
    for nqn in "$NQN1" "$NQN2" "$VOLA" "$VOLB" "$VOLC" "$VOLT" "$VOLZ"; do
        if ctrl_of "$nqn" >/dev/null; then nvme disconnect -n "$nqn" >/dev/null 2>&1; fi
    done
}
ctrl_of() { # NQN: print the name (nvmeN) of a controller connected to subsystem NQN
    local c
    for c in /sys/class/nvme/nvme*; do
        [ "$(cat "$c/subsysnqn" 2>/dev/null)" = "$1" ] && { echo "${c##*/}"; return 0; }
    done
    return 1
}
ns_dev() { # NQN NSID: print the block device of namespace NSID (multipath head node or
           # plain namespace), waiting up to 20 s for the namespace scan
    local n i
    for i in $(seq 100); do
        for n in /sys/class/nvme-subsystem/nvme-subsys*/nvme*n* /sys/class/nvme/nvme*/nvme*n*; do
            [ -b "/dev/${n##*/}" ] && [ "$(cat "$n/nsid" 2>/dev/null)" = "$2" ] &&
                [ "$(cat "$(dirname "$n")/subsysnqn" 2>/dev/null)" = "$1" ] || continue
            echo "/dev/${n##*/}"; return 0
        done
        sleep 0.2
    done
    return 1
}
connect() { # NQN [nvme connect options...]; ctrl-loss-tmo 60 bounds hangs on a dead target
    local nqn=$1; shift
    timeout 180 nvme connect -t tcp -a "$ADDR" -s "$PORT" -n "$nqn" --ctrl-loss-tmo 60 "$@" >/dev/null &&
        ctrl_of "$nqn" >/dev/null
}
disconnect() { # NQN: disconnect and check that no controller of NQN is left
    timeout 120 nvme disconnect -n "$1" >/dev/null && ! ctrl_of "$1" >/dev/null
}
wait_live() { # CTRL SECONDS: wait until controller CTRL is live again
    local i
    for i in $(seq $(($2 * 5))); do
        [ "$(cat "/sys/class/nvme/$1/state" 2>/dev/null)" = live ] && return 0
        sleep 0.2
    done
    return 1
}

# ---- target control ----------------------------------------------------------------
NVMET=/sys/kernel/config/nvmet
nvmet_ns() { # NQN NSID SIZE_MIB: nvmet namespace backed by a file on the guest's tmpfs
    local s=$NVMET/subsystems/$1 f=/tmp/nvmet-${1##*:}-$2.img
    if [ ! -d "$s" ]; then mkdir "$s" && echo 1 > "$s/attr_allow_any_host"; fi
    truncate -s "$3M" "$f" && mkdir "$s/namespaces/$2" &&
        echo -n "$f" > "$s/namespaces/$2/device_path" &&
        echo 1 > "$s/namespaces/$2/buffered_io" &&   # tmpfs has no O_DIRECT on 6.1
        echo 1 > "$s/namespaces/$2/enable"
}
nvmet_port_up() {
    local p=$NVMET/ports/1 nqn
    mkdir "$p" && echo tcp > "$p/addr_trtype" && echo ipv4 > "$p/addr_adrfam" &&
        echo "$ADDR" > "$p/addr_traddr" && echo "$PORT" > "$p/addr_trsvcid" || return 1
    for nqn in "$NQN1" "$NQN2"; do ln -s "$NVMET/subsystems/$nqn" "$p/subsystems/$nqn" || return 1; done
}
nvmet_port_down() { rm -f "$NVMET"/ports/1/subsystems/* && rmdir "$NVMET/ports/1"; }
nvmet_setup() {
    # With THP on, 1M writes over guest loopback hit a 6.1 kernel BUG (mm/usercopy.c:101,
    # "Kernel memory exposure attempt ... from page alloc") in nvmet-tcp's receive path:
    # the skb fragment is most likely fio's THP-backed buffer, spanning two huge pages.
    echo never > /sys/kernel/mm/transparent_hugepage/enabled
    modprobe nvmet && modprobe nvmet-tcp &&
        nvmet_ns "$NQN1" 1 512 && nvmet_ns "$NQN1" 2 64 && nvmet_ns "$NQN2" 1 32 && nvmet_port_up
}
nvmet_teardown() {
    local ns s
    [ -d "$NVMET/ports/1" ] && nvmet_port_down
    for s in "$NVMET/subsystems/$NQN1" "$NVMET/subsystems/$NQN2"; do
        [ -d "$s" ] || continue
        for ns in "$s"/namespaces/*; do echo 0 > "$ns/enable"; rmdir "$ns"; done
        rmdir "$s"
    done
}
target_up() { # weft: wait for the supervisor's first start; nvmet: configure it
    if [ "$TARGET" = nvmet ]; then nvmet_setup; return; fi
    local i
    for i in $(seq 450); do
        if [ -s "$CTL/weft-pid" ]; then echo "  weft pid $(cat "$CTL/weft-pid") on the host, $ADDR:$PORT"; return 0; fi
        if [ -e "$CTL/start-failed" ]; then echo "  host: $(cat "$CTL/start-failed")"; return 1; fi
        sleep 0.2
    done
    echo "  no word from the host supervisor after 90 s"; return 1
}
host_ctl() { # restart|kill9: have the target restarted (weft: by the host supervisor)
    if [ "$TARGET" = nvmet ]; then
        nvmet_port_down && nvmet_port_up && echo "  nvmet port 1 taken down and up again"
        return
    fi
    local req=$1 i ans
    rm -f "$CTL/$req.done"
    : > "$CTL/$req"
    for i in $(seq 600); do
        if [ -e "$CTL/$req.done" ]; then
            ans=$(cat "$CTL/$req.done"); echo "  host: $ans"
            [[ $ans == ok* ]]; return
        fi
        sleep 0.2
    done
    echo "  no answer to $req from the host supervisor after 120 s"; return 1
}
cleanup() {
    reset_host
    [ "$TARGET" = nvmet ] && nvmet_teardown
    return 0
}
trap cleanup EXIT

# ---- python glue -------------------------------------------------------------------
check_discovery() { # JSON_FILE NQN...: every NQN is in the discovery log with trtype tcp
    python3 - "$@" <<'EOF'
import json, sys
recs = json.load(open(sys.argv[1])).get('records', [])
for r in recs:
    print(f"  {r.get('trtype', '?'):4} {r.get('traddr', '?')}:{r.get('trsvcid', '?')} {r.get('subtype', '?'):32} {r.get('subnqn', '?')}")
bad = [n for n in sys.argv[2:] if not any(r.get('subnqn') == n and r.get('trtype') == 'tcp' for r in recs)]
if bad:
    sys.exit(f"  not in the discovery log with trtype tcp: {' '.join(bad)}")
EOF
}
check_id_ctrl() { # JSON_FILE NQN MODEL: print the main fields, check mn/sn/subnqn
    python3 - "$@" <<'EOF'
import json, sys
c, nqn, model = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3]
keys = ('vid sn mn fr ver cntlid cntrltype mdts sqes cqes maxcmd nn oncs fuses vwc sgls '
        'kas ioccsz iorcsz icdoff msdbd ctratt oaes subnqn').split()
print('  ' + '  '.join(f"{k}={str(c.get(k, '-')).strip()}" for k in keys))
errs = []
if model not in str(c.get('mn', '')): errs.append(f"mn {c.get('mn')!r} does not contain {model!r}")
if not str(c.get('sn', '')).strip(): errs.append('empty serial number')
if c.get('subnqn') != nqn: errs.append(f"subnqn {c.get('subnqn')!r} != {nqn!r}")
if errs: sys.exit('  ' + '; '.join(errs))
EOF
}
ns_info() { # DEV: print "<size in bytes> <identifiers>" from id-ns and ns-descs,
            # identifiers being the non-zero ones of nguid, eui64, uuid ("none" if none)
    nvme id-ns "$1" -o json > "$TMP/id-ns.json" && nvme ns-descs "$1" -o json > "$TMP/ns-descs.json" &&
    python3 - "$TMP/id-ns.json" "$TMP/ns-descs.json" <<'EOF'
import json, sys
ns, descs = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])).get('ns-descs', [])
flbas = ns['flbas']
lbaf = ns['lbafs'][(flbas & 0xf) | ((flbas >> 5) & 0x3) << 4]
ids = {'nguid': ns.get('nguid', ''), 'eui64': ns.get('eui64', '')}
for d in descs:
    t = d.get('type')
    if t in ('nguid', 'eui64', 'uuid'):
        if ids.get(t, '').strip('0') and ids[t] != d.get(t):
            sys.exit(f"  {t} {ids[t]} in id-ns, {d.get(t)} in ns-descs")
        ids[t] = d.get(t, '')
ident = ' '.join(f'{k}={v}' for k, v in sorted(ids.items()) if v.strip('0-'))
print(ns['nsze'] * (1 << lbaf['ds']), ident or 'none')
EOF
}
check_list_subsys() { # JSON_FILE NQN ADDR PORT: a live tcp path to ADDR:PORT
    python3 - "$@" <<'EOF'
import json, sys
doc, nqn, addr, port = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3], sys.argv[4]
hosts = doc if isinstance(doc, list) else [doc]
paths = [p for h in hosts for s in h.get('Subsystems', []) if s.get('NQN') == nqn for p in s.get('Paths', [])]
for p in paths:
    print(f"  {p.get('Name')} {p.get('Transport')} {p.get('Address')} {p.get('State')}")
ok = [p for p in paths if p.get('Transport') == 'tcp' and p.get('State') == 'live'
      and f'traddr={addr},' in p.get('Address', '') + ',' and f'trsvcid={port}' in p.get('Address', '')]
if not ok:
    sys.exit(f'  no live tcp path to {addr}:{port} for {nqn}')
EOF
}
fio_summary() { # JSON_FILE SIZE_BYTES: one line per job; everything written was read back
    python3 - "$@" <<'EOF'
import json, sys
txt = open(sys.argv[1]).read()
job = json.loads(txt[txt.index('{'):])['jobs'][0]
w, r, size = job['write'], job['read'], int(sys.argv[2])
mib = lambda b: b / 1048576
print(f"  write {mib(w['io_bytes']):.0f} MiB {mib(w['bw_bytes']):.1f} MiB/s {w['iops']:.0f} IOPS, "
      f"verify-read {mib(r['io_bytes']):.0f} MiB {mib(r['bw_bytes']):.1f} MiB/s, "
      f"lat mean w {w['lat_ns']['mean'] / 1000:.0f} us r {r['lat_ns']['mean'] / 1000:.0f} us, error {job['error']}")
if job['error'] or w['io_bytes'] != size or r['io_bytes'] != size:
    sys.exit(f"  expected {size} bytes written and verified, error 0")
EOF
}
FIO_N=0
fio_verify() { # DEV BS SIZE_MIB [FIO-ARGS...]: write SIZE with BS blocks carrying crc32c, read back, verify
    local dev=$1 bs=$2 size=$(($3 * MIB)) json
    shift 3
    FIO_N=$((FIO_N + 1))
    json=$OUT/fio-$FIO_N-${dev#/dev/}-$bs.json
    timeout 900 fio --name="verify-$bs" --filename="$dev" --rw=randwrite --bs="$bs" --size="$size" \
        --direct=1 --ioengine=libaio --iodepth=32 --verify=crc32c --do_verify=1 --verify_fatal=1 \
        --verify_state_save=0 --output-format=json --output="$json" "$@" &&
        fio_summary "$json" "$size"
}
raw_pdus() { # CASE: raw TCP connections with malformed input, see "step g" below
    WEFT_TARGET=$TARGET python3 - "$1" "$ADDR" "$PORT" "$TMP" <<'EOF'
# Cases: random  4 KiB of random bytes right after connecting: the connection is closed,
#                possibly after a C2HTermReq
#        hlen    ICReq, ICResp, then a CapsuleCmd header with hlen 50 (must be 72):
#                C2HTermReq with FES 0x01, then close
#        h2c     ICReq, ICResp, then H2CData for a transfer that does not exist:
#                C2HTermReq, then close
#        hold    ICReq, ICResp, half of the bad CapsuleCmd header; touch TMP/hold.ready;
#                wait for TMP/hold.release; then send the rest: as "hlen" (a target that
#                dropped the stalled connection in the meantime is fine too)
# Against nvmet (WEFT_TARGET=nvmet) a close without C2HTermReq is accepted.
import os, random, socket, struct, sys, time
case, host, port, tmp = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
strict = os.environ['WEFT_TARGET'] == 'weft'
TIMEOUT = 30   # seconds; everything is slow under TCG
FES = {1: 'invalid PDU header field', 2: 'PDU sequence error', 3: 'header digest error',
       4: 'data out of range', 5: 'data limit exceeded', 6: 'unsupported parameter'}

def die(msg):
    sys.exit(f'  {case}: {msg}')

def icreq(s):
    s.sendall(struct.pack('<BBBBIHBBI', 0x00, 0, 128, 0, 128, 0, 0, 0, 0).ljust(128, b'\0'))
    resp = b''
    while len(resp) < 128:
        d = s.recv(128 - len(resp))
        if not d:
            die(f'connection closed after {len(resp)} bytes of the ICResp')
        resp += d
    ptype, _, hlen, _, plen = struct.unpack_from('<BBBBI', resp)
    if (ptype, hlen, plen) != (0x01, 128, 128):
        die(f'bad ICResp header {resp[:8].hex()}')

def send(s, data):
    try:
        s.sendall(data)
    except OSError as e:   # the target may close before it has read everything
        print(f'  {case}: send: {e}')

def until_close(s, timeout=TIMEOUT):
    """Bytes received until the target closes the connection (None if it stays open)."""
    data = b''
    s.settimeout(timeout)
    try:
        while True:
            d = s.recv(65536)
            if not d:
                return data
            data += d
    except ConnectionResetError:
        return data
    except socket.timeout:
        return None

def judge(data, want_fes=None, need_termreq=strict):
    if data is None:
        die(f'connection still open after {TIMEOUT} s')
    if not data:
        if need_termreq:
            die('connection closed without a C2HTermReq')
        print(f'  {case}: connection closed without a C2HTermReq')
        return
    ptype, _, hlen, _, plen = struct.unpack_from('<BBBBI', data.ljust(8, b'\0'))
    if ptype != 0x03 or hlen != 24 or not 24 <= plen <= 24 + 152 or len(data) != plen:
        die(f'expected one C2HTermReq, got {len(data)} bytes: {data[:32].hex()}')
    fes, fei = struct.unpack_from('<HI', data, 8)
    print(f'  {case}: C2HTermReq FES {fes:#04x} ({FES.get(fes, "unknown")}), FEI {fei}, '
          f'plen {plen}, then the connection was closed')
    if want_fes is not None and fes != want_fes:
        die(f'FES {fes:#04x}, expected {want_fes:#04x}')

def main():
    bad_capsule = struct.pack('<BBBBI', 0x04, 0, 50, 0, 72).ljust(72, b'\0')   # hlen 50, must be 72
    s = socket.create_connection((host, port), timeout=TIMEOUT)
    if case == 'random':
        seed = int(os.environ.get('GARBAGE_SEED', '1'))
        garbage = random.Random(seed).randbytes(4096)
        print(f'  random: seed {seed}, first bytes {garbage[:8].hex()}')
        send(s, garbage)
        judge(until_close(s), need_termreq=False)
    elif case == 'hlen':
        icreq(s)
        send(s, bad_capsule)
        judge(until_close(s), want_fes=0x01)
    elif case == 'h2c':
        icreq(s)
        # H2CData (type 0x06, flags LAST_PDU, hlen 24, pdo 24): cccid 1, ttag 0x1234, datao 0,
        # datal 512. The header goes first; the data only if the target waits for it.
        send(s, struct.pack('<BBBBIHHII', 0x06, 0x04, 24, 24, 24 + 512, 1, 0x1234, 0, 512).ljust(24, b'\0'))
        data = until_close(s, timeout=3)
        if data is None:
            send(s, bytes(512))
            data = until_close(s)
        judge(data)
    elif case == 'hold':
        icreq(s)
        send(s, bad_capsule[:4])
        open(os.path.join(tmp, 'hold.ready'), 'w').close()
        t0 = time.monotonic()
        while not os.path.exists(os.path.join(tmp, 'hold.release')):
            if time.monotonic() - t0 > 600:
                die('never released')
            time.sleep(0.1)
        if until_close(s, timeout=0.5) is not None:
            print(f'  hold: the target closed the stalled connection within {time.monotonic() - t0:.0f} s')
        else:
            print(f'  hold: connection still open after {time.monotonic() - t0:.0f} s mid-header, sending the rest')
            send(s, bad_capsule[4:])
            judge(until_close(s), want_fes=0x01)
    else:
        die('unknown case')

try:
    main()
except OSError as e:
    die(f'{type(e).__name__}: {e}')
EOF
}

# ---- steps -------------------------------------------------------------------------
SERIAL='' IDS1='' IDS2=''

step_discovery() {
    check "target up ($TARGET)" target_up || return
    check "modprobe nvme-tcp" modprobe nvme-tcp || return
    check "nvme discover -t tcp -a $ADDR -s $PORT" \
        eval 'timeout 180 nvme discover -t tcp -a "$ADDR" -s "$PORT" -o json > "$TMP/discover.json"' || return
    check "discovery log lists $NQN1 and $NQN2 with trtype tcp" check_discovery "$TMP/discover.json" "$NQN1" "$NQN2"
}

step_identify() {
    check "connect $NQN1 --nr-io-queues 2" connect "$NQN1" --nr-io-queues 2 || return
    local ctrl dev1 dev2 q mq size
    ctrl=$(ctrl_of "$NQN1")
    dev1=$(ns_dev "$NQN1" 1); check "namespace 1 block device: ${dev1:-none}" [ -n "$dev1" ] || return
    dev2=$(ns_dev "$NQN1" 2); check "namespace 2 block device: ${dev2:-none}" [ -n "$dev2" ]
    for q in /sys/class/nvme/"$ctrl"/nvme*c*n1 /sys/block/"${dev1#/dev/}"; do [ -d "$q/mq" ] && break; done
    mq=$(ls "$q/mq" 2>/dev/null | wc -l)
    check "$mq I/O queues (${q##*/}/mq; controller queue_count $(cat "/sys/class/nvme/$ctrl/queue_count") incl. admin)" [ "$mq" -ge 2 ]
    # CMIC bit 1 + NMIC bit 0 (as nvmet): the host keeps I/O at the head while a controller reconnects
    check "ns1 behind a native multipath head (path ${q##*/}, head $dev1)" compgen -G "/sys/class/nvme/$ctrl/nvme*c*n1"
    check "nvme id-ctrl: mn contains $MODEL, sn set, subnqn $NQN1" \
        eval 'nvme id-ctrl "/dev/$ctrl" -o json > "$TMP/id-ctrl.json" && check_id_ctrl "$TMP/id-ctrl.json" "$NQN1" "$MODEL"'
    SERIAL=$(cat "/sys/class/nvme/$ctrl/serial")
    read -r size IDS1 <<< "$(ns_info "$dev1")"
    check "ns1 id-ns: nsze * LBA size = ${size:-?} bytes (want $((512 * MIB)))" [ "${size:-0}" = $((512 * MIB)) ]
    check "ns1 has a non-zero NGUID, EUI-64 or UUID: ${IDS1:-?}" [ "${IDS1:-none}" != none ]
    check "$dev1 size $(blockdev --getsize64 "$dev1") bytes" [ "$(blockdev --getsize64 "$dev1")" = $((512 * MIB)) ]
    if [ -n "$dev2" ]; then
        read -r size IDS2 <<< "$(ns_info "$dev2")"
        check "ns2 id-ns: nsze * LBA size = ${size:-?} bytes (want $((64 * MIB)))" [ "${size:-0}" = $((64 * MIB)) ]
        check "ns2 has a non-zero NGUID, EUI-64 or UUID: ${IDS2:-?}" [ "${IDS2:-none}" != none ]
        check "ns1 and ns2 have different identifiers" [ "$IDS1" != "$IDS2" ]
    fi
    check "nvme list-subsys: live tcp path to $ADDR:$PORT" \
        eval 'nvme list-subsys -o json > "$TMP/list-subsys.json" && check_list_subsys "$TMP/list-subsys.json" "$NQN1" "$ADDR" "$PORT"'
    check "nvme list" eval 'nvme list | sed "s/^/  /"'
    check "disconnect" disconnect "$NQN1"
}

step_fio() {
    check "connect $NQN1 --nr-io-queues 2" connect "$NQN1" --nr-io-queues 2 || return
    local dev1 dev2
    dev1=$(ns_dev "$NQN1" 1) && dev2=$(ns_dev "$NQN1" 2)
    check "block devices $dev1 $dev2" nonempty "$dev1" "$dev2" || return
    check "fio crc32c verify ns1 bs 4k 32 MiB" fio_verify "$dev1" 4k 32
    check "fio crc32c verify ns1 bs 64k 32 MiB" fio_verify "$dev1" 64k 32
    check "fio crc32c verify ns1 bs 1M 64 MiB" fio_verify "$dev1" 1M 64
    check "fio crc32c verify ns2 (ram) bs 4k 32 MiB" fio_verify "$dev2" 4k 32
    check "nvme write and nvme read of 1 MiB in one command each (MDTS)" nvme_cli_mib "$dev1"
    check "disconnect" disconnect "$NQN1"
}
nvme_cli_mib() { # DEV: one 1 MiB nvme-cli Write and Read at LBA 0 (a Linux host refuses
                 # more than MDTS with EINVAL), the data read back intact
    local blocks=$((MIB / $(blockdev --getss "$1") - 1))
    head -c "$MIB" /dev/urandom > "$TMP/mib.in"
    nvme write "$1" --start-block=0 --block-count=$blocks --data-size=$MIB --data="$TMP/mib.in" > /dev/null &&
        nvme read "$1" --start-block=0 --block-count=$blocks --data-size=$MIB --data="$TMP/mib.out" > /dev/null &&
        cmp "$TMP/mib.in" "$TMP/mib.out"
}

step_digests() {
    check "connect $NQN1 --hdr-digest --data-digest --nr-io-queues 2 --queue-size 64 --keep-alive-tmo 5" \
        connect "$NQN1" --hdr-digest --data-digest --nr-io-queues 2 --queue-size 64 --keep-alive-tmo 5 || return
    local ctrl dev1
    ctrl=$(ctrl_of "$NQN1")
    echo "  $ctrl: kato $(cat "/sys/class/nvme/$ctrl/kato") s, sqsize $(cat "/sys/class/nvme/$ctrl/sqsize"), queue_count $(cat "/sys/class/nvme/$ctrl/queue_count")"
    dev1=$(ns_dev "$NQN1" 1); check "namespace 1 block device: ${dev1:-none}" [ -n "$dev1" ] || return
    check "fio crc32c verify with digests, bs 4k 16 MiB" fio_verify "$dev1" 4k 16
    check "fio crc32c verify with digests, bs 1M 64 MiB" fio_verify "$dev1" 1M 64
    check "controller still live (keep-alive 5 s)" [ "$(cat "/sys/class/nvme/$ctrl/state")" = live ]
    check "disconnect" disconnect "$NQN1"
}

write_files() { # 20 MiB of random bytes and 40 small files on $MNT
    local i
    head -c $((20 * MIB)) /dev/urandom > "$MNT/big.bin" && mkdir "$MNT/small" || return 1
    for i in $(seq 40); do head -c $((RANDOM * 3 + i)) /dev/urandom > "$MNT/small/f$i" || return 1; done
}
mount_ns1() { # connect NQN1 and mount its namespace 1 on $MNT
    local dev
    connect "$NQN1" && dev=$(ns_dev "$NQN1" 1) && mount "$dev" "$MNT"
}

step_ext4() {
    check "connect $NQN1" connect "$NQN1" || return
    local dev
    dev=$(ns_dev "$NQN1" 1); check "namespace 1 block device: ${dev:-none}" [ -n "$dev" ] || return
    check "mkfs.ext4 $dev" mkfs.ext4 -q -F "$dev" || return
    check "mount" mount "$dev" "$MNT" || return
    check "write 20 MiB random + 40 small files" write_files
    check "sha256sum" eval '(cd "$MNT" && find . -type f ! -path "./lost+found/*" -print0 | xargs -0 sha256sum) > "$TMP/sums"'
    check "sync; umount" eval 'sync && umount "$MNT"'
    check "disconnect" disconnect "$NQN1"
    check "reconnect and mount" mount_ns1 || return
    check "sha256sum -c ($(wc -l < "$TMP/sums") files)" eval '(cd "$MNT" && sha256sum -c --quiet "$TMP/sums")'
    check "umount" umount "$MNT"
    check "disconnect" disconnect "$NQN1"
}

step_restart() {
    # Connected (idle) during the restart: SIGTERM must not hang on a connected host.
    check "connect $NQN1" connect "$NQN1" || return
    check "restart the target (SIGTERM, start again)" host_ctl restart || return
    check "disconnect the old controller" disconnect "$NQN1"
    check "connect again" connect "$NQN1" || return
    local ctrl dev1 dev2 size ids
    ctrl=$(ctrl_of "$NQN1")
    check "serial number unchanged ($SERIAL)" [ "$(cat "/sys/class/nvme/$ctrl/serial")" = "$SERIAL" ]
    dev1=$(ns_dev "$NQN1" 1) && dev2=$(ns_dev "$NQN1" 2)
    check "block devices $dev1 $dev2" nonempty "$dev1" "$dev2" || return
    read -r size ids <<< "$(ns_info "$dev1")"
    check "ns1 identifiers unchanged ($ids)" [ "$ids" = "$IDS1" ]
    read -r size ids <<< "$(ns_info "$dev2")"
    check "ns2 identifiers unchanged ($ids)" [ "$ids" = "$IDS2" ]
    check "mount" mount "$dev1" "$MNT" || return
    check "sha256sum -c after the restart" eval '(cd "$MNT" && sha256sum -c --quiet "$TMP/sums")'
    check "umount" umount "$MNT"
    check "disconnect" disconnect "$NQN1"
}

read_works() { # NQN: connect, read 4 MiB with O_DIRECT from namespace 1, disconnect
    local dev
    connect "$1" && dev=$(ns_dev "$1" 1) &&
        dd if="$dev" of=/dev/null bs=1M count=4 iflag=direct status=none && disconnect "$1"
}

step_garbage() {
    check "4 KiB of random bytes: connection closed" raw_pdus random
    check "CapsuleCmd with hlen 50: C2HTermReq FES 0x01, closed" raw_pdus hlen
    check "H2CData for a transfer that does not exist: C2HTermReq, closed" raw_pdus h2c
    rm -f "$TMP/hold.ready" "$TMP/hold.release"
    raw_pdus hold & local hold=$! i
    for i in $(seq 300); do [ -e "$TMP/hold.ready" ] || ! kill -0 "$hold" 2>/dev/null && break; sleep 0.1; done
    check "connection stalled mid-PDU is open" [ -e "$TMP/hold.ready" ]
    check "meanwhile: connect $NQN2, dd read, disconnect" read_works "$NQN2"
    touch "$TMP/hold.release"
    check "stalled connection: bad header completed, C2HTermReq FES 0x01, closed" wait "$hold"
    check "after the garbage: connect $NQN1, dd read, disconnect" read_works "$NQN1"
    if [ "$TARGET" = weft ]; then
        check "weft did not exit (ctl/events empty)" [ ! -s "$CTL/events" ] || sed 's/^/  host: /' "$CTL/events"
    fi
}

step_kill9() {
    check "connect $NQN1 --reconnect-delay 1" connect "$NQN1" --reconnect-delay 1 || return
    local ctrl dev t0
    ctrl=$(ctrl_of "$NQN1")
    dev=$(ns_dev "$NQN1" 1); check "namespace 1 block device: ${dev:-none}" [ -n "$dev" ] || return
    head -c $((8 * MIB)) /dev/urandom > "$TMP/k9.bin"
    check "dd 8 MiB at 400 MiB, oflag=direct conv=fsync" \
        dd if="$TMP/k9.bin" of="$dev" bs=1M seek=400 oflag=direct conv=fsync status=none || return
    check "kill -9 the target, start again" host_ctl kill9 || return
    t0=$SECONDS
    if check "the host reconnected by itself" wait_live "$ctrl" 90; then
        echo "  $ctrl live again after $((SECONDS - t0)) s"
    else
        disconnect "$NQN1"; connect "$NQN1"; dev=$(ns_dev "$NQN1" 1)
    fi
    check "data read back with iflag=direct is identical" \
        eval 'dd if="$dev" bs=1M skip=400 count=8 iflag=direct status=none | cmp - "$TMP/k9.bin"'
    check "disconnect" disconnect "$NQN1"
}

weft_cli() { # weft's CLI (the repository's release build) against the host's API
    WEFT_API=$ADDR:${WEFT_API_PORT:-9440} WEFT_API_TOKEN=$(cat "$LAB_SHARE/api-token") \
        timeout 300 "$WEFT_DIR/target/release/weft" "$@"
}
OTHER_HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:0badc0de-0000-4000-8000-000000000000
refused_host() { # NQN: connecting as host OTHER_HOSTNQN fails with the target's refusal
    local out
    dmesg -C
    out=$(timeout 60 nvme connect -t tcp -a "$ADDR" -s "$PORT" -n "$1" --hostnqn "$OTHER_HOSTNQN" \
        --hostid "${OTHER_HOSTNQN##*:}" 2>&1) && return 1
    echo "  nvme connect: $out"
    # the kernel logs Connect Invalid Host (SCT 1h, SC 84h) this way
    dmesg | grep "is not allowed, hostnqn: $OTHER_HOSTNQN" | sed 's/^/  kernel: /'
    dmesg | grep -q "is not allowed, hostnqn: $OTHER_HOSTNQN" && ! ctrl_of "$1" >/dev/null
}
not_discovered() { # HOSTNQN NQN...: the discovery log of HOSTNQN lists none of the NQNs
    local host=$1 n; shift
    nvme discover -t tcp -a "$ADDR" -s "$PORT" --hostnqn "$host" -o json > "$TMP/disc-$host.json" || return
    for n; do grep -q "\"$n\"" "$TMP/disc-$host.json" && { echo "  $n listed"; return 1; }; done
    return 0
}
fio_across_kill9() { # DEV CTRL: fio writes 96 MiB at 16 MiB/s with crc32c; weft is killed
    # (SIGKILL) and restarted 2 s in; the host must reconnect and fio's verify pass
    local dev=$1 ctrl=$2 json=$OUT/fio-kill9-${1#/dev/}.json pid t0
    # SIGPIPE ignored: Linux 6.1's nvme-tcp sends a request from the submitting task when
    # its queue is idle (nvme_tcp_queue_request), without MSG_NOSIGNAL, so the target's
    # connection reset at the kill can raise SIGPIPE in fio itself (seen here: fio died
    # of signal 13 although the host reconnected and requeued its I/O).
    dmesg -C
    (trap '' PIPE; exec fio --name=kill9 --filename="$dev" --rw=randwrite --bs=64k --size=$((96 * MIB)) --rate=16m \
        --direct=1 --ioengine=libaio --iodepth=8 --verify=crc32c --do_verify=1 --verify_fatal=1 \
        --verify_state_save=0 --output-format=json --output="$json") &
    pid=$!
    sleep 2
    check "kill -9 weft while fio writes" host_ctl kill9 || { wait "$pid"; return 1; }
    t0=$SECONDS
    check "the host reconnected by itself" wait_live "$ctrl" 90 && echo "  live again after $((SECONDS - t0)) s"
    check "fio finished and every block verified" eval 'wait "$pid" && fio_summary "$json" $((96 * MIB))' ||
        dmesg | grep -i nvme | tail -n 30 | sed 's/^/  kernel: /'
}
wait_size() { # DEV BYTES SECONDS: wait until DEV has BYTES
    local i
    for i in $(seq $(($3 * 5))); do
        [ "$(blockdev --getsize64 "$1")" = "$2" ] && return 0
        sleep 0.2
    done
    return 1
}
grow_under_io() { # DEV: fio writes DEV (crc32c) at 16 MiB/s while the pool gains a device
    local dev=$1 json=$OUT/fio-grow.json pid
    (exec fio --name=grow --filename="$dev" --rw=randwrite --bs=64k --size=$((48 * MIB)) --rate=16m \
        --direct=1 --ioengine=libaio --iodepth=8 --verify=crc32c --do_verify=1 --verify_fatal=1 \
        --verify_state_save=0 --output-format=json --output="$json") &
    pid=$!
    sleep 1
    weft_cli pool add-device fast --device "$WEFT_POOL_DIR/pool2.img" --device-size 1GiB || { wait "$pid"; return 1; }
    wait "$pid" && fio_summary "$json" $((48 * MIB))
}
refused_while_connected() { # volume delete must fail and say why
    local out
    out=$(weft_cli volume delete vol-b 2>&1) && return 1
    echo "  weft: $out"
    [[ $out == *"connected hosts"* ]]
}

step_volumes() {
    if [ "$TARGET" != weft ] || [ -z "${WEFT_POOL_DIR:-}" ]; then echo "  skipped: needs weft and WEFT_POOL_DIR"; return; fi
    check "pool create fast over two 1 GiB files" \
        weft_cli pool create fast --device "$WEFT_POOL_DIR/pool0.img" --device "$WEFT_POOL_DIR/pool1.img" --device-size 1GiB || return
    check "volume create vol-a 256MiB (thin)" weft_cli volume create vol-a --pool fast --size 256MiB || return
    check "volume create vol-b 128MiB (thick, encrypted)" weft_cli volume create vol-b --pool fast --size 128MiB --thick --encrypt || return
    check "vol-b is encrypted (AES-256-XTS)" eval 'weft_cli volume show vol-b | grep -q "^encryption  aes-256-xts, data key wrapped by key-encryption key"'
    weft_cli pool list | sed 's/^/  /'
    check "no host attached: vol-a not in discovery" not_discovered "$HOSTNQN" "$VOLA" "$VOLB"
    check "no host attached: connect vol-a refused" refused_host "$VOLA"
    check "host add guest (this host's NQN), attach vol-a and vol-b" eval 'weft_cli host add guest --nqn "$HOSTNQN" &&
        weft_cli volume attach vol-a --host guest && weft_cli volume attach vol-b --host guest' || return
    check "another host NQN still refused at Connect" refused_host "$VOLA"
    check "another host NQN sees no volume in discovery" not_discovered "$OTHER_HOSTNQN" "$VOLA" "$VOLB"
    check "discovery lists both volumes" eval 'nvme discover -t tcp -a "$ADDR" -s "$PORT" -o json > "$TMP/vol-disc.json" && check_discovery "$TMP/vol-disc.json" "$VOLA" "$VOLB"'
    check "connect vol-a" connect "$VOLA" --reconnect-delay 1 || return
    check "connect vol-b (both connected)" connect "$VOLB" --reconnect-delay 1 || return
    local deva devb devc ctrla
    deva=$(ns_dev "$VOLA" 1) && devb=$(ns_dev "$VOLB" 1)
    check "block devices $deva $devb" nonempty "$deva" "$devb" || return
    check "sizes 256 MiB and 128 MiB" eval '[ "$(blockdev --getsize64 "$deva")" = 268435456 ] && [ "$(blockdev --getsize64 "$devb")" = 134217728 ]'
    check "fio crc32c verify vol-b bs 4k 32 MiB" fio_verify "$devb" 4k 32
    check "fio crc32c verify vol-a bs 128k 64 MiB" fio_verify "$deva" 128k 64
    check "a 2 GiB thick volume does not fit in the pool yet" eval '! weft_cli volume create vol-big --pool fast --size 2GiB --thick'
    check "pool add-device (a third 1 GiB file) while fio writes and verifies vol-a" grow_under_io "$deva"
    check "now it fits: volume create vol-big 2 GiB thick, delete it" eval 'weft_cli volume create vol-big --pool fast --size 2GiB --thick && weft_cli volume delete vol-big'
    weft_cli pool show fast | sed 's/^/  /'
    check "volume delete refused while a host is connected" refused_while_connected
    check "mkfs.ext4 vol-a, mount" eval 'mkfs.ext4 -q -F "$deva" && mount "$deva" "$MNT"' || return
    check "write 20 MiB random + 40 small files" write_files
    check "sha256sum" eval '(cd "$MNT" && find . -type f ! -path "./lost+found/*" -print0 | xargs -0 sha256sum) > "$TMP/vol-sums"'
    check "fsfreeze, snapshot vol-a@s1, thaw" eval 'fsfreeze -f "$MNT"; weft_cli snapshot create vol-a@s1; rc=$?; fsfreeze -u "$MNT"; [ $rc = 0 ]' || return
    check "write after the snapshot" eval 'head -c $((4 * MIB)) /dev/urandom > "$MNT/after-snapshot" && sync'
    check "clone vol-a@s1 as vol-a-copy, attach it" eval 'weft_cli volume clone vol-a@s1 vol-a-copy && weft_cli volume attach vol-a-copy --host guest' || return
    check "connect the clone" connect "$VOLC" || return
    devc=$(ns_dev "$VOLC" 1)
    check "mount the clone read-only at $MNT2 (${devc:-none})" mount -o ro,noload "$devc" "$MNT2" || return
    check "the clone has the snapshot's files" eval '(cd "$MNT2" && sha256sum -c --quiet "$TMP/vol-sums")'
    check "the clone lacks what was written after the snapshot" [ ! -e "$MNT2/after-snapshot" ]
    check "umount and disconnect the clone" eval 'umount "$MNT2" && disconnect "$VOLC"'
    local before after
    before=$(df -B1M --output=size "$MNT" | tail -1)
    check "resize vol-a to 384 MiB while mounted" weft_cli volume resize vol-a --size 384MiB || return
    check "the host sees 384 MiB without reconnecting" wait_size "$deva" 402653184 30
    check "resize2fs online" eval 'resize2fs "$deva" > "$TMP/resize2fs.log" 2>&1 || { cat "$TMP/resize2fs.log"; false; }'
    after=$(df -B1M --output=size "$MNT" | tail -1)
    check "the filesystem grew by about 128 MiB (df: $before -> $after MiB)" [ "$((after - before))" -gt 100 ]
    check "sha256sum including the post-snapshot file" eval '(cd "$MNT" && find . -type f ! -path "./lost+found/*" -print0 | xargs -0 sha256sum) > "$TMP/vol-sums2" && sync'
    ctrla=$(ctrl_of "$VOLA")
    check "restart the target (SIGTERM, start again)" host_ctl restart || return
    check "vol-a reconnected by itself" wait_live "$ctrla" 90
    check "files intact after the restart (caches dropped)" eval 'echo 3 > /proc/sys/vm/drop_caches && (cd "$MNT" && sha256sum -c --quiet "$TMP/vol-sums2")'
    check "vol-a still 384 MiB" [ "$(blockdev --getsize64 "$deva")" = 402653184 ]
    check "umount" umount "$MNT"
    fio_across_kill9 "$devb" "$(ctrl_of "$VOLB")"
    weft_cli volume list | sed 's/^/  /'
    check "disconnect vol-a and vol-b" eval 'disconnect "$VOLA" && disconnect "$VOLB"'
    tiered_volume
}
tiered_volume() { # a pool with a write tier: fio verify through it, and across a kill -9
    local devt
    check "pool create tiered over a 1 GiB file, with a 16 MiB write tier" \
        weft_cli pool create tiered --device "$WEFT_POOL_DIR/tiered0.img" --device-size 1GiB \
        --write-tier "$WEFT_POOL_DIR/tier0.img" --write-tier-size 16MiB || return
    check "volume create vol-t 256MiB, attach" eval 'weft_cli volume create vol-t --pool tiered --size 256MiB &&
        weft_cli volume attach vol-t --host guest' || return
    check "connect vol-t" connect "$VOLT" --reconnect-delay 1 || return
    devt=$(ns_dev "$VOLT" 1)
    check "fio crc32c verify vol-t bs 4k 24 MiB (more than its tier holds: writes wait for destages)" fio_verify "$devt" 4k 24
    fio_across_kill9 "$devt" "$(ctrl_of "$VOLT")"
    weft_cli pool show tiered | sed 's/^/  /'
    check "disconnect vol-t" disconnect "$VOLT"
    compressed_volume
}
compressed_volume() { # compressed and encrypted, on the pool with a tier: fio verify, kill -9
    local devz
    check "volume create vol-z 128MiB (zstd, encrypted), attach" eval 'weft_cli volume create vol-z \
        --pool tiered --size 128MiB --compression zstd --encrypt && weft_cli volume attach vol-z --host guest' || return
    check "connect vol-z" connect "$VOLZ" --reconnect-delay 1 || return
    devz=$(ns_dev "$VOLZ" 1)
    check "vol-z's block device $devz" nonempty "$devz" || return
    check "fio crc32c verify vol-z bs 4k 8 MiB (parts of units: read, changed, placed anew)" fio_verify "$devz" 4k 8
    check "fio crc32c verify vol-z bs 128k 16 MiB" fio_verify "$devz" 128k 16
    # fio's verify data is random: text that compresses, written past it, read back.
    check "32 MiB of text written to vol-z at 64 MiB (O_DIRECT), read back the same" eval '
        (set +o pipefail; yes "weft compresses the lines of this text" | head -c $((32 * MIB))) > "$TMP/text" &&
        dd if="$TMP/text" of="$devz" bs=1M seek=64 oflag=direct status=none &&
        dd if="$devz" of="$TMP/back" bs=1M skip=64 count=32 iflag=direct status=none &&
        cmp "$TMP/text" "$TMP/back"'
    # Compressed when the tier destages them: once writes have paused for half a second.
    check "vol-z stores less than it was given once destaged (ratio at least 1.5)" eval '(for _ in $(seq 120); do
            weft_cli volume show vol-z | tee "$TMP/vol-z" |
                awk "/^compression zstd:/ { gsub(/[(x)]/, \"\", \$NF); ok = (\$NF + 0) >= 1.5 } END { exit !ok }" && exit 0
            sleep 0.5
        done; cat "$TMP/vol-z"; false)'
    fio_across_kill9 "$devz" "$(ctrl_of "$VOLZ")"
    check "disconnect vol-z" disconnect "$VOLZ"
}

step_csi() { # csi-sanity against `weft csi --mode all` in this guest, over the host's API
    local sanity=$WEFT_DIR/.cache/go/bin/csi-sanity pid socket=/tmp/weft-csi.sock
    if [ "$TARGET" != weft ] || [ -z "${WEFT_POOL_DIR:-}" ]; then echo "  skipped: needs weft and WEFT_POOL_DIR"; return; fi
    [ -x "$sanity" ] || { check "csi-sanity built (harness/csi-tools.sh)" false; return; }
    # --dhchap none: this guest's Linux 6.1 has no NVMe in-band authentication
    # (CONFIG_NVME_AUTH unset), so its nodes connect without per-node secrets.
    WEFT_API_TOKEN=$(cat "$LAB_SHARE/api-token") "$WEFT_DIR/target/release/weft" csi --dhchap none \
        --endpoint "unix://$socket" --mode all --api "http://$ADDR:${WEFT_API_PORT:-9440}" \
        --discovery "$ADDR:$PORT" --state-dir "$TMP/csi-state" 2> "$TMP/csi.log" &
    pid=$!
    for _ in $(seq 50); do [ -S "$socket" ] && break; sleep 0.2; done
    check "weft csi serves on $socket" test -S "$socket" || { kill "$pid"; cat "$TMP/csi.log"; return; }
    # Every test of csi-sanity: the controller (volumes, publishing, expansion, listing)
    # and the node (nvme connect through discovery, mkfs.ext4, mounts, stats, expansion).
    check "csi-sanity $("$sanity" --version 2>/dev/null | head -1): every test passes" \
        eval 'timeout 900 "$sanity" --csi.endpoint "$socket" --csi.stagingdir /tmp/csi-staging \
            --csi.mountdir /tmp/csi-mount --csi.testvolumesize $((64 * MIB)) \
            --csi.testvolumeexpandsize $((128 * MIB)) -ginkgo.no-color > "$TMP/csi-sanity.log" 2>&1;
            rc=$?; grep -E "^Ran |Passed|FAIL" "$TMP/csi-sanity.log" | sed "s/^/  /"; [ $rc = 0 ]' ||
        { grep -E "\[FAIL\]|desc = " "$TMP/csi-sanity.log" | sort | uniq -c | head -40 | sed 's/^/  /'; tail -20 "$TMP/csi.log" | sed 's/^/  plugin: /'; }
    check "no subsystem of a CSI volume left connected" eval '! nvme list-subsys 2>/dev/null | grep -q "vol:sanity"'
    kill "$pid"; wait "$pid" 2>/dev/null
}

NODE_A=nqn.2014-08.org.nvmexpress:uuid:0000000a-0000-4000-8000-00000000000a
NODE_B=nqn.2014-08.org.nvmexpress:uuid:0000000b-0000-4000-8000-00000000000b
csi_call() { # SOCKET SERVICE/METHOD JSON: one CSI call, as a kubelet or a sidecar makes it
    "$WEFT_DIR/.cache/go/bin/grpcurl" -plaintext -unix -import-path "$WEFT_DIR/crates/weft-csi/proto" \
        -proto csi.proto -d "$3" "$1" "csi.v1.$2"
}
csi_plugin() { # SOCKET MODE HOSTNQN: `weft csi` in the background as node HOSTNQN; its pid
    WEFT_API_TOKEN=$(cat "$LAB_SHARE/api-token") "$WEFT_DIR/target/release/weft" csi --dhchap none \
        --endpoint "unix://$1" --mode "$2" --api "http://$ADDR:${WEFT_API_PORT:-9440}" \
        --discovery "$ADDR:$PORT" --host-nqn "$3" --state-dir "$TMP/state-${1##*/}" > /dev/null 2>> "$TMP/csi-nodes.log" &
    echo $!
}
stage_and_publish() { # SOCKET NODE STAGE TARGET: ControllerPublish to NODE, then NodeStage and NodePublish
    local context cap='{"mount":{"fs_type":"ext4"},"access_mode":{"mode":"SINGLE_NODE_WRITER"}}'
    context=$(csi_call "$CSI_A" Controller/ControllerPublishVolume \
        '{"volume_id":"db","node_id":"'"$2"'","volume_capability":'"$cap"'}' |
        python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["publishContext"]))') || return
    csi_call "$1" Node/NodeStageVolume '{"volume_id":"db","publish_context":'"$context"',"staging_target_path":"'"$3"'","volume_capability":'"$cap"'}' > /dev/null &&
        csi_call "$1" Node/NodePublishVolume '{"volume_id":"db","staging_target_path":"'"$3"'","target_path":"'"$4"'","volume_capability":'"$cap"'}' > /dev/null
}
DB_FIO=(--name=db --size=16m --rw=randwrite --bs=4k --direct=1 --ioengine=libaio --iodepth=4
    --verify=crc32c --randseed=11 --fsync_on_close=1)
step_csi_failover() { # a database's volume on node A; A dies; node B sees every fsync'd write; A is fenced
    local pid_a pid_b i
    CSI_A=/tmp/weft-csi-a.sock CSI_B=/tmp/weft-csi-b.sock
    if [ "$TARGET" != weft ] || [ -z "${WEFT_POOL_DIR:-}" ]; then echo "  skipped: needs weft and WEFT_POOL_DIR"; return; fi
    pid_a=$(csi_plugin "$CSI_A" all "$NODE_A") pid_b=$(csi_plugin "$CSI_B" node "$NODE_B")
    for _ in $(seq 50); do [ -S "$CSI_A" ] && [ -S "$CSI_B" ] && break; sleep 0.2; done
    check "CreateVolume db (128 MiB)" eval 'csi_call "$CSI_A" Controller/CreateVolume '"'"'{"name":"db","capacity_range":{"required_bytes":134217728},"volume_capabilities":[{"mount":{},"access_mode":{"mode":"SINGLE_NODE_WRITER"}}]}'"'"' > /dev/null' || { kill "$pid_a" "$pid_b"; return; }
    check "node A: published, staged (mkfs.ext4), mounted in its pod" stage_and_publish "$CSI_A" "$NODE_A" /tmp/a-stage /tmp/a-pod || { kill "$pid_a" "$pid_b"; return; }
    check "node A writes 8 files, each fsync'd" eval 'for i in $(seq 8); do dd if=/dev/urandom of=/tmp/a-pod/f$i bs=1M count=1 conv=fsync status=none || exit 1; done'
    (cd /tmp/a-pod && sha256sum f*) > "$TMP/db-sums"
    check "node A: fio writes 16 MiB with crc32c in the pod's filesystem, fsync'd at close" \
        eval 'fio "${DB_FIO[@]}" --directory=/tmp/a-pod --do_verify=1 > "$TMP/db-fio-a.txt" 2>&1 || { tail -3 "$TMP/db-fio-a.txt"; false; }'
    check "node B cannot take the volume while A holds it (FAILED_PRECONDITION)" eval '! stage_and_publish "$CSI_B" "$NODE_B" /tmp/b-stage /tmp/b-pod 2> "$TMP/b-refused" && grep -q FailedPrecondition "$TMP/b-refused"'
    # Node A dies: its kernel and its connections go (here: unmounted lazily and
    # disconnected, without its plugin); the cluster then unpublishes the volume from it,
    # the fence: A's host NQN may no longer connect. (A fenced while still connected loses
    # its queues at once: weft-proto's test of revoked access; one kernel cannot play a
    # dead node and a live one on the same subsystem here.)
    umount -l /tmp/a-pod; umount -l /tmp/a-stage
    timeout 60 nvme disconnect -n nqn.2026-11.io.weft:vol:db > /dev/null 2>&1
    check "ControllerUnpublishVolume from the dead node A (the fence)" \
        eval 'csi_call "$CSI_A" Controller/ControllerUnpublishVolume '"'"'{"volume_id":"db","node_id":"'"$NODE_A"'"}'"'"' > /dev/null'
    check "node A can no longer connect to the volume" eval '! timeout 60 nvme connect -t tcp -a "$ADDR" -s "$PORT" -n nqn.2026-11.io.weft:vol:db --hostnqn "$NODE_A" --hostid "${NODE_A##*:}" > /dev/null 2>&1'
    check "node B: published, staged, mounted in its pod" stage_and_publish "$CSI_B" "$NODE_B" /tmp/b-stage /tmp/b-pod || { kill "$pid_a" "$pid_b"; return; }
    check "node B sees every write A made durable" eval '(cd /tmp/b-pod && sha256sum -c --quiet "$TMP/db-sums")'
    check "node B: fio verifies what A's fio wrote" \
        eval 'fio "${DB_FIO[@]}" --directory=/tmp/b-pod --verify_only > "$TMP/db-fio-b.txt" 2>&1 || { tail -3 "$TMP/db-fio-b.txt"; false; }'
    check "node B: unpublished, unstaged, nothing left connected" eval 'csi_call "$CSI_B" Node/NodeUnpublishVolume '"'"'{"volume_id":"db","target_path":"/tmp/b-pod"}'"'"' > /dev/null &&
        csi_call "$CSI_B" Node/NodeUnstageVolume '"'"'{"volume_id":"db","staging_target_path":"/tmp/b-stage"}'"'"' > /dev/null &&
        ! nvme list-subsys 2>/dev/null | grep -q vol:db && [ ! -e /tmp/b-pod ]'
    check "ControllerUnpublishVolume from B, DeleteVolume" eval 'csi_call "$CSI_A" Controller/ControllerUnpublishVolume '"'"'{"volume_id":"db","node_id":"'"$NODE_B"'"}'"'"' > /dev/null &&
        csi_call "$CSI_A" Controller/DeleteVolume '"'"'{"volume_id":"db"}'"'"' > /dev/null'
    kill "$pid_a" "$pid_b"; wait "$pid_a" "$pid_b" 2>/dev/null
}

VOLR=nqn.2026-11.io.weft:vol:resv
ctrl_as() { # NQN HOSTNQN: the controller device of subsystem NQN connected as HOSTNQN
    local c
    for c in /sys/class/nvme/nvme*; do
        [ "$(cat "$c/subsysnqn" 2>/dev/null)" = "$1" ] && [ "$(cat "$c/hostnqn" 2>/dev/null)" = "$2" ] &&
            { echo "/dev/${c##*/}"; return 0; }
    done
    return 1
}
resv_report() { # CTRL: "rtype=N regctl=M keys=K[*],..." (* holds it) from resv-report --eds
    nvme resv-report "$1" -n 1 --eds -o json | python3 -c '
import json, sys
r = json.load(sys.stdin)
regs = next((v for v in r.values() if isinstance(v, list)), [])
keys = ",".join("%x%s" % (int(x["rkey"]), "*" if int(x["rcsts"]) & 1 else "") for x in regs)
print("rtype=%s regctl=%s keys=%s" % (r["rtype"], r["regctl"], keys))'
}
io_passthru() { # CTRL read|write: 4 KiB at LBA 0 through controller CTRL only (not the multipath head)
    local blocks=$((4096 / RESV_LBA - 1))
    if [ "$2" = write ]; then
        nvme io-passthru "$1" -n 1 --opcode=0x01 --data-len=4096 --write --input-file="$TMP/resv-block" --cdw12=$blocks 2>&1
    else
        nvme io-passthru "$1" -n 1 --opcode=0x02 --data-len=4096 --read --cdw12=$blocks 2>&1
    fi
}
conflict() { # CTRL: a write through CTRL fails with Reservation Conflict
    local out
    out=$(io_passthru "$1" write) && { echo "  write accepted: $out"; return 1; }
    echo "  nvme io-passthru: $(echo "$out" | head -1)"
    echo "$out" | grep -qiE 'reservation[ _]conflict'
}
step_reservations() { # NVMe reservations from two host identities, across a weft restart
    if [ "$TARGET" != weft ] || [ -z "${WEFT_POOL_DIR:-}" ]; then echo "  skipped: needs weft and WEFT_POOL_DIR"; return; fi
    local other_id=${OTHER_HOSTNQN##*:} a b dev r
    # Pool fast is step i's; made here when step i did not run.
    weft_cli pool show fast > /dev/null 2>&1 ||
        check "pool create fast" weft_cli pool create fast --device "$WEFT_POOL_DIR/resv0.img" --device-size 256MiB || return
    weft_cli host show guest > /dev/null 2>&1 ||
        check "host add guest" weft_cli host add guest --nqn "$HOSTNQN" || return
    check "volume resv; host other added; both hosts attached" eval 'weft_cli volume create resv --pool fast --size 64MiB &&
        weft_cli host add other --nqn "$OTHER_HOSTNQN" && weft_cli volume attach resv --host guest &&
        weft_cli volume attach resv --host other' || return
    check "connect as this host (A)" connect "$VOLR" --reconnect-delay 1 || return
    # nvme-cli 2.3 takes a second host identity to one subsystem for a duplicate
    # ("already connected"): the kernel is asked directly.
    check "connect as host other (B)" eval 'printf "transport=tcp,traddr=%s,trsvcid=%s,nqn=%s,hostnqn=%s,hostid=%s,ctrl_loss_tmo=60,reconnect_delay=1" \
        "$ADDR" "$PORT" "$VOLR" "$OTHER_HOSTNQN" "$other_id" > /dev/nvme-fabrics' || return
    a=$(ctrl_as "$VOLR" "$HOSTNQN"); b=$(ctrl_as "$VOLR" "$OTHER_HOSTNQN"); dev=$(ns_dev "$VOLR" 1)
    check "controllers A=$a B=$b, namespace $dev" nonempty "$a" "$b" "$dev" || return
    RESV_LBA=$(blockdev --getss "$dev")
    head -c 4096 /dev/urandom > "$TMP/resv-block"
    check "id-ns RESCAP ffh (every type, persistence through power loss)" eval \
        '[ "$(nvme id-ns "$dev" -o json | python3 -c "import json, sys; print(json.load(sys.stdin)[\"rescap\"])")" = 255 ]'
    check "id-ctrl ONCS has Reservations (bit 5)" eval \
        '[ $(( $(nvme id-ctrl "$a" -o json | python3 -c "import json, sys; print(json.load(sys.stdin)[\"oncs\"])") & 32 )) != 0 ]'
    check "A registers key a1 (cptpl 3)" nvme resv-register "$a" -n 1 --nrkey=0xa1 --rrega=0 --cptpl=3
    check "A acquires Write Exclusive" nvme resv-acquire "$a" -n 1 --crkey=0xa1 --rtype=1 --racqa=0
    check "A writes" eval 'io_passthru "$a" write > /dev/null'
    check "B's write: Reservation Conflict" conflict "$b"
    check "B reads" eval 'io_passthru "$b" read > /dev/null'
    check "B cannot acquire without a registration" eval '! nvme resv-acquire "$b" -n 1 --crkey=0xb2 --rtype=1 --racqa=0 > /dev/null 2>&1'
    check "a report without --eds is refused (Host Identifier Inconsistent Format)" eval '! nvme resv-report "$a" -n 1 > /dev/null 2>&1'
    r=$(resv_report "$a"); echo "  report: $r"
    check "report: Write Exclusive, held by key a1" [ "$r" = "rtype=1 regctl=1 keys=a1*" ]
    check "restart weft (SIGTERM, start again)" host_ctl restart || return
    check "A and B reconnected by themselves" eval 'wait_live "${a#/dev/}" 90 && wait_live "${b#/dev/}" 90'
    r=$(resv_report "$b"); echo "  report after the restart: $r"
    check "the same reservation after the restart" [ "$r" = "rtype=1 regctl=1 keys=a1*" ]
    check "B's write still refused" conflict "$b"
    check "B registers b2 and preempts A (Write Exclusive Registrants Only, preempt and abort)" eval \
        'nvme resv-register "$b" -n 1 --nrkey=0xb2 --rrega=0 --cptpl=3 && nvme resv-acquire "$b" -n 1 --crkey=0xb2 --prkey=0xa1 --rtype=3 --racqa=2'
    r=$(resv_report "$b"); echo "  report: $r"
    check "report: B holds it, A is unregistered" [ "$r" = "rtype=3 regctl=1 keys=b2*" ]
    check "A's write: Reservation Conflict (fenced)" conflict "$a"
    check "B writes" eval 'io_passthru "$b" write > /dev/null'
    check "B clears every registration" nvme resv-release "$b" -n 1 --crkey=0xb2 --rrela=1
    check "A writes again" eval 'io_passthru "$a" write > /dev/null'
    check "disconnect both, delete the volume" eval 'disconnect "$VOLR" && weft_cli volume delete resv > /dev/null'
}

echo "weft kernel-interop: target $TARGET at $ADDR:$PORT, kernel $(uname -r), $(nvme version), $(fio --version)"
# A subset of the steps (INTEROP_STEPS) still needs the host driver step a loads.
[ -z "${INTEROP_STEPS:-}" ] || modprobe nvme-tcp
run_step a-discovery step_discovery
run_step b-connect-identify step_identify
run_step c-fio-verify step_fio
run_step d-digests step_digests
run_step e-ext4-persistence step_ext4
run_step f-restart step_restart
run_step g-malformed-pdus step_garbage
run_step h-kill9-durability step_kill9
run_step i-volumes step_volumes
run_step j-csi step_csi
run_step k-csi-failover step_csi_failover
run_step l-reservations step_reservations

echo; echo "=== summary (target $TARGET, ${SECONDS}s)"
printf '%s\n' "${RESULTS[@]}"
if printf '%s\n' "${RESULTS[@]}" | grep -q '^FAIL'; then echo "interop: FAIL"; exit 1; fi
echo "interop: PASS"
