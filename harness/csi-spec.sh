#!/bin/bash
# Checks that crates/weft-csi/proto/csi.proto is the CSI spec's csi.proto of the version
# its README names, as the Go module proxy serves it. Needs Go (harness/go.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(grep -o 'spec@v[0-9.]*' crates/weft-csi/proto/README.md | head -1 | cut -d@ -f2)
export GOPATH="$PWD/.cache/go" GOFLAGS=-mod=mod
go=$(command -v go || echo /usr/local/go/bin/go)
dir=$("$go" mod download -json "github.com/container-storage-interface/spec@$version" | sed -n 's/.*"Dir": "\(.*\)",/\1/p')
cmp "$dir/csi.proto" crates/weft-csi/proto/csi.proto
echo "csi-spec: crates/weft-csi/proto/csi.proto is the spec's $version"
