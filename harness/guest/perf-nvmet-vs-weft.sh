#!/bin/bash
# Guest script: the guest kernel's nvmet-tcp target vs weft running in the same guest, both
# on guest loopback 127.0.0.1 and backed by RAM of the same size (nvmet: brd /dev/ram0;
# weft: a `ram` namespace), measured with the same fio jobs from the kernel NVMe/TCP host:
# 4k randread QD1 (total latency lat_ns: mean, p50, p99) and 4k randread QD32 (IOPS),
# after a write pass over the whole namespace. Under TCG only the weft/nvmet ratios mean
# anything. Prints a table and writes $LAB_SHARE/perf-nvmet-vs-weft.json (raw fio JSON in
# $LAB_SHARE/perf/). Without a weft binary only the nvmet half runs.
#
# Run from the host: harness/perf-guest.sh (or harness/vm/vm-run.sh -n none -c 2
# harness/guest/perf-nvmet-vs-weft.sh [RUNTIME_S]).
# ARGS: [RUNTIME_S] per fio job (default 10)
# Env:  WEFT_BIN (default /mnt/weft/target/release/weft), PERF_SIZE_MIB (default 256)
set -euo pipefail
RUNTIME=${1:-10}
SIZE_MIB=${PERF_SIZE_MIB:-256}
WEFT_BIN=${WEFT_BIN:-/mnt/weft/target/release/weft}
NQN_NVMET=nqn.2026-11.io.weft:perf-nvmet
NQN_WEFT=nqn.2026-11.io.weft:perf-weft
PORT_NVMET=4420 PORT_WEFT=4421
OUT=$LAB_SHARE/perf
JSON=$LAB_SHARE/perf-nvmet-vs-weft.json
NVMET=/sys/kernel/config/nvmet
WEFT_PID=''
rm -rf "$OUT" "$JSON"
mkdir -p "$OUT"

step() { echo; echo "=== $*"; }
ctrl_of() { # NQN: name of a connected controller of subsystem NQN
    local c
    for c in /sys/class/nvme/nvme*; do
        [ "$(cat "$c/subsysnqn" 2>/dev/null)" = "$1" ] && { echo "${c##*/}"; return 0; }
    done
    return 1
}
ns_dev() { # NQN: block device of namespace 1 of NQN (waits up to 20 s)
    local n i
    for i in $(seq 100); do
        for n in /sys/class/nvme-subsystem/nvme-subsys*/nvme*n1 /sys/class/nvme/nvme*/nvme*n1; do
            [ -b "/dev/${n##*/}" ] && [ "$(cat "$(dirname "$n")/subsysnqn" 2>/dev/null)" = "$1" ] &&
                { echo "/dev/${n##*/}"; return 0; }
        done
        sleep 0.2
    done
    echo "no block device for $1" >&2
    return 1
}
nvmet_down() {
    [ -d "$NVMET/ports/1" ] || return 0
    rm -f "$NVMET/ports/1/subsystems/$NQN_NVMET"
    rmdir "$NVMET/ports/1"
    echo 0 > "$NVMET/subsystems/$NQN_NVMET/namespaces/1/enable"
    rmdir "$NVMET/subsystems/$NQN_NVMET/namespaces/1" "$NVMET/subsystems/$NQN_NVMET"
}
weft_stop() { # SIGTERM, then wait for the exit (SIGKILL after 30 s); fails unless exit status 0
    [ -n "$WEFT_PID" ] || return 0
    local pid=$WEFT_PID i rc=''
    WEFT_PID=''
    kill -TERM "$pid"
    for i in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
        kill -KILL "$pid"; wait "$pid" || true
        echo "weft did not exit within 30 s of SIGTERM (killed)"; return 1
    fi
    wait "$pid" || rc=$?
    echo "weft exited with status ${rc:-0} on SIGTERM"
    [ -z "$rc" ]
}
cleanup() {
    local nqn
    for nqn in "$NQN_NVMET" "$NQN_WEFT"; do
        if ctrl_of "$nqn" >/dev/null; then nvme disconnect -n "$nqn" >/dev/null || true; fi
    done
    nvmet_down || true
    weft_stop || true
    if [ -d /sys/module/brd ]; then rmmod brd || true; fi
}
trap cleanup EXIT

run_fio() { # LABEL DEV: prefill, QD1 and QD32 4k randread; JSON in $OUT/LABEL-*.json
    local label=$1 dev=$2
    local common=(--filename="$dev" --direct=1 --ioengine=libaio --bs=4k --group_reporting --output-format=json)
    echo "prefill $dev ($SIZE_MIB MiB, 1M writes)"
    fio --name=prefill "${common[@]}" --rw=write --bs=1M --iodepth=8 --output="$OUT/$label-prefill.json"
    echo "4k randread QD1, ${RUNTIME}s"
    fio --name=randread-qd1 "${common[@]}" --rw=randread --iodepth=1 --lat_percentiles=1 \
        --time_based --runtime="$RUNTIME" --output="$OUT/$label-qd1.json"
    echo "4k randread QD32, ${RUNTIME}s"
    fio --name=randread-qd32 "${common[@]}" --rw=randread --iodepth=32 --lat_percentiles=1 \
        --time_based --runtime="$RUNTIME" --output="$OUT/$label-qd32.json"
}
connect() { # NQN PORT: connect over loopback, print the namespace's block device
    nvme connect -t tcp -a 127.0.0.1 -s "$2" -n "$1" --nr-io-queues 2 >/dev/null && ns_dev "$1"
}

