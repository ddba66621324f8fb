#!/bin/bash
# Builds csi-sanity (kubernetes-csi/csi-test, the version below) with Go from the Go module
# proxy into .cache/go/bin, once; prints its path. The kernel-interop guest runs it against
# `weft csi --mode all` (harness/guest/interop.sh, step j-csi).
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=v5.6.0
export GOPATH="$PWD/.cache/go" GOBIN="$PWD/.cache/go/bin" GOFLAGS=-mod=mod CGO_ENABLED=0
bin=$GOBIN/csi-sanity
stamp=$GOBIN/csi-sanity.version
if [ ! -x "$bin" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$VERSION" ]; then
    go=$(command -v go || echo /usr/local/go/bin/go)
    "$go" install "github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity@$VERSION" >&2
    echo "$VERSION" > "$stamp"
fi
echo "$bin"
