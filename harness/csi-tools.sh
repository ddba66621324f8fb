#!/bin/bash
# Builds the CSI test tools with Go from the Go module proxy into .cache/go/bin, once each
# (versions below): csi-sanity (kubernetes-csi/csi-test) and grpcurl (the kubelet-like
# calls of the compute-node failover test). The kernel-interop guest runs them against
# `weft csi` (harness/guest/interop.sh, steps j-csi and k-csi-failover). Prints the directory.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOPATH="$PWD/.cache/go" GOBIN="$PWD/.cache/go/bin" GOFLAGS=-mod=mod CGO_ENABLED=0
go=$(command -v go || echo /usr/local/go/bin/go)
build() { # NAME MODULE/PATH VERSION
    local bin=$GOBIN/$1 stamp=$GOBIN/$1.version
    if [ ! -x "$bin" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$3" ]; then
        "$go" install "$2@$3" >&2
        echo "$3" > "$stamp"
    fi
}
build csi-sanity github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity v5.6.0
build grpcurl github.com/fullstorydev/grpcurl/cmd/grpcurl v1.9.4
echo "$GOBIN"
