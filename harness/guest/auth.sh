#!/bin/bash
# In the Linux 6.12 guest (Debian trixie: CONFIG_NVME_HOST_AUTH, CONFIG_NVME_TCP_TLS): the
# kernel's NVMe/TCP host against weft (harness/auth-interop.sh) with DH-HMAC-CHAP:
# bidirectional and host-only connects, a write read back through each; a wrong secret and
# no secret refused. Secrets in $LAB_SHARE/secrets (host, controller, wrong). Then a volume
# whose host weft gave the ffdhe2048 group: the kernel reports that group. Then TLS 1.3
# with the PSK in $LAB_SHARE/tls-psk (tlshd does the handshake): the key inserted as
# nvme-cli does, a connect with --tls, a write read back; TLS required in the discovery
# log; refused in the clear. Prints "auth: PASS" when every check passed.
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
[ "$FAILS" = 0 ] && echo "auth: PASS" || echo "auth: $FAILS FAILED"
