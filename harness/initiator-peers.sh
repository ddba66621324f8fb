#!/bin/bash
# weft's user-space initiator against the Linux kernel's nvmet-tcp target (an independent
# peer) inside the test guest: boots the guest without network and runs
# harness/guest/initiator-vs-nvmet.sh (peer_check, weft bench --verify and Debian's fio with
# libweft_fio.so; see there).
# Usage (as root): harness/initiator-peers.sh   (needs target/release/weft and
# target/release/examples/peer_check: cargo build --release -p weft -p weft-fio -p weft-initiator --examples)
# About 1-2 minutes under TCG. Console in .cache/initiator/share/.lab/console.log.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "initiator-peers: run as root" >&2; exit 2; }
for bin in target/release/weft target/release/examples/peer_check target/release/libweft_fio.so; do
    [ -x "$bin" ] || { echo "initiator-peers: $bin missing: cargo build --release -p weft -p weft-initiator --examples" >&2; exit 2; }
done
echo "initiator-peers: guest image $(harness/vm/build-image.sh)"
mkdir -p .cache/initiator
exec 9> .cache/initiator.lock
flock -n 9 || { echo "initiator-peers: another run is active (.cache/initiator.lock)" >&2; exit 2; }
SHARE=.cache/initiator/share
rm -rf "$SHARE"
mkdir -p "$SHARE"
harness/vm/vm-run.sh -s "$SHARE" -n none -c 2 -t 600 harness/guest/initiator-vs-nvmet.sh
