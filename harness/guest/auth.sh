#!/bin/bash
# In the Linux 6.12 guest (Debian trixie: CONFIG_NVME_HOST_AUTH, CONFIG_NVME_TCP_TLS): the
# kernel's NVMe/TCP host against weft (harness/auth-interop.sh) with DH-HMAC-CHAP:
# bidirectional and host-only connects, a write read back through each; a wrong secret and
# no secret refused. Secrets in $LAB_SHARE/secrets (host, controller, wrong). Then a volume
# whose host weft gave the ffdhe2048 group: the kernel reports that group. Then TLS 1.3
# with the PSK in $LAB_SHARE/tls-psk (tlshd does the handshake): the key inserted as
# nvme-cli does, a connect with --tls, a write read back; TLS required in the discovery
# log; refused in the clear. Then `weft csi` as one Kubernetes node: a volume created,
# published, staged and mounted with the per-node secrets its controller made, a file
# written read back; the node's NQN alone, and another host's secret, refused. Prints
# "auth: PASS" when every check passed.
set -u
ADDR=${LAB_HOST_IP:?needs slirp} PORT=${WEFT_PORT:?} NQN=${WEFT_NQN:?} HOSTNQN=${WEFT_HOSTNQN:?}
TLS_NQN=${WEFT_TLS_NQN:?} TLS_HOSTNQN=${WEFT_TLS_HOSTNQN:?} PSK=$(cat "$LAB_SHARE/tls-psk")
FFDHE_NQN=${WEFT_FFDHE_NQN:?} FFDHE_HOSTNQN=${WEFT_FFDHE_HOSTNQN:?}
HOST_SECRET=$(sed -n 1p "$LAB_SHARE/secrets") CTRL_SECRET=$(sed -n 2p "$LAB_SHARE/secrets")
WRONG=$(sed -n 3p "$LAB_SHARE/secrets")
FAILS=0
ok() { echo "  ok: $*"; }
fail() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }
echo "kernel $(uname -r), $(nvme version | head -1)"
modprobe nvme-tcp
# The guide's way to make a host's secret (docs/guide/03-hosts-and-security.md).
made=$(nvme gen-dhchap-key --nqn "$HOSTNQN" 2>&1)
[[ "$made" == DHHC-1:0?:*: ]] && ok "nvme gen-dhchap-key makes a DHHC-1 secret" \
    || fail "nvme gen-dhchap-key printed: $made"
connect() { timeout 60 nvme connect -t tcp -a "$ADDR" -s "$PORT" -n "$NQN" --hostnqn "$HOSTNQN" "$@"; }
device() { # the namespace of NQN, once it appears
    for _ in $(seq 50); do
        for d in /sys/class/nvme/nvme*; do
            [ "$(cat "$d/subsysnqn" 2>/dev/null)" = "$NQN" ] || continue
            for n in /dev/"${d##*/}"n*; do [ -b "$n" ] && { echo "$n"; return 0; }; done
        done
        sleep 0.2
    done
    return 1
}
write_read() { # LABEL: 4 MiB written (O_DIRECT) and read back equal
    local dev
    dev=$(device) || { fail "$1: no namespace appeared"; return; }
    dd if=/dev/urandom of=/tmp/data bs=1M count=4 status=none
    if dd if=/tmp/data of="$dev" bs=1M oflag=direct status=none &&
        dd if="$dev" of=/tmp/back bs=1M count=4 iflag=direct status=none && cmp -s /tmp/data /tmp/back; then
        ok "$1: 4 MiB written through $dev read back equal"
    else
        fail "$1: data through $dev"
    fi
}
disconnect() { nvme disconnect -n "$NQN" >/dev/null 2>&1; sleep 0.5; }

