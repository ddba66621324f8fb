#!/bin/bash
# Builds the application benchmark's Go tools with Go from the Go module proxy into
# .cache/go/bin, once per version: go-tpc (TPC-C) and go-ycsb (YCSB). go-ycsb's go.mod has
# replace directives, so it cannot be `go install`ed by version: it is built from a copy
# of its module directory (its workload files kept beside it in .cache/go/ycsb-workloads),
# with only the bindings the benchmark drives (MariaDB's, and `basic`): its twenty others
# (TiKV, Spanner, DynamoDB...) made the build minutes long on a fresh machine, 24 s without.
# Static binaries: the guest runs them from the repository's share. Prints the directory.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .cache/go
exec 8> .cache/go/app-tools.lock; flock 8
export GOPATH="$PWD/.cache/go" GOBIN="$PWD/.cache/go/bin" GOFLAGS="-mod=mod -modcacherw" CGO_ENABLED=0
go=$(command -v go || echo /usr/local/go/bin/go)
GO_TPC=v1.0.7 GO_YCSB=v1.0.3 YCSB_BINDINGS='basic|mysql'
fresh() { [ -x "$GOBIN/$1" ] && [ "$(cat "$GOBIN/$1.version" 2>/dev/null)" = "$2" ]; }
if ! fresh go-tpc $GO_TPC; then
    "$go" install "github.com/pingcap/go-tpc/cmd/go-tpc@$GO_TPC" >&2
    echo $GO_TPC > "$GOBIN/go-tpc.version"
fi
if ! fresh go-ycsb "$GO_YCSB $YCSB_BINDINGS" || [ ! -e "$GOPATH/ycsb-workloads/workloada" ]; then
    module=$("$go" mod download -json "github.com/pingcap/go-ycsb@$GO_YCSB" |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
    work=$(mktemp -d)
    cp -r "$module/." "$work"; chmod -R u+w "$work"
    sed -i -E "/_ \"github.com\/pingcap\/go-ycsb\/db\//{/\/db\/($YCSB_BINDINGS)\"/!d}" "$work/cmd/go-ycsb/main.go"
    (cd "$work" && "$go" build -o "$GOBIN/go-ycsb" ./cmd/go-ycsb) >&2
    rm -rf "$GOPATH/ycsb-workloads"; cp -r "$work/workloads" "$GOPATH/ycsb-workloads"
    rm -rf "$work"
    echo "$GO_YCSB $YCSB_BINDINGS" > "$GOBIN/go-ycsb.version"
fi
echo "$GOBIN"