step "modules"
# With THP on, 1M writes over guest loopback hit a 6.1 kernel BUG (mm/usercopy.c:101, "Kernel
# memory exposure attempt ... from page alloc") in the receiver's copy (seen in nvmet-tcp; the
# same check guards weft's recv): the skb fragment is most likely fio's THP-backed buffer.
echo never > /sys/kernel/mm/transparent_hugepage/enabled
modprobe nvme-tcp
modprobe nvmet
modprobe nvmet-tcp
modprobe brd rd_nr=1 rd_size=$((SIZE_MIB * 1024)) max_part=0

step "nvmet-tcp: $NQN_NVMET, ns 1 = /dev/ram0 ($SIZE_MIB MiB), 127.0.0.1:$PORT_NVMET"
S=$NVMET/subsystems/$NQN_NVMET
mkdir "$S"
echo 1 > "$S/attr_allow_any_host"
mkdir "$S/namespaces/1"
echo -n /dev/ram0 > "$S/namespaces/1/device_path"
echo 1 > "$S/namespaces/1/enable"
mkdir "$NVMET/ports/1"
echo tcp > "$NVMET/ports/1/addr_trtype"
echo ipv4 > "$NVMET/ports/1/addr_adrfam"
echo 127.0.0.1 > "$NVMET/ports/1/addr_traddr"
echo "$PORT_NVMET" > "$NVMET/ports/1/addr_trsvcid"
ln -s "$S" "$NVMET/ports/1/subsystems/$NQN_NVMET"
DEV=$(connect "$NQN_NVMET" "$PORT_NVMET")
echo "connected: $DEV"
run_fio nvmet "$DEV"
nvme disconnect -n "$NQN_NVMET"
nvmet_down
rmmod brd

HAVE_WEFT=0
if [ -x "$WEFT_BIN" ]; then
    HAVE_WEFT=1
    step "weft: $NQN_WEFT, ns 1 = ram $SIZE_MIB MiB, 127.0.0.1:$PORT_WEFT"
    mkdir -p /tmp/weft-perf/data
    cp "$WEFT_BIN" /tmp/weft-perf/weft   # run from tmpfs, not from the 9p share
    cat > /tmp/weft-perf/weft.toml <<EOF
data_dir = "/tmp/weft-perf/data"
listen = ["127.0.0.1:$PORT_WEFT"]
[[subsystem]]
nqn = "$NQN_WEFT"
[[subsystem.namespace]]
nsid = 1
backend = "ram"
size = "${SIZE_MIB}MiB"
EOF
    /tmp/weft-perf/weft serve --config /tmp/weft-perf/weft.toml > "$LAB_SHARE/perf-weft.log" 2>&1 &
    WEFT_PID=$!
    for i in $(seq 300); do
        (exec 3<>"/dev/tcp/127.0.0.1/$PORT_WEFT") 2>/dev/null && break
        kill -0 "$WEFT_PID" 2>/dev/null || { echo "weft exited at start, see perf-weft.log:"; tail "$LAB_SHARE/perf-weft.log"; exit 1; }
        [ "$i" -lt 300 ] || { echo "weft: port $PORT_WEFT not up after 30 s"; exit 1; }
        sleep 0.1
    done
    echo "weft pid $WEFT_PID listening after $((i / 10)).$((i % 10)) s"
    DEV=$(connect "$NQN_WEFT" "$PORT_WEFT")
    echo "connected: $DEV"
    run_fio weft "$DEV"
    nvme disconnect -n "$NQN_WEFT"
    weft_stop
else
    step "weft: no binary at $WEFT_BIN: only the nvmet half was measured"
fi

step "results (runtime ${RUNTIME}s per job, $SIZE_MIB MiB RAM-backed namespace, guest loopback)"
python3 - "$OUT" "$JSON" "$RUNTIME" "$SIZE_MIB" "$HAVE_WEFT" <<'EOF'
import json, os, sys
out, dest, runtime, size_mib, have_weft = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == '1'

def job(label, name):
    txt = open(os.path.join(out, f'{label}-{name}.json')).read()
    j = json.loads(txt[txt.index('{'):])['jobs'][0]
    if j['error']:
        sys.exit(f'{label} {name}: fio error {j["error"]}')
    return j['read']

def stats(label):
    qd1, qd32 = job(label, 'qd1'), job(label, 'qd32')
    pct = qd1['lat_ns']['percentile']
    return {'qd1_lat_mean_us': round(qd1['lat_ns']['mean'] / 1000, 1),
            'qd1_lat_p50_us': round(pct['50.000000'] / 1000, 1),
            'qd1_lat_p99_us': round(pct['99.000000'] / 1000, 1),
            'qd1_iops': round(qd1['iops']),
            'qd32_iops': round(qd32['iops']),
            'qd32_lat_mean_us': round(qd32['lat_ns']['mean'] / 1000, 1)}

res = {'runtime_s': runtime, 'size_mib': size_mib, 'nvmet': stats('nvmet'),
       'weft': stats('weft') if have_weft else None}
if have_weft:
    # < 1 is better for weft on latencies, > 1 is better on IOPS
    res['ratio_weft_over_nvmet'] = {k: round(res['weft'][k] / res['nvmet'][k], 3)
                                    for k in res['nvmet'] if res['nvmet'][k]}
keys = list(res['nvmet'])
print(f"{'':8}" + ''.join(f'{k:>18}' for k in keys))
for label in ('nvmet', 'weft'):
    if res[label]:
        print(f'{label:8}' + ''.join(f'{res[label][k]:>18}' for k in keys))
if have_weft:
    print(f"{'weft/nv':8}" + ''.join(f"{res['ratio_weft_over_nvmet'].get(k, '-'):>18}" for k in keys))
else:
    print('weft: not measured (no binary)')
json.dump(res, open(dest, 'w'), indent=1)
print(f'JSON: {dest}')
EOF