echo "=== bidirectional: the host and the controller each prove their secret"
connect --dhchap-secret "$HOST_SECRET" --dhchap-ctrl-secret "$CTRL_SECRET" && ok "connected" || fail "bidirectional connect"
write_read bidirectional
disconnect
echo "=== host only"
connect --dhchap-secret "$HOST_SECRET" && ok "connected" || fail "host-only connect"
write_read "host only"
disconnect
echo "=== refused: a wrong secret, no secret"
connect --dhchap-secret "$WRONG" 2>/dev/null && fail "a wrong secret connected" || ok "a wrong secret is refused"
disconnect
connect 2>/dev/null && fail "no secret connected" || ok "no secret is refused"
disconnect

echo "=== DH-HMAC-CHAP with the ffdhe2048 group weft host add --dhchap-group gave the host"
(NQN=$FFDHE_NQN HOSTNQN=$FFDHE_HOSTNQN FAILS=0
dmesg -C
connect --dhchap-secret "$HOST_SECRET" --dhchap-ctrl-secret "$CTRL_SECRET" && ok "connected" || fail "FFDHE connect"
said=$(dmesg | grep -o "authenticated with hash .*" | head -1)
[[ "$said" == *"dhgroup ffdhe2048"* ]] && ok "the kernel: $said" || fail "the kernel did not use ffdhe2048: $(dmesg | tail -5)"
write_read FFDHE
disconnect
exit "$FAILS") || FAILS=$((FAILS + $?))

echo "=== TLS 1.3 with the PSK weft host add --tls made"
# tlshd does TLS handshakes for the kernel; the .nvme keyring comes with nvme-tcp.
tlshd > /tmp/tlshd.log 2>&1 &
sleep 1
NQN=$TLS_NQN HOSTNQN=$TLS_HOSTNQN
if nvme check-tls-key --keydata="$PSK" --hostnqn="$TLS_HOSTNQN" --subsysnqn="$TLS_NQN" --insert; then
    ok "PSK inserted ($(keyctl show %:.nvme 2>/dev/null | grep -c psk) key(s) in .nvme)"
else
    fail "nvme check-tls-key --insert"
fi
connect --tls && ok "connected over TLS" || fail "TLS connect ($(tail -3 /tmp/tlshd.log))"
write_read TLS
echo "  addresses: $(cat /sys/class/nvme/nvme*/address 2>/dev/null | tr '\n' ' ')"
disconnect
echo "=== TLS required in the discovery log, refused in the clear"
entry=$(nvme discover -t tcp -a "$ADDR" -s "$PORT" --hostnqn "$TLS_HOSTNQN" 2>&1 | grep -B3 -A12 "subnqn: *$TLS_NQN")
echo "$entry" | grep -qi "treq:.*required" && echo "$entry" | grep -qi "sectype: *tls13" \
    && ok "discovery: treq required, sectype tls1.3" || fail "discovery entry: $entry"
connect 2>/dev/null && fail "the TLS host connected in the clear" || ok "the TLS host is refused in the clear"
disconnect

echo "=== CSI: the node plugin connects with the DH-HMAC-CHAP secrets its controller made for this node"
# `weft csi --mode all` (controller and node, as one Kubernetes node runs them), the
# controller with the node's CSI token, the per-node secrets its default; the calls a
# kubelet and the attacher make, through grpcurl.
CSI=/tmp/weft-csi.sock CSI_HOSTNQN=${WEFT_CSI_HOSTNQN:?} CAP='{"mount":{"fs_type":"ext4"},"access_mode":{"mode":"SINGLE_NODE_WRITER"}}'
csi_call() { # SERVICE/METHOD JSON
    "$WEFT_DIR/.cache/go/bin/grpcurl" -plaintext -unix -import-path "$WEFT_DIR/crates/weft-csi/proto" \
        -proto csi.proto -d "$2" "$CSI" "csi.v1.$1"
}
WEFT_API_TOKEN=$(cat "$LAB_SHARE/api-token.csi") "$LAB_SHARE/weft" csi --endpoint "unix://$CSI" --mode all \
    --api "http://$ADDR:${WEFT_API_PORT:?}" --discovery "$ADDR:$PORT" --host-nqn "$CSI_HOSTNQN" \
    --state-dir /tmp/csi-state 2> /tmp/csi.log &
