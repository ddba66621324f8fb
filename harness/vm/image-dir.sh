#!/bin/bash
# Prints the cache directory of the guest image for the current recipe:
# <repo>/.cache/vm/<first 16 hex digits of sha256 over the recipe files>.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# Another suite (LAB_SUITE=trixie) is another image.
HASH=$( {
    cat "$HERE/build-image.sh" "$HERE/guest-init" "$HERE/mk-initramfs.py"
    [ "${LAB_SUITE:-bookworm}" = bookworm ] || echo "suite=$LAB_SUITE"
} | sha256sum | cut -c1-16)
echo "$(cd "$HERE/../.." && pwd)/.cache/vm/$HASH"
