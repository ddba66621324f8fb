#!/bin/bash
# DH-HMAC-CHAP and TLS interop: the Linux 6.12 NVMe/TCP host (Debian trixie guest, nvme-cli
# 2.13, ktls-utils' tlshd: in-band authentication and TLS built in, which Debian 12's 6.1
# lacks) against a weft node on this machine. A volume is attached to the guest's host NQN
# with a host and a controller secret; the guest (harness/guest/auth.sh) connects
# bidirectionally and host-only, writes and reads back through each, and is refused with a
# wrong secret and with none. Another volume, for a host given the ffdhe2048 group (`weft
# host add --dhchap-group`), is connected bidirectionally: the kernel reports that group. A
# further volume is attached to a second host NQN made with
# `weft host add --tls`: the guest inserts the PSK weft printed, connects with --tls,
# writes and reads back, finds TLS required in its discovery log, and is refused in the
# clear. Last, `weft csi` runs in the guest as a Kubernetes node's controller and node
# plugin (the CSI token; per-node DH-HMAC-CHAP secrets, its default): the volume it
# creates and stages is connected with the secrets made for that node, and the node's NQN
# alone is refused.
# Usage: harness/auth-interop.sh [--weft BIN]   (as root; the trixie image is built once,
# harness/vm/build-image.sh with LAB_SUITE=trixie)
set -euo pipefail
cd "$(dirname "$0")/.."
WEFT=target/release/weft
while [ $# -gt 0 ]; do
    case "$1" in
        --weft) WEFT=$2; shift 2 ;;
        *) echo "usage: $0 [--weft BIN]" >&2; exit 2 ;;
    esac
done
die() { echo "auth-interop: $*" >&2; exit 2; }
[ "$(id -u)" = 0 ] || die "run as root (qemu)"
[ -x "$WEFT" ] || die "no weft binary at $WEFT (cargo build --release, or --weft PATH)"
WEFT=$(realpath "$WEFT")
IMAGE=$(LAB_SUITE=trixie harness/vm/build-image.sh)
echo "auth-interop: guest image $IMAGE (kernel $(cat "$IMAGE/kernel-version"))"
WORK=$PWD/.cache/auth-interop
SHARE=$WORK/share
PORT=14470 API_PORT=14479
NQN=nqn.2026-11.io.weft:vol:authv
HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000a0a01
FFDHE_NQN=nqn.2026-11.io.weft:vol:ffdhev
FFDHE_HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000a0a03
TLS_NQN=nqn.2026-11.io.weft:vol:tlsv
TLS_HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000a0a02
CSI_HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000a0a04
rm -rf "$WORK"
mkdir -p "$SHARE"
# Three DH-HMAC-CHAP secrets (32 random bytes, their CRC-32, base64: `nvme gen-dhchap-key`'s
# form): the host's, the controller's, and a wrong one.
python3 - "$SHARE/secrets" <<'PY'
import base64, os, struct, sys, zlib
def secret():
    key = os.urandom(32)
    return "DHHC-1:01:" + base64.b64encode(key + struct.pack("<I", zlib.crc32(key))).decode() + ":"
open(sys.argv[1], "w").write("\n".join(secret() for _ in range(3)) + "\n")
PY
"$WEFT" serve --data-dir "$WORK/node" --listen "127.0.0.1:$PORT" --api-listen "127.0.0.1:$API_PORT" \
    > "$WORK/node.out" 2> "$WORK/node.log" &
PID=$!
trap 'kill -TERM $PID 2>/dev/null; wait 2>/dev/null' EXIT
for _ in $(seq 100); do grep -q "nvme discover" "$WORK/node.out" 2>/dev/null && break; sleep 0.1; done
cli() { WEFT_API=127.0.0.1:$API_PORT WEFT_API_TOKEN=$(cat "$WORK/node/api-token") "$WEFT" "$@"; }
cli pool create p --device "$WORK/node/p.img" --device-size 256MiB > /dev/null
cli volume create authv --size 64MiB --pool p > /dev/null
cli host add guest --nqn "$HOSTNQN" --dhchap-secret "$(sed -n 1p "$SHARE/secrets")" \
    --dhchap-ctrl-secret "$(sed -n 2p "$SHARE/secrets")" > /dev/null
cli volume attach authv --host guest > /dev/null
cli volume create ffdhev --size 64MiB --pool p > /dev/null
cli host add ffdheguest --nqn "$FFDHE_HOSTNQN" --dhchap-secret "$(sed -n 1p "$SHARE/secrets")" \
    --dhchap-ctrl-secret "$(sed -n 2p "$SHARE/secrets")" --dhchap-group ffdhe2048 > /dev/null
cli host list | grep -q "ffdheguest .* bidirectional ffdhe2048" || die "weft host list does not show ffdheguest's group"
cli volume attach ffdhev --host ffdheguest > /dev/null
cli volume create tlsv --size 64MiB --pool p > /dev/null
# The PSK `host add --tls` makes and shows once, as the operator copies it.
cli host add tlsguest --nqn "$TLS_HOSTNQN" --tls > "$WORK/tls-host.out"
grep -o 'NVMeTLSkey-1:01:[^ ]*:' "$WORK/tls-host.out" | head -1 > "$SHARE/tls-psk"
[ -s "$SHARE/tls-psk" ] || die "weft host add --tls printed no PSK: $(cat "$WORK/tls-host.out")"
cli host list | grep -q "tlsguest .* yes" || die "weft host list does not show tlsguest's TLS"
cli volume attach tlsv --host tlsguest > /dev/null
# The CSI plugin in the guest: this binary and the token a CSI controller is given.
cp "$WEFT" "$SHARE/weft"
cp "$WORK/node/api-token.csi" "$SHARE/api-token.csi"
CSI_TOOLS=$(harness/csi-tools.sh)
[ "$CSI_TOOLS" = "$PWD/.cache/go/bin" ] || die "grpcurl is not where the guest looks for it ($CSI_TOOLS)"
set +e
LAB_IMAGE_DIR=$IMAGE harness/vm/vm-run.sh -n slirp -s "$SHARE" -c 2 -t 600 -e "WEFT_PORT=$PORT" \
    -e "WEFT_NQN=$NQN" -e "WEFT_HOSTNQN=$HOSTNQN" -e "WEFT_TLS_NQN=$TLS_NQN" \
    -e "WEFT_FFDHE_NQN=$FFDHE_NQN" -e "WEFT_FFDHE_HOSTNQN=$FFDHE_HOSTNQN" \
    -e "WEFT_TLS_HOSTNQN=$TLS_HOSTNQN" -e "WEFT_CSI_HOSTNQN=$CSI_HOSTNQN" -e "WEFT_API_PORT=$API_PORT" harness/guest/auth.sh 2>&1 | tee "$WORK/run.log"
rc=${PIPESTATUS[0]}
set -e
if grep -qE "panicked at|fatal runtime error" "$WORK/node.log"; then echo "auth-interop: weft panicked"; rc=1; fi
[ "$rc" = 0 ] && grep -q '^auth: PASS' "$SHARE/.lab/console.log" || { echo "auth-interop: FAIL (guest exit $rc; $WORK)"; exit 1; }
echo "auth-interop: PASS"