CSI_PID=$!
for _ in $(seq 50); do [ -S "$CSI" ] && break; sleep 0.2; done
(NQN=nqn.2026-11.io.weft:vol:csidb HOSTNQN=$CSI_HOSTNQN FAILS=0
csi_call Controller/CreateVolume '{"name":"csidb","capacity_range":{"required_bytes":67108864},"volume_capabilities":[{"mount":{},"access_mode":{"mode":"SINGLE_NODE_WRITER"}}]}' > /dev/null \
    && ok "CreateVolume csidb" || { fail "CreateVolume: $(tail -3 /tmp/csi.log)"; exit "$FAILS"; }
context=$(csi_call Controller/ControllerPublishVolume '{"volume_id":"csidb","node_id":"'"$CSI_HOSTNQN"'","volume_capability":'"$CAP"'}' |
    python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["publishContext"]))')
[[ "$context" == *'"dhchapSecret": "DHHC-1:'* && "$context" == *'"dhchapCtrlSecret": "DHHC-1:'* ]] \
    && ok "ControllerPublishVolume: the publish context carries this node's host and controller secrets" \
    || fail "publish context without secrets: $context"
dmesg -C
csi_call Node/NodeStageVolume '{"volume_id":"csidb","publish_context":'"$context"',"staging_target_path":"/tmp/csi-stage","volume_capability":'"$CAP"'}' > /dev/null \
    && csi_call Node/NodePublishVolume '{"volume_id":"csidb","staging_target_path":"/tmp/csi-stage","target_path":"/tmp/csi-pod","volume_capability":'"$CAP"'}' > /dev/null \
    && ok "NodeStageVolume (nvme connect, mkfs.ext4) and NodePublishVolume" || fail "stage and publish: $(tail -3 /tmp/csi.log)"
said=$(dmesg | grep -o "authenticated with hash .*" | head -1)
[ -n "$said" ] && ok "the kernel authenticated the volume's controller: $said" || fail "no DH-HMAC-CHAP in the kernel log: $(dmesg | tail -5)"
head -c 1048576 /dev/urandom > /tmp/csi-data
cp /tmp/csi-data /tmp/csi-pod/f && sync && echo 3 > /proc/sys/vm/drop_caches && cmp -s /tmp/csi-data /tmp/csi-pod/f \
    && ok "a file written in the pod's mount reads back equal" || fail "the pod's file"
csi_call Node/NodeUnpublishVolume '{"volume_id":"csidb","target_path":"/tmp/csi-pod"}' > /dev/null &&
    csi_call Node/NodeUnstageVolume '{"volume_id":"csidb","staging_target_path":"/tmp/csi-stage"}' > /dev/null \
    && ok "NodeUnpublishVolume, NodeUnstageVolume" || fail "unpublish and unstage: $(tail -3 /tmp/csi.log)"
# The attack: the node's NQN is public (its CSINode object); presenting it opens nothing.
connect 2>/dev/null && fail "the node's NQN alone connected to its volume" || ok "the node's NQN alone is refused (the volume is still published to it)"
disconnect
connect --dhchap-secret "$HOST_SECRET" 2>/dev/null && fail "another host's secret connected" || ok "another host's secret is refused"
disconnect
csi_call Controller/ControllerUnpublishVolume '{"volume_id":"csidb","node_id":"'"$CSI_HOSTNQN"'"}' > /dev/null &&
    csi_call Controller/DeleteVolume '{"volume_id":"csidb"}' > /dev/null && ok "ControllerUnpublishVolume, DeleteVolume" || fail "unpublish and delete"
exit "$FAILS") || FAILS=$((FAILS + $?))
kill "$CSI_PID"; wait "$CSI_PID" 2>/dev/null

[ "$FAILS" = 0 ] && echo "auth: PASS" || echo "auth: $FAILS FAILED"
